package nats_test

import (
	"strings"
	"testing"

	cejs "github.com/cloudevents/sdk-go/protocol/nats_jetstream/v2"
	natsgo "github.com/nats-io/nats.go"

	"github.com/pgoutbox/pgoutbox/broker"
	"github.com/pgoutbox/pgoutbox/internal/cetest"
	"github.com/pgoutbox/pgoutbox/wire"
)

// TestCloudEventsFormat publishes in the CloudEvents format and decodes the
// stored message with the CloudEvents Go SDK's NATS JetStream protocol binding
// (ce-* headers, a content-type header).
func TestCloudEventsFormat(t *testing.T) {
	t.Parallel()
	js := sharedJetStream(t)
	cfg := isolated(t, js)
	const source = "/pgoutbox/app"
	cfg.Encoding = wire.Encoding{Format: wire.FormatCloudEvents, CloudEventsSource: source}
	p := newPublisher(t, js, cfg)

	spoofed := message("order", 1)
	spoofed.Headers["ce-source"] = "/elsewhere"
	if err := publish(t, p, spoofed)[0]; !broker.IsPermanent(err) {
		t.Fatalf("a producer header ce-source: %v, want a permanent refusal", err)
	}
	m := message("order", 1)
	raw := publishFirst(t, p, js, cfg.Stream, m)
	for k := range raw.Header {
		if strings.HasPrefix(strings.ToLower(k), "outbox-") {
			t.Errorf("header %s in the CloudEvents format", k)
		}
	}
	if raw.Header.Get("Tenant") != m.Headers["Tenant"] || raw.Header.Get("traceparent") != m.Headers["traceparent"] {
		t.Errorf("producer headers %v not carried as in the default format", raw.Header)
	}
	if got := raw.Header.Get("Nats-Msg-Id"); got != m.EventID.String() {
		t.Errorf("Nats-Msg-Id %q, want the event id", got)
	}
	msg := cejs.NewMessage(&natsgo.Msg{Subject: raw.Subject, Header: raw.Header, Data: raw.Data})
	ev := cetest.Decode(t, msg)
	t.Logf("NATS, SDK decoded: %s", cetest.Check(t, ev, &m, source))
}
