package kafkainbox_test

import (
	"context"
	"fmt"
	"log"
	"log/slog"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/pgoutbox/pgoutbox"
	"github.com/pgoutbox/pgoutbox/broker"
	"github.com/pgoutbox/pgoutbox/broker/kafka"
	"github.com/pgoutbox/pgoutbox/inbox"
	"github.com/pgoutbox/pgoutbox/inbox/kafkainbox"
	"github.com/pgoutbox/pgoutbox/internal/pgtest"
	"github.com/pgoutbox/pgoutbox/migrate"
)

// A consumer service: events the relay published to the topic outbox.order (here
// a publisher stands in for it, on franz-go's in-process kfake cluster) are applied
// to PostgreSQL once each, and their offsets committed after the commit.
func Example() {
	ctx := context.Background()
	quiet := slog.New(slog.DiscardHandler) // the default is slog.Default()

	// The broker, with one event on it, published twice (a relay re-publish).
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(4, "outbox.order"))
	if err != nil {
		log.Fatal(err)
	}
	defer cluster.Close()
	pub, err := kafka.Dial(ctx, "kafka://"+strings.Join(cluster.ListenAddrs(), ","), &kafka.Config{Logger: quiet})
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
	// when both records are processed.
	outcomes := make(observer, 2)
	type Paid struct {
		Cents int `json:"cents"`
	}
	consumer, err := inbox.New(inbox.Pgx(pool), inbox.HandleJSON(func(ctx context.Context, tx pgx.Tx, ev inbox.Event, p Paid) error {
		_, err := tx.Exec(ctx, "INSERT INTO "+schema+".paid_orders VALUES ($1, $2)", ev.AggregateID, p.Cents)
		return err
	}), &inbox.Config{Name: "shipping", Schema: schema, Observer: outcomes, Logger: quiet})
	if err != nil {
		log.Fatal(err)
	}

	// Group "shipping" (the consumer's name), shared by every instance.
	sub, err := kafkainbox.Dial(cluster.ListenAddrs(), "", []string{"outbox.order"}, consumer,
		&kafkainbox.Config{Logger: quiet})
	if err != nil {
		log.Fatal(err)
	}
	if err := sub.Start(ctx); err != nil {
		log.Fatal(err)
	}
	for range 2 {
		select {
		case o := <-outcomes:
			fmt.Println(o.Status)
		case <-time.After(30 * time.Second):
			log.Fatal("no record within 30s")
		}
	}
	// Stop lets the records in progress commit, commits their offsets and
	// leaves the group.
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
