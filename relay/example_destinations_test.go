package relay_test

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/pgoutbox/pgoutbox"
	"github.com/pgoutbox/pgoutbox/broker/brokertest"
	"github.com/pgoutbox/pgoutbox/migrate"
	"github.com/pgoutbox/pgoutbox/relay"
)

// A relay with destinations: every order event goes to "orders", the paid
// ones to "billing" too; New takes no publisher, each destination has its
// own. An event no rule takes would be a dead letter.
func ExampleConfig_destinations() {
	ctx := context.Background()
	pool, drop := exampleDatabase(ctx) // real code has its pool
	defer drop()
	if _, err := migrate.Up(ctx, pool, &migrate.Config{Lines: []migrate.Line{migrate.LineOutbox}}); err != nil {
		log.Fatal(err)
	}
	p, _ := pgoutbox.NewProducer(nil)
	if _, err := p.EnqueueTx(ctx, pool,
		pgoutbox.Event{AggregateType: "order", AggregateID: "1", EventType: "order.placed", Payload: 100},
		pgoutbox.Event{AggregateType: "order", AggregateID: "1", EventType: "order.paid", Payload: 100},
	); err != nil {
		log.Fatal(err)
	}

	orders, billing := &brokertest.Recorder{}, &brokertest.Recorder{} // real code: Kafka, NATS, a webhook...
	r, err := relay.New(pool, nil, &relay.Config{PollInterval: 50 * time.Millisecond, Destinations: []relay.Destination{
		{Name: "orders", Publisher: orders, Start: relay.StartBackfill,
			Rules: []relay.Rule{{AggregateTypes: []string{"order"}}}},
		{Name: "billing", Publisher: billing, Start: relay.StartBackfill,
			Rules: []relay.Rule{{EventTypes: []string{"order.paid"}}}},
	}})
	if err != nil {
		log.Fatal(err)
	}
	if err := r.Start(ctx); err != nil {
		log.Fatal(err)
	}
	for deadline := time.Now().Add(30 * time.Second); len(billing.Messages()) < 1 || len(orders.Messages()) < 2; {
		if time.Now().After(deadline) {
			log.Fatal("not delivered")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err := r.Stop(ctx); err != nil {
		log.Fatal(err)
	}
	for _, m := range orders.Messages() {
		fmt.Println("orders:", m.EventType)
	}
	for _, m := range billing.Messages() {
		fmt.Println("billing:", m.EventType)
	}
	// Output:
	// orders: order.placed
	// orders: order.paid
	// billing: order.paid
}
