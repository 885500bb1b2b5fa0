package relay_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/pgoutbox/pgoutbox/broker/webhook"
	"github.com/pgoutbox/pgoutbox/internal/pgtest"
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
	pub, err := webhook.New(webhook.Config{URL: srv.URL, AllowUnsigned: true, Logger: quietLogger()})
	pgtest.Must(t, err, "webhook")
	t.Cleanup(func() { _ = pub.Close() })
	o.enqueue(t, 3, 2)
	startRelay(t, o, pub, relay.Config{PollInterval: 50 * time.Millisecond})

	waitFor(t, 30*time.Second, "delivery and quarantine", func() bool {
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
