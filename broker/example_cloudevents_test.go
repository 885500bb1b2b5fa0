package broker_test

import (
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/pgoutbox/pgoutbox"
	"github.com/pgoutbox/pgoutbox/broker"
	"github.com/pgoutbox/pgoutbox/wire"
)

// The headers of one event in the CloudEvents format, per the Kafka binding.
func ExampleEncoding_Headers() {
	id, _ := pgoutbox.ParseUUID("01a241cd-ba14-7001-8c4d-e6d083ca2950")
	m := broker.Message{
		EventID: id, AggregateType: "order", AggregateID: "42", AggregateSequence: 3,
		EventType: "order.paid", SchemaVersion: 2, OccurredAt: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC),
		Payload: []byte(`{"total":"9.50"}`), Headers: map[string]string{"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"},
	}
	enc := wire.Encoding{Format: wire.FormatCloudEvents, CloudEventsSource: "/pgoutbox/app"}
	h := maps.Collect(enc.Headers(&m, wire.CloudEventsKafka))
	for _, k := range slices.Sorted(maps.Keys(h)) {
		fmt.Printf("%s: %s\n", k, h[k])
	}
	// Output:
	// ce_id: 01a241cd-ba14-7001-8c4d-e6d083ca2950
	// ce_pgoutboxaggid: 42
	// ce_pgoutboxaggtype: order
	// ce_pgoutboxschemaver: 2
	// ce_pgoutboxseq: 3
	// ce_source: /pgoutbox/app
	// ce_specversion: 1.0
	// ce_subject: order/42
	// ce_time: 2026-01-02T03:04:05Z
	// ce_type: order.paid
	// content-type: application/json
	// traceparent: 00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01
}
