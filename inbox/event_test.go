package inbox_test

import (
	"errors"
	stdmaps "maps"
	"net/http"
	"strings"
	"testing"

	"github.com/pgoutbox/pgoutbox/broker"
	"github.com/pgoutbox/pgoutbox/inbox"
	"github.com/pgoutbox/pgoutbox/wire"
)

// Decode reads untrusted input: whatever it is given, it returns an event whose
// fields hold the contract, or ErrUndecodable; it never panics.
func FuzzDecode(f *testing.F) {
	good := inbox.DeliveryOf(event("1", 1))
	h := good.Headers
	f.Add(string(good.Body), h[wire.HeaderEventID], h[wire.HeaderAggregateType], h[wire.HeaderAggregateID],
		h[wire.HeaderAggregateSequence], h[wire.HeaderSchemaVersion], h[wire.HeaderOccurredAt], "outbox-event-id")
	f.Add(`{"a":1}`, "not-a-uuid", "order", "1", "-4", "1", "2026-01-01T00:00:00Z", "x")
	f.Add(`[`, h[wire.HeaderEventID], "", "1", "9223372036854775808", "0", "yesterday", "")
	f.Fuzz(func(t *testing.T, body, id, aggType, aggID, seq, version, occurred, extra string) {
		d := inbox.Delivery{Body: []byte(body), Headers: map[string]string{
			wire.HeaderEventID: id, wire.HeaderEventType: "t", wire.HeaderAggregateType: aggType,
			wire.HeaderAggregateID: aggID, wire.HeaderAggregateSequence: seq, wire.HeaderSchemaVersion: version,
			wire.HeaderOccurredAt: occurred, extra: "v",
		}}
		ev, err := inbox.Decode(d)
		if err != nil {
			if !errors.Is(err, inbox.ErrUndecodable) {
				t.Fatalf("error %v does not match ErrUndecodable", err)
			}
			return
		}
		if ev.EventID.IsZero() {
			t.Fatalf("nil event id decoded from %q", id)
		}
		if ev.AggregateSequence < 1 || ev.SchemaVersion < 1 || ev.AggregateType == "" || ev.AggregateID == "" {
			t.Fatalf("decoded an event breaking the contract: %+v", ev)
		}
		for k := range ev.Headers {
			if len(k) >= 7 && (k[:7] == "Outbox-" || k[:7] == "outbox-" || k[:7] == "OUTBOX-") {
				t.Fatalf("Outbox-* header %q leaked into Event.Headers", k)
			}
		}
	})
}

// cloudEventDelivery is m as the relay sends it with --format cloudevents over
// binding b, with every header name passed through fold (a broker or HTTP
// changing their case).
func cloudEventDelivery(m broker.Message, b wire.CloudEventsBinding, fold func(string) string) inbox.Delivery {
	enc := wire.Encoding{Format: wire.FormatCloudEvents, CloudEventsSource: "/pgoutbox/app"}
	h := map[string]string{}
	for k, v := range enc.Headers(&m, b) {
		h[fold(k)] = v
	}
	return inbox.Delivery{Body: m.Payload, Headers: h, Attempt: 1}
}

// Decode reads the CloudEvents format of every binding as the same Event as
// the default format, header names in any case.
func TestDecodeCloudEvents(t *testing.T) {
	t.Parallel()
	m := event("1", 3)
	want, err := inbox.Decode(inbox.DeliveryOf(m))
	if err != nil {
		t.Fatal(err)
	}
	same := func(s string) string { return s }
	for _, c := range []struct {
		b    wire.CloudEventsBinding
		fold func(string) string
	}{
		{wire.CloudEventsHTTP, http.CanonicalHeaderKey},
		{wire.CloudEventsNATS, same},
		{wire.CloudEventsKafka, same},
		{wire.CloudEventsAMQP, same},
		{wire.CloudEventsAMQP, strings.ToLower},
		{wire.CloudEventsBinding{Prefix: "cloudEvents:"}, same}, // the older AMQP binding's prefix
	} {
		d := cloudEventDelivery(m, c.b, c.fold)
		got, err := inbox.Decode(d)
		if err != nil {
			t.Fatalf("%s: Decode(%v): %v", c.b.Prefix, d.Headers, err)
		}
		if got.EventID != want.EventID || got.AggregateType != want.AggregateType || got.AggregateID != want.AggregateID ||
			got.AggregateSequence != want.AggregateSequence || got.EventType != want.EventType ||
			got.SchemaVersion != want.SchemaVersion || !got.OccurredAt.Equal(want.OccurredAt) ||
			!stdmaps.Equal(lowerKeys(got.Headers), lowerKeys(want.Headers)) || string(got.Payload) != string(want.Payload) {
			t.Errorf("%s: decoded %+v, want %+v", c.b.Prefix, got, want)
		}
	}
}

// Decode reads untrusted CloudEvents attributes: an event that holds the
// contract, or ErrUndecodable; never a panic, never an attribute or Outbox-*
// header among Event.Headers.
func FuzzDecodeCloudEvents(f *testing.F) {
	good := cloudEventDelivery(event("1", 1), wire.CloudEventsKafka, func(s string) string { return s })
	h := good.Headers
	f.Add(string(good.Body), "1.0", h["ce_id"], h["ce_pgoutboxaggtype"], h["ce_pgoutboxaggid"], h["ce_pgoutboxseq"],
		h["ce_pgoutboxschemaver"], h["ce_time"], "application/json", "Outbox-Event-Id")
	f.Add(`{}`, "0.3", "x", "", "", "0", "-1", "now", "text/plain", "ce_extra")
	f.Fuzz(func(t *testing.T, body, spec, id, aggType, aggID, seq, version, occurred, ct, extra string) {
		d := inbox.Delivery{Body: []byte(body), Headers: map[string]string{
			"ce_specversion": spec, "ce_id": id, "ce_type": "t", "ce_pgoutboxaggtype": aggType, "ce_pgoutboxaggid": aggID,
			"ce_pgoutboxseq": seq, "ce_pgoutboxschemaver": version, "ce_time": occurred, "content-type": ct, extra: "v",
		}}
		ev, err := inbox.Decode(d)
		if err != nil {
			if !errors.Is(err, inbox.ErrUndecodable) {
				t.Fatalf("error %v does not match ErrUndecodable", err)
			}
			return
		}
		if ev.EventID.IsZero() || ev.AggregateSequence < 1 || ev.SchemaVersion < 1 || ev.AggregateType == "" || ev.AggregateID == "" {
			t.Fatalf("decoded an event breaking the contract: %+v", ev)
		}
		for k := range ev.Headers {
			l := strings.ToLower(k)
			if strings.HasPrefix(l, "outbox-") || strings.HasPrefix(l, "ce_") || l == "content-type" {
				t.Fatalf("header %q leaked into Event.Headers", k)
			}
		}
	})
}

func lowerKeys(h map[string]string) map[string]string {
	out := make(map[string]string, len(h))
	for k, v := range h {
		out[strings.ToLower(k)] = v
	}
	return out
}
