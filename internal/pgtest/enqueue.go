package pgtest

import (
	"context"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgoutbox/pgoutbox"
)

// EnqueueInterleaved writes perAgg events to each of aggregates aggregates of
// type "acct" (ids a0000, a0001, ...), interleaved (round-robin over the
// aggregates), in transactions of up to txSize events, and returns all events'
// ids in the order written.
func EnqueueInterleaved(tb testing.TB, pool *pgxpool.Pool, prod *pgoutbox.Producer, aggregates, perAgg, txSize int) []pgoutbox.UUID {
	tb.Helper()
	var ids []pgoutbox.UUID
	var batch []pgoutbox.Event
	flush := func() {
		res, err := prod.EnqueueTx(context.Background(), pool, batch...)
		Must(tb, err, "enqueue")
		for _, r := range res {
			ids = append(ids, r.EventID)
		}
		batch = batch[:0]
	}
	for s := range perAgg {
		for a := range aggregates {
			batch = append(batch, pgoutbox.Event{AggregateType: "acct", AggregateID: fmt.Sprintf("a%04d", a),
				EventType: "acct.changed", Payload: map[string]int{"n": s}})
			if len(batch) == txSize {
				flush()
			}
		}
	}
	if len(batch) > 0 {
		flush()
	}
	return ids
}
