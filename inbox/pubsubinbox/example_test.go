package pubsubinbox_test

import (
	"context"
	"log"

	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"cloud.google.com/go/pubsub/v2/pstest"

	pubsubbroker "github.com/pgoutbox/pgoutbox/broker/pubsub"
	"github.com/pgoutbox/pgoutbox/inbox/internal/exampletest"
	"github.com/pgoutbox/pgoutbox/inbox/pubsubinbox"
)

// A consumer service: events published to a topic (here by the relay's
// publisher, on pstest, the client library's in-process fake) are received
// through an ordered subscription and applied to PostgreSQL once each, acked
// after the commit.
func Example() {
	ctx := context.Background()

	// The broker: a topic and an ordered subscription "shipping" of it.
	fake := pstest.NewServerWithAddress("127.0.0.1:0")
	defer fake.Close()
	u, err := pubsubbroker.ParseURL("pubsub://my-project/outbox?endpoint=" + fake.Addr)
	if err != nil {
		log.Fatal(err)
	}
	client, err := u.NewClient(ctx)
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()
	if _, err := client.TopicAdminClient.CreateTopic(ctx, &pubsubpb.Topic{Name: "projects/my-project/topics/outbox"}); err != nil {
		log.Fatal(err)
	}
	if _, err := client.SubscriptionAdminClient.CreateSubscription(ctx, &pubsubpb.Subscription{
		Name: "projects/my-project/subscriptions/shipping", Topic: "projects/my-project/topics/outbox", EnableMessageOrdering: true,
	}); err != nil {
		log.Fatal(err)
	}

	// One event, published twice (a relay re-publish after a lost ack).
	pub, err := pubsubbroker.New(client, &pubsubbroker.Config{Topic: u.Topic})
	if err != nil {
		log.Fatal(err)
	}
	defer pub.Close()
	paid := exampletest.Paid()
	exampletest.Publish(ctx, pub, paid, paid)

	// The consumer service: a Consumer "shipping" that records each paid order
	// once (built as in the inbox package's example), on the subscription of
	// its name.
	shop := exampletest.NewShop(ctx, 2, nil)
	defer shop.Close()
	sub, err := pubsubinbox.New(client, shop.Consumer, nil)
	if err != nil {
		log.Fatal(err)
	}
	if err := sub.Start(ctx); err != nil {
		log.Fatal(err)
	}

	// Finish waits for the two deliveries, then stops sub: Stop lets the
	// deliveries in progress commit and ack.
	shop.Finish(ctx, sub, func() int64 { return sub.Stats().Acked })
	// Output:
	// applied
	// duplicate
	// acked 2; applied 1, duplicates 1; paid orders: 1
}
