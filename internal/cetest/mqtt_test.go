package cetest_test

import (
	"bytes"
	"encoding/json"
	"testing"

	"github.com/cloudevents/sdk-go/v2/event"

	"github.com/pgoutbox/pgoutbox/broker/brokertest"
	"github.com/pgoutbox/pgoutbox/broker/mqtt"
	"github.com/pgoutbox/pgoutbox/internal/cetest"
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

// TestSDKDecodesMQTT5BinaryMode: on MQTT 5 broker/mqtt writes binary mode as
// the CloudEvents MQTT binding prescribes (the attributes as user properties
// under their own names, datacontenttype as the Content Type); read as the
// SDK's MQTT binding reads user properties (no prefix: each one an attribute
// or an extension), the event is valid and the outbox message's.
func TestSDKDecodesMQTT5BinaryMode(t *testing.T) {
	t.Parallel()
	enc := wire.Encoding{Format: wire.FormatCloudEvents, CloudEventsSource: "/pgoutbox/app"}
	m := brokertest.Message("order", "order-42", 7)
	props, err := mqtt.Encode5(enc, &m)
	if err != nil {
		t.Fatal(err)
	}
	headers := map[string]string{}
	for _, u := range props.User {
		headers[u.Key] = u.Value
	}
	ev := cetest.Decode(t, &cetest.HeaderMessage{Headers: headers, ContentType: props.ContentType, Body: m.Payload})
	// Beside the attributes: the tracing extension, and the producer's
	// other headers.
	ext := ev.Extensions()
	if ext[wire.HeaderTraceParent] != m.Headers[wire.HeaderTraceParent] || ext["pgoutboxheaders"] != `{"Tenant":"acme corp"}` {
		t.Errorf("extensions %v, want traceparent and pgoutboxheaders", ext)
	}
	ev.SetExtension(wire.HeaderTraceParent, nil)
	ev.SetExtension("pgoutboxheaders", nil)
	t.Log(cetest.Check(t, ev, &m, "/pgoutbox/app"))
}
