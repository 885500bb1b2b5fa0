package broker_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/pgoutbox/pgoutbox"
	"github.com/pgoutbox/pgoutbox/broker"
	"github.com/pgoutbox/pgoutbox/broker/brokertest"
	"github.com/pgoutbox/pgoutbox/wire"
)

// CheckMessage refuses, as permanent, every message the producer's checks would
// have refused; PublishValid sends the others and holds back the rest of a
// refused message's aggregate.
func TestPublishValidRefusesWhatTheProducerWould(t *testing.T) {
	t.Parallel()
	with := func(agg string, seq int64, edit func(*broker.Message)) broker.Message {
		m := msg(agg, seq)
		edit(&m)
		return m
	}
	hostile := []func(*broker.Message){
		func(m *broker.Message) { m.Headers = map[string]string{"Nats-Rollup": "all"} },
		func(m *broker.Message) { m.Headers = map[string]string{"nats-expected-stream": "X"} },
		func(m *broker.Message) { m.Headers = map[string]string{"Authorization": "Bearer x"} },
		func(m *broker.Message) { m.Headers = map[string]string{"outbox-event-id": "x"} },
		func(m *broker.Message) { m.Headers = map[string]string{"x-delay": "1000"} },
		func(m *broker.Message) { m.Headers = map[string]string{"k": "a\r\nb"} },
		func(m *broker.Message) { m.Headers = map[string]string{"a:b": "v"} },
		func(m *broker.Message) { m.Headers = map[string]string{"big": strings.Repeat("v", 2<<20)} },
		func(m *broker.Message) { m.AggregateID = strings.Repeat("i", pgoutbox.MaxAggregateIDBytes+1) },
		func(m *broker.Message) { m.EventType = "" },
		func(m *broker.Message) { m.AggregateID = "ord-1 " },
		func(m *broker.Message) { m.AggregateID = "ord\n1" },
		func(m *broker.Message) { m.EventType = "\u3000created" },
		func(m *broker.Message) { m.AggregateType = "order\x7f" },
		func(m *broker.Message) { m.Payload = make([]byte, pgoutbox.HardMaxPayloadBytes+1) },
		func(m *broker.Message) { m.AggregateType = "" },
		func(m *broker.Message) { m.AggregateID = "" },
		func(m *broker.Message) { m.SchemaVersion = 0 },
		func(m *broker.Message) { m.SchemaVersion = -1 },
		func(m *broker.Message) { m.AggregateSequence = 0 },
		func(m *broker.Message) { m.AggregateSequence = -5 },
	}
	for i, edit := range hostile {
		m := with("a", 1, edit)
		if err := broker.CheckMessage(&m); err == nil || !broker.IsPermanent(err) {
			t.Errorf("case %d: CheckMessage = %v, want a permanent refusal", i, err)
		}
	}

	rec := &brokertest.Recorder{}
	bad := with("bad", 1, hostile[0])
	msgs := []broker.Message{msg("good", 1), bad, msg("bad", 2), msg("good", 2), msg("other", 1), msg("other", 2)}
	refused := make([]error, len(msgs))
	refused[4] = errors.New("undecodable")
	results := broker.PublishValid(context.Background(), rec, msgs, refused)
	want := []string{"", "permanent", "predecessor", "", "permanent", "predecessor"}
	for i, err := range results {
		var got string
		switch {
		case err == nil:
		case errors.Is(err, broker.ErrPredecessorFailed):
			got = "predecessor"
		case broker.IsPermanent(err):
			got = "permanent"
		default:
			got = err.Error()
		}
		if got != want[i] {
			t.Errorf("message %d: %q, want %q", i, got, want[i])
		}
	}
	if n := len(rec.Messages()); n != 2 {
		t.Errorf("%d messages published, want the 2 valid ones", n)
	}
}

// A reserved producer header that reaches the wire headers anyway is left out.
func TestWireHeadersLeaveOutReservedNames(t *testing.T) {
	t.Parallel()
	m := msg("a", 1)
	m.Headers = map[string]string{"Nats-Rollup": "all", "authorization": "x", "X-Death": "x", "Outbox-Event-Id": "spoof",
		"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "tenant": "acme"}
	h := m.WireHeaders()
	for k := range h {
		if _, reserved := pgoutbox.ReservedHeader(k); reserved && !strings.HasPrefix(k, "Outbox-") {
			t.Errorf("reserved header %s on the wire", k)
		}
	}
	if h[wire.HeaderEventID] != m.EventID.String() || h["tenant"] != "acme" || h["traceparent"] == "" {
		t.Errorf("wire headers %v", h)
	}
}
