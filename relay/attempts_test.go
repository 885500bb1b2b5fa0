package relay_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/pgoutbox/admin"
	"github.com/pgoutbox/pgoutbox/broker/webhook"
	"github.com/pgoutbox/pgoutbox/internal/pgtest"
	"github.com/pgoutbox/pgoutbox/internal/wait"
	"github.com/pgoutbox/pgoutbox/relay"
)

// failingWebhook answers 500 with the request's number in its body until
// accept is set, then 204.
func failingWebhook(t *testing.T) (*webhook.Publisher, *atomic.Bool) {
	t.Helper()
	var accept atomic.Bool
	var n atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if accept.Load() {
			w.WriteHeader(http.StatusNoContent)
			return
		}
		http.Error(w, fmt.Sprintf("upstream down, request %d", n.Add(1)), http.StatusInternalServerError)
	}))
	t.Cleanup(srv.Close)
	pub, err := webhook.New(&webhook.Config{URL: srv.URL, AllowUnsigned: true, Logger: quietLogger()})
	pgtest.Must(t, err, "webhook")
	t.Cleanup(func() { _ = pub.Close() })
	return pub, &accept
}

func (o *outbox) attemptRows(t *testing.T) int {
	t.Helper()
	var n int
	pgtest.Must(t, o.pool.QueryRow(context.Background(), "SELECT count(*) FROM "+pgx.Identifier{o.schema, "outbox_attempts"}.Sanitize()).Scan(&n), "count attempts")
	return n
}

// A webhook failing an event 3 times: 3 attempt rows, newest first, each with
// its own error, the relay's id and no destination, written with the failure
// (the event's last_error is the newest row's). The event retried and
// delivered keeps its history; cleanup deletes it with the event.
func TestAttemptHistory(t *testing.T) {
	t.Parallel()
	o := newOutbox(t, 4)
	pub, accept := failingWebhook(t)
	ids := o.enqueue(t, 1, 1)
	r := startRelay(t, o, pub, relay.Config{ID: "relay-h", PollInterval: 20 * time.Millisecond, MaxAttempts: 3,
		BackoffBase: time.Millisecond, BackoffMax: 5 * time.Millisecond})
	wait.For(t, 60*time.Second, "the quarantine", func() bool { return o.count(t, "quarantined_at IS NOT NULL") == 1 })
	a, err := admin.New(o.pool, &admin.Config{Schema: o.schema})
	pgtest.Must(t, err, "admin")
	ctx := context.Background()
	ev, err := a.Get(ctx, ids[0])
	pgtest.Must(t, err, "get")
	if len(ev.Attempts) != 3 {
		t.Fatalf("%d attempts, want 3: %+v", len(ev.Attempts), ev.Attempts)
	}
	for i, at := range ev.Attempts {
		want := 3 - i
		if at.Attempt != want || at.RelayID != r.ID() || at.Destination != "" || at.At.IsZero() ||
			!strings.Contains(at.Error, "500") || !strings.Contains(at.Error, fmt.Sprintf("request %d", want)) {
			t.Errorf("attempt %d: %+v", want, at)
		}
		if i > 0 && at.At.After(ev.Attempts[i-1].At) {
			t.Errorf("attempts not newest first: %+v", ev.Attempts)
		}
	}
	if ev.LastError != ev.Attempts[0].Error || ev.AttemptCount != 3 {
		t.Errorf("the event says %d attempts, %q; its newest attempt row %q", ev.AttemptCount, ev.LastError, ev.Attempts[0].Error)
	}

	accept.Store(true)
	_, err = a.Retry(ctx, ids[0])
	pgtest.Must(t, err, "retry")
	wait.For(t, 60*time.Second, "the delivery", func() bool { return o.count(t, "published_at IS NOT NULL") == 1 })
	if n := o.attemptRows(t); n != 3 {
		t.Fatalf("%d attempt rows after the delivery, want the 3 kept", n)
	}
	res, err := admin.Cleanup(ctx, o.pool, admin.CleanupConfig{Schema: o.schema, Retention: time.Microsecond, Logger: quietLogger()})
	pgtest.Must(t, err, "cleanup")
	if res.Deleted != 1 || o.attemptRows(t) != 0 {
		t.Fatalf("cleanup deleted %d events and left %d attempt rows", res.Deleted, o.attemptRows(t))
	}
}

// The history of an event is bounded: after 25 failures, the 20 newest.
func TestAttemptHistoryBounded(t *testing.T) {
	t.Parallel()
	o := newOutbox(t, 4)
	pub, _ := failingWebhook(t)
	ids := o.enqueue(t, 1, 1)
	startRelay(t, o, pub, relay.Config{PollInterval: 20 * time.Millisecond, MaxAttempts: 25,
		BackoffBase: time.Millisecond, BackoffMax: 5 * time.Millisecond})
	wait.For(t, 60*time.Second, "the quarantine", func() bool { return o.count(t, "quarantined_at IS NOT NULL") == 1 })
	a, err := admin.New(o.pool, &admin.Config{Schema: o.schema})
	pgtest.Must(t, err, "admin")
	ev, err := a.Get(context.Background(), ids[0])
	pgtest.Must(t, err, "get")
	if n := o.attemptRows(t); n != 20 || len(ev.Attempts) != 20 || ev.Attempts[0].Attempt != 25 || ev.Attempts[19].Attempt != 6 {
		t.Fatalf("%d rows, %d attempts shown (newest %d, oldest %d); want the 20 newest, 25 to 6",
			n, len(ev.Attempts), ev.Attempts[0].Attempt, ev.Attempts[len(ev.Attempts)-1].Attempt)
	}
}
