package kinesis_test

import (
	"context"
	"fmt"
	"log"

	"github.com/aws/aws-sdk-go-v2/aws"
	awskinesis "github.com/aws/aws-sdk-go-v2/service/kinesis"

	"github.com/pgoutbox/pgoutbox/broker"
	"github.com/pgoutbox/pgoutbox/broker/brokertest"
	"github.com/pgoutbox/pgoutbox/broker/kinesis"
	"github.com/pgoutbox/pgoutbox/broker/kinesis/kinesistest"
	"github.com/pgoutbox/pgoutbox/wire"
)

// Publish an event to a Kinesis stream (here kinesalite, an emulator; the
// credentials come from the AWS default chain, the environment in this test)
// and read the record back.
func Example() {
	ctx := context.Background()
	srv, err := kinesistest.EnsureShared()
	if err != nil {
		log.Fatal(err)
	}
	stream := kinesistest.UniqueName("example")
	client := srv.Client()
	if _, err := client.CreateStream(ctx, &awskinesis.CreateStreamInput{StreamName: aws.String(stream), ShardCount: aws.Int32(1)}); err != nil {
		log.Fatal(err)
	}
	defer client.DeleteStream(ctx, &awskinesis.DeleteStreamInput{StreamName: aws.String(stream)})

	pub, err := kinesis.Dial(ctx, "kinesis://"+stream+"?region=us-east-1&endpoint="+srv.Endpoint, &kinesis.DialConfig{})
	if err != nil {
		log.Fatal(err)
	}
	defer pub.Close()
	results := pub.Publish(ctx, []broker.Message{brokertest.Message("order", "42", 1)})
	fmt.Println("result:", results[0])

	records, err := kinesistest.ReadAll(ctx, client, stream)
	if err != nil {
		log.Fatal(err)
	}
	headers, body, err := kinesis.ParseRecord(records[0].Data)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(records[0].PartitionKey, string(body), headers[wire.HeaderAggregateSequence])
	// Output:
	// result: <nil>
	// order/42 {"total":"9.50"} 1
}
