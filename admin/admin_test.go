package admin_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/pgoutbox/pgoutbox"
	"github.com/pgoutbox/pgoutbox/admin"
	"github.com/pgoutbox/pgoutbox/internal/pgtest"
	"github.com/pgoutbox/pgoutbox/migrate"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestRetryLiftsOnlyQuarantine(t *testing.T) {
	t.Parallel()
	pool, schema := pgtest.Migrated(t, 2)
	ctx := context.Background()
	p, err := pgoutbox.NewProducer(&pgoutbox.Config{Schema: schema})
	pgtest.Must(t, err, "producer")
	res, err := p.EnqueueTx(ctx, pool,
		pgoutbox.Event{AggregateType: "a", AggregateID: "1", EventType: "e"},
		pgoutbox.Event{AggregateType: "a", AggregateID: "2", EventType: "e"},
		pgoutbox.Event{AggregateType: "a", AggregateID: "3", EventType: "e"})
	pgtest.Must(t, err, "enqueue")
	table := quoted(schema, "outbox_events")
	_, err = pool.Exec(ctx, "UPDATE "+table+" SET quarantined_at = now(), attempt_count = 10, last_error = 'boom', available_at = now() + interval '1 hour' WHERE event_id = $1", res[0].EventID)
	pgtest.Must(t, err, "quarantine")
	_, err = pool.Exec(ctx, "UPDATE "+table+" SET published_at = now() WHERE event_id = $1", res[1].EventID)
	pgtest.Must(t, err, "publish")

	// The relays of the schema are woken.
	conn, err := pool.Acquire(ctx)
	pgtest.Must(t, err, "acquire")
	defer conn.Release()
	_, err = conn.Exec(ctx, "LISTEN "+quoted(migrate.NotifyChannel(schema)))
	pgtest.Must(t, err, "listen")

	a, err := admin.New(pool, &admin.Config{Schema: schema})
	pgtest.Must(t, err, "admin")
	// An id no event has: not found, and nothing is retried.
	unknown := pgoutbox.NewEventID()
	if got, err := a.Retry(ctx, res[0].EventID, unknown); !errors.Is(err, admin.ErrNotFound) || !strings.Contains(err.Error(), unknown.String()) || got != nil {
		t.Fatalf("retry with an unknown id = %v, %v; want ErrNotFound naming it", got, err)
	}
	var stillQuarantined bool
	pgtest.Must(t, pool.QueryRow(ctx, "SELECT quarantined_at IS NOT NULL FROM "+table+" WHERE event_id = $1", res[0].EventID).Scan(&stillQuarantined), "read")
	if !stillQuarantined {
		t.Fatal("a retry that failed with not found retried an event")
	}
	got, err := a.Retry(ctx, res[0].EventID, res[1].EventID, res[2].EventID)
	pgtest.Must(t, err, "retry")
	if len(got) != 1 || got[0] != res[0].EventID {
		t.Fatalf("retried %v, want only the quarantined event", got)
	}
	var attempts int
	var lastErr string
	var due bool
	pgtest.Must(t, pool.QueryRow(ctx, "SELECT attempt_count, last_error, available_at <= now() FROM "+table+
		" WHERE event_id = $1 AND quarantined_at IS NULL", res[0].EventID).Scan(&attempts, &lastErr, &due), "read")
	if attempts != 0 || lastErr != "boom" || !due {
		t.Fatalf("after retry: attempts %d, last_error %q, due %v", attempts, lastErr, due)
	}
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	n, err := conn.Conn().WaitForNotification(wctx)
	if err != nil || n.Channel != migrate.NotifyChannel(schema) {
		t.Fatalf("notification %+v, %v", n, err)
	}

	if _, err := a.Retry(ctx); !errors.Is(err, admin.ErrNoEvents) {
		t.Fatalf("Retry() = %v, want ErrNoEvents", err)
	}
}
