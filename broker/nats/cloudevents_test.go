package nats_test

import (
	"bytes"
	"strings"
	"testing"

	"github.com/pgoutbox/pgoutbox/broker"
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
	for k, v := range cfg.Encoding.Headers(&m, wire.CloudEventsNATS) {
		if got := raw.Header.Get(k); got != v {
			t.Errorf("NATS header %s = %q, want %q", k, got, v)
		}
	}
	if !bytes.Equal(raw.Data, m.Payload) {
		t.Errorf("data %q, want the payload %q", raw.Data, m.Payload)
	}
}
