package admin_test

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgoutbox/pgoutbox"
	"github.com/pgoutbox/pgoutbox/admin"
	"github.com/pgoutbox/pgoutbox/internal/pgtest"
)

// exampleOutbox is a schema of the example's own (pgtest.ExampleDB) with two
// events of one order, the first of them quarantined as a relay leaves a
// poison event.
func exampleOutbox(ctx context.Context) (pool *pgxpool.Pool, schema string, poison pgoutbox.UUID, done func()) {
	pool, schema, done = pgtest.ExampleDB(ctx)
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
	return pool, schema, res[0].EventID, done
}

// An operator lists the dead letters of an aggregate and skips one, with a reason
// that is kept in outbox_skipped_events. The order's next event is then free to go.
func ExampleAdmin_Skip() {
	ctx := context.Background()
	pool, schema, _, done := exampleOutbox(ctx)
	defer done()

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
	pool, schema, poison, done := exampleOutbox(ctx)
	defer done()

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

func ExampleCleanup() {
	ctx := context.Background()
	pool, schema, done := pgtest.ExampleDB(ctx)
	defer done()

	res, err := admin.Cleanup(ctx, pool, admin.CleanupConfig{
		Schema:         schema,
		Retention:      7 * 24 * time.Hour,  // published events older than this go
		InboxRetention: 14 * 24 * time.Hour, // and dedup rows older than this
	})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("deleted %d events and %d dedup rows\n", res.Deleted, res.InboxDeleted)
	// Output: deleted 0 events and 0 dedup rows
}

func ExampleReplay() {
	ctx := context.Background()
	pool, schema, done := pgtest.ExampleDB(ctx)
	defer done()

	// How many events would a replay of yesterday's orders send?
	res, err := admin.Replay(ctx, pool, nil, admin.ReplayRequest{
		Schema: schema,
		Filter: admin.ReplayFilter{AggregateType: "order", Since: time.Now().Add(-24 * time.Hour)},
		DryRun: true,
	})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("would replay", res.Total, "events")
	// Output: would replay 0 events
}

// An operator looks at the destinations of a relay with destinations, finds
// the dead letter of one of them, skips it there alone, and drops a
// destination that is gone for good. (The progress rows are written here as
// a relay with destinations writes them.)
func ExampleAdmin_Destinations() {
	ctx := context.Background()
	pool, schema, _, done := exampleOutbox(ctx)
	defer done()
	// The relay registered "warehouse" and "crm"; warehouse stopped at order 42 #1.
	for _, q := range []struct{ table, values string }{
		{"outbox_destinations", `(name, rules, start) VALUES ('warehouse', '[{"all": true}]', 'backfill'), ('crm', '[{"all": true}]', 'now')`},
		{"outbox_destination_lanes", `(destination, aggregate_type, aggregate_id, quarantined_at, quarantined_sequence, attempt_count, last_error)
		 VALUES ('warehouse', 'order', '42', now(), 1, 10, 'rabbitmq: NO_ROUTE')`},
	} {
		if _, err := pool.Exec(ctx, "INSERT INTO "+pgx.Identifier{schema, q.table}.Sanitize()+" "+q.values); err != nil {
			log.Fatal(err)
		}
	}

	a, err := admin.New(pool, &admin.Config{Schema: schema})
	if err != nil {
		log.Fatal(err)
	}
	ds, err := a.Destinations(ctx)
	if err != nil {
		log.Fatal(err)
	}
	for _, d := range ds {
		fmt.Printf("%s: start %s, %d pending lanes, %d dead letters\n", d.Name, d.Start, d.PendingLanes, d.DeadLetters)
	}
	dead, err := a.ListDestinationQuarantined(ctx, "warehouse", admin.Filter{})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("warehouse stopped at %s/%s #%d: %s\n", dead[0].AggregateType, dead[0].AggregateID, dead[0].AggregateSequence, dead[0].LastError)
	if _, err := a.SkipDestination(ctx, admin.DestinationSkipRequest{Destination: "warehouse", IDs: []pgoutbox.UUID{dead[0].ID},
		Reason: "the warehouse never needed that order", Actor: "alice"}); err != nil {
		log.Fatal(err)
	}
	dropped, err := a.DropDestination(ctx, admin.DropRequest{Name: "crm", Reason: "CRM decommissioned", Actor: "alice"})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("dropped %s (%d progress rows)\n", dropped.Destination.Name, dropped.Lanes)
	// Output:
	// crm: start now, 1 pending lanes, 0 dead letters
	// warehouse: start backfill, 1 pending lanes, 1 dead letters
	// warehouse stopped at order/42 #1: rabbitmq: NO_ROUTE
	// dropped crm (0 progress rows)
}
