package pgoutbox_test

import (
	"context"
	"fmt"
	"log"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/pgoutbox/pgoutbox"
	"github.com/pgoutbox/pgoutbox/internal/pgtest"
)

// exampleSchema gives each example a schema of its own on the test database,
// with an orders table, and returns a function that drops it. Real code uses
// its own pool and schema.
func exampleSchema(ctx context.Context) (*pgxpool.Pool, string, func()) {
	pool, schema, done := pgtest.ExampleDB(ctx)
	if _, err := pool.Exec(ctx, "CREATE TABLE "+schema+".orders (id text PRIMARY KEY, total_cents int)"); err != nil {
		log.Fatal(err)
	}
	return pool, schema, done
}

// The order row and its events commit together: the relay sees the events only if
// the order exists.
func ExampleProducer_EnqueueTx() {
	ctx := context.Background()
	pool, schema, done := exampleSchema(ctx)
	defer done()

	producer, err := pgoutbox.NewProducer(&pgoutbox.Config{Schema: schema})
	if err != nil {
		log.Fatal(err)
	}
	type OrderPlaced struct {
		OrderID    string `json:"order_id"`
		TotalCents int    `json:"total_cents"`
	}
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "INSERT INTO "+schema+".orders VALUES ('o-1', 1250)"); err != nil {
			return err
		}
		res, err := producer.EnqueueTx(ctx, tx,
			pgoutbox.Event{AggregateType: "order", AggregateID: "o-1", EventType: "order.placed",
				Payload: OrderPlaced{OrderID: "o-1", TotalCents: 1250}},
			pgoutbox.Event{AggregateType: "order", AggregateID: "o-1", EventType: "order.paid",
				Payload: map[string]string{"order_id": "o-1"}},
		)
		if err != nil {
			return err
		}
		for _, r := range res {
			fmt.Println("order/o-1 sequence", r.AggregateSequence)
		}
		return nil
	})
	if err != nil {
		log.Fatal(err)
	}
	// Output:
	// order/o-1 sequence 1
	// order/o-1 sequence 2
}

// The order row and its event go to PostgreSQL in one round trip: the event costs
// no round trip of its own. Sent outside a transaction, the batch is one implicit
// transaction; inside one, send it with tx.SendBatch.
func ExampleProducer_QueueTx() {
	ctx := context.Background()
	pool, schema, done := exampleSchema(ctx)
	defer done()

	producer, err := pgoutbox.NewProducer(&pgoutbox.Config{Schema: schema})
	if err != nil {
		log.Fatal(err)
	}
	b := &pgx.Batch{}
	b.Queue("INSERT INTO "+schema+".orders VALUES ($1, $2)", "o-2", 990)
	queued, err := producer.QueueTx(ctx, b, pgoutbox.Event{AggregateType: "order", AggregateID: "o-2",
		EventType: "order.placed", Payload: map[string]any{"order_id": "o-2", "total_cents": 990}})
	if err != nil {
		log.Fatal(err) // a *pgoutbox.ValidationError: nothing was queued
	}
	if err := pool.SendBatch(ctx, b).Close(); err != nil {
		log.Fatal(err) // neither the order nor its event was written
	}
	res, err := queued.Result()
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("order/o-2 sequence", res[0].AggregateSequence)
	// Output:
	// order/o-2 sequence 1
}

// database/sql works the same way, with any PostgreSQL driver.
func ExampleProducer_EnqueueSQLTx() {
	ctx := context.Background()
	pool, schema, done := exampleSchema(ctx)
	defer done()
	db := stdlib.OpenDBFromPool(pool) // a *sql.DB, as sql.Open("pgx", url) returns
	defer db.Close()

	producer, err := pgoutbox.NewProducer(&pgoutbox.Config{Schema: schema})
	if err != nil {
		log.Fatal(err)
	}
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		log.Fatal(err)
	}
	defer tx.Rollback()
	if _, err := tx.ExecContext(ctx, "INSERT INTO "+schema+".orders VALUES ('o-2', 990)"); err != nil {
		log.Fatal(err)
	}
	res, err := producer.EnqueueSQLTx(ctx, tx, pgoutbox.Event{
		AggregateType: "order", AggregateID: "o-2", EventType: "order.placed",
		Payload: []byte(`{"order_id":"o-2","total_cents":990}`), // raw JSON
	})
	if err != nil {
		log.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		log.Fatal(err)
	}
	fmt.Println("sequence", res[0].AggregateSequence, "id is v7:", res[0].EventID[6]>>4 == 7)
	// Output: sequence 1 id is v7: true
}

// Invalid events are refused before any SQL runs, so the transaction stays usable.
func ExampleValidationError() {
	producer, _ := pgoutbox.NewProducer(&pgoutbox.Config{MaxPayloadBytes: 64})
	err := producer.Validate(pgoutbox.Event{AggregateType: "order", EventType: "order.placed", Payload: 1})
	fmt.Println(err)
	// Output: pgoutbox: invalid event #0: AggregateID must not be empty
}
