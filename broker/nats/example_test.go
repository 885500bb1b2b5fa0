package nats_test

import (
	"context"
	"fmt"
	"log"

	natsgo "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/pgoutbox/pgoutbox/broker"
	"github.com/pgoutbox/pgoutbox/broker/brokertest"
	"github.com/pgoutbox/pgoutbox/broker/nats"
	"github.com/pgoutbox/pgoutbox/broker/nats/natsembed"
	"github.com/pgoutbox/pgoutbox/wire"
)

// Publish an event to an embedded NATS server, the zero-setup default, and read
// it back from the OUTBOX stream.
func Example() {
	ctx := context.Background()
	// The streams live in a temporary directory that Shutdown removes.
	srv, err := natsembed.New(&natsembed.Config{Port: natsembed.RandomPort})
	if err != nil {
		log.Fatal(err)
	}
	defer srv.Shutdown()

	pub, err := nats.Dial(ctx, srv.URL(), &nats.Config{})
	if err != nil {
		log.Fatal(err)
	}
	defer pub.Close()

	results := pub.Publish(ctx, []broker.Message{
		// An event as the relay reads it from the outbox: order 42, created.
		brokertest.Message("order", "42", 1),
	})
	fmt.Println("result:", results[0])

	nc, err := natsgo.Connect(srv.URL())
	if err != nil {
		log.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		log.Fatal(err)
	}
	stream, err := js.Stream(ctx, "OUTBOX")
	if err != nil {
		log.Fatal(err)
	}
	msg, err := stream.GetMsg(ctx, 1)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(msg.Subject, string(msg.Data), msg.Header.Get(wire.HeaderAggregateSequence))
	// Output:
	// result: <nil>
	// outbox.order.created {"total":"9.50"} 1
}
