package wire_test

import (
	"maps"
	"slices"
	"testing"

	"github.com/pgoutbox/pgoutbox/broker"
	"github.com/pgoutbox/pgoutbox/broker/brokertest"
	"github.com/pgoutbox/pgoutbox/wire"
)

// message is the conformance suite's message: producer headers included.
func message() wire.Message { return brokertest.Message("order", "42", 3) }

// TestEncodeContentType: the payload's content type reaches the adapter
// (Encoded.ContentType) and the CloudEvents content-type header, JSON when
// the message names none; the default format's headers never carry it.
func TestEncodeContentType(t *testing.T) {
	t.Parallel()
	for _, ct := range []string{"", "application/x-protobuf", "text/plain; charset=utf-8"} {
		m := message()
		m.ContentType = ct
		want := ct
		if want == "" {
			want = "application/json"
		}
		enc, err := wire.Encoding{}.Encode(&m, wire.CloudEventsKafka)
		if err != nil {
			t.Fatalf("%q: %v", ct, err)
		}
		h := maps.Collect(enc.Headers)
		if enc.ContentType != want || string(enc.Body) != string(m.Payload) || !maps.Equal(h, m.WireHeaders()) || enc.HeaderCount < len(h) {
			t.Errorf("%q: default format encoded %+v, headers %v", ct, enc, h)
		}
		enc, err = wire.Encoding{Format: wire.FormatCloudEvents}.Encode(&m, wire.CloudEventsKafka)
		if err != nil {
			t.Fatalf("%q: %v", ct, err)
		}
		h = maps.Collect(enc.Headers)
		if enc.ContentType != want || h["content-type"] != want || h["ce_id"] != m.EventID.String() || enc.HeaderCount < len(h) {
			t.Errorf("%q: CloudEvents encoded %+v, headers %v", ct, enc, h)
		}
		amqp, err := wire.Encoding{Format: wire.FormatCloudEvents}.Encode(&m, wire.CloudEventsAMQP)
		if err != nil {
			t.Fatalf("%q: %v", ct, err)
		}
		for k := range amqp.Headers {
			if k == "content-type" {
				t.Errorf("%q: the AMQP binding has a content-type header; it is the property", ct)
			}
		}
	}
}

// TestEncodeRefuses: what the codec cannot write is refused, and the refusal
// is permanent at the broker seam (the relay quarantines at once).
func TestEncodeRefuses(t *testing.T) {
	t.Parallel()
	for name, change := range map[string]func(*wire.Message){
		"content type with a line break": func(m *wire.Message) { m.ContentType = "application/json\r\nX-Evil: 1" },
		"content type not a media type":  func(m *wire.Message) { m.ContentType = "json" },
		"content type too long":          func(m *wire.Message) { m.ContentType = "application/x-" + string(make([]byte, 250)) },
		"reserved producer header":       func(m *wire.Message) { m.Headers["Outbox-Event-Id"] = "x" },
	} {
		m := message()
		change(&m)
		for _, enc := range []wire.Encoding{{}, {Format: wire.FormatCloudEvents}} {
			_, err := enc.Encode(&m, wire.CloudEventsHTTP)
			if !wire.IsRefused(err) || !broker.IsPermanent(err) {
				t.Errorf("%s, format %s: Encode = %v, want a permanent refusal", name, enc.Format, err)
			}
		}
	}
	m := message()
	m.Headers["ce-id"] = "x"
	if _, err := (wire.Encoding{}).Encode(&m, wire.CloudEventsHTTP); err != nil {
		t.Errorf("a ce- producer header in the default format: %v", err)
	}
	if _, err := (wire.Encoding{Format: wire.FormatCloudEvents}).Encode(&m, wire.CloudEventsHTTP); !broker.IsPermanent(err) {
		t.Errorf("a ce- producer header in the CloudEvents format: %v, want a permanent refusal", err)
	}
	if wire.IsRefused(nil) || wire.Refused(nil) != nil {
		t.Error("nil is not a refusal")
	}
}

// TestParseReceivedEitherFormat: a message written in either format reads
// back as the same event.
func TestParseReceivedEitherFormat(t *testing.T) {
	t.Parallel()
	m := message()
	for _, enc := range []wire.Encoding{{}, {Format: wire.FormatCloudEvents}} {
		e, err := enc.Encode(&m, wire.CloudEventsNATS)
		if err != nil {
			t.Fatal(err)
		}
		h := maps.Collect(e.Headers)
		names := slices.Collect(maps.Keys(h))
		got, err := wire.ParseReceived(e.Body, names, func(n string) string { return h[n] })
		if err != nil {
			t.Fatalf("format %s: %v", enc.Format, err)
		}
		if got.EventID != m.EventID || got.AggregateSequence != m.AggregateSequence || !got.OccurredAt.Equal(m.OccurredAt) ||
			!maps.Equal(got.Headers, m.Headers) || string(got.Payload) != string(m.Payload) {
			t.Errorf("format %s: read back %+v, want %+v", enc.Format, got, m)
		}
		if at, id := wire.LaneHeaders(func(n string) string { return h[n] }); at != m.AggregateType || id != m.AggregateID {
			t.Errorf("format %s: LaneHeaders = %q, %q", enc.Format, at, id)
		}
	}
}
