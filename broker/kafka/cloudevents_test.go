package kafka_test

import (
	"bytes"
	"testing"

	"github.com/pgoutbox/pgoutbox/broker"
	"github.com/pgoutbox/pgoutbox/broker/brokertest"
	"github.com/pgoutbox/pgoutbox/broker/kafka"
	"github.com/pgoutbox/pgoutbox/wire"
)

// TestCloudEventsFormat publishes in the CloudEvents format and checks that the
// record carries the Kafka binding's headers as the codec makes them (ce_*
// headers, content-type) and the payload as its value; internal/cetest (a module of its own) has the CloudEvents Go SDK decode those headers.
func TestCloudEventsFormat(t *testing.T) {
	t.Parallel()
	c := newCluster(t, false)
	enc := wire.Encoding{Format: wire.FormatCloudEvents, CloudEventsSource: "/pgoutbox/app"}
	p := c.dial(kafka.Config{Encoding: enc})

	spoofed := message("order", "order-spoof", 1)
	spoofed.Headers["CE_id"] = "spoofed"
	if err := publish(t, p, spoofed)[0]; !broker.IsPermanent(err) {
		t.Fatalf("a producer header CE_id: %v, want a permanent refusal", err)
	}
	m := message("order", "order-42", 3)
	m.SchemaVersion = 2
	m.Headers["Tenant"] = "acme"
	if err := publish(t, p, m)[0]; err != nil {
		t.Fatalf("Publish: %v", err)
	}
	recs := read(t, c)
	if len(recs) != 1 {
		t.Fatalf("stored %d records, want 1", len(recs))
	}
	r := recs[0]
	h := map[string]string{}
	for _, rh := range r.Headers {
		h[rh.Key] = string(rh.Value)
	}
	brokertest.CheckCloudEventsHeaders(t, h, enc, &m, wire.CloudEventsKafka)
	if !bytes.Equal(r.Value, m.Payload) {
		t.Errorf("record value %q, want the payload %q", r.Value, m.Payload)
	}
}
