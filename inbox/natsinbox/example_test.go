package natsinbox_test

import (
	"context"
	"fmt"
	"log"
	"os"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	natsgo "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/pgoutbox/pgoutbox"
	"github.com/pgoutbox/pgoutbox/broker"
	natsbroker "github.com/pgoutbox/pgoutbox/broker/nats"
	"github.com/pgoutbox/pgoutbox/broker/nats/natsembed"
	"github.com/pgoutbox/pgoutbox/inbox"
	"github.com/pgoutbox/pgoutbox/inbox/natsinbox"
	"github.com/pgoutbox/pgoutbox/internal/pgtest"
	"github.com/pgoutbox/pgoutbox/migrate"
)

// A consumer service: events published to the OUTBOX stream (here by a publisher
// standing in for the relay, on an embedded server) are applied to PostgreSQL once
// each, and acked after the commit.
func Example() {
	ctx := context.Background()

	// The broker, with one event on it, published twice (a relay re-publish).
	dir, err := os.MkdirTemp("", "natsinbox-example")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	srv, err := natsembed.New(&natsembed.Config{StoreDir: dir, Port: -1})
	if err != nil {
		log.Fatal(err)
	}
	defer srv.Shutdown()
	pub, err := natsbroker.Dial(ctx, srv.URL(), &natsbroker.Config{})
	if err != nil {
		log.Fatal(err)
	}
	defer pub.Close()
	paid := broker.Message{EventID: pgoutbox.NewEventID(), AggregateType: "order", AggregateID: "42",
		AggregateSequence: 1, EventType: "paid", SchemaVersion: 1, OccurredAt: time.Now(),
		Payload: []byte(`{"cents":1250}`)}
	if err := pub.Publish(ctx, []broker.Message{paid})[0]; err != nil {
		log.Fatal(err)
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

	nc, err := natsgo.Connect(srv.URL())
	if err != nil {
		log.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		log.Fatal(err)
	}
	// Durable consumer "shipping" on stream OUTBOX, shared by every instance.
	sub, err := natsinbox.New(js, consumer, &natsinbox.Config{Stream: "OUTBOX"})
	if err != nil {
		log.Fatal(err)
	}
	if err := sub.Start(ctx); err != nil {
		log.Fatal(err)
	}
	// Deliver the same event again under another message id, as after a crash.
	again := &natsgo.Msg{Subject: "outbox.order.paid", Data: paid.Payload, Header: natsgo.Header{}}
	for k, v := range paid.WireHeaders() {
		again.Header.Set(k, v)
	}
	if _, err := js.PublishMsg(ctx, again, jetstream.WithMsgID(paid.EventID.String()+"-again")); err != nil {
		log.Fatal(err)
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
