package relay_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pgoutbox/pgoutbox/broker/webhook"
	"github.com/pgoutbox/pgoutbox/internal/logtest"
	"github.com/pgoutbox/pgoutbox/internal/pgtest"
	"github.com/pgoutbox/pgoutbox/internal/wait"
	"github.com/pgoutbox/pgoutbox/relay"
)

// A webhook answering 400 for one aggregate: that event is quarantined at once with
// the receiver's answer in last_error; the other aggregates are delivered.
func TestWebhook400Quarantines(t *testing.T) {
	t.Parallel()
	o := newOutbox(t, 4)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Outbox-Aggregate-Id") == "a0001" {
			http.Error(w, "invalid payload: field total is missing", http.StatusBadRequest)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	}))
	t.Cleanup(srv.Close)
	pub, err := webhook.New(&webhook.Config{URL: srv.URL, AllowUnsigned: true, Logger: quietLogger()})
	pgtest.Must(t, err, "webhook")
	t.Cleanup(func() { _ = pub.Close() })
	o.enqueue(t, 3, 2)
	startRelay(t, o, pub, relay.Config{PollInterval: 50 * time.Millisecond})

	wait.For(t, 30*time.Second, "delivery and quarantine", func() bool {
		return o.count(t, "published_at IS NOT NULL") == 4 && o.count(t, "quarantined_at IS NOT NULL") == 1
	})
	var lastErr string
	var attempts int
	pgtest.Must(t, o.pool.QueryRow(context.Background(), "SELECT last_error, attempt_count FROM "+o.table()+
		" WHERE quarantined_at IS NOT NULL AND aggregate_id = 'a0001' AND aggregate_sequence = 1").Scan(&lastErr, &attempts), "read")
	if attempts != 1 || !strings.Contains(lastErr, "400") || !strings.Contains(lastErr, "field total is missing") {
		t.Fatalf("attempts %d, last_error %q: want one attempt and the receiver's answer", attempts, lastErr)
	}
	if n := o.count(t, "aggregate_id = 'a0001' AND aggregate_sequence = 2 AND published_at IS NULL AND attempt_count = 0"); n != 1 {
		t.Fatal("the event behind the quarantined one was attempted or published")
	}
}

// A webhook that refuses the relay's credentials (401, 403) and echoes the request
// back: a configuration error. The relay reports it so (Healthy fails with
// ErrBrokerMisconfigured and the answer, not ErrBrokerUnreachable), quarantines
// nothing and retries with backoff; no last_error holds the request's secrets.
// Once the receiver accepts, every event is delivered and the relay is healthy.
func TestWebhookRefusedCredentialsAreAConfigurationError(t *testing.T) {
	t.Parallel()
	for _, code := range []int{http.StatusUnauthorized, http.StatusForbidden} {
		t.Run(strconv.Itoa(code), func(t *testing.T) {
			t.Parallel()
			sign, pass, token := "Zq"+strings.ToLower(rand.Text()), "Zq"+strings.ToLower(rand.Text()), "Zq"+strings.ToLower(rand.Text())
			o := newOutbox(t, 4)
			var accept atomic.Bool
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if accept.Load() {
					w.WriteHeader(http.StatusNoContent)
					return
				}
				var dump bytes.Buffer
				_ = r.Header.Write(&dump)
				w.WriteHeader(code)
				fmt.Fprintf(&dump, "url %s secret %s", r.URL, sign)
				_, _ = w.Write(dump.Bytes())
			}))
			t.Cleanup(srv.Close)
			u, _ := url.Parse(srv.URL)
			u.User = url.UserPassword("hook", pass)
			var logs logtest.Buffer
			pub, err := webhook.New(&webhook.Config{URL: u.String() + "/in?token=" + token, Secret: []byte(sign), Logger: quietLogger()})
			pgtest.Must(t, err, "webhook")
			t.Cleanup(func() { _ = pub.Close() })
			o.enqueue(t, 2, 2)
			r := startRelay(t, o, pub, relay.Config{PollInterval: 50 * time.Millisecond, BackoffBase: 10 * time.Millisecond,
				MaxAttempts: 2, Logger: logs.Logger()})

			wait.For(t, 30*time.Second, "the refusal reported", func() bool {
				return errors.Is(r.Healthy(), relay.ErrBrokerMisconfigured) && o.count(t, "attempt_count >= 3") >= 1
			})
			h := r.Healthy()
			if errors.Is(h, relay.ErrBrokerUnreachable) || !strings.Contains(h.Error(), strconv.Itoa(code)) {
				t.Errorf("Healthy = %v: want the configuration error with the answer, not unreachable", h)
			}
			if n := o.count(t, "quarantined_at IS NOT NULL"); n != 0 {
				t.Errorf("%d events quarantined past MaxAttempts 2: the events are fine, the configuration is not", n)
			}
			rows, err := o.pool.Query(context.Background(), "SELECT coalesce(last_error, '') FROM "+o.table())
			pgtest.Must(t, err, "read last_error")
			for rows.Next() {
				var le string
				pgtest.Must(t, rows.Scan(&le), "scan")
				for _, s := range []string{sign, pass, token, sign[:8], pass[:8], token[:8]} {
					if strings.Contains(le, s) {
						t.Errorf("last_error holds a secret (%q): %s", s, le)
					}
				}
			}
			pgtest.Must(t, rows.Err(), "rows")
			if l := logs.String(); !strings.Contains(l, "refuses the relay's configuration") || strings.Contains(l, "broker unreachable") ||
				strings.Contains(l, sign) || strings.Contains(l, pass) || strings.Contains(l, token) {
				t.Errorf("logs: want the configuration error, no secret:\n%s", l)
			}

			accept.Store(true)
			wait.For(t, 30*time.Second, "delivery once accepted", func() bool {
				return o.count(t, "published_at IS NOT NULL") == 4 && r.Healthy() == nil
			})
		})
	}
}
