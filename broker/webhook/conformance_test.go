package webhook_test

import (
	"context"
	"net/http"
	"testing"

	"github.com/pgoutbox/pgoutbox/broker"
	"github.com/pgoutbox/pgoutbox/broker/brokertest"
	"github.com/pgoutbox/pgoutbox/broker/webhook"
)

func TestConformance(t *testing.T) {
	t.Parallel()
	brokertest.Run(t, brokertest.Harness{
		Open: openReceiver,
		// The receiver answers 400 to a body that is not JSON.
		Invalid: func(m *broker.Message) { m.Payload = []byte(`{"total":`) },
		// The receiver deduplicates on Idempotency-Key, which is the event id.
		Dedup: true,
	})
}

// openReceiver runs a receiver of the subtest's own. Stop drops its listener and
// every connection, as a crashed endpoint would; Start listens again on the same
// address with the same store.
func openReceiver(t *testing.T, opts brokertest.Options) *brokertest.Instance {
	rc := newReceiver()
	srv := serve(t, rc.handler())
	pub := newPublisher(t, webhook.Config{
		URL:        srv.URL() + "/hooks/{aggregate_type}",
		HTTPClient: &http.Client{Transport: transport(t, opts.WrapConn)},
	})
	return &brokertest.Instance{
		Publisher: pub,
		Read: func(context.Context) ([]brokertest.Stored, error) {
			return rc.messages(), nil
		},
		Stop: func(context.Context) error {
			srv.stop()
			return nil
		},
		Start: func(context.Context) error { return srv.start() },
	}
}
