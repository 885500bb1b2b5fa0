package rabbitmq_test

import (
	"context"
	"fmt"
	"log"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/pgoutbox/pgoutbox"
	"github.com/pgoutbox/pgoutbox/broker"
	"github.com/pgoutbox/pgoutbox/broker/brokertest"
	"github.com/pgoutbox/pgoutbox/broker/rabbitmq"
	"github.com/pgoutbox/pgoutbox/wire"
)

// Publish an event to a RabbitMQ server on localhost and read it back from a
// queue bound to the exchange.
func Example() {
	ctx := context.Background()
	const url = "amqp://guest:guest@127.0.0.1:5672/"

	// The consumer's side, set up first so that the event has somewhere to go.
	// The exchange and the queue are the example's own, and the server deletes
	// both when this connection closes. A relay would use the default exchange,
	// "outbox", declared by Dial if missing.
	conn, err := amqp.Dial(url)
	if err != nil {
		log.Fatal(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		log.Fatal(err)
	}
	exchange := "pgoutbox-example-" + pgoutbox.NewEventID().String()
	if err := ch.ExchangeDeclare(exchange, amqp.ExchangeTopic, false, true, false, false, nil); err != nil {
		log.Fatal(err)
	}
	q, err := ch.QueueDeclare("", false, true, true, false, nil)
	if err != nil {
		log.Fatal(err)
	}
	if err := ch.QueueBind(q.Name, "order.*", exchange, false, nil); err != nil {
		log.Fatal(err)
	}

	pub, err := rabbitmq.Dial(ctx, url, &rabbitmq.Config{Exchange: exchange})
	if err != nil {
		log.Fatal(err)
	}
	defer pub.Close()

	results := pub.Publish(ctx, []broker.Message{
		// An event as the relay reads it from the outbox: order 42, created.
		brokertest.Message("order", "42", 1),
	})
	fmt.Println("result:", results[0])

	d, ok, err := ch.Get(q.Name, true)
	if err != nil || !ok {
		log.Fatal("nothing in the queue: ", err)
	}
	fmt.Println(d.RoutingKey, string(d.Body), d.Headers[wire.HeaderAggregateSequence], d.ContentType)
	// Output:
	// result: <nil>
	// order.created {"total":"9.50"} 1 application/json
}
