package wire_test

import (
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/pgoutbox/pgoutbox"
	"github.com/pgoutbox/pgoutbox/wire"
)

// An adapter's whole part of the codec: encode, then map headers, body and
// content type onto the transport (here, printed).
func ExampleEncoding_Encode() {
	id, err := pgoutbox.ParseUUID("0192d1c4-6b0a-7c3e-8f00-000000000001")
	if err != nil {
		panic(err)
	}
	m := wire.Message{
		EventID:       id,
		AggregateType: "order", AggregateID: "42", AggregateSequence: 7,
		EventType: "order.paid", SchemaVersion: 1,
		OccurredAt: time.Date(2025, 3, 4, 5, 6, 7, 0, time.UTC),
		Payload:    []byte(`{"cents":1250}`),
	}
	for _, enc := range []wire.Encoding{{}, {Format: wire.FormatCloudEvents, CloudEventsSource: "/shop"}} {
		e, err := enc.Encode(&m, wire.CloudEventsKafka)
		if err != nil {
			panic(err)
		}
		h := maps.Collect(e.Headers)
		fmt.Printf("%s: content type %s, body %s\n", enc.Format, e.ContentType, e.Body)
		for _, k := range slices.Sorted(maps.Keys(h)) {
			fmt.Printf("  %s: %s\n", k, h[k])
		}
	}
	// Output:
	// outbox: content type application/json, body {"cents":1250}
	//   Outbox-Aggregate-Id: 42
	//   Outbox-Aggregate-Sequence: 7
	//   Outbox-Aggregate-Type: order
	//   Outbox-Event-Id: 0192d1c4-6b0a-7c3e-8f00-000000000001
	//   Outbox-Event-Type: order.paid
	//   Outbox-Occurred-At: 2025-03-04T05:06:07Z
	//   Outbox-Schema-Version: 1
	// cloudevents: content type application/json, body {"cents":1250}
	//   ce_id: 0192d1c4-6b0a-7c3e-8f00-000000000001
	//   ce_pgoutboxaggid: 42
	//   ce_pgoutboxaggtype: order
	//   ce_pgoutboxschemaver: 1
	//   ce_pgoutboxseq: 7
	//   ce_source: /shop
	//   ce_specversion: 1.0
	//   ce_subject: order/42
	//   ce_time: 2025-03-04T05:06:07Z
	//   ce_type: order.paid
	//   content-type: application/json
}
