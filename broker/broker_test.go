package broker_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pgoutbox/pgoutbox"
	"github.com/pgoutbox/pgoutbox/broker"
	"github.com/pgoutbox/pgoutbox/wire"
)

func msg(agg string, seq int64) broker.Message {
	return broker.Message{EventID: pgoutbox.NewEventID(), AggregateType: "t", AggregateID: agg, AggregateSequence: seq,
		EventType: "e", SchemaVersion: 1, OccurredAt: time.Now(), Payload: []byte(`{}`)}
}

// Within a lane, k+1 is sent only after k's ack; a failure stops the lane; other
// lanes go on.
func TestPublishLanesOrderAndFailure(t *testing.T) {
	for name, publish := range publishers {
		t.Run(name, func(t *testing.T) { testOrderAndFailure(t, publish) })
	}
}

type publishFunc func(context.Context, []broker.Message, func(context.Context, *broker.Message) (broker.AckFunc, error)) []error

var publishers = map[string]publishFunc{
	"concurrent": broker.PublishLanes,
	"in-order": func(ctx context.Context, msgs []broker.Message, send func(context.Context, *broker.Message) (broker.AckFunc, error)) []error {
		return broker.PublishLanesInOrder(ctx, msgs, 2, send)
	},
}

func testOrderAndFailure(t *testing.T, publish publishFunc) {
	msgs := []broker.Message{msg("a", 1), msg("b", 1), msg("a", 2), msg("b", 2), msg("a", 3), msg("c", 1)}
	var mu sync.Mutex
	var sent []string
	acked := map[string]bool{}
	send := func(_ context.Context, m *broker.Message) (broker.AckFunc, error) {
		key := fmt.Sprintf("%s%d", m.AggregateID, m.AggregateSequence)
		mu.Lock()
		defer mu.Unlock()
		if m.AggregateSequence > 1 && !acked[fmt.Sprintf("%s%d", m.AggregateID, m.AggregateSequence-1)] {
			t.Errorf("%s sent before its predecessor's ack", key)
		}
		sent = append(sent, key)
		if key == "c1" {
			return nil, broker.Permanent(errors.New("refused"))
		}
		return func(context.Context) error {
			if key == "b1" {
				return errors.New("nack")
			}
			mu.Lock()
			acked[key] = true
			mu.Unlock()
			return nil
		}, nil
	}
	res := publish(context.Background(), msgs, send)
	want := []string{"<nil>", "nack", "<nil>", broker.ErrPredecessorFailed.Error(), "<nil>", "refused"}
	for i, err := range res {
		if fmt.Sprint(err) != want[i] {
			t.Errorf("result %d = %v, want %s", i, err, want[i])
		}
	}
	if !broker.IsPermanent(res[5]) || broker.IsPermanent(res[1]) {
		t.Error("error classes lost")
	}
	if strings.Contains(strings.Join(sent, " "), "b2") {
		t.Errorf("b2 was sent after b1 failed: %v", sent)
	}
}

// A slow ack holds back only its own lane.
func TestPublishLanesNoHeadOfLineBlocking(t *testing.T) {
	msgs := []broker.Message{msg("slow", 1), msg("fast", 1), msg("fast", 2), msg("fast", 3)}
	fastDone := make(chan struct{})
	send := func(_ context.Context, m *broker.Message) (broker.AckFunc, error) {
		if m.AggregateID == "slow" {
			return func(context.Context) error { <-fastDone; return nil }, nil
		}
		if m.AggregateSequence == 3 {
			return func(context.Context) error { close(fastDone); return nil }, nil
		}
		return func(context.Context) error { return nil }, nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for i, err := range broker.PublishLanes(ctx, msgs, send) {
		if err != nil {
			t.Fatalf("result %d: %v (the fast lane waited for the slow ack)", i, err)
		}
	}
}

// PublishLanesInOrder keeps at most maxInFlight messages unacknowledged, waits for
// acks oldest first, and still lets every lane finish.
func TestPublishLanesInOrderBoundsInFlight(t *testing.T) {
	var msgs []broker.Message
	for a := range 7 {
		for seq := range int64(4) {
			msgs = append(msgs, msg(fmt.Sprint("agg", a), seq+1))
		}
	}
	inFlight, most, acks := 0, 0, 0
	var order []string
	send := func(_ context.Context, m *broker.Message) (broker.AckFunc, error) {
		inFlight++
		most = max(most, inFlight)
		key := fmt.Sprintf("%s/%d", m.AggregateID, m.AggregateSequence)
		order = append(order, key)
		return func(context.Context) error {
			inFlight--
			acks++
			return nil
		}, nil
	}
	for i, err := range broker.PublishLanesInOrder(context.Background(), msgs, 3, send) {
		if err != nil {
			t.Fatalf("result %d: %v", i, err)
		}
	}
	if most != 3 || acks != len(msgs) {
		t.Fatalf("at most %d in flight (want 3), %d acks (want %d)", most, acks, len(msgs))
	}
	// The heads of all lanes go first, in order of appearance.
	if got := strings.Join(order[:7], " "); got != "agg0/1 agg1/1 agg2/1 agg3/1 agg4/1 agg5/1 agg6/1" {
		t.Fatalf("first sends %s", got)
	}
}

func TestPublishLanesCancelled(t *testing.T) {
	for name, publish := range publishers {
		t.Run(name, func(t *testing.T) { testCancelled(t, publish) })
	}
}

func testCancelled(t *testing.T, publish publishFunc) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	res := publish(ctx, []broker.Message{msg("a", 1), msg("a", 2)}, func(context.Context, *broker.Message) (broker.AckFunc, error) {
		t.Fatal("sent with a cancelled context")
		return nil, nil
	})
	if !errors.Is(res[0], context.Canceled) || !errors.Is(res[1], broker.ErrPredecessorFailed) {
		t.Fatalf("results %v", res)
	}
	if !broker.IsUnavailable(context.DeadlineExceeded) || !broker.IsUnavailable(fmt.Errorf("x: %w", broker.Unavailable(errors.New("down")))) {
		t.Error("IsUnavailable")
	}
}

func TestFailAll(t *testing.T) {
	t.Parallel()
	down := broker.Unavailable(errors.New("down"))
	res := broker.FailAll([]broker.Message{msg("a", 1), msg("b", 1), msg("a", 2)}, down)
	if len(res) != 3 || res[0] != down || res[1] != down || res[2] != down {
		t.Fatalf("results %v, want the error once per message", res)
	}
	if res := broker.FailAll(nil, down); len(res) != 0 {
		t.Fatalf("no messages: results %v", res)
	}
}

func TestWireHeadersRoundTrip(t *testing.T) {
	m := msg("42", 7)
	m.SchemaVersion = 3
	m.Headers = map[string]string{"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "tenant": "acme",
		"outbox-event-id": "spoofed", "OUTBOX-AGGREGATE-ID": "spoofed"}
	h := m.WireHeaders()
	if len(h) != 9 {
		t.Fatalf("headers %v: want the 7 Outbox-* and 2 producer headers", h)
	}
	// The iterator yields the same headers, each once, within WireHeaderCount,
	// and stops when told to.
	seen := map[string]string{}
	for k, v := range m.AllWireHeaders() {
		if _, dup := seen[k]; dup {
			t.Fatalf("AllWireHeaders yields %s twice", k)
		}
		seen[k] = v
	}
	if !maps.Equal(seen, h) || len(seen) > m.WireHeaderCount() {
		t.Fatalf("AllWireHeaders %v, WireHeaderCount %d; WireHeaders %v", seen, m.WireHeaderCount(), h)
	}
	for stop := 1; stop <= len(h); stop++ {
		n := 0
		for range m.AllWireHeaders() {
			if n++; n == stop {
				break
			}
		}
		if n != stop {
			t.Fatalf("break after %d headers: %d yielded", stop, n)
		}
	}
	names := make([]string, 0, len(h))
	for k := range h {
		names = append(names, k)
	}
	back, err := wire.ParseOutboxHeaders(m.Payload, names, func(n string) string { return h[n] })
	if err != nil {
		t.Fatal(err)
	}
	if back.EventID != m.EventID || back.AggregateID != "42" || back.AggregateSequence != 7 || back.SchemaVersion != 3 ||
		!back.OccurredAt.Equal(m.OccurredAt) || back.Headers["tenant"] != "acme" || back.Headers["traceparent"] == "" {
		t.Fatalf("round trip: %+v", back)
	}
	for _, missing := range []string{wire.HeaderEventID, wire.HeaderAggregateSequence, wire.HeaderOccurredAt} {
		_, err := wire.ParseOutboxHeaders(nil, nil, func(n string) string {
			if n == missing {
				return ""
			}
			return h[n]
		})
		if err == nil {
			t.Errorf("parsed without %s", missing)
		}
	}
}

func TestTemplate(t *testing.T) {
	m := msg("42", 1)
	m.AggregateType, m.EventType, m.SchemaVersion, m.Tenant = "order", "order.paid", 2, "acme"
	for tmpl, want := range map[string]string{
		"outbox.{aggregate_type}.{event_type}": "outbox.order.order.paid",
		"outbox.{tenant}.{aggregate_type}":     "outbox.acme.order",
		"{aggregate_type}":                     "order",
		"v{schema_version}/{aggregate_id}":     "v2/42",
		"static":                               "static",
	} {
		got, err := broker.ParseTemplate(tmpl)
		if err != nil || got.Expand(&m) != want || got.String() != tmpl {
			t.Errorf("%s: %q, %v; want %q", tmpl, got.Expand(&m), err, want)
		}
		if uses := strings.Contains(tmpl, "{tenant}"); got.Uses("tenant") != uses {
			t.Errorf("%s: Uses(tenant) = %v", tmpl, !uses)
		}
	}
	// A message without a tenant cannot fill {tenant}: refused, never sent to
	// a destination another tenant's events share.
	m.Tenant = ""
	if _, err := broker.MustParseTemplate("outbox.{tenant}.{aggregate_type}").ExpandChecked(&m); !errors.Is(err, broker.ErrAmbiguousDestination) {
		t.Errorf("ExpandChecked without a tenant: %v", err)
	}
	for _, bad := range []string{"", "x.{aggregate", "x.{payload}", "{}"} {
		if _, err := broker.ParseTemplate(bad); err == nil {
			t.Errorf("ParseTemplate(%q) accepted", bad)
		}
	}
}

func FuzzTemplate(f *testing.F) {
	for _, s := range []string{"outbox.{aggregate_type}.{event_type}", "{", "}{", "a{schema_version}b", "{{aggregate_id}}"} {
		f.Add(s)
	}
	m := msg("id", 1)
	f.Fuzz(func(t *testing.T, s string) {
		tmpl, err := broker.ParseTemplate(s)
		if err != nil {
			return
		}
		// Literal text survives expansion; a template without braces expands to itself.
		if !strings.ContainsAny(s, "{}") && tmpl.Expand(&m) != s {
			t.Fatalf("%q expanded to %q", s, tmpl.Expand(&m))
		}
	})
}

// collisionValues are values meant to make distinct fields share a destination:
// separators, wildcards, spaces, unicode, empty segments.
var collisionValues = []string{"a", "b", "c", "a.b", "b.c", "a.b.c", ".", "..", "a.", ".a", "a*", "*", "a>", ">",
	"a b", " ", "ä", "ä.ö", "日本", "a-b", "b-c", "a_b", "a/b", "b/c", "", "1", "2", "1.2"}

// Distinct (aggregate type, event type, ...) values never share a destination:
// whatever ExpandChecked accepts, it accepts for one tuple only.
func TestExpandCheckedIsInjective(t *testing.T) {
	for _, tmplText := range []string{
		"outbox.{aggregate_type}.{event_type}", // NATS
		"{aggregate_type}.{event_type}",        // RabbitMQ
		"outbox.{aggregate_type}",              // Kafka
		"outbox-{aggregate_type}-{event_type}", // Kafka with dashes
		"x.{aggregate_type}.{aggregate_id}.{event_type}.v{schema_version}",
		"/hooks/{aggregate_type}/{event_type}", // webhook path
		"{aggregate_type}{aggregate_type}.{event_type}",
		"{event_type}.{aggregate_type}",
	} {
		tmpl := broker.MustParseTemplate(tmplText)
		seen := map[string][3]string{}
		accepted, refused := 0, 0
		for _, at := range collisionValues {
			for _, id := range []string{"1", "1.2", "x"} {
				for _, et := range collisionValues {
					m := msg(id, 1)
					m.AggregateType, m.EventType = at, et
					got, err := tmpl.ExpandChecked(&m)
					if err != nil {
						if !errors.Is(err, broker.ErrAmbiguousDestination) {
							t.Fatalf("%s: %q/%q: %v, want ErrAmbiguousDestination", tmplText, at, et, err)
						}
						refused++
						continue
					}
					accepted++
					key := [3]string{}
					for i, f := range []string{"{aggregate_type}", "{aggregate_id}", "{event_type}"} {
						if strings.Contains(tmplText, f) {
							key[i] = []string{at, id, et}[i]
						}
					}
					if prev, ok := seen[got]; ok && prev != key {
						t.Fatalf("%s: %q and %q both map to %q", tmplText, prev, key, got)
					}
					seen[got] = key
				}
			}
		}
		t.Logf("%s: %d accepted, %d refused", tmplText, accepted, refused)
	}
	// The pairs of the issue: one of each is refused.
	tmpl := broker.MustParseTemplate("outbox.{aggregate_type}.{event_type}")
	for _, pair := range [][2][2]string{{{"a.b", "c"}, {"a", "b.c"}}, {{"a.b.c", "d"}, {"a", "b.c.d"}}} {
		m1, m2 := msg("1", 1), msg("1", 1)
		m1.AggregateType, m1.EventType = pair[0][0], pair[0][1]
		m2.AggregateType, m2.EventType = pair[1][0], pair[1][1]
		_, err1 := tmpl.ExpandChecked(&m1)
		got2, err2 := tmpl.ExpandChecked(&m2)
		if err1 == nil || err2 != nil || got2 != "outbox."+pair[1][0]+"."+pair[1][1] {
			t.Errorf("%v: %v; %q, %v", pair, err1, got2, err2)
		}
	}
}

func TestTemplateRefusesAdjacentPlaceholders(t *testing.T) {
	for _, bad := range []string{"{aggregate_type}{event_type}", "x.{aggregate_id}{schema_version}", "{event_type}{aggregate_type}.x"} {
		if _, err := broker.ParseTemplate(bad); err == nil {
			t.Errorf("ParseTemplate(%q) accepted placeholders with nothing between them", bad)
		}
	}
}

// FuzzExpandChecked: two messages with the same accepted destination have the
// same values in it.
func FuzzExpandChecked(f *testing.F) {
	f.Add("outbox.{aggregate_type}.{event_type}", "a.b", "c", "a", "b.c")
	f.Add("{aggregate_type}-{event_type}", "a-b", "c", "a", "b-c")
	f.Add("{aggregate_type}.{event_type}", "a", "", "", "a")
	f.Add("x.{aggregate_type}..{event_type}", "a.", ".b", "a", "..b")
	f.Fuzz(func(t *testing.T, tmplText, at1, et1, at2, et2 string) {
		tmpl, err := broker.ParseTemplate(tmplText)
		if err != nil {
			return
		}
		m1, m2 := msg("id", 1), msg("id", 1)
		m1.AggregateType, m1.EventType = at1, et1
		m2.AggregateType, m2.EventType = at2, et2
		d1, err1 := tmpl.ExpandChecked(&m1)
		d2, err2 := tmpl.ExpandChecked(&m2)
		if err1 != nil || err2 != nil || d1 != d2 {
			return
		}
		if strings.Contains(tmplText, "{aggregate_type}") && at1 != at2 || strings.Contains(tmplText, "{event_type}") && et1 != et2 {
			t.Fatalf("%q: %q/%q and %q/%q both expand to %q", tmplText, at1, et1, at2, et2, d1)
		}
	})
}
