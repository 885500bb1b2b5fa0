package pgoutbox_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgoutbox/pgoutbox"
	"github.com/pgoutbox/pgoutbox/internal/pgtest"
)

// newOrdersFixture is a fixture with a business table, orders (id text PRIMARY KEY).
func newOrdersFixture(t *testing.T) *fixture {
	t.Helper()
	f := newFixture(t, 2)
	_, err := f.pool.Exec(context.Background(), "CREATE TABLE "+f.table("orders")+" (id text PRIMARY KEY)")
	pgtest.Must(t, err, "orders")
	return f
}

// QueueTx's events travel in the caller's batch, inside its transaction: they
// continue the lanes of earlier EnqueueTx calls, span several statements when
// many, and are known only once the batch's results are read.
func TestQueueTxInTransaction(t *testing.T) {
	t.Parallel()
	f := newOrdersFixture(t)
	ctx := context.Background()
	tx, err := f.pool.Begin(ctx)
	pgtest.Must(t, err, "begin")
	defer tx.Rollback(ctx)

	_, err = f.p.EnqueueTx(ctx, tx, ev("a", 1))
	pgtest.Must(t, err, "enqueue")
	many := make([]pgoutbox.Event, 1500) // two statements
	for i := range many {
		many[i] = ev([]string{"a", "b"}[i%2], i)
	}
	b := &pgx.Batch{}
	b.Queue("INSERT INTO " + f.table("orders") + " VALUES ('o-1')")
	q, err := f.p.QueueTx(ctx, b, many...)
	pgtest.Must(t, err, "queue")
	if b.Len() != 3 {
		t.Fatalf("batch of %d statements, want the business one and 2 for 1,500 events", b.Len())
	}
	if _, err := q.Result(); err == nil {
		t.Fatal("Result before the batch was sent: no error")
	}
	pgtest.Must(t, tx.SendBatch(ctx, b).Close(), "send batch")
	res, err := q.Result()
	pgtest.Must(t, err, "result")
	if len(res) != len(many) {
		t.Fatalf("%d results for %d events", len(res), len(many))
	}
	for i, r := range res {
		// Lane a had sequence 1 from EnqueueTx; lane b starts at 1.
		if want := int64(1 + i/2 + 1 - i%2); r.AggregateSequence != want || r.EventID == (pgoutbox.UUID{}) {
			t.Fatalf("event %d (%s): %+v, want sequence %d", i, many[i].AggregateID, r, want)
		}
	}
	pgtest.Must(t, tx.Commit(ctx), "commit")
	if n := f.count(t); n != 1501 {
		t.Fatalf("%d rows, want 1501", n)
	}
}

// Sent outside a transaction, the batch is one implicit transaction: when a
// business statement after the events fails, the events are not written.
func TestQueueTxImplicitTransactionIsAtomic(t *testing.T) {
	t.Parallel()
	f := newOrdersFixture(t)
	ctx := context.Background()

	send := func(second string) (*pgoutbox.Queued, error) {
		b := &pgx.Batch{}
		b.Queue("INSERT INTO " + f.table("orders") + " VALUES ('o-1')")
		q, err := f.p.QueueTx(ctx, b, ev("o-1", 1))
		pgtest.Must(t, err, "queue")
		b.Queue("INSERT INTO " + f.table("orders") + " VALUES ('" + second + "')")
		return q, f.pool.SendBatch(ctx, b).Close()
	}
	q, err := send("o-1") // duplicate key after the event
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "23505" {
		t.Fatalf("batch error %v, want a unique violation", err)
	}
	// The enqueue statement itself ran (Result may answer), but its implicit
	// transaction did not commit.
	_, _ = q.Result()
	if n := f.count(t); n != 0 {
		t.Fatalf("%d events written by a failed batch", n)
	}
	q, err = send("o-2")
	pgtest.Must(t, err, "send")
	res, err := q.Result()
	pgtest.Must(t, err, "result")
	if len(res) != 1 || res[0].AggregateSequence != 1 || f.count(t) != 1 {
		t.Fatalf("result %+v, %d rows", res, f.count(t))
	}
}

// An invalid event queues nothing; a failing enqueue statement makes both the
// batch and Result fail.
func TestQueueTxErrors(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 2)
	ctx := context.Background()
	b := &pgx.Batch{}
	_, err := f.p.QueueTx(ctx, b, ev("a", 1), pgoutbox.Event{AggregateType: "order", EventType: "x", Payload: 1})
	var ve *pgoutbox.ValidationError
	if !errors.As(err, &ve) || ve.Index != 1 || b.Len() != 0 {
		t.Fatalf("error %v, batch of %d; want a ValidationError for event #1 and nothing queued", err, b.Len())
	}

	// An event id already in the outbox: the statement fails in the database.
	e := ev("a", 1)
	e.ID = pgoutbox.NewEventID()
	_, err = f.p.EnqueueTx(ctx, f.pool, e)
	pgtest.Must(t, err, "enqueue")
	e.AggregateID = "b"
	q, err := f.p.QueueTx(ctx, b, e)
	pgtest.Must(t, err, "queue")
	err = f.pool.SendBatch(ctx, b).Close()
	if _, rerr := q.Result(); err == nil || rerr == nil || !strings.Contains(rerr.Error(), "pgoutbox: enqueue") {
		t.Fatalf("batch error %v, Result error %v; want both to fail", err, rerr)
	}
}
