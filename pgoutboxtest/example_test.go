package pgoutboxtest_test

import (
	"context"
	"fmt"
	"log"
	"os"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgoutbox/pgoutbox"
	"github.com/pgoutbox/pgoutbox/migrate"
	"github.com/pgoutbox/pgoutbox/pgoutboxtest"
)

// exampleDatabase is the test database: PGOUTBOX_TEST_DATABASE_URL, else the
// local server.
func exampleDatabase() string {
	if url := os.Getenv("PGOUTBOX_TEST_DATABASE_URL"); url != "" {
		return url
	}
	return "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"
}

// An order service's events, checked end to end: enqueued in the service's
// transaction, published by an in-process relay to an in-memory broker. In a
// test, New(t, pool, cfg) and Schema(t, pool) do the starting, stopping and
// dropping below with t.Cleanup.
func Example() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pool, err := pgxpool.New(ctx, exampleDatabase())
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	schema := fmt.Sprintf("example_%d", time.Now().UnixNano())
	if _, err := migrate.Up(ctx, pool, &migrate.Config{Schema: schema}); err != nil {
		log.Fatal(err)
	}
	defer pool.Exec(context.Background(), "DROP SCHEMA "+pgx.Identifier{schema}.Sanitize()+" CASCADE")

	relay, err := pgoutboxtest.Start(ctx, pool, &pgoutboxtest.Config{Schema: schema})
	if err != nil {
		log.Fatal(err)
	}
	defer relay.Stop(ctx)

	// The code under test: a transaction that enqueues two events.
	producer, err := pgoutbox.NewProducer(&pgoutbox.Config{Schema: schema})
	if err != nil {
		log.Fatal(err)
	}
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		_, err := producer.EnqueueTx(ctx, tx,
			pgoutbox.Event{AggregateType: "order", AggregateID: "o-1", EventType: "order.placed",
				Payload: map[string]int{"total_cents": 1250}},
			pgoutbox.Event{AggregateType: "order", AggregateID: "o-1", EventType: "order.paid",
				Payload: map[string]int{"total_cents": 1250}})
		return err
	})
	if err != nil {
		log.Fatal(err)
	}

	if err := relay.WaitDrained(ctx); err != nil {
		log.Fatal(err)
	}
	for _, m := range relay.PublishedFor("order", "o-1") {
		fmt.Println(m.AggregateSequence, m.EventType, string(m.Payload))
	}
	// Output:
	// 1 order.placed {"total_cents": 1250}
	// 2 order.paid {"total_cents": 1250}
}
