package sqs_test

import (
	"context"
	"fmt"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awssqs "github.com/aws/aws-sdk-go-v2/service/sqs"

	"github.com/pgoutbox/pgoutbox"
	"github.com/pgoutbox/pgoutbox/broker"
	"github.com/pgoutbox/pgoutbox/broker/aws/sqs"
)

// Publish an event to an SQS FIFO queue. A relay's client comes from
// config.LoadDefaultConfig (the AWS default credential chain); this one talks
// to the test's emulator.
func Example() {
	ctx := context.Background()
	client := awssqs.NewFromConfig(awsConfig())
	queue := unique("example") + ".fifo"
	created, err := client.CreateQueue(ctx, &awssqs.CreateQueueInput{QueueName: aws.String(queue),
		Attributes: map[string]string{"FifoQueue": "true"}})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer client.DeleteQueue(ctx, &awssqs.DeleteQueueInput{QueueUrl: created.QueueUrl})

	pub, err := sqs.New(ctx, client, &sqs.Config{Destination: broker.MustParseTemplate(queue)})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer pub.Close()
	results := pub.Publish(ctx, []broker.Message{{
		EventID: pgoutbox.NewEventID(), AggregateType: "order", AggregateID: "42", AggregateSequence: 1,
		EventType: "order.created", SchemaVersion: 1, OccurredAt: time.Now(), Payload: []byte(`{"total":12}`),
	}})
	fmt.Println("published:", results[0])
	// Output: published: <nil>
}
