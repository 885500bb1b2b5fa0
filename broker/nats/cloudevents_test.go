package nats_test

import (
	"bytes"
	"testing"

	"github.com/pgoutbox/pgoutbox/broker"
	"github.com/pgoutbox/pgoutbox/broker/brokertest"
	"github.com/pgoutbox/pgoutbox/wire"
)

// TestCloudEventsFormat publishes in the CloudEvents format and checks that the
// stored message carries the NATS binding's headers as the codec makes them
// (ce-* headers, a content-type header) and the payload; internal/cetest (a module of its own) has the CloudEvents Go SDK decode those headers.
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
	h := map[string]string{}
	for k := range raw.Header {
		h[k] = raw.Header.Get(k)
	}
	brokertest.CheckCloudEventsHeaders(t, h, cfg.Encoding, &m, wire.CloudEventsNATS)
	if got := raw.Header.Get("Nats-Msg-Id"); got != m.EventID.String() {
		t.Errorf("Nats-Msg-Id %q, want the event id", got)
	}
	if !bytes.Equal(raw.Data, m.Payload) {
		t.Errorf("data %q, want the payload %q", raw.Data, m.Payload)
	}
}
