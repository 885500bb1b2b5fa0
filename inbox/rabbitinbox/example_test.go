package rabbitinbox_test

import (
	"context"
	"log"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/pgoutbox/pgoutbox/broker/rabbitmq"
	"github.com/pgoutbox/pgoutbox/inbox/internal/exampletest"
	"github.com/pgoutbox/pgoutbox/inbox/rabbitinbox"
)

// A consumer service: events the relay publishes to a RabbitMQ exchange (here a
// publisher stands in for it, on a server on localhost) are applied to PostgreSQL
// once each, and acked after the commit.
func Example() {
	ctx := context.Background()
	const url = "amqp://guest:guest@127.0.0.1:5672/"

	// The consumer service: a Consumer "shipping" that records each paid order
	// once (built as in the inbox package's example).
	shop := exampletest.NewShop(ctx, 2, nil)
	defer shop.Close()

	// The subscriber declares the exchange and a durable queue "shipping", shared
	// by every instance, bound to the order events. (The names are the example's
	// own, deleted at the end; in production: Exchange "outbox", the relay's
	// default, and Queue "shipping".)
	exchange, queue := uniqueName("pgoutbox-example"), uniqueName("shipping")
	defer deleteTopology(url, exchange, queue)
	sub, err := rabbitinbox.Dial(ctx, url, shop.Consumer, &rabbitinbox.Config{
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
	paid := exampletest.Paid()
	exampletest.Publish(ctx, pub, paid, paid)

	// Finish waits for the two deliveries, then stops sub: Stop lets the
	// deliveries in progress commit and ack.
	shop.Finish(ctx, sub, func() int64 { return sub.Stats().Acked })
	// Output:
	// applied
	// duplicate
	// acked 2; applied 1, duplicates 1; paid orders: 1
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
