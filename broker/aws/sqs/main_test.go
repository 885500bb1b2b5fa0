package sqs_test

import (
	"context"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	awssns "github.com/aws/aws-sdk-go-v2/service/sns"
	awssqs "github.com/aws/aws-sdk-go-v2/service/sqs"

	"github.com/pgoutbox/pgoutbox/broker/aws/fauxqs"
	"github.com/pgoutbox/pgoutbox/broker/aws/sqs"
	"github.com/pgoutbox/pgoutbox/broker/brokertest"
)

// emulator is the package's one fauxqs, started by TestMain.
var emulator *fauxqs.Server

func TestMain(m *testing.M) { fauxqs.Main(m, &emulator, nil) }

// awsConfig is a client configuration for the emulator.
func awsConfig() aws.Config { return emulator.Config() }

func sqsClient() *awssqs.Client { return awssqs.NewFromConfig(awsConfig()) }
func snsClient() *awssns.Client { return awssns.NewFromConfig(awsConfig()) }

func unique(prefix string) string { return fauxqs.Unique(prefix) }

// newQueue creates a queue of the test's own, FIFO unless standard, deleted
// at the end; it returns its name and URL.
func newQueue(t *testing.T, standard bool) (name, url string) {
	return emulator.Queue(t, "q", !standard)
}

// reader receives a queue's messages, deleting each, and keeps them all:
// brokertest's Read returns everything stored so far.
type reader struct {
	url  string
	kept []brokertest.Stored
}

func (r *reader) read(ctx context.Context) ([]brokertest.Stored, error) {
	got, err := fauxqs.Drain(ctx, sqsClient(), r.url)
	if err != nil {
		return nil, err
	}
	for _, m := range got {
		h, err := sqs.Headers(fauxqs.Attributes(m))
		if err != nil {
			return nil, err
		}
		r.kept = append(r.kept, brokertest.Stored{Destination: r.url, Key: m.Attributes["MessageGroupId"],
			Headers: h, Body: []byte(aws.ToString(m.Body))})
	}
	return r.kept, nil
}
