package cetest_test

import (
	"bytes"
	"encoding/json"
	"testing"

	"github.com/cloudevents/sdk-go/v2/event"

	"github.com/pgoutbox/pgoutbox/broker/brokertest"
	"github.com/pgoutbox/pgoutbox/broker/mqtt"
	"github.com/pgoutbox/pgoutbox/wire"
)

// TestSDKDecodesMQTTStructuredMode: MQTT 3.1.1 carries CloudEvents in
// structured mode only; the SDK reads what broker/mqtt writes as a valid
// event with the same attributes, extensions and data.
func TestSDKDecodesMQTTStructuredMode(t *testing.T) {
	t.Parallel()
	enc := wire.Encoding{Format: wire.FormatCloudEvents, CloudEventsSource: "/pgoutbox/app"}
	m := brokertest.Message("order", "order-42", 7)
	payload, err := mqtt.Encode(enc, &m)
	if err != nil {
		t.Fatal(err)
	}
	var e event.Event
	if err := json.Unmarshal(payload, &e); err != nil {
		t.Fatalf("the SDK refused the payload: %v\n%s", err, payload)
	}
	if err := e.Validate(); err != nil {
		t.Fatalf("invalid event: %v", err)
	}
	ext := e.Extensions()
	if e.ID() != m.EventID.String() || e.Source() != "/pgoutbox/app" || e.Type() != m.EventType ||
		e.Subject() != "order/order-42" || !e.Time().Equal(m.OccurredAt) || e.DataContentType() != wire.DefaultContentType ||
		ext[wire.CEExtAggregateType] != "order" || ext[wire.CEExtAggregateID] != "order-42" || ext[wire.CEExtSequence] != "7" ||
		ext[wire.HeaderTraceParent] != m.Headers[wire.HeaderTraceParent] {
		t.Errorf("the SDK read %s", e)
	}
	if !bytes.Equal(e.Data(), m.Payload) {
		t.Errorf("data %q, want %q", e.Data(), m.Payload)
	}
}
