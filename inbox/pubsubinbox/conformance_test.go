package pubsubinbox_test

import (
	"context"
	"log/slog"
	"testing"

	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"go.uber.org/goleak"

	"github.com/pgoutbox/pgoutbox/broker"
	pubsubbroker "github.com/pgoutbox/pgoutbox/broker/pubsub"
	"github.com/pgoutbox/pgoutbox/broker/pubsub/pubsubtest"
	"github.com/pgoutbox/pgoutbox/inbox"
	"github.com/pgoutbox/pgoutbox/inbox/inboxtest"
	"github.com/pgoutbox/pgoutbox/inbox/pubsubinbox"
	"github.com/pgoutbox/pgoutbox/internal/pgtest"
)

// Two goroutines of the Pub/Sub client outlive what started them: OpenCensus's
// stats worker, started in an init function, runs for the life of the
// process; a stopped Receive's stream keep-alive handler returns at its next
// tick.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.IgnoreTopFunction("go.opencensus.io/stats/view.(*worker).start"),
		goleak.IgnoreTopFunction("cloud.google.com/go/pubsub/v2.(*messageIterator).streamKeepAliveHandler"))
}

var quiet = slog.New(slog.DiscardHandler)

// The subscriber conformance suite, each case on a pstest fake of its own
// (in memory: the server cannot close its connections, so BrokerRestart is
// skipped).
func TestConformance(t *testing.T) {
	t.Parallel()
	inboxtest.Run(t, inboxtest.Harness{
		New: func(t *testing.T) inboxtest.Target { return newTarget(t) },
		Skip: map[string]string{
			"GapPolicies/Reject": "an ordered subscription delivers an aggregate's messages in publish order, the next only " +
				"after the previous is acknowledged: a message published ahead of its predecessor is redelivered before it " +
				"forever (the relay never publishes so; see the package doc)",
		},
	})
}

// target is a topic and an ordered subscription of it on a fake of its own.
type target struct {
	srv          *pubsubtest.Server
	topic, subID string
}

func newTarget(t *testing.T) *target {
	t.Helper()
	srv := pubsubtest.Start(t)
	tg := &target{srv: srv, topic: srv.CreateTopic(t, "outbox"), subID: pubsubtest.UniqueName("inbox")}
	_, err := srv.Client.SubscriptionAdminClient.CreateSubscription(context.Background(), &pubsubpb.Subscription{
		Name:  "projects/" + pubsubtest.Project + "/subscriptions/" + tg.subID,
		Topic: pubsubtest.TopicName(tg.topic), EnableMessageOrdering: true, AckDeadlineSeconds: 10,
	})
	pgtest.Must(t, err, "create subscription")
	t.Cleanup(func() {
		if t.Failed() {
			for _, m := range srv.Messages() {
				t.Logf("fake: message %s: deliveries %d acks %d modacks %v", m.ID, m.Deliveries, m.Acks, m.Modacks)
			}
		}
	})
	return tg
}

// Publish stores msgs as the relay's publisher writes them: the wire
// headers as attributes, the aggregate as the ordering key.
func (tg *target) Publish(t *testing.T, msgs ...broker.Message) {
	for i := range msgs {
		m := &msgs[i]
		tg.srv.PublishOrdered(pubsubtest.TopicName(tg.topic), m.Payload, m.WireHeaders(), pubsubbroker.OrderingKey(m))
	}
}

func (tg *target) PublishRaw(t *testing.T, body []byte) {
	tg.srv.Publish(pubsubtest.TopicName(tg.topic), body, nil)
}

func (tg *target) NewSubscriber(t *testing.T, proc inbox.Processor, k inboxtest.Knobs) inboxtest.Subscriber {
	t.Helper()
	sub, err := pubsubinbox.New(tg.srv.Client, proc, &pubsubinbox.Config{Subscription: tg.subID, Concurrency: k.Concurrency, Logger: quiet})
	pgtest.Must(t, err, "pubsubinbox.New")
	return sub
}
