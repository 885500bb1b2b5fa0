package cdc

import (
	"context"
	"testing"

	"github.com/jackc/pglogrepl"

	"github.com/pgoutbox/pgoutbox"
	"github.com/pgoutbox/pgoutbox/internal/pgtest"
)

// Handing a lane back to the stream moves the position up to which the
// stream looks events up before publishing past everything the table path
// published: the stream may still bring later events of the lane that the
// table path sent.
func TestUnblockExtendsTheLookUp(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, s := idleSource(t)
	prod, err := pgoutbox.NewProducer(&pgoutbox.Config{Schema: s.cfg.Schema})
	pgtest.Must(t, err, "producer")
	var evs []pgoutbox.Event
	for range 3 {
		evs = append(evs, pgoutbox.Event{AggregateType: "order", AggregateID: "1", EventType: "placed", Payload: map[string]any{"n": 1}})
	}
	_, err = prod.EnqueueTx(ctx, pool, evs...)
	pgtest.Must(t, err, "enqueue")
	_, err = pool.Exec(ctx, "UPDATE "+s.q.table+" SET published_at = now()") // the table path published all three
	pgtest.Must(t, err, "mark")
	var text string
	pgtest.Must(t, pool.QueryRow(ctx, "SELECT pg_current_wal_insert_lsn()::text").Scan(&text), "insert position")
	before, err := pglogrepl.ParseLSN(text)
	pgtest.Must(t, err, "parse")

	lane := pgoutbox.LaneOf("order", "1")
	s.mu.Lock()
	s.blocked[lane] = &laneState{seen: 1} // the stream skipped the first only
	n := s.unblockLocked([]pgoutbox.Lane{lane})
	until := s.checkUntil
	s.mu.Unlock()
	if n != 1 {
		t.Fatalf("%d lanes handed back, want 1", n)
	}
	if until < before {
		t.Fatalf("look-up up to %s after the hand-back, want at least %s (past the events the table path published)", until, before)
	}
}

// A batch with a failure waits for every mark begun before it, and for no
// mark begun after it started waiting.
func TestMarkTicketsWaitForMarksBegunBefore(t *testing.T) {
	t.Parallel()
	m := &markTickets{}
	m.cond.L = &m.mu
	m.waitBegun() // nothing begun: returns at once
	a, b := m.begin(), m.begin()
	m.end(b)
	m.waitBefore(a) // below a: nothing
	done := make(chan struct{})
	go func() {
		m.waitBefore(b + 1) // a and b; b is over
		close(done)
	}()
	later := m.begin() // after the waiter's number
	select {
	case <-done:
		t.Fatal("returned while a mark begun before it runs")
	default:
	}
	m.end(a)
	<-done // returns although later still runs
	m.end(later)
	m.waitBegun()
}
