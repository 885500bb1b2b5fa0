package cdc

import (
	"context"
	"testing"

	"github.com/pgoutbox/pgoutbox"
	"github.com/pgoutbox/pgoutbox/internal/pgtest"
)

// A commit reaches logical decoding a moment before other sessions see it. The
// producer's transaction may become visible between the source's mark (which
// then updated nothing) and its look for events published meanwhile: the event
// is then present and unpublished, and must be marked, not taken for
// published (seen as events on the stream with published_at NULL for ever).
func TestMarkAllMarksAnEventThatBecomesVisibleMidway(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, s := idleSource(t)

	prod, err := pgoutbox.NewProducer(&pgoutbox.Config{Schema: s.cfg.Schema})
	pgtest.Must(t, err, "producer")
	tx, err := pool.Begin(ctx)
	pgtest.Must(t, err, "begin")
	defer tx.Rollback(ctx) // after the commit: a no-op
	enq, err := prod.EnqueueTx(ctx, tx, pgoutbox.Event{AggregateType: "order", AggregateID: "1", EventType: "placed",
		Payload: map[string]any{"n": 1}})
	pgtest.Must(t, err, "enqueue")

	// The transaction commits after the first mark, before the look.
	committed := false
	s.afterMark = func() {
		if !committed {
			committed = true
			pgtest.Must(t, tx.Commit(ctx), "commit")
		}
	}
	if !s.markAll([]pgoutbox.UUID{enq[0].EventID}) {
		t.Fatal("markAll gave up")
	}
	if !committed {
		t.Fatal("the hook did not run: the mark found the uncommitted event")
	}
	var unpublished int
	pgtest.Must(t, pool.QueryRow(ctx, "SELECT count(*) FROM "+s.q.table+" WHERE published_at IS NULL").Scan(&unpublished), "count")
	if unpublished != 0 {
		t.Fatalf("%d event left unpublished after markAll: taken for published meanwhile", unpublished)
	}
}
