package redisstream_test

import (
	"maps"
	"testing"

	"github.com/pgoutbox/pgoutbox/broker"
	"github.com/pgoutbox/pgoutbox/broker/brokertest"
	"github.com/pgoutbox/pgoutbox/broker/redisstream"
	"github.com/pgoutbox/pgoutbox/wire"
)

// TestCloudEventsFormat publishes in the CloudEvents format and checks the
// entry's fields: the attributes and content-type as the codec makes them
// for redisstream.CloudEventsBinding, the producer's headers, the body, and
// no Outbox-* field; and that the received entry parses back.
func TestCloudEventsFormat(t *testing.T) {
	t.Parallel()
	c := client(t, mustAddr(t, sharedURL))
	cfg, prefix := isolated(t, c)
	cfg.Encoding = wire.Encoding{Format: wire.FormatCloudEvents, CloudEventsSource: "/pgoutbox/app"}
	p := dial(t, sharedURL, cfg)

	spoofed := brokertest.Message("order", "1", 1)
	spoofed.Headers["ce-source"] = "/elsewhere"
	if err := brokertest.Publish(t, p, spoofed)[0]; !broker.IsPermanent(err) {
		t.Fatalf("a producer header ce-source: %v, want a permanent refusal", err)
	}
	m := brokertest.Message("order", "1", 1)
	if err := brokertest.Publish(t, p, m)[0]; err != nil {
		t.Fatal(err)
	}
	got, err := readStreams(t.Context(), c, prefix)
	if err != nil || len(got) != 1 {
		t.Fatalf("read: %v, %v", got, err)
	}
	fields := got[0].Headers
	brokertest.CheckCloudEventsHeaders(t, fields, cfg.Encoding, &m, redisstream.CloudEventsBinding)
	if n := len(maps.Collect(cfg.Encoding.Headers(&m, redisstream.CloudEventsBinding))); len(fields) != n {
		t.Errorf("fields %v: want the %d of the binding and the body", fields, n)
	}
	names := make([]string, 0, len(fields))
	for k := range fields {
		names = append(names, k)
	}
	back, err := wire.ParseReceived(got[0].Body, names, func(n string) string { return fields[n] })
	if err != nil || back.EventID != m.EventID || back.AggregateSequence != 1 || string(back.Payload) != string(m.Payload) {
		t.Errorf("parsed back: %+v, %v", back, err)
	}
}
