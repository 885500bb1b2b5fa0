package kafka_test

import (
	"strings"
	"testing"

	"github.com/pgoutbox/pgoutbox/broker"
	"github.com/pgoutbox/pgoutbox/broker/kafka"
	"github.com/pgoutbox/pgoutbox/internal/cetest"
	"github.com/pgoutbox/pgoutbox/wire"
)

// TestCloudEventsFormat publishes in the CloudEvents format and decodes the
// record with the CloudEvents Go SDK (binding.ToEvent over the record's
// headers, per the Kafka protocol binding: ce_* headers, content-type).
func TestCloudEventsFormat(t *testing.T) {
	t.Parallel()
	c := newCluster(t, false)
	const source = "/pgoutbox/app"
	p := c.dial(kafka.Config{Encoding: wire.Encoding{Format: wire.FormatCloudEvents, CloudEventsSource: source}})

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
		if strings.HasPrefix(strings.ToLower(rh.Key), "outbox-") {
			t.Errorf("header %s in the CloudEvents format", rh.Key)
		}
	}
	if h["Tenant"] != "acme" || h["traceparent"] != m.Headers["traceparent"] {
		t.Errorf("producer headers %v not carried as in the default format", h)
	}
	ev := cetest.Decode(t, &cetest.HeaderMessage{Headers: h, Prefix: "ce_", ContentType: h["content-type"], Body: r.Value})
	t.Logf("Kafka, SDK decoded: %s", cetest.Check(t, ev, &m, source))
}
