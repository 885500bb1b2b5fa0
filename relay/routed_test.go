package relay_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/pgoutbox"
	"github.com/pgoutbox/pgoutbox/broker"
	"github.com/pgoutbox/pgoutbox/broker/brokertest"
	"github.com/pgoutbox/pgoutbox/internal/pgtest"
	"github.com/pgoutbox/pgoutbox/internal/wait"
	"github.com/pgoutbox/pgoutbox/migrate"
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

// fastRetry is a routed relay's config for tests that break a destination:
// failed lanes are retried within milliseconds.
func fastRetry(dests []relay.Destination) relay.Config {
	return relay.Config{Destinations: dests, BatchSize: 20, RunLength: 3, PollInterval: 50 * time.Millisecond,
		BackoffBase: 10 * time.Millisecond, BackoffMax: 100 * time.Millisecond}
}

// One destination down (its broker unreachable): the two others deliver
// everything while it has its events pending, and no event it takes counts
// as done; Healthy names it. Healed, it catches up in order, and every event
// is done.
func TestDestinationDownHoldsBackOnlyItself(t *testing.T) {
	t.Parallel()
	o := newOutbox(t, 16)
	evs := o.enqueueRouted(t, 12)
	orders, users, eu := &brokertest.Recorder{}, &brokertest.Recorder{}, &brokertest.Recorder{}
	eu.Down.Store(true)
	r := startRouted(t, o, fastRetry(routedDests(relay.StartBackfill, orders, users, eu)))
	wait.For(t, 60*time.Second, "orders and users to receive all their events", func() bool {
		return received(orders, wantFor("orders", evs)) && received(users, wantFor("users", evs))
	})
	// Every lane's first event has region=eu: nothing is done while eu is down.
	if n := o.count(t, "published_at IS NOT NULL"); n != 0 {
		t.Fatalf("%d events published while the eu destination had not passed them", n)
	}
	if len(eu.Messages()) != 0 {
		t.Fatal("the eu destination received messages while down")
	}
	wait.For(t, 30*time.Second, "Healthy to name the unreachable destination", func() bool {
		err := r.Healthy()
		return errors.Is(err, relay.ErrBrokerUnreachable) && strings.Contains(err.Error(), `destination "eu"`)
	})
	if n := o.count(t, "quarantined_at IS NOT NULL AND last_error NOT LIKE 'routed to no destination: %'"); n != 0 {
		t.Fatalf("%d events quarantined for an outage", n)
	}

	eu.Down.Store(false)
	wait.For(t, 60*time.Second, "every event done once eu is back", func() bool {
		return o.count(t, "published_at IS NULL AND quarantined_at IS NULL") == 0
	})
	checkRouted(t, "orders", orders.Messages(), wantFor("orders", evs))
	checkRouted(t, "users", users.Messages(), wantFor("users", evs))
	checkRouted(t, "eu", eu.Messages(), wantFor("eu", evs))
	wait.For(t, 30*time.Second, "Healthy once eu is back", func() bool { return r.Healthy() == nil })
}

// A permanent refusal by one destination quarantines that destination's lane
// alone, at the refused event: its other lanes, and the other destinations
// on that same lane, go on. An operator's retry of the lane (what dlq retry
// does) resumes it in order.
func TestDestinationQuarantineBlocksOnlyItsLane(t *testing.T) {
	t.Parallel()
	o := newOutbox(t, 16)
	evs := o.enqueueRouted(t, 8)
	orders, eu := &brokertest.Recorder{}, &brokertest.Recorder{}
	users := newSwitchable()
	users.set(func(m *broker.Message) error {
		if m.AggregateID == "u1" && m.AggregateSequence == 3 {
			return broker.Permanent(errors.New("refused: u1 seq 3"))
		}
		return nil
	})
	startRouted(t, o, fastRetry(routedDests(relay.StartBackfill, orders, users, eu)))
	lanesTable := pgx.Identifier{o.schema, "outbox_destination_lanes"}.Sanitize()
	wait.For(t, 60*time.Second, "users' lane u1 quarantined, the rest delivered", func() bool {
		var n int
		pgtest.Must(t, o.pool.QueryRow(context.Background(), "SELECT count(*) FROM "+lanesTable+
			" WHERE destination = 'users' AND aggregate_id = 'u1' AND quarantined_at IS NOT NULL AND quarantined_sequence = 3"+
			" AND delivered_sequence = 2 AND last_error LIKE '%refused: u1 seq 3%'").Scan(&n), "read lane")
		return n == 1 && received(orders, wantFor("orders", evs)) && received(eu, wantFor("eu", evs)) &&
			o.count(t, "published_at IS NULL AND quarantined_at IS NULL") == 6 // u1 seq 3..8
	})
	var u1 []int64
	for _, m := range users.Messages() {
		if m.AggregateID == "u1" {
			u1 = append(u1, m.AggregateSequence)
		}
	}
	if !slices.Equal(u1, []int64{1, 2}) {
		t.Fatalf("users received u1 sequences %v, want [1 2]", u1)
	}
	// The attempt history has the refusal, with the destination's name, on the
	// refused event alone.
	var attempts int
	var dest, errText string
	pgtest.Must(t, o.pool.QueryRow(context.Background(), "SELECT count(*), min(a.destination), min(a.error) FROM "+
		pgx.Identifier{o.schema, "outbox_attempts"}.Sanitize()+" a JOIN "+pgx.Identifier{o.schema, "outbox_events"}.Sanitize()+
		" e USING (event_id) WHERE e.aggregate_id = 'u1' AND e.aggregate_sequence = 3").Scan(&attempts, &dest, &errText), "read attempts")
	if attempts != 1 || dest != "users" || !strings.Contains(errText, "refused: u1 seq 3") {
		t.Fatalf("attempt history of u1 seq 3: %d rows, destination %q, error %q; want 1, users, the refusal", attempts, dest, errText)
	}
	var others int
	pgtest.Must(t, o.pool.QueryRow(context.Background(), "SELECT count(*) FROM "+
		pgx.Identifier{o.schema, "outbox_attempts"}.Sanitize()).Scan(&others), "count attempts")
	if others != 1 {
		t.Fatalf("%d attempt rows in all, want the one refusal", others)
	}
	if n := o.count(t, "aggregate_id <> 'u1' AND published_at IS NULL AND quarantined_at IS NULL"); n != 0 {
		t.Fatalf("%d events of other lanes not done", n)
	}

	users.set(nil)
	_, err := o.pool.Exec(context.Background(), "UPDATE "+lanesTable+
		" SET quarantined_at = NULL, quarantined_sequence = NULL, attempt_count = 0, available_at = now() WHERE destination = 'users'")
	pgtest.Must(t, err, "retry the lane")
	wait.For(t, 60*time.Second, "every event done after the retry", func() bool {
		return o.count(t, "published_at IS NULL AND quarantined_at IS NULL") == 0
	})
	checkRouted(t, "users", users.Messages(), wantFor("users", evs))
}

// StartNow takes the events committed after the destination's registration;
// StartBackfill every retained event, even those already published by the
// single-broker relay. The events before a StartNow destination are done
// once the others passed them.
func TestDestinationStartNowAndBackfill(t *testing.T) {
	t.Parallel()
	o := newOutbox(t, 16)
	// Published by a single-broker relay first.
	before := o.enqueue(t, 3, 2)
	single := &brokertest.Recorder{}
	r1 := startRelay(t, o, single, relay.Config{PollInterval: 50 * time.Millisecond})
	wait.For(t, 30*time.Second, "the single-broker relay to publish", func() bool { return o.count(t, "published_at IS NULL") == 0 })
	pgtest.Must(t, r1.Stop(context.Background()), "stop")
	pending := o.enqueue(t, 3, 1) // pending when the destinations register

	now, back := &brokertest.Recorder{}, &brokertest.Recorder{}
	r := startRouted(t, o, relay.Config{PollInterval: 50 * time.Millisecond, Destinations: []relay.Destination{
		{Name: "now", Publisher: now, Rules: []relay.Rule{{All: true}}, Start: relay.StartNow},
		{Name: "back", Publisher: back, Rules: []relay.Rule{{All: true}}, Start: relay.StartBackfill},
	}})
	wait.For(t, 30*time.Second, "the backfill", func() bool {
		return o.count(t, "published_at IS NULL") == 0 && received(back, append(slices.Clone(before), pending...))
	})
	if n := len(now.Messages()); n != 0 {
		t.Fatalf("the StartNow destination received %d events committed before its registration", n)
	}
	after := o.enqueue(t, 3, 1) // sequence 4 of a0000..a0002
	wait.For(t, 30*time.Second, "the new events", func() bool {
		return o.count(t, "published_at IS NULL") == 0 && received(now, after) && received(back, after)
	})
	checkRouted(t, "now", now.Messages(), after)
	checkRouted(t, "back", back.Messages(), slices.Concat(before, pending, after))
	t.Logf("stats %+v", r.Stats())
}

// A destination registered earlier resumes from its progress: a relay
// started again (with StartBackfill, which only a new destination heeds)
// sends it only what it did not have.
func TestDestinationResumesFromItsProgress(t *testing.T) {
	t.Parallel()
	o := newOutbox(t, 16)
	first := o.enqueue(t, 4, 3)
	rec1 := &brokertest.Recorder{}
	dests := func(pub broker.Publisher) []relay.Destination {
		return []relay.Destination{{Name: "only", Publisher: pub, Rules: []relay.Rule{{All: true}}, Start: relay.StartBackfill}}
	}
	r1 := startRouted(t, o, relay.Config{ID: "first", PollInterval: 50 * time.Millisecond, Destinations: dests(rec1)})
	wait.For(t, 30*time.Second, "the first events", func() bool { return o.count(t, "published_at IS NULL") == 0 })
	pgtest.Must(t, r1.Stop(context.Background()), "stop")
	checkRouted(t, "only", rec1.Messages(), first)

	second := o.enqueue(t, 4, 2)
	rec2 := &brokertest.Recorder{}
	startRouted(t, o, relay.Config{ID: "second", PollInterval: 50 * time.Millisecond, Destinations: dests(rec2)})
	wait.For(t, 30*time.Second, "the second events", func() bool { return o.count(t, "published_at IS NULL") == 0 })
	checkRouted(t, "only", rec2.Messages(), second) // none of the first again
	if got := o.lanes(t, "only"); got["acct/a0000"] != 5 || len(got) != 4 {
		t.Fatalf("progress %v, want 4 lanes at 5", got)
	}
}

// Two relays on the same destinations: the leases keep each (destination,
// lane) with one relay at a time, so each destination receives each of its
// events once, in order per aggregate.
func TestTwoRoutedRelaysShareTheLanes(t *testing.T) {
	t.Parallel()
	o := newOutbox(t, 32)
	evs := o.enqueueRouted(t, 30)
	orders := &brokertest.Recorder{Jitter: 200 * time.Microsecond}
	users := &brokertest.Recorder{Jitter: 200 * time.Microsecond}
	eu := &brokertest.Recorder{Jitter: 200 * time.Microsecond}
	var relays []*relay.Relay
	for i := range 2 {
		cfg := relay.Config{ID: fmt.Sprintf("r%d", i), Workers: 2, BatchSize: 7, RunLength: 2, PollInterval: 50 * time.Millisecond,
			Destinations: routedDests(relay.StartBackfill, orders, users, eu)}
		relays = append(relays, startRouted(t, o, cfg))
	}
	wait.For(t, 60*time.Second, "every event done", func() bool {
		return o.count(t, "published_at IS NULL AND quarantined_at IS NULL") == 0
	})
	for name, rec := range map[string]*brokertest.Recorder{"orders": orders, "users": users, "eu": eu} {
		if dups := checkRouted(t, name, rec.Messages(), wantFor(name, evs)); dups != 0 {
			t.Errorf("%s received %d duplicates without a lease expiring", name, dups)
		}
	}
	for _, r := range relays {
		t.Logf("%s: %+v", r.ID(), r.Stats())
	}
}

// A change of a destination's rules, at a relay's start, is recorded and
// audited (who: the relay; the old and the new rules); the same rules again
// audit nothing.
func TestDestinationRulesChangeAudited(t *testing.T) {
	t.Parallel()
	o := newOutbox(t, 8)
	rec := &brokertest.Recorder{}
	start := func(id string, rules []relay.Rule) {
		r := startRouted(t, o, relay.Config{ID: id, PollInterval: 50 * time.Millisecond, Destinations: []relay.Destination{
			{Name: "d", Publisher: rec, Rules: rules, Start: relay.StartNow}}})
		pgtest.Must(t, r.Stop(context.Background()), "stop")
	}
	start("one", []relay.Rule{{AggregateTypes: []string{"order"}}})
	start("two", []relay.Rule{{AggregateTypes: []string{"order"}}})
	start("three", []relay.Rule{{EventTypes: []string{"user.changed"}}})
	var rules string
	pgtest.Must(t, o.pool.QueryRow(context.Background(), "SELECT rules::text FROM "+
		pgx.Identifier{o.schema, "outbox_destinations"}.Sanitize()+" WHERE name = 'd'").Scan(&rules), "read rules")
	if rules != `[{"event_types": ["user.changed"]}]` {
		t.Fatalf("rules %s", rules)
	}
	rows, err := o.pool.Query(context.Background(), "SELECT actor, reason, selection->>'destination', selection->'old_rules'->0->'aggregate_types'->>0, "+
		"selection->'new_rules'->0->'event_types'->>0 FROM "+pgx.Identifier{o.schema, "outbox_operator_audit"}.Sanitize()+
		" WHERE action = 'destination_rules'")
	pgtest.Must(t, err, "read audit")
	var audits []string
	for rows.Next() {
		var actor, reason, dest, old, new string
		pgtest.Must(t, rows.Scan(&actor, &reason, &dest, &old, &new), "scan")
		audits = append(audits, actor+"|"+dest+"|"+old+"|"+new)
		if !strings.Contains(reason, "relay three") {
			t.Errorf("reason %q does not name the relay", reason)
		}
	}
	pgtest.Must(t, rows.Err(), "read audit")
	if !slices.Equal(audits, []string{"three|d|order|user.changed"}) {
		t.Fatalf("audit rows %q, want one by relay three from order to user.changed", audits)
	}
}

// Dead letters: an event no rule takes, and one whose headers column is not
// a JSON object of strings (a raw INSERT), are quarantined in outbox_events
// with the reason, never sent; the lane goes on behind them. An operator's
// retry of one after every destination passed it is quarantined again with
// what to do instead, never marked done.
func TestDestinationDeadLetters(t *testing.T) {
	t.Parallel()
	o := newOutbox(t, 8)
	res, err := o.prod.EnqueueTx(context.Background(), o.pool,
		pgoutbox.Event{AggregateType: "order", AggregateID: "o1", EventType: "order.created", Payload: 1},
		pgoutbox.Event{AggregateType: "misc", AggregateID: "o1", EventType: "misc.noted", Payload: 2},
		pgoutbox.Event{AggregateType: "order", AggregateID: "o2", EventType: "order.created", Payload: 3},
	)
	pgtest.Must(t, err, "enqueue")
	_, err = o.pool.Exec(context.Background(), "UPDATE "+o.table()+` SET headers = '{"region": 7}' WHERE event_id = $1`, res[2].EventID)
	pgtest.Must(t, err, "spoil the headers")
	res2, err := o.prod.EnqueueTx(context.Background(), o.pool,
		pgoutbox.Event{AggregateType: "order", AggregateID: "o2", EventType: "order.paid", Payload: 4})
	pgtest.Must(t, err, "enqueue")
	rec := &brokertest.Recorder{}
	startRouted(t, o, relay.Config{PollInterval: 50 * time.Millisecond, Destinations: []relay.Destination{
		{Name: "orders", Publisher: rec, Rules: routedRules["orders"], Start: relay.StartBackfill}}})
	wait.For(t, 30*time.Second, "the dead letters and the delivery", func() bool {
		return o.count(t, "published_at IS NULL AND quarantined_at IS NULL") == 0
	})
	checkRouted(t, "orders", rec.Messages(), []pgoutbox.UUID{res[0].EventID, res2[0].EventID})
	var lastErr string
	pgtest.Must(t, o.pool.QueryRow(context.Background(), "SELECT last_error FROM "+o.table()+" WHERE event_id = $1 AND quarantined_at IS NOT NULL",
		res[1].EventID).Scan(&lastErr), "read the unrouted one")
	if lastErr != "routed to no destination: no rule of orders matches it" {
		t.Fatalf("last_error %q", lastErr)
	}
	pgtest.Must(t, o.pool.QueryRow(context.Background(), "SELECT last_error FROM "+o.table()+" WHERE event_id = $1 AND quarantined_at IS NOT NULL",
		res[2].EventID).Scan(&lastErr), "read the refused one")
	if !strings.HasPrefix(lastErr, "routed to no destination: ") || !strings.Contains(lastErr, "headers are not a JSON object of strings") {
		t.Fatalf("last_error %q", lastErr)
	}

	// The operator retries both (admin's dlq retry): quarantined again, not done.
	_, err = o.pool.Exec(context.Background(), "UPDATE "+o.table()+
		" SET quarantined_at = NULL, attempt_count = 0, available_at = now() WHERE quarantined_at IS NOT NULL")
	pgtest.Must(t, err, "retry")
	wait.For(t, 30*time.Second, "the retried dead letters quarantined again", func() bool {
		return o.count(t, "quarantined_at IS NOT NULL AND last_error LIKE 'routed to no destination: retried after every destination had passed it%'") == 2
	})
	if n := o.count(t, "published_at IS NOT NULL"); n != 2 {
		t.Fatalf("%d events published, want the 2 delivered", n)
	}
	if n := len(rec.Messages()); n != 2 {
		t.Fatalf("%d messages sent, want 2", n)
	}
}

// New refuses a publisher together with destinations, and neither;
// Validate and New name a bad destination; a Group refuses destinations.
func TestDestinationsConfig(t *testing.T) {
	t.Parallel()
	o := newOutbox(t, 4)
	rec := &brokertest.Recorder{}
	good := []relay.Destination{{Name: "d", Publisher: rec, Rules: []relay.Rule{{All: true}}, Start: relay.StartNow}}
	if _, err := relay.New(o.pool, rec, &relay.Config{Schema: o.schema, Destinations: good}); err == nil ||
		!strings.Contains(err.Error(), "Config.Destinations") || !strings.Contains(err.Error(), "publisher") {
		t.Fatalf("publisher and destinations: %v", err)
	}
	if _, err := relay.New(o.pool, nil, &relay.Config{Schema: o.schema}); err == nil || !strings.Contains(err.Error(), "publisher") {
		t.Fatalf("neither: %v", err)
	}
	if _, err := relay.New(o.pool, nil, nil); err == nil {
		t.Fatal("a nil config and no publisher accepted")
	}
	for _, bad := range [][]relay.Destination{
		{{Name: "Bad Name", Publisher: rec, Rules: []relay.Rule{{All: true}}, Start: relay.StartNow}},
		{{Name: "d", Publisher: rec, Rules: []relay.Rule{{All: true}}}},
		{{Name: "d", Publisher: rec, Start: relay.StartNow}},
		{good[0], good[0]},
	} {
		cfg := &relay.Config{Schema: o.schema, Destinations: bad}
		err := cfg.Validate()
		if !errors.Is(err, relay.ErrInvalidDestination) || !strings.Contains(err.Error(), "Config.Destinations") {
			t.Errorf("Validate(%+v): %v", bad, err)
		}
		if _, err := relay.New(o.pool, nil, cfg); !errors.Is(err, relay.ErrInvalidDestination) {
			t.Errorf("New(%+v): %v", bad, err)
		}
	}
	_, err := relay.NewGroup(rec, &relay.GroupConfig{Config: relay.Config{Destinations: good}, Databases: []relay.Database{{Pool: o.pool}}})
	if err == nil || !strings.Contains(err.Error(), "does not support destinations") {
		t.Fatalf("NewGroup with destinations: %v", err)
	}
}

// A relay with destinations follows the one lifecycle rule; a stop whose
// deadline passes while a publish is held turns hard, and the held lane's
// lease is released without counting an attempt or moving the cursor.
func TestRoutedRelayLifecycle(t *testing.T) {
	t.Parallel()
	heldLifecycle(t, func(o *outbox, pub *gatePublisher) (*relay.Relay, error) {
		return relay.New(o.pool, nil, &relay.Config{Schema: o.schema, Logger: quietLogger(), PollInterval: 50 * time.Millisecond,
			Destinations: []relay.Destination{{Name: "held", Publisher: pub, Rules: []relay.Rule{{All: true}}, Start: relay.StartNow}}})
	}, "the held lane's lease released", func(t *testing.T, o *outbox) bool {
		var n int
		pgtest.Must(t, o.pool.QueryRow(context.Background(), "SELECT count(*) FROM "+
			pgx.Identifier{o.schema, "outbox_destination_lanes"}.Sanitize()+
			" WHERE claimed_by IS NULL AND attempt_count = 0 AND delivered_sequence = 0").Scan(&n), "count")
		return n == 1
	})
}

// A relay with destinations needs no more than the relay role's grants
// (pgoutbox migrate print --grants): it registers a destination of each
// start, records a change of rules with its audit, routes, quarantines a dead
// letter and marks events done.
func TestRoutedRelayWithLeastPrivilege(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	o := newOutbox(t, 4)
	evs := o.enqueueRouted(t, 3)
	role := pgtest.Role(t, o.pool, "")
	script, err := migrate.Grants(&migrate.GrantsConfig{Schema: o.schema, RoleNames: map[migrate.Role]string{migrate.RoleRelay: role}, Roles: []migrate.Role{migrate.RoleRelay}})
	pgtest.Must(t, err, "grants")
	_, err = o.pool.Exec(ctx, script, pgx.QueryExecModeSimpleProtocol)
	pgtest.Must(t, err, "apply grants")
	pool := pgtest.Pool(t, pgtest.AsRole(t, pgtest.URL(), role), 16)
	orders, users, eu := &brokertest.Recorder{}, &brokertest.Recorder{}, &brokertest.Recorder{}
	dests := routedDests(relay.StartBackfill, orders, users, eu)
	dests[1].Start = relay.StartNow
	_, err = o.pool.Exec(ctx, "INSERT INTO "+pgx.Identifier{o.schema, "outbox_destinations"}.Sanitize()+
		` (name, rules, start) VALUES ('eu', '[{"all": true}]', 'now')`)
	pgtest.Must(t, err, "register eu with other rules")
	r := startRelayVia(t, pool, o, nil, relay.Config{PollInterval: 50 * time.Millisecond, Destinations: dests})
	wait.For(t, 30*time.Second, "every event done or a dead letter", func() bool {
		return o.count(t, "published_at IS NULL AND quarantined_at IS NULL") == 0
	})
	if !received(orders, wantFor("orders", evs)) || o.count(t, "quarantined_at IS NOT NULL") != len(unrouted(evs)) {
		t.Fatal("orders did not receive its events, or the dead letters are not quarantined")
	}
	if len(users.Messages()) != 0 {
		t.Fatal("users, started now, received events committed before its registration")
	}
	var audits int
	pgtest.Must(t, o.pool.QueryRow(ctx, "SELECT count(*) FROM "+pgx.Identifier{o.schema, "outbox_operator_audit"}.Sanitize()+
		" WHERE action = 'destination_rules' AND db_user = $1", role).Scan(&audits), "read audit")
	if audits != 1 {
		t.Fatalf("%d audit rows of the rules change by the relay's role, want 1", audits)
	}
	if err := r.Healthy(); err != nil {
		t.Fatalf("Healthy: %v", err)
	}
}

// Attacker: events whose fields try to pass for what a rule takes (a header
// value in another case or script, a header name in another case, an
// aggregate type that extends or quotes the rule's, SQL in the fields, a
// headers column spoiled by a raw INSERT) reach no destination whose rule
// does not take them exactly: each is a dead letter with the routing reason,
// the outbox's tables are intact, and the legitimate events are delivered.
func TestDestinationRoutingHostileEvents(t *testing.T) {
	t.Parallel()
	o := newOutbox(t, 8)
	hostile := []pgoutbox.Event{
		{AggregateType: "misc", AggregateID: "h1", EventType: "misc.noted", Headers: map[string]string{"region": "EU"}},
		{AggregateType: "misc", AggregateID: "h2", EventType: "misc.noted", Headers: map[string]string{"region": "\u0435u"}}, // Cyrillic е
		{AggregateType: "misc", AggregateID: "h3", EventType: "misc.noted", Headers: map[string]string{"Region": "eu"}},
		{AggregateType: "orders", AggregateID: "h4", EventType: "order.created"},
		{AggregateType: "Order", AggregateID: "h5", EventType: "order.created"},
		{AggregateType: "order'); DROP TABLE outbox_destination_lanes; --", AggregateID: "h6", EventType: "order.created"},
		{AggregateType: "misc", AggregateID: "h7'; DELETE FROM outbox_destinations; --", EventType: "user.changed"},
		{AggregateType: "misc", AggregateID: "h8", EventType: "misc.noted", Headers: map[string]string{"region": "eu,us"}},
	}
	for i := range hostile {
		hostile[i].Payload = map[string]int{"n": i}
	}
	legit := []pgoutbox.Event{
		{AggregateType: "order", AggregateID: "l1", EventType: "order.created", Payload: 1},
		{AggregateType: "misc", AggregateID: "l2", EventType: "misc.noted", Payload: 2, Headers: map[string]string{"region": "eu"}},
	}
	res, err := o.prod.EnqueueTx(context.Background(), o.pool, append(slices.Clone(hostile), legit...)...)
	pgtest.Must(t, err, "enqueue")
	// A raw INSERT's headers that are no JSON object of strings, with the rule's value inside.
	_, err = o.pool.Exec(context.Background(), "INSERT INTO "+o.table()+
		` (event_id, aggregate_type, aggregate_id, aggregate_sequence, event_type, payload, headers)
		  VALUES (gen_random_uuid(), 'misc', 'h9', 1, 'misc.noted', '{}', '{"region": ["eu"]}')`)
	pgtest.Must(t, err, "raw insert")
	orders, users, eu := &brokertest.Recorder{}, &brokertest.Recorder{}, &brokertest.Recorder{}
	startRouted(t, o, relay.Config{PollInterval: 50 * time.Millisecond, Destinations: routedDests(relay.StartBackfill, orders, users, eu)})
	wait.For(t, 30*time.Second, "every event delivered or a dead letter", func() bool {
		return o.count(t, "published_at IS NULL AND quarantined_at IS NULL") == 0
	})
	n := len(hostile)
	checkRouted(t, "orders", orders.Messages(), []pgoutbox.UUID{res[n].EventID})
	checkRouted(t, "users", users.Messages(), nil)
	checkRouted(t, "eu", eu.Messages(), []pgoutbox.UUID{res[n+1].EventID})
	if got := o.count(t, "quarantined_at IS NOT NULL AND last_error LIKE 'routed to no destination: %'"); got != len(hostile)+1 {
		t.Fatalf("%d dead letters, want %d", got, len(hostile)+1)
	}
	var dests, lanes int
	pgtest.Must(t, o.pool.QueryRow(context.Background(), "SELECT (SELECT count(*) FROM "+
		pgx.Identifier{o.schema, "outbox_destinations"}.Sanitize()+"), (SELECT count(*) FROM "+
		pgx.Identifier{o.schema, "outbox_destination_lanes"}.Sanitize()+")").Scan(&dests, &lanes), "tables intact")
	if dests != 3 || lanes == 0 {
		t.Fatalf("%d destinations, %d lanes after the hostile events", dests, lanes)
	}
}

// Under a steady flow, with no probe to fall back on (PollInterval of an
// hour), every destination keeps up while the flow goes on: a destination's
// worker that polls hot keeps the relay busy, so producers stop notifying,
// and the others hear of the events from the claims that find them.
func TestDestinationsKeepUpUnderSteadyFlow(t *testing.T) {
	t.Parallel()
	o := newOutbox(t, 16)
	a, b := &brokertest.Recorder{}, &brokertest.Recorder{}
	all := []relay.Rule{{All: true}}
	startRouted(t, o, relay.Config{PollInterval: time.Hour, Destinations: []relay.Destination{
		{Name: "a", Publisher: a, Rules: all, Start: relay.StartNow},
		{Name: "b", Publisher: b, Rules: all, Start: relay.StartNow},
	}})
	stop := make(chan struct{})
	produced := make(chan struct{})
	go func() {
		defer close(produced)
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			_, err := o.prod.EnqueueTx(context.Background(), o.pool,
				pgoutbox.Event{AggregateType: "flow", AggregateID: fmt.Sprintf("f%d", i%5), EventType: "flow.step", Payload: i})
			if err != nil {
				t.Errorf("enqueue: %v", err)
				return
			}
			time.Sleep(time.Millisecond) // the pace of the flow, not a wait
		}
	}()
	defer func() { close(stop); <-produced }()
	wait.For(t, 60*time.Second, "both destinations to receive 300 events while the flow goes on", func() bool {
		return len(a.Messages()) >= 300 && len(b.Messages()) >= 300
	})
}

// A relay that finds a destination registered since it started (another
// relay, with a newer file, added it) must not judge what is done or routed
// nowhere: it leases nothing, marks nothing done, quarantines nothing, and
// says why in Healthy, until the destination is dropped (or it restarts with
// it); then it delivers everything.
func TestRelayWaitsForADestinationAddedSince(t *testing.T) {
	t.Parallel()
	o := newOutbox(t, 16)
	orders, users := &brokertest.Recorder{}, &brokertest.Recorder{}
	r := startRouted(t, o, relay.Config{ID: "older", PollInterval: 50 * time.Millisecond, Destinations: []relay.Destination{
		{Name: "orders", Publisher: orders, Rules: routedRules["orders"], Start: relay.StartBackfill},
		{Name: "users", Publisher: users, Rules: routedRules["users"], Start: relay.StartBackfill}}})
	// A relay with a newer file adds eu, then stops before any event exists.
	newer := startRouted(t, o, relay.Config{ID: "newer", PollInterval: 50 * time.Millisecond,
		Destinations: routedDests(relay.StartBackfill, &brokertest.Recorder{}, &brokertest.Recorder{}, &brokertest.Recorder{})})
	pgtest.Must(t, newer.Stop(context.Background()), "stop the newer relay")

	evs := o.enqueueRouted(t, 6) // misc events with region=eu: only eu takes them; other misc events: none
	wait.For(t, 60*time.Second, "Healthy to name the destination added since", func() bool {
		err := r.Healthy()
		return errors.Is(err, relay.ErrUnservedDestination) && strings.Contains(err.Error(), `"eu"`)
	})
	if n := len(orders.Messages()) + len(users.Messages()); n != 0 {
		t.Fatalf("the older relay delivered %d messages", n)
	}
	if n := o.count(t, "published_at IS NOT NULL OR quarantined_at IS NOT NULL"); n != 0 {
		t.Fatalf("the older relay marked %d events done or dead", n)
	}

	// The operator drops eu after all (what admin.DropDestination does).
	ctx := context.Background()
	_, err := o.pool.Exec(ctx, "DELETE FROM "+pgx.Identifier{o.schema, "outbox_destination_lanes"}.Sanitize()+" WHERE destination = 'eu'")
	pgtest.Must(t, err, "drop eu's progress")
	_, err = o.pool.Exec(ctx, "DELETE FROM "+pgx.Identifier{o.schema, "outbox_destinations"}.Sanitize()+" WHERE name = 'eu'")
	pgtest.Must(t, err, "drop eu")
	wait.For(t, 60*time.Second, "every event done or dead once eu is dropped", func() bool {
		return o.count(t, "published_at IS NULL AND quarantined_at IS NULL") == 0
	})
	checkRouted(t, "orders", orders.Messages(), wantFor("orders", evs))
	checkRouted(t, "users", users.Messages(), wantFor("users", evs))
	checkMiscDead(t, o, evs, "orders, users")
	wait.For(t, 30*time.Second, "Healthy once no destination is unknown", func() bool { return r.Healthy() == nil })
}

// A destination registered before a relay starts and left out of its
// configuration counts as removed: the relay delivers to its own, marks
// events done without it, routes nowhere what only it took, and keeps its
// progress.
func TestDestinationLeftOutCountsAsRemoved(t *testing.T) {
	t.Parallel()
	o := newOutbox(t, 16)
	all := startRouted(t, o, relay.Config{ID: "all", PollInterval: 50 * time.Millisecond,
		Destinations: routedDests(relay.StartBackfill, &brokertest.Recorder{}, &brokertest.Recorder{}, &brokertest.Recorder{})})
	pgtest.Must(t, all.Stop(context.Background()), "stop the relay with every destination")
	pgtest.Must(t, o.pool.QueryRow(context.Background(), "INSERT INTO "+pgx.Identifier{o.schema, "outbox_destination_lanes"}.Sanitize()+
		" (destination, aggregate_type, aggregate_id, delivered_sequence) VALUES ('eu', 'order', 'o0', 0) RETURNING 1").Scan(new(int)), "eu's progress")

	evs := o.enqueueRouted(t, 6)
	orders, users := &brokertest.Recorder{}, &brokertest.Recorder{}
	r := startRouted(t, o, relay.Config{ID: "fewer", PollInterval: 50 * time.Millisecond, Destinations: []relay.Destination{
		{Name: "orders", Publisher: orders, Rules: routedRules["orders"], Start: relay.StartBackfill},
		{Name: "users", Publisher: users, Rules: routedRules["users"], Start: relay.StartBackfill}}})
	wait.For(t, 60*time.Second, "every event done or dead without eu", func() bool {
		return o.count(t, "published_at IS NULL AND quarantined_at IS NULL") == 0
	})
	checkRouted(t, "orders", orders.Messages(), wantFor("orders", evs))
	checkRouted(t, "users", users.Messages(), wantFor("users", evs))
	checkMiscDead(t, o, evs, "orders, users")
	if _, ok := o.lanes(t, "eu")["order/o0"]; !ok {
		t.Fatal("eu's progress was not kept")
	}
	if err := r.Healthy(); err != nil {
		t.Fatalf("Healthy: %v", err)
	}
}

// checkMiscDead asserts that exactly the misc events of evs are dead letters
// routed to none of names.
func checkMiscDead(t *testing.T, o *outbox, evs []routedEvent, names string) {
	t.Helper()
	dead := o.count(t, "quarantined_at IS NOT NULL AND last_error = 'routed to no destination: no rule of "+names+" matches it'")
	misc := 0
	for _, e := range evs {
		if e.aggregateType == "misc" {
			misc++
		}
	}
	if dead != misc {
		t.Fatalf("%d dead letters, want the %d misc events", dead, misc)
	}
}
