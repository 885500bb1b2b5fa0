package sqsinbox_test

import (
	"context"
	"log"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awssqs "github.com/aws/aws-sdk-go-v2/service/sqs"

	"github.com/pgoutbox/pgoutbox/broker"
	"github.com/pgoutbox/pgoutbox/broker/aws/sqs"
	"github.com/pgoutbox/pgoutbox/inbox/internal/exampletest"
	"github.com/pgoutbox/pgoutbox/inbox/sqsinbox"
)

// A consumer service: events the relay sent to an SQS FIFO queue (here its
// publisher stands in for it, on the fauxqs emulator the package's tests
// start) are applied to PostgreSQL once each, and deleted after the commit.
// A real service builds its client with config.LoadDefaultConfig (the AWS
// default credential chain); this one talks to the emulator
// (aws.Config.BaseEndpoint).
func Example() {
	ctx := context.Background()
	client := awssqs.NewFromConfig(emulator.Config())
	created, err := client.CreateQueue(ctx, &awssqs.CreateQueueInput{QueueName: aws.String(unique("shipping") + ".fifo"),
		Attributes: map[string]string{"FifoQueue": "true"}})
	if err != nil {
		log.Fatal(err)
	}
	defer client.DeleteQueue(ctx, &awssqs.DeleteQueueInput{QueueUrl: created.QueueUrl})
	queue := aws.ToString(created.QueueUrl)

	// The event, sent twice: the second time under another deduplication id,
	// as a relay's re-publish after SQS's five-minute window would be.
	pub, err := sqs.New(ctx, client, &sqs.Config{Destination: broker.MustParseTemplate(queue)})
	if err != nil {
		log.Fatal(err)
	}
	defer pub.Close()
	paid := exampletest.Paid()
	exampletest.Publish(ctx, pub, paid, exampletest.Republished(paid))

	// The consumer service: a Consumer "shipping" that records each paid
	// order once, on the queue every instance shares.
	shop := exampletest.NewShop(ctx, 2, nil)
	defer shop.Close()
	sub, err := sqsinbox.New(client, shop.Consumer, &sqsinbox.Config{Queue: queue, WaitTime: time.Second})
	if err != nil {
		log.Fatal(err)
	}
	if err := sub.Start(ctx); err != nil {
		log.Fatal(err)
	}
	// Finish waits for the two deliveries, then stops sub: Stop lets the
	// deliveries in progress commit and delete.
	shop.Finish(ctx, sub, func() int64 { return sub.Stats().Deleted })
	// Output:
	// applied
	// duplicate
	// acked 2; applied 1, duplicates 1; paid orders: 1
}
