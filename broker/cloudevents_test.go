package broker_test

import (
	"maps"
	"slices"
	"strings"
	"testing"

	"github.com/pgoutbox/pgoutbox/broker"
	"github.com/pgoutbox/pgoutbox/broker/brokertest"
	"github.com/pgoutbox/pgoutbox/wire"
)

func ceHeaders(enc wire.Encoding, m *broker.Message, b wire.CloudEventsBinding) map[string]string {
	h := map[string]string{}
	for k, v := range enc.Headers(m, b) {
		h[k] = v
	}
	return h
}

func lookup(h map[string]string) (names []string, get func(string) string) {
	return slices.Sorted(maps.Keys(h)), func(name string) string {
		for k, v := range h {
			if strings.EqualFold(k, name) {
				return v
			}
		}
		return ""
	}
}

// TestCloudEventsRoundTrip: what Encoding.Headers writes for each binding,
// ParseCloudEvent reads back as the same message; the default format is
// untouched by the zero Encoding.
func TestCloudEventsRoundTrip(t *testing.T) {
	t.Parallel()
	m := brokertest.Message("order", "order/42", 9)
	if got, want := ceHeaders(wire.Encoding{}, &m, wire.CloudEventsKafka), m.WireHeaders(); !maps.Equal(got, want) {
		t.Fatalf("the zero Encoding wrote %v, want the default wire headers %v", got, want)
	}
	enc := wire.Encoding{Format: wire.FormatCloudEvents}
	for _, b := range []wire.CloudEventsBinding{wire.CloudEventsHTTP, wire.CloudEventsNATS, wire.CloudEventsKafka, wire.CloudEventsAMQP} {
		h := ceHeaders(enc, &m, b)
		if h[b.Prefix+"source"] != wire.DefaultCloudEventsSource || h[b.Prefix+"subject"] != "order/order/42" ||
			h[b.Prefix+"specversion"] != "1.0" || h[b.Prefix+"time"] != "2025-03-04T05:06:07.00000089Z" {
			t.Errorf("%s: headers %v", b.Prefix, h)
		}
		if b.ContentTypeHeader != "" && h[b.ContentTypeHeader] != "application/json" {
			t.Errorf("%s: no %s header: %v", b.Prefix, b.ContentTypeHeader, h)
		}
		for k := range h {
			if strings.HasPrefix(k, "Outbox-") {
				t.Errorf("%s: header %s in the CloudEvents format", b.Prefix, k)
			}
		}
		names, get := lookup(h)
		got, err := wire.ParseCloudEvent(m.Payload, names, get)
		if err != nil {
			t.Fatalf("%s: ParseCloudEvent: %v", b.Prefix, err)
		}
		if got.EventID != m.EventID || got.AggregateType != m.AggregateType || got.AggregateID != m.AggregateID ||
			got.AggregateSequence != m.AggregateSequence || got.EventType != m.EventType || got.SchemaVersion != m.SchemaVersion ||
			!got.OccurredAt.Equal(m.OccurredAt) || !maps.Equal(got.Headers, m.Headers) || string(got.Payload) != string(m.Payload) {
			t.Errorf("%s: read back %+v, want %+v", b.Prefix, got, m)
		}
		if at, id := wire.LaneHeaders(get); at != m.AggregateType || id != m.AggregateID {
			t.Errorf("%s: LaneHeaders = %q, %q", b.Prefix, at, id)
		}
	}
}

// TestCloudEventsRefusals: producer headers named like attributes are refused
// in the CloudEvents format only; a bad source or format is a config error.
func TestCloudEventsRefusals(t *testing.T) {
	t.Parallel()
	enc := wire.Encoding{Format: wire.FormatCloudEvents}
	for _, name := range []string{"ce-id", "CE_type", "cloudEvents_source", "Ce-Pgoutboxseq", "cloudevents:id"} {
		m := brokertest.Message("order", "1", 1)
		m.Headers[name] = "x"
		if err := enc.CheckMessage(&m); !broker.IsPermanent(err) {
			t.Errorf("header %s: %v, want a permanent refusal", name, err)
		}
		if err := (wire.Encoding{}).CheckMessage(&m); err != nil {
			t.Errorf("header %s in the default format: %v", name, err)
		}
	}
	for _, src := range []string{"/pgoutbox/app", "urn:pgoutbox:app", "https://example.com/app", "app"} {
		if err := (wire.Encoding{Format: wire.FormatCloudEvents, CloudEventsSource: src}).Validate(); err != nil {
			t.Errorf("source %q: %v", src, err)
		}
	}
	for _, src := range []string{"/a b", "/a\n", "/é", "%zz", strings.Repeat("a", 1025)} {
		if err := (wire.Encoding{Format: wire.FormatCloudEvents, CloudEventsSource: src}).Validate(); err == nil {
			t.Errorf("source %q accepted", src)
		}
	}
	for in, want := range map[string]wire.Format{"": wire.FormatOutbox, "outbox": wire.FormatOutbox, "CloudEvents": wire.FormatCloudEvents} {
		if got, err := wire.ParseFormat(in); err != nil || got != want {
			t.Errorf("ParseFormat(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	if _, err := wire.ParseFormat("cloudevent"); err == nil {
		t.Error("ParseFormat(cloudevent) succeeded")
	}
}

// TestParseCloudEventHostile: attribute values are data; each malformed one is
// an error, bounded in length, never a panic.
func TestParseCloudEventHostile(t *testing.T) {
	t.Parallel()
	m := brokertest.Message("order", "1", 1)
	good := ceHeaders(wire.Encoding{Format: wire.FormatCloudEvents}, &m, wire.CloudEventsKafka)
	huge := strings.Repeat("9", 1<<20)
	for name, change := range map[string]func(h map[string]string){
		"no specversion":     func(h map[string]string) { delete(h, "ce_specversion") },
		"specversion 0.3":    func(h map[string]string) { h["ce_specversion"] = "0.3" },
		"no id":              func(h map[string]string) { delete(h, "ce_id") },
		"id not a uuid":      func(h map[string]string) { h["ce_id"] = huge },
		"no type":            func(h map[string]string) { delete(h, "ce_type") },
		"no aggregate type":  func(h map[string]string) { delete(h, "ce_pgoutboxaggtype") },
		"no aggregate id":    func(h map[string]string) { delete(h, "ce_pgoutboxaggid") },
		"sequence 0":         func(h map[string]string) { h["ce_pgoutboxseq"] = "0" },
		"sequence overflows": func(h map[string]string) { h["ce_pgoutboxseq"] = huge },
		"version -1":         func(h map[string]string) { h["ce_pgoutboxschemaver"] = "-1" },
		"time not rfc3339":   func(h map[string]string) { h["ce_time"] = huge },
		"not json":           func(h map[string]string) { h["content-type"] = "text/plain" },
	} {
		h := maps.Clone(good)
		change(h)
		names, get := lookup(h)
		_, err := wire.ParseCloudEvent(m.Payload, names, get)
		if err == nil {
			t.Errorf("%s: accepted", name)
		} else if len(err.Error()) > 300 {
			t.Errorf("%s: error of %d bytes quotes the hostile value", name, len(err.Error()))
		}
	}
}

// The default source is the event's outbox, one escaped path segment however
// the schema is named; --ce-source replaces it; the header carries it.
func TestCloudEventsSourceOfTheOutbox(t *testing.T) {
	t.Parallel()
	enc := wire.Encoding{Format: wire.FormatCloudEvents}
	for schema, want := range map[string]string{
		"":          wire.DefaultCloudEventsSource,
		"app":       "/pgoutbox/app",
		"tenant_1":  "/pgoutbox/tenant_1",
		"a/b":       "/pgoutbox/a%2Fb",
		"a b":       "/pgoutbox/a%20b",
		"ä":         "/pgoutbox/%C3%A4",
		"..":        "/pgoutbox/..",
		"a?x#y":     "/pgoutbox/a%3Fx%23y",
		"x\"\n\x1b": "/pgoutbox/x%22%0A%1B",
	} {
		m := brokertest.Message("order", "1", 1)
		m.Schema, m.Tenant = schema, "prefix-"+schema
		got := enc.Source(&m)
		if got != want {
			t.Errorf("schema %q: source %q, want %q", schema, got, want)
		}
		if err := wire.CheckCloudEventsSource(got); err != nil {
			t.Errorf("schema %q: source %q: %v", schema, got, err)
		}
		if h := ceHeaders(enc, &m, wire.CloudEventsHTTP); h["ce-source"] != want {
			t.Errorf("schema %q: ce-source header %q, want %q", schema, h["ce-source"], want)
		}
		set := wire.Encoding{Format: wire.FormatCloudEvents, CloudEventsSource: "urn:app"}
		if got := set.Source(&m); got != "urn:app" {
			t.Errorf("schema %q with CloudEventsSource: source %q", schema, got)
		}
	}
}
