package inbox_test

import (
	"errors"
	"testing"

	"github.com/pgoutbox/pgoutbox/broker"
	"github.com/pgoutbox/pgoutbox/inbox"
)

// Decode reads untrusted input: whatever it is given, it returns an event whose
// fields hold the contract, or ErrUndecodable; it never panics.
func FuzzDecode(f *testing.F) {
	good := inbox.DeliveryOf(event("1", 1))
	h := good.Headers
	f.Add(string(good.Body), h[broker.HeaderEventID], h[broker.HeaderAggregateType], h[broker.HeaderAggregateID],
		h[broker.HeaderAggregateSequence], h[broker.HeaderSchemaVersion], h[broker.HeaderOccurredAt], "outbox-event-id")
	f.Add(`{"a":1}`, "not-a-uuid", "order", "1", "-4", "1", "2026-01-01T00:00:00Z", "x")
	f.Add(`[`, h[broker.HeaderEventID], "", "1", "9223372036854775808", "0", "yesterday", "")
	f.Fuzz(func(t *testing.T, body, id, aggType, aggID, seq, version, occurred, extra string) {
		d := inbox.Delivery{Body: []byte(body), Headers: map[string]string{
			broker.HeaderEventID: id, broker.HeaderEventType: "t", broker.HeaderAggregateType: aggType,
			broker.HeaderAggregateID: aggID, broker.HeaderAggregateSequence: seq, broker.HeaderSchemaVersion: version,
			broker.HeaderOccurredAt: occurred, extra: "v",
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
