package sqs_test

import (
	"testing"

	"github.com/pgoutbox/pgoutbox/broker"
	"github.com/pgoutbox/pgoutbox/broker/aws/sqs"
	"github.com/pgoutbox/pgoutbox/broker/brokertest"
)

func TestConformance(t *testing.T) {
	t.Parallel()
	brokertest.Run(t, brokertest.Harness{
		Open: func(t *testing.T, _ brokertest.Options) *brokertest.Instance {
			_, url := newQueue(t, false)
			pub, err := sqs.New(t.Context(), sqsClient(), &sqs.Config{Destination: broker.MustParseTemplate(url)})
			if err != nil {
				t.Fatalf("New: %v", err)
			}
			t.Cleanup(func() { _ = pub.Close() })
			r := &reader{url: url}
			// The emulator loses its data when stopped: no Stop/Start.
			return &brokertest.Instance{Publisher: pub, Read: r.read}
		},
		// SQS refuses a body with control characters.
		Invalid: func(m *broker.Message) { m.Payload = []byte("\"\x01\"") },
		Dedup:   true,
	})
}
