package rabbitinbox_test

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/pgoutbox/pgoutbox"
	"github.com/pgoutbox/pgoutbox/broker"
	"github.com/pgoutbox/pgoutbox/broker/rabbitmq"
	"github.com/pgoutbox/pgoutbox/inbox"
	"github.com/pgoutbox/pgoutbox/inbox/rabbitinbox"
	"github.com/pgoutbox/pgoutbox/internal/pgtest"
	"github.com/pgoutbox/pgoutbox/migrate"
)

// A consumer service: events the relay publishes to a RabbitMQ exchange (here a
// publisher stands in for it, on a server on localhost) are applied to PostgreSQL
// once each, and acked after the commit.
func Example() {
	ctx := context.Background()
	const url = "amqp://guest:guest@127.0.0.1:5672/"

	// The consumer's database (a schema of its own here).
	pool, err := pgxpool.New(ctx, pgtest.URL())
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	schema := pgtest.Name("example")
	defer pool.Exec(ctx, "DROP SCHEMA "+schema+" CASCADE")
	if _, err := migrate.Up(ctx, pool, &migrate.Config{Schema: schema, Lines: []migrate.Line{migrate.LineInbox}}); err != nil {
		log.Fatal(err)
	}
	if _, err := pool.Exec(ctx, "CREATE TABLE "+schema+".paid_orders (id text PRIMARY KEY, cents int)"); err != nil {
		log.Fatal(err)
	}

	// An Observer sees every outcome (metrics use it); here it tells the example
	// when both deliveries are processed.
	outcomes := make(observer, 2)
	type Paid struct {
		Cents int `json:"cents"`
	}
	consumer, err := inbox.New(inbox.Pgx(pool), inbox.HandleJSON(func(ctx context.Context, tx pgx.Tx, ev inbox.Event, p Paid) error {
		_, err := tx.Exec(ctx, "INSERT INTO "+schema+".paid_orders VALUES ($1, $2)", ev.AggregateID, p.Cents)
		return err
	}), &inbox.Config{Name: "shipping", Schema: schema, Observer: outcomes})
	if err != nil {
		log.Fatal(err)
	}

	// The subscriber declares the exchange and a durable queue "shipping", shared
	// by every instance, bound to the order events. (The names are the example's
	// own, deleted at the end; in production: Exchange "outbox", the relay's
	// default, and Queue "shipping".)
	exchange, queue := uniqueName("pgoutbox-example"), uniqueName("shipping")
	defer deleteTopology(url, exchange, queue)
	sub, err := rabbitinbox.Dial(ctx, url, consumer, &rabbitinbox.Config{
		Queue: queue, Exchange: exchange, BindingKeys: []string{"order.*"},
	})
	if err != nil {
		log.Fatal(err)
	}
	if err := sub.Start(ctx); err != nil {
		log.Fatal(err)
	}

	// One event, published twice (a relay re-publish after a crash).
	pub, err := rabbitmq.Dial(ctx, url, &rabbitmq.Config{Exchange: exchange})
	if err != nil {
		log.Fatal(err)
	}
	defer pub.Close()
	paid := broker.Message{EventID: pgoutbox.NewEventID(), AggregateType: "order", AggregateID: "42",
		AggregateSequence: 1, EventType: "paid", SchemaVersion: 1, OccurredAt: time.Now(),
		Payload: []byte(`{"cents":1250}`)}
	for range 2 {
		if err := pub.Publish(ctx, []broker.Message{paid})[0]; err != nil {
			log.Fatal(err)
		}
	}

	for range 2 {
		select {
		case o := <-outcomes:
			fmt.Println(o.Status)
		case <-time.After(30 * time.Second):
			log.Fatal("no delivery within 30s")
		}
	}
	// Stop lets the deliveries in progress commit and ack.
	stopCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := sub.Stop(stopCtx); err != nil {
		log.Fatal(err)
	}
	var n int
	if err := pool.QueryRow(ctx, "SELECT count(*) FROM "+schema+".paid_orders").Scan(&n); err != nil {
		log.Fatal(err)
	}
	s := consumer.Stats()
	fmt.Printf("acked %d; applied %d, duplicates %d; paid orders: %d\n", sub.Stats().Acked, s.Applied, s.Duplicates, n)
	// Output:
	// applied
	// duplicate
	// acked 2; applied 1, duplicates 1; paid orders: 1
}

// observer passes outcomes on; it never blocks (Observe must not).
type observer chan inbox.Outcome

func (o observer) Observe(out inbox.Outcome) {
	select {
	case o <- out:
	default:
	}
}

// deleteTopology removes the example's exchange and queue from the server.
func deleteTopology(url, exchange, queue string) {
	conn, err := amqp.Dial(url)
	if err != nil {
		log.Fatal(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		log.Fatal(err)
	}
	if _, err := ch.QueueDelete(queue, false, false, false); err != nil {
		log.Fatal(err)
	}
	if err := ch.ExchangeDelete(exchange, false, false); err != nil {
		log.Fatal(err)
	}
}
