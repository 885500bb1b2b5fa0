package admin_test

import (
	"context"
	"fmt"
	"log"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgoutbox/pgoutbox"
	"github.com/pgoutbox/pgoutbox/admin"
	"github.com/pgoutbox/pgoutbox/internal/pgtest"
	"github.com/pgoutbox/pgoutbox/migrate"
)

// exampleOutbox migrates a schema of its own with two events of one order, the
// first of them quarantined as a relay leaves a poison event.
func exampleOutbox(ctx context.Context, pool *pgxpool.Pool) (schema string, poison pgoutbox.UUID) {
	schema = pgtest.Name("example")
	if _, err := migrate.Up(ctx, pool, &migrate.Config{Schema: schema}); err != nil {
		log.Fatal(err)
	}
	p, _ := pgoutbox.NewProducer(&pgoutbox.Config{Schema: schema})
	res, err := p.EnqueueTx(ctx, pool,
		pgoutbox.Event{AggregateType: "order", AggregateID: "42", EventType: "order.placed", Payload: map[string]int{"cents": -5}},
		pgoutbox.Event{AggregateType: "order", AggregateID: "42", EventType: "order.paid"})
	if err != nil {
		log.Fatal(err)
	}
	_, err = pool.Exec(ctx, "UPDATE "+pgx.Identifier{schema, "outbox_events"}.Sanitize()+
		" SET quarantined_at = now(), attempt_count = 1, last_error = 'webhook: 400 negative amount' WHERE event_id = $1", res[0].EventID)
	if err != nil {
		log.Fatal(err)
	}
	return schema, res[0].EventID
}

// An operator lists the dead letters of an aggregate and skips one, with a reason
// that is kept in outbox_skipped_events. The order's next event is then free to go.
func ExampleAdmin_Skip() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, pgtest.URL()) // your DATABASE_URL
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	schema, _ := exampleOutbox(ctx, pool)
	defer pool.Exec(ctx, "DROP SCHEMA "+schema+" CASCADE")

	a, err := admin.New(pool, &admin.Config{Schema: schema})
	if err != nil {
		log.Fatal(err)
	}
	dead, err := a.ListQuarantined(ctx, admin.Filter{AggregateType: "order", AggregateID: "42"})
	if err != nil {
		log.Fatal(err)
	}
	for _, e := range dead {
		fmt.Printf("quarantined: %s/%s #%d %s: %s\n", e.AggregateType, e.AggregateID, e.AggregateSequence, e.EventType, e.LastError)
	}
	skipped, err := a.Skip(ctx, admin.SkipRequest{
		IDs:    []pgoutbox.UUID{dead[0].ID},
		Reason: "amount was corrected by hand in the ledger (TICKET-1234)",
		Actor:  "alice",
	})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("skipped #%d by %s: %s\n", skipped[0].AggregateSequence, skipped[0].SkippedBy, skipped[0].Reason)
	st, err := a.Status(ctx)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("pending %d, quarantined %d, skipped %d\n", st.Pending, st.Quarantined, st.Skipped)
	// Output:
	// quarantined: order/42 #1 order.placed: webhook: 400 negative amount
	// skipped #1 by alice: amount was corrected by hand in the ledger (TICKET-1234)
	// pending 1, quarantined 0, skipped 1
}

// Retrying a dead letter, e.g. after fixing the consumer that refused it, puts it
// back at the head of its lane with fresh attempts.
func ExampleAdmin_RetryWhere() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, pgtest.URL()) // your DATABASE_URL
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	schema, poison := exampleOutbox(ctx, pool)
	defer pool.Exec(ctx, "DROP SCHEMA "+schema+" CASCADE")

	a, err := admin.New(pool, &admin.Config{Schema: schema})
	if err != nil {
		log.Fatal(err)
	}
	retried, err := a.RetryWhere(ctx, admin.Filter{ErrorContains: "negative amount"})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("retried", len(retried), retried[0] == poison)
	e, err := a.Get(ctx, poison)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(e.State, e.AttemptCount)
	// Output:
	// retried 1 true
	// pending 0
}
