package cdc_test

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pgoutbox/pgoutbox/broker/webhook"
	"github.com/pgoutbox/pgoutbox/cdc"
	"github.com/pgoutbox/pgoutbox/internal/pgtest"
	"github.com/pgoutbox/pgoutbox/internal/wait"
)

// The CDC source treats a webhook's 401 like the polling relay: a configuration
// error in Healthy (not "broker unreachable"), nothing quarantined, and delivery
// once the receiver accepts.
func TestWebhookRefusalIsAConfigurationError(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	var accept atomic.Bool
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if accept.Load() {
			w.WriteHeader(http.StatusNoContent)
			return
		}
		http.Error(w, "bad signature", http.StatusUnauthorized)
	}))
	t.Cleanup(srv.Close)
	pub, err := webhook.New(&webhook.Config{URL: srv.URL, AllowUnsigned: true, Logger: quietLogger()})
	pgtest.Must(t, err, "webhook")
	t.Cleanup(func() { _ = pub.Close() })
	cfg := e.cfg
	cfg.BackoffBase, cfg.BackoffMax, cfg.MaxAttempts = 10*time.Millisecond, 100*time.Millisecond, 2
	src := e.start(t, pub, cfg)
	e.enqueue(t, 3, 2, 6)
	wait.For(t, 30*time.Second, "the refusal reported", func() bool {
		h := src.Healthy()
		return h != nil && strings.Contains(h.Error(), "refuses the relay's configuration") && e.count(t, "attempt_count >= 3") > 0
	})
	if h := src.Healthy(); !errors.Is(h, cdc.ErrBrokerMisconfigured) || errors.Is(h, cdc.ErrBrokerUnreachable) || !strings.Contains(h.Error(), "401") {
		t.Errorf("Healthy = %v: want the configuration error with the answer, not unreachable", h)
	}
	if n := e.count(t, "quarantined_at IS NOT NULL"); n != 0 {
		t.Errorf("%d events quarantined past MaxAttempts 2", n)
	}
	accept.Store(true)
	wait.For(t, 60*time.Second, "delivery once accepted", func() bool {
		return e.count(t, "published_at IS NULL") == 0 && src.Healthy() == nil
	})
}
