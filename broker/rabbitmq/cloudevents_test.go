package rabbitmq_test

import (
	"bytes"
	"fmt"
	"testing"

	"github.com/pgoutbox/pgoutbox/broker"
	"github.com/pgoutbox/pgoutbox/broker/brokertest"
	"github.com/pgoutbox/pgoutbox/wire"
)

// TestCloudEventsFormat publishes in the CloudEvents format and checks that the
// delivery carries the AMQP binding's headers as the codec makes them
// (cloudEvents_* application properties), datacontenttype as the content-type
// property and the payload; internal/cetest (a module of its own) has the CloudEvents Go SDK decode those headers.
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
	d := a.getOne(q)
	h := map[string]string{}
	for k, v := range d.Headers {
		if _, ok := v.(string); !ok {
			t.Errorf("header %s is a %T, want a string", k, v)
		}
		h[k] = fmt.Sprint(v)
	}
	brokertest.CheckCloudEventsHeaders(t, h, cfg.Encoding, &m, wire.CloudEventsAMQP)
	if d.MessageId != m.EventID.String() || d.Type != m.EventType {
		t.Errorf("message id %q, type %q: want the event's, as in the default format", d.MessageId, d.Type)
	}
	if d.ContentType != wire.DefaultContentType || !bytes.Equal(d.Body, m.Payload) {
		t.Errorf("content type %q, body %q: want %q and the payload %q", d.ContentType, d.Body, wire.DefaultContentType, m.Payload)
	}
}
