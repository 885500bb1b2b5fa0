package sqs_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	awssns "github.com/aws/aws-sdk-go-v2/service/sns"
	awssqs "github.com/aws/aws-sdk-go-v2/service/sqs"
	sqstypes "github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/pgoutbox/pgoutbox/broker/aws/fauxqs"
	"github.com/pgoutbox/pgoutbox/broker/aws/sqs"
	"github.com/pgoutbox/pgoutbox/broker/brokertest"
)

// emulator is the package's one fauxqs, started by TestMain.
var emulator *fauxqs.Server

func TestMain(m *testing.M) {
	s, err := fauxqs.Start()
	if err != nil {
		fmt.Fprintln(os.Stderr, err) // fail, never skip: the message has the install command
		os.Exit(1)
	}
	emulator = s
	code := m.Run()
	s.Close()
	os.Exit(code)
}

// awsConfig is a client configuration for the emulator (it accepts any key).
func awsConfig() aws.Config {
	return aws.Config{Region: fauxqs.Region, BaseEndpoint: aws.String(emulator.Endpoint),
		Credentials: credentials.NewStaticCredentialsProvider("test", "test", "")}
}

func sqsClient() *awssqs.Client { return awssqs.NewFromConfig(awsConfig()) }
func snsClient() *awssns.Client { return awssns.NewFromConfig(awsConfig()) }

func unique(prefix string) string {
	var r [5]byte
	_, _ = rand.Read(r[:])
	return prefix + "-" + hex.EncodeToString(r[:])
}

// newQueue creates a queue of the test's own, FIFO unless standard, deleted
// at the end; it returns its name and URL.
func newQueue(t *testing.T, standard bool) (name, url string) {
	t.Helper()
	name, attrs := unique("q"), map[string]string{}
	if !standard {
		name += ".fifo"
		attrs[string(sqstypes.QueueAttributeNameFifoQueue)] = "true"
	}
	c := sqsClient()
	out, err := c.CreateQueue(t.Context(), &awssqs.CreateQueueInput{QueueName: aws.String(name), Attributes: attrs})
	if err != nil {
		t.Fatalf("CreateQueue: %v", err)
	}
	url = aws.ToString(out.QueueUrl)
	t.Cleanup(func() {
		_, _ = c.DeleteQueue(context.Background(), &awssqs.DeleteQueueInput{QueueUrl: aws.String(url)})
	})
	return name, url
}

// reader receives a queue's messages, deleting each, and keeps them all:
// brokertest's Read returns everything stored so far.
type reader struct {
	url  string
	kept []brokertest.Stored
}

func (r *reader) read(ctx context.Context) ([]brokertest.Stored, error) {
	c := sqsClient()
	for {
		out, err := c.ReceiveMessage(ctx, &awssqs.ReceiveMessageInput{QueueUrl: aws.String(r.url), MaxNumberOfMessages: 10,
			MessageAttributeNames: []string{"All"}, VisibilityTimeout: 60,
			MessageSystemAttributeNames: []sqstypes.MessageSystemAttributeName{sqstypes.MessageSystemAttributeNameMessageGroupId}})
		if err != nil {
			return nil, err
		}
		if len(out.Messages) == 0 {
			// A FIFO queue may answer nothing while messages remain (a group
			// held by a receive): done only once it counts none.
			a, err := c.GetQueueAttributes(ctx, &awssqs.GetQueueAttributesInput{QueueUrl: aws.String(r.url),
				AttributeNames: []sqstypes.QueueAttributeName{sqstypes.QueueAttributeNameAll}})
			if err != nil {
				return nil, err
			}
			if a.Attributes["ApproximateNumberOfMessages"] == "0" && a.Attributes["ApproximateNumberOfMessagesNotVisible"] == "0" {
				return r.kept, nil
			}
			continue
		}
		for _, m := range out.Messages {
			attrs := map[string]string{}
			for k, v := range m.MessageAttributes {
				attrs[k] = aws.ToString(v.StringValue)
			}
			h, err := sqs.Headers(attrs)
			if err != nil {
				return nil, err
			}
			r.kept = append(r.kept, brokertest.Stored{Destination: r.url, Key: m.Attributes["MessageGroupId"],
				Headers: h, Body: []byte(aws.ToString(m.Body))})
			if _, err := c.DeleteMessage(ctx, &awssqs.DeleteMessageInput{QueueUrl: aws.String(r.url), ReceiptHandle: m.ReceiptHandle}); err != nil {
				return nil, err
			}
		}
	}
}
