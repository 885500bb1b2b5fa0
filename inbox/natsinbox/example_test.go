package natsinbox_test

import (
	"context"
	"log"

	natsgo "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	natsbroker "github.com/pgoutbox/pgoutbox/broker/nats"
	"github.com/pgoutbox/pgoutbox/broker/nats/natsembed"
	"github.com/pgoutbox/pgoutbox/inbox/internal/exampletest"
	"github.com/pgoutbox/pgoutbox/inbox/natsinbox"
)

// A consumer service: events published to the OUTBOX stream (here by a publisher
// standing in for the relay, on an embedded server) are applied to PostgreSQL once
// each, and acked after the commit.
func Example() {
	ctx := context.Background()

	// The broker, with one event on it, published twice (a relay re-publish).
	// The streams live in a temporary directory that Shutdown removes.
	srv, err := natsembed.New(&natsembed.Config{Port: natsembed.RandomPort})
	if err != nil {
		log.Fatal(err)
	}
	defer srv.Shutdown()
	pub, err := natsbroker.Dial(ctx, srv.URL(), &natsbroker.Config{})
	if err != nil {
		log.Fatal(err)
	}
	defer pub.Close()
	paid := exampletest.Paid()
	exampletest.Publish(ctx, pub, paid)

	// The consumer service: a Consumer "shipping" that records each paid order
	// once (built as in the inbox package's example).
	shop := exampletest.NewShop(ctx, 2, nil)
	defer shop.Close()

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
	sub, err := natsinbox.New(js, shop.Consumer, &natsinbox.Config{Stream: "OUTBOX"})
	if err != nil {
		log.Fatal(err)
	}
	if err := sub.Start(ctx); err != nil {
		log.Fatal(err)
	}
	// Deliver the same event again under another message id (Nats-Msg-Id), as
	// a relay's re-publish after the stream's duplicate window would be.
	exampletest.Publish(ctx, pub, exampletest.Republished(paid))

	// Finish waits for the two deliveries, then stops sub: Stop lets the
	// deliveries in progress commit and ack.
	shop.Finish(ctx, sub, func() int64 { return sub.Stats().Acked })
	// Output:
	// applied
	// duplicate
	// acked 2; applied 1, duplicates 1; paid orders: 1
}
