package kafkainbox_test

import (
	"testing"

	"github.com/pgoutbox/pgoutbox/broker"
	"github.com/pgoutbox/pgoutbox/inbox"
	"github.com/pgoutbox/pgoutbox/inbox/inboxtest"
	"github.com/pgoutbox/pgoutbox/inbox/kafkainbox"
)

// The subscriber conformance suite, on an in-process cluster (kfake) per case.
func TestConformance(t *testing.T) {
	t.Parallel()
	inboxtest.Run(t, inboxtest.Harness{
		New: func(t *testing.T) inboxtest.Target { return suiteTarget{newCluster(t, 3)} },
		Skip: map[string]string{
			"BrokerRestart": "kfake cannot close a client's connections or restart on the same addresses; " +
				"franz-go reconnects by itself, and partition loss is TestRevocationCommitsFinishedRecordsOnly's",
			"GapPolicies/Reject": "a partition is processed in order and retries in place: an event behind the " +
				"one it waits for in its own partition never arrives under GapReject (the relay publishes a lane in order)",
		},
	})
}

// suiteTarget is a fresh cluster for the suite.
type suiteTarget struct{ *kcluster }

func (s suiteTarget) Publish(t *testing.T, msgs ...broker.Message) { s.publish(t, msgs) }

func (s suiteTarget) PublishRaw(t *testing.T, body []byte) { s.produceRaw(t, "raw", string(body)) }

func (s suiteTarget) NewSubscriber(t *testing.T, proc inbox.Processor, k inboxtest.Knobs) inboxtest.Subscriber {
	t.Helper()
	return s.newSubscriber(t, proc, kafkainbox.Config{Concurrency: k.Concurrency})
}
