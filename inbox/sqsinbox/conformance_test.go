package sqsinbox_test

import (
	"context"
	"fmt"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awssqs "github.com/aws/aws-sdk-go-v2/service/sqs"
	"go.uber.org/goleak"

	"github.com/pgoutbox/pgoutbox/broker"
	"github.com/pgoutbox/pgoutbox/broker/aws/fauxqs"
	"github.com/pgoutbox/pgoutbox/broker/aws/sqs"
	"github.com/pgoutbox/pgoutbox/inbox"
	"github.com/pgoutbox/pgoutbox/inbox/inboxtest"
	"github.com/pgoutbox/pgoutbox/inbox/sqsinbox"
	"github.com/pgoutbox/pgoutbox/internal/pgtest"
)

// emulator is the package's one fauxqs, started by TestMain; each test has
// queues of its own on it.
var emulator *fauxqs.Server

func TestMain(m *testing.M) { fauxqs.Main(m, &emulator, func() error { return goleak.Find() }) }

var quiet = slog.New(slog.DiscardHandler)

func sqsClient() *awssqs.Client { return awssqs.NewFromConfig(emulator.Config()) }

func unique(prefix string) string { return fauxqs.Unique(prefix) }

// newQueue creates a queue of the test's own, FIFO unless standard, deleted
// at the end; it returns its URL.
func newQueue(t *testing.T, standard bool) string {
	_, url := emulator.Queue(t, "inbox", !standard)
	return url
}

// testConfig is the subscribers' configuration in tests: a short long poll,
// so that a stop does not wait long for the receive in progress.
func testConfig(url string, concurrency int) *sqsinbox.Config {
	return &sqsinbox.Config{Queue: url, Concurrency: concurrency, WaitTime: time.Second,
		VisibilityTimeout: 10 * time.Second, Logger: quiet}
}

// The subscriber conformance suite against fauxqs.
func TestConformance(t *testing.T) {
	t.Parallel()
	inboxtest.Run(t, inboxtest.Harness{
		New: func(t *testing.T) inboxtest.Target { return newTarget(t) },
		Skip: map[string]string{
			"GapPolicies/Reject": "a FIFO queue delivers a group's messages in the order stored and, a message handed back, " +
				"delivers the group again from it: a message stored ahead of its predecessor comes back before it forever " +
				"(the relay never stores so; see the package doc)",
			"BrokerRestart": "SQS is HTTP, a request per call: there is no session for the server to close, and the " +
				"emulator keeps its queues in memory only, so it cannot restart",
		},
	})
}

// target is a FIFO queue of its own, fed by the relay's publisher.
type target struct {
	url    string
	pub    *sqs.Publisher
	copies atomic.Int64
}

func newTarget(t *testing.T) *target {
	t.Helper()
	tg := &target{url: newQueue(t, false)}
	pub, err := sqs.New(t.Context(), sqsClient(), &sqs.Config{Destination: broker.MustParseTemplate(tg.url), Logger: quiet})
	pgtest.Must(t, err, "sqs.New")
	t.Cleanup(func() { _ = pub.Close() })
	tg.pub = pub
	return tg
}

// Publish sends msgs in order; each publish is a copy of its own (a dedup id
// of its own), as a relay's re-publish after SQS's five-minute window is.
func (tg *target) Publish(t *testing.T, msgs ...broker.Message) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	// One at a time: a batch holds one event per lane, and the copies of
	// one event share a lane.
	for i, m := range msgs {
		m.DedupID = fmt.Sprintf("%s-%d", m.EventID, tg.copies.Add(1))
		pgtest.Must(t, tg.pub.Publish(ctx, []broker.Message{m})[0], "publish %d", i)
	}
}

func (tg *target) PublishRaw(t *testing.T, body []byte) {
	_, err := sqsClient().SendMessage(t.Context(), &awssqs.SendMessageInput{QueueUrl: aws.String(tg.url),
		MessageBody: aws.String(string(body)), MessageGroupId: aws.String("raw"), MessageDeduplicationId: aws.String(unique("raw"))})
	pgtest.Must(t, err, "SendMessage")
}

func (tg *target) NewSubscriber(t *testing.T, proc inbox.Processor, k inboxtest.Knobs) inboxtest.Subscriber {
	t.Helper()
	sub, err := sqsinbox.New(sqsClient(), proc, testConfig(tg.url, k.Concurrency))
	pgtest.Must(t, err, "sqsinbox.New")
	return sub
}
