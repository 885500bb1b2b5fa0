package relay_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/pgoutbox"
	"github.com/pgoutbox/pgoutbox/broker"
	"github.com/pgoutbox/pgoutbox/broker/brokertest"
	"github.com/pgoutbox/pgoutbox/internal/pgtest"
	"github.com/pgoutbox/pgoutbox/internal/wait"
	"github.com/pgoutbox/pgoutbox/relay"
)

// routedEvent is an event a routing test wrote, as the destinations' rules
// see it.
type routedEvent struct {
	id            pgoutbox.UUID
	aggregateType string
	eventType     string
	headers       map[string]string
}

// enqueueRouted writes perAgg events to each of the test's aggregates,
// interleaved: orders (order.created, then order.paid, every third one with
// region=eu), users (user.changed, every second one region=eu) and misc
// (misc.noted, region=eu on every fourth: the others match no rule of
// routedDests).
func (o *outbox) enqueueRouted(t testing.TB, perAgg int) []routedEvent {
	t.Helper()
	var evs []pgoutbox.Event
	for s := range perAgg {
		for a := range 4 {
			e := pgoutbox.Event{AggregateType: "order", AggregateID: fmt.Sprintf("o%d", a), EventType: "order.created", Payload: map[string]int{"n": s}}
			if s%2 == 1 {
				e.EventType = "order.paid"
			}
			if s%3 == 0 {
				e.Headers = map[string]string{"region": "eu"}
			}
			evs = append(evs, e)
		}
		for a := range 3 {
			e := pgoutbox.Event{AggregateType: "user", AggregateID: fmt.Sprintf("u%d", a), EventType: "user.changed", Payload: map[string]int{"n": s}}
			if s%2 == 0 {
				e.Headers = map[string]string{"region": "eu"}
			}
			evs = append(evs, e)
		}
		e := pgoutbox.Event{AggregateType: "misc", AggregateID: "m0", EventType: "misc.noted", Payload: map[string]int{"n": s}}
		if s%4 == 0 {
			e.Headers = map[string]string{"region": "eu"}
		}
		evs = append(evs, e)
	}
	res, err := o.prod.EnqueueTx(context.Background(), o.pool, evs...)
	pgtest.Must(t, err, "enqueue")
	out := make([]routedEvent, len(evs))
	for i, e := range evs {
		out[i] = routedEvent{id: res[i].EventID, aggregateType: e.AggregateType, eventType: e.EventType, headers: e.Headers}
	}
	return out
}

// routedRules are the rules of the three destinations of the routing tests:
// orders takes every order event, users every user event, eu every event
// with region=eu.
var routedRules = map[string][]relay.Rule{
	"orders": {{AggregateTypes: []string{"order"}}},
	"users":  {{AggregateTypes: []string{"user"}, EventTypes: []string{"user.changed"}}},
	"eu":     {{Headers: map[string]string{"region": "eu"}}},
}

// routedDests are the three destinations on the given publishers.
func routedDests(start relay.Start, orders, users, eu broker.Publisher) []relay.Destination {
	return []relay.Destination{
		{Name: "orders", Publisher: orders, Rules: routedRules["orders"], Start: start},
		{Name: "users", Publisher: users, Rules: routedRules["users"], Start: start},
		{Name: "eu", Publisher: eu, Rules: routedRules["eu"], Start: start},
	}
}

// wantFor returns the ids of evs the destination's rules take.
func wantFor(name string, evs []routedEvent) []pgoutbox.UUID {
	d := relay.Destination{Rules: routedRules[name]}
	var ids []pgoutbox.UUID
	for _, e := range evs {
		if d.Match(e.aggregateType, e.eventType, e.headers) {
			ids = append(ids, e.id)
		}
	}
	return ids
}

// unrouted returns the ids of evs no destination takes.
func unrouted(evs []routedEvent) []pgoutbox.UUID {
	var ids []pgoutbox.UUID
	for _, e := range evs {
		taken := false
		for name := range routedRules {
			d := relay.Destination{Rules: routedRules[name]}
			taken = taken || d.Match(e.aggregateType, e.eventType, e.headers)
		}
		if !taken {
			ids = append(ids, e.id)
		}
	}
	return ids
}

// checkRouted asserts what a destination received: every id of want, no
// other event, and per aggregate the first appearances in ascending sequence
// order. It returns the number of duplicates.
func checkRouted(t testing.TB, dest string, got []broker.Message, want []pgoutbox.UUID) (duplicates int) {
	t.Helper()
	wanted := make(map[pgoutbox.UUID]bool, len(want))
	for _, id := range want {
		wanted[id] = true
	}
	seen := map[pgoutbox.UUID]bool{}
	last := map[pgoutbox.Lane]int64{}
	for _, m := range got {
		if !wanted[m.EventID] {
			t.Fatalf("%s received event %s (%s seq %d), which its rules do not take", dest, m.EventID, m.Lane(), m.AggregateSequence)
		}
		if seen[m.EventID] {
			duplicates++
			continue
		}
		seen[m.EventID] = true
		if m.AggregateSequence <= last[m.Lane()] {
			t.Fatalf("%s: order violated on %s: sequence %d first appeared after %d", dest, m.Lane(), m.AggregateSequence, last[m.Lane()])
		}
		last[m.Lane()] = m.AggregateSequence
	}
	if len(seen) != len(wanted) {
		t.Fatalf("%s received %d of its %d events", dest, len(seen), len(wanted))
	}
	return duplicates
}

// received reports whether rec holds every id of want.
func received(rec *brokertest.Recorder, want []pgoutbox.UUID) bool {
	seen := map[pgoutbox.UUID]bool{}
	for _, m := range rec.Messages() {
		seen[m.EventID] = true
	}
	for _, id := range want {
		if !seen[id] {
			return false
		}
	}
	return true
}

// startRouted starts a relay with destinations, stopped when the test ends.
func startRouted(t testing.TB, o *outbox, cfg relay.Config) *relay.Relay {
	t.Helper()
	return startRelay(t, o, nil, cfg)
}

// lanes returns the destination's progress rows: lane → delivered_sequence.
func (o *outbox) lanes(t testing.TB, dest string) map[string]int64 {
	t.Helper()
	rows, err := o.pool.Query(context.Background(), "SELECT aggregate_type || '/' || aggregate_id, delivered_sequence FROM "+
		pgx.Identifier{o.schema, "outbox_destination_lanes"}.Sanitize()+" WHERE destination = $1", dest)
	pgtest.Must(t, err, "read lanes")
	out := map[string]int64{}
	for rows.Next() {
		var lane string
		var seq int64
		pgtest.Must(t, rows.Scan(&lane, &seq), "scan")
		out[lane] = seq
	}
	pgtest.Must(t, rows.Err(), "read lanes")
	return out
}

// Three destinations with different rules, events of several aggregates:
// each destination gets exactly its events, in order per aggregate; an event
// no rule takes is a dead letter in outbox_events; every other event is
// published once all destinations passed it.
func TestDestinationsRouteEachItsEvents(t *testing.T) {
	t.Parallel()
	o := newOutbox(t, 16)
	evs := o.enqueueRouted(t, 20)
	orders, users, eu := &brokertest.Recorder{Jitter: 100 * time.Microsecond}, &brokertest.Recorder{}, &brokertest.Recorder{}
	r := startRouted(t, o, relay.Config{Destinations: routedDests(relay.StartBackfill, orders, users, eu),
		BatchSize: 20, RunLength: 3, PollInterval: 50 * time.Millisecond})
	dead := unrouted(evs)
	wait.For(t, 60*time.Second, "every routed event published and the others dead letters", func() bool {
		return o.count(t, "published_at IS NULL AND quarantined_at IS NULL") == 0
	})
	checkRouted(t, "orders", orders.Messages(), wantFor("orders", evs))
	checkRouted(t, "users", users.Messages(), wantFor("users", evs))
	checkRouted(t, "eu", eu.Messages(), wantFor("eu", evs))
	if n := o.count(t, "quarantined_at IS NOT NULL AND last_error = 'routed to no destination: no rule of orders, users, eu matches it'"); n != len(dead) || n == 0 {
		t.Fatalf("%d dead letters for no rule, want %d", n, len(dead))
	}
	if n := o.count(t, "published_at IS NOT NULL"); n != len(evs)-len(dead) {
		t.Fatalf("%d events published, want %d", n, len(evs)-len(dead))
	}
	if err := r.Healthy(); err != nil {
		t.Fatalf("Healthy: %v", err)
	}
	t.Logf("stats %+v", r.Stats())
}

var errBroken = errors.New("routed test: this destination is broken")

// switchable fails every message while broken is set (a permanent error
// when permanent, else an error counted towards quarantine).
type switchable struct {
	brokertest.Recorder
	mu     sync.Mutex
	broken func(m *broker.Message) error
}

func newSwitchable() *switchable {
	s := &switchable{}
	s.Fail = func(m *broker.Message) error {
		s.mu.Lock()
		defer s.mu.Unlock()
		if s.broken != nil {
			return s.broken(m)
		}
		return nil
	}
	return s
}

func (s *switchable) set(f func(m *broker.Message) error) {
	s.mu.Lock()
	s.broken = f
	s.mu.Unlock()
}

var _ = slices.Contains[[]string]
