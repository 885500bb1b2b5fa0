package pubsub_test

import (
	"context"
	"fmt"
	"log"

	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"cloud.google.com/go/pubsub/v2/pstest"

	"github.com/pgoutbox/pgoutbox/broker"
	"github.com/pgoutbox/pgoutbox/broker/brokertest"
	"github.com/pgoutbox/pgoutbox/broker/pubsub"
	"github.com/pgoutbox/pgoutbox/wire"
)

// Publish an event to a Pub/Sub topic (here on pstest, the client library's
// in-process fake, reached through the URL's endpoint; against Google Cloud,
// credentials come from Application Default Credentials) and read it back.
func Example() {
	ctx := context.Background()
	fake := pstest.NewServerWithAddress("127.0.0.1:0")
	defer fake.Close()

	pub, err := pubsub.Dial(ctx, "pubsub://my-project/outbox.{aggregate_type}?endpoint="+fake.Addr, &pubsub.Config{})
	if err != nil {
		log.Fatal(err)
	}
	defer pub.Close()
	if _, err := fake.GServer.CreateTopic(ctx, &pubsubpb.Topic{Name: "projects/my-project/topics/outbox.order"}); err != nil {
		log.Fatal(err)
	}

	results := pub.Publish(ctx, []broker.Message{brokertest.Message("order", "42", 1)})
	fmt.Println("result:", results[0])

	got := fake.Messages()[0]
	m, err := pubsub.ParseMessage(got.Data, got.Attributes)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(got.Topic, got.OrderingKey, string(m.Payload), got.Attributes[wire.HeaderAggregateSequence])
	// Output:
	// result: <nil>
	// projects/my-project/topics/outbox.order order/42 {"total":"9.50"} 1
}
