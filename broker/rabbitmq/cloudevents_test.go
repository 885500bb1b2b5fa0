package rabbitmq_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/pgoutbox/pgoutbox/broker"
	"github.com/pgoutbox/pgoutbox/internal/cetest"
	"github.com/pgoutbox/pgoutbox/wire"
)

// TestCloudEventsFormat publishes in the CloudEvents format and decodes the
// delivery with the CloudEvents Go SDK (binding.ToEvent over the message
// headers, per the AMQP protocol binding: cloudEvents_* application properties,
// datacontenttype as the content-type property).
func TestCloudEventsFormat(t *testing.T) {
	t.Parallel()
	cfg, a, q := isolated(t)
	const source = "/pgoutbox/app"
	cfg.Encoding = wire.Encoding{Format: wire.FormatCloudEvents, CloudEventsSource: source}
	p := dial(t, sharedURL, cfg)

	spoofed := message("order", "order-spoof", 1)
	spoofed.Headers["cloudevents_id"] = "spoofed"
	if err := publish(t, p, spoofed)[0]; !broker.IsPermanent(err) {
		t.Fatalf("a producer header cloudevents_id: %v, want a permanent refusal", err)
	}
	m := message("order", "order-42", 5)
	if err := publish(t, p, m)[0]; err != nil {
		t.Fatalf("Publish: %v", err)
	}
	got := a.get(q)
	if len(got) != 1 {
		t.Fatalf("queue holds %d messages, want 1", len(got))
	}
	d := got[0]
	h := map[string]string{}
	for k, v := range d.Headers {
		if _, ok := v.(string); !ok {
			t.Errorf("header %s is a %T, want a string", k, v)
		}
		h[k] = fmt.Sprint(v)
		if strings.HasPrefix(strings.ToLower(k), "outbox-") {
			t.Errorf("header %s in the CloudEvents format", k)
		}
	}
	if h["Tenant"] != m.Headers["Tenant"] || h["traceparent"] != m.Headers["traceparent"] {
		t.Errorf("producer headers %v not carried as in the default format", h)
	}
	if d.MessageId != m.EventID.String() || d.Type != m.EventType {
		t.Errorf("message id %q, type %q: want the event's, as in the default format", d.MessageId, d.Type)
	}
	ev := cetest.Decode(t, &cetest.HeaderMessage{Headers: h, Prefix: "cloudEvents_", ContentType: d.ContentType, Body: d.Body})
	t.Logf("RabbitMQ, SDK decoded: %s", cetest.Check(t, ev, &m, source))
}
