package pubsub_test

import (
	"context"
	"strings"
	"testing"

	"github.com/pgoutbox/pgoutbox/broker"
	"github.com/pgoutbox/pgoutbox/broker/brokertest"
	"github.com/pgoutbox/pgoutbox/broker/pubsub"
	"github.com/pgoutbox/pgoutbox/broker/pubsub/pubsubtest"
)

func TestConformance(t *testing.T) {
	t.Parallel()
	brokertest.Run(t, brokertest.Harness{
		// A fake per subtest, a topic on it, published to through Dial. pstest
		// keeps its data in memory only, so the instance has no Stop/Start and
		// the suite skips its broker-restart subtest.
		Open: func(t *testing.T, _ brokertest.Options) *brokertest.Instance {
			srv := pubsubtest.Start(t)
			topic := srv.CreateTopic(t, "outbox")
			return &brokertest.Instance{
				Publisher: dial(t, srv.URL(topic), pubsub.Config{}),
				Read: func(context.Context) ([]brokertest.Stored, error) {
					return srv.Read(topic), nil // acknowledged means stored: nothing to wait for
				},
			}
		},
		// An attribute value above Pub/Sub's 1024 bytes.
		Invalid: func(m *broker.Message) {
			m.Headers = map[string]string{"Big": strings.Repeat("x", pubsub.MaxAttributeValueBytes+1)}
		},
		Dedup: false, // Pub/Sub has none for publishing: the inbox drops duplicates
	})
}

// dial returns a publisher of rawURL, closed when t ends.
func dial(t *testing.T, rawURL string, cfg pubsub.Config) *pubsub.Publisher {
	t.Helper()
	pub, err := pubsub.Dial(t.Context(), rawURL, &cfg)
	if err != nil {
		t.Fatalf("Dial: %v", err)
	}
	t.Cleanup(func() { _ = pub.Close() })
	return pub
}
