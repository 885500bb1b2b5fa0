package inboxtest

import (
	"bytes"
	"context"
	"maps"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/pgoutbox"
	"github.com/pgoutbox/pgoutbox/broker"
	"github.com/pgoutbox/pgoutbox/inbox"
	"github.com/pgoutbox/pgoutbox/internal/wait"
	"github.com/pgoutbox/pgoutbox/wire"
)

// cloudEventsSettle bounds the wait for the CloudEvents case's events.
const cloudEventsSettle = time.Minute

// Publisher returns the broker adapter, configured with enc, that publishes to
// the destination a subscriber reads. The case closes it.
type Publisher func(t *testing.T, enc wire.Encoding) broker.Publisher

// publishAll publishes msgs through a new adapter with enc, each acknowledged.
func publishAll(t *testing.T, newPublisher Publisher, enc wire.Encoding, msgs ...broker.Message) {
	t.Helper()
	p := newPublisher(t, enc)
	defer func() { _ = p.Close() }()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for i, err := range p.Publish(ctx, msgs) {
		if err != nil {
			t.Fatalf("publish event %d: %v", i, err)
		}
	}
}

// CloudEvents is the case of a subscriber fed in the CloudEvents format: three
// events of one aggregate published by the adapter with
// wire.FormatCloudEvents, then the second again in the default format (a
// re-publish, as after a format change). The consumer applies the three once
// each, in order, the re-publish is a duplicate, and the handler sees each
// event as it was published. start starts a subscriber of the destination for
// proc, stopped when the test ends.
func CloudEvents(t *testing.T, e *Effects, publish Publisher, start func(t *testing.T, proc inbox.Processor)) {
	t.Helper()
	msgs := Lane("ce-1", 3)
	for i := range msgs {
		msgs[i].SchemaVersion = 2
		msgs[i].Headers = map[string]string{"Tenant": "acme", wire.HeaderTraceParent: "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}
	}
	byID := map[pgoutbox.UUID]broker.Message{}
	for _, m := range msgs {
		byID[m.EventID] = m
	}
	var mu sync.Mutex
	var mismatches []string
	c := e.Consumer(t, inbox.Config{}, func(ctx context.Context, tx pgx.Tx, ev inbox.Event) error {
		m, ok := byID[ev.EventID]
		if !ok || ev.AggregateType != m.AggregateType || ev.AggregateID != m.AggregateID ||
			ev.AggregateSequence != m.AggregateSequence || ev.EventType != m.EventType ||
			ev.PublishedSchemaVersion != m.SchemaVersion || !ev.OccurredAt.Equal(m.OccurredAt) ||
			!bytes.Equal(ev.Payload, m.Payload) || !maps.Equal(ev.Headers, m.Headers) {
			mu.Lock()
			mismatches = append(mismatches, ev.EventID.String())
			mu.Unlock()
			t.Errorf("the handler saw %+v, want the published %+v", ev, m)
		}
		return e.Record(ctx, tx, ev)
	})
	publishAll(t, publish, wire.Encoding{Format: wire.FormatCloudEvents, CloudEventsSource: "/pgoutbox/" + e.Schema}, msgs...)
	again := msgs[1]
	again.DedupID = again.EventID.String() + "-again"
	publishAll(t, publish, wire.Encoding{}, again)
	start(t, c)
	wait.For(t, cloudEventsSettle, "3 events applied and the re-publish found a duplicate", func() bool {
		st := c.Stats()
		return st.Applied == 3 && st.Duplicates == 1
	})
	if st := c.Stats(); st.Undecodable != 0 || st.Failed != 0 {
		t.Errorf("inbox stats %+v, want no undecodable or failed delivery", st)
	}
	if n := e.Count(t, "effects", "true"); n != 3 {
		t.Errorf("%d effects, want 3", n)
	}
	if got := e.Sequences(t, "ce-1"); len(got) != 3 || got[0] != 1 || got[1] != 2 || got[2] != 3 {
		t.Errorf("applied sequences %v, want [1 2 3]", got)
	}
}
