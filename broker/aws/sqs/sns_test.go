package sqs_test

import (
	"context"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	awssns "github.com/aws/aws-sdk-go-v2/service/sns"
	awssqs "github.com/aws/aws-sdk-go-v2/service/sqs"
	sqstypes "github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/pgoutbox/pgoutbox/broker"
	"github.com/pgoutbox/pgoutbox/broker/aws/sqs"
	"github.com/pgoutbox/pgoutbox/broker/brokertest"
)

// newTopic creates a topic of the test's own (FIFO unless standard), deleted
// at the end, and returns its ARN.
func newTopic(t *testing.T, standard bool) string {
	t.Helper()
	name, attrs := unique("t"), map[string]string{}
	if !standard {
		name += ".fifo"
		attrs["FifoTopic"] = "true"
	}
	c := snsClient()
	out, err := c.CreateTopic(t.Context(), &awssns.CreateTopicInput{Name: aws.String(name), Attributes: attrs})
	if err != nil {
		t.Fatalf("CreateTopic: %v", err)
	}
	arn := aws.ToString(out.TopicArn)
	t.Cleanup(func() {
		_, _ = c.DeleteTopic(context.Background(), &awssns.DeleteTopicInput{TopicArn: aws.String(arn)})
	})
	return arn
}

// subscribe delivers topic's messages raw (body and attributes as published)
// to a FIFO queue of the test's own, whose URL it returns.
func subscribe(t *testing.T, topic string) string {
	t.Helper()
	_, url := newQueue(t, false)
	a, err := sqsClient().GetQueueAttributes(t.Context(), &awssqs.GetQueueAttributesInput{QueueUrl: aws.String(url),
		AttributeNames: []sqstypes.QueueAttributeName{sqstypes.QueueAttributeNameQueueArn}})
	if err != nil {
		t.Fatalf("GetQueueAttributes: %v", err)
	}
	_, err = snsClient().Subscribe(t.Context(), &awssns.SubscribeInput{TopicArn: aws.String(topic), Protocol: aws.String("sqs"),
		Endpoint: aws.String(a.Attributes["QueueArn"]), Attributes: map[string]string{"RawMessageDelivery": "true"}})
	if err != nil {
		t.Fatalf("Subscribe: %v", err)
	}
	return url
}

func TestConformanceSNS(t *testing.T) {
	t.Parallel()
	brokertest.Run(t, brokertest.Harness{
		Open: func(t *testing.T, _ brokertest.Options) *brokertest.Instance {
			topic := newTopic(t, false)
			r := &reader{url: subscribe(t, topic)}
			pub, err := sqs.NewSNS(t.Context(), snsClient(), &sqs.Config{Destination: broker.MustParseTemplate(topic)})
			if err != nil {
				t.Fatalf("NewSNS: %v", err)
			}
			t.Cleanup(func() { _ = pub.Close() })
			return &brokertest.Instance{Publisher: pub, Read: r.read}
		},
		Invalid: func(m *broker.Message) { m.Payload = []byte("\"\x01\"") },
		Dedup:   true,
	})
}
