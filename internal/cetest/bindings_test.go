package cetest_test

import (
	"bytes"
	"net/http"
	"testing"

	cejs "github.com/cloudevents/sdk-go/protocol/nats_jetstream/v2"
	"github.com/cloudevents/sdk-go/v2/binding"
	cehttp "github.com/cloudevents/sdk-go/v2/protocol/http"
	natsgo "github.com/nats-io/nats.go"

	"github.com/pgoutbox/pgoutbox/broker/brokertest"
	"github.com/pgoutbox/pgoutbox/internal/cetest"
	"github.com/pgoutbox/pgoutbox/wire"
)

// The adapters' tests (broker/kafka, nats, rabbitmq, webhook) check that each
// puts on its transport exactly the headers wire.Encoding.Headers yields for
// its binding, with the payload as the body; this test has the official
// CloudEvents Go SDK decode those headers, per binding, as each adapter carries
// them: what the SDK decodes is then what the adapters publish. The SDK lives in
// this module so that the library's users do not download it.
func TestSDKDecodesEveryBinding(t *testing.T) {
	const source = "/pgoutbox/app"
	enc := wire.Encoding{Format: wire.FormatCloudEvents, CloudEventsSource: source}
	m := brokertest.Message("order", "order-42", 7)
	if err := enc.CheckMessage(&m); err != nil {
		t.Fatalf("CheckMessage: %v", err)
	}
	headers := func(b wire.CloudEventsBinding) map[string]string {
		h := map[string]string{}
		for k, v := range enc.Headers(&m, b) {
			h[k] = v
		}
		return h
	}
	for _, c := range []struct {
		name string
		msg  func() binding.Message
	}{
		{"HTTP (webhook)", func() binding.Message {
			// The webhook sets datacontenttype as the request's Content-Type.
			req, err := http.NewRequest(http.MethodPost, "/hooks", bytes.NewReader(m.Payload))
			if err != nil {
				t.Fatal(err)
			}
			for k, v := range headers(wire.CloudEventsHTTP) {
				req.Header.Set(k, v)
			}
			req.Header.Set("Content-Type", wire.DefaultContentType)
			return cehttp.NewMessageFromHttpRequest(req)
		}},
		{"NATS JetStream", func() binding.Message {
			msg := &natsgo.Msg{Subject: "orders.order", Header: natsgo.Header{}, Data: m.Payload}
			for k, v := range headers(wire.CloudEventsNATS) {
				msg.Header.Set(k, v)
			}
			return cejs.NewMessage(msg)
		}},
		{"Kafka", func() binding.Message {
			h := headers(wire.CloudEventsKafka)
			return &cetest.HeaderMessage{Headers: h, Prefix: "ce_", ContentType: h["content-type"], Body: m.Payload}
		}},
		{"AMQP (RabbitMQ)", func() binding.Message {
			// RabbitMQ sets datacontenttype as the content-type property.
			return &cetest.HeaderMessage{Headers: headers(wire.CloudEventsAMQP), Prefix: "cloudEvents_",
				ContentType: wire.DefaultContentType, Body: m.Payload}
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			ev := cetest.Decode(t, c.msg())
			t.Logf("SDK decoded: %s", cetest.Check(t, ev, &m, source))
			// The comparison itself can fail: the same event is not one of
			// another source or another aggregate.
			other := m
			other.AggregateID = "order-43"
			if errs := cetest.Compare(ev, &other, "/elsewhere"); len(errs) != 3 {
				t.Errorf("Compare with another source and aggregate: %d differences %v, want 3 (source, subject, aggid)", len(errs), errs)
			}
		})
	}
}
