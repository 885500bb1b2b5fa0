package admin_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgoutbox/pgoutbox"
	"github.com/pgoutbox/pgoutbox/admin"
	"github.com/pgoutbox/pgoutbox/broker"
	"github.com/pgoutbox/pgoutbox/broker/brokertest"
	natsbroker "github.com/pgoutbox/pgoutbox/broker/nats"
	"github.com/pgoutbox/pgoutbox/internal/natstest"
	"github.com/pgoutbox/pgoutbox/internal/pgtest"
	"github.com/pgoutbox/pgoutbox/internal/wait"
	"github.com/pgoutbox/pgoutbox/relay"
)

// rowState is every row's relay-owned state, to prove a replay changed none.
func rowState(t *testing.T, pool *pgxpool.Pool, schema string) string {
	t.Helper()
	var s string
	pgtest.Must(t, pool.QueryRow(context.Background(), "SELECT coalesce(string_agg(event_id::text || published_at::text || attempt_count || coalesce(claimed_by, '') || available_at::text, ',' ORDER BY event_id), '') FROM "+
		quoted(schema, "outbox_events")).Scan(&s), "row state")
	return s
}

// checkReplayed asserts got holds exactly the events want, each aggregate's in
// sequence order, with their original ids.
func checkReplayed(t *testing.T, got []broker.Message, want map[pgoutbox.UUID]bool) {
	t.Helper()
	last := map[string]int64{}
	seen := map[pgoutbox.UUID]bool{}
	for _, m := range got {
		if !want[m.EventID] {
			t.Fatalf("replayed %s (%s/%s #%d), not selected", m.EventID, m.AggregateType, m.AggregateID, m.AggregateSequence)
		}
		if seen[m.EventID] {
			t.Fatalf("event %s replayed twice", m.EventID)
		}
		seen[m.EventID] = true
		k := m.AggregateType + "/" + m.AggregateID
		if m.AggregateSequence <= last[k] {
			t.Fatalf("order violated on %s: %d after %d", k, m.AggregateSequence, last[k])
		}
		last[k] = m.AggregateSequence
	}
	if len(seen) != len(want) {
		t.Fatalf("replayed %d events, want %d", len(seen), len(want))
	}
}

// Acceptance: 1,000 published events of 20 aggregates replayed to a real NATS
// server arrive in per-aggregate order with their original ids and headers; the
// outbox rows are not touched; a second replay within the stream's duplicate
// window is stored again; a dry run publishes nothing.
func TestReplayToNATS(t *testing.T) {
	t.Parallel()
	pool, schema := pgtest.Migrated(t, 4)
	ctx := context.Background()
	ids := opsEnqueue(t, pool, schema, "acct", 20, 50)
	table := quoted(schema, "outbox_events")
	_, err := pool.Exec(ctx, "UPDATE "+table+" SET published_at = now() - interval '1 hour', attempt_count = 1")
	pgtest.Must(t, err, "publish")
	// An unpublished event is never replayed.
	opsEnqueue(t, pool, schema, "acct", 1, 1)
	before := rowState(t, pool, schema)

	target := natstest.New(t, natstest.URL())
	pub, err := natsbroker.New(ctx, target.JS, &natsbroker.Config{Stream: target.Stream, StreamSubjects: target.Subjects(),
		Subject: broker.MustParseTemplate(target.Template)})
	pgtest.Must(t, err, "nats publisher")
	defer pub.Close()

	dry, err := admin.Replay(ctx, pool, pub, admin.ReplayRequest{Schema: schema, DryRun: true})
	pgtest.Must(t, err, "dry run")
	if dry.Total != 1000 || dry.ByAggregateType["acct"] != 1000 || dry.Published != 0 {
		t.Fatalf("dry run = %+v", dry)
	}
	if got := target.Read(t); len(got) != 0 {
		t.Fatalf("the dry run published %d messages", len(got))
	}

	var progress []admin.ReplayProgress
	res, err := admin.Replay(ctx, pool, pub, admin.ReplayRequest{Schema: schema, BatchSize: 300,
		Progress: func(p admin.ReplayProgress) { progress = append(progress, p) }})
	pgtest.Must(t, err, "replay")
	if res.Total != 1000 || res.Published != 1000 || res.Batches != 4 || len(progress) != 4 || progress[3].Published != 1000 {
		t.Fatalf("replay = %+v, progress %v", res, progress)
	}
	want := map[pgoutbox.UUID]bool{}
	for _, id := range ids {
		want[id] = true
	}
	got := target.Read(t)
	checkReplayed(t, got, want)
	if got[0].Headers["Test"] != "yes" {
		t.Fatalf("producer header lost: %v", got[0].Headers)
	}
	if after := rowState(t, pool, schema); after != before {
		t.Fatal("the replay changed outbox rows")
	}

	// Within the duplicate window, a second replay (one aggregate) is stored again.
	again, err := admin.Replay(ctx, pool, pub, admin.ReplayRequest{Schema: schema,
		Filter: admin.ReplayFilter{AggregateType: "acct", AggregateID: "a07"}})
	pgtest.Must(t, err, "second replay")
	if again.Published != 50 || again.RunID == res.RunID {
		t.Fatalf("second replay = %+v", again)
	}
	if n := len(target.Read(t)); n != 1050 {
		t.Fatalf("stream holds %d messages after the second replay, want 1050", n)
	}
}

func TestReplayFilters(t *testing.T) {
	t.Parallel()
	pool, schema := pgtest.Migrated(t, 4)
	ctx := context.Background()
	acct := opsEnqueue(t, pool, schema, "acct", 3, 4)
	order := opsEnqueue(t, pool, schema, "order", 2, 3)
	table := quoted(schema, "outbox_events")
	_, err := pool.Exec(ctx, "UPDATE "+table+" SET published_at = now()")
	pgtest.Must(t, err, "publish")
	// Spread occurred_at: acct events an hour ago, order events now.
	_, err = pool.Exec(ctx, "UPDATE "+table+" SET occurred_at = now() - interval '1 hour' WHERE aggregate_type = 'acct'")
	pgtest.Must(t, err, "occurred_at")
	// A skipped dead letter looks published but never reached the broker.
	_, err = pool.Exec(ctx, "INSERT INTO "+quoted(schema, "outbox_skipped_events")+
		" (event_id, aggregate_type, aggregate_id, aggregate_sequence, event_type, attempt_count, reason, skipped_by)"+
		" SELECT event_id, aggregate_type, aggregate_id, aggregate_sequence, event_type, attempt_count, 'poison', 'test' FROM "+table+" WHERE event_id = $1", order[0])
	pgtest.Must(t, err, "skip")

	set := func(ids ...pgoutbox.UUID) map[pgoutbox.UUID]bool {
		m := map[pgoutbox.UUID]bool{}
		for _, id := range ids {
			m[id] = true
		}
		return m
	}
	now := time.Now()
	cases := []struct {
		name   string
		filter admin.ReplayFilter
		want   map[pgoutbox.UUID]bool
	}{
		{"all but the skipped", admin.ReplayFilter{}, set(append(append([]pgoutbox.UUID{}, acct...), order[1:]...)...)},
		{"aggregate type", admin.ReplayFilter{AggregateType: "acct"}, set(acct...)},
		// acct events are interleaved a00, a01, a02, a00, …: a01 is every third from 1.
		{"one aggregate", admin.ReplayFilter{AggregateType: "acct", AggregateID: "a01"}, set(acct[1], acct[4], acct[7], acct[10])},
		{"event type", admin.ReplayFilter{EventType: "order.changed"}, set(order[1:]...)},
		{"since", admin.ReplayFilter{Since: now.Add(-10 * time.Minute)}, set(order[1:]...)},
		{"until", admin.ReplayFilter{Until: now.Add(-10 * time.Minute)}, set(acct...)},
		{"event ids", admin.ReplayFilter{EventIDs: []pgoutbox.UUID{acct[5], order[0], order[2]}}, set(acct[5], order[2])},
	}
	for _, tc := range cases {
		rec := &brokertest.Recorder{}
		res, err := admin.Replay(ctx, pool, rec, admin.ReplayRequest{Schema: schema, Filter: tc.filter, BatchSize: 2})
		pgtest.Must(t, err, "replay %s", tc.name)
		if res.Total != int64(len(tc.want)) || res.Published != res.Total {
			t.Fatalf("%s: %+v, want %d events", tc.name, res, len(tc.want))
		}
		checkReplayed(t, rec.Messages(), tc.want)
		for _, m := range rec.Messages() {
			if m.DedupID != m.EventID.String()+":replay:"+res.RunID {
				t.Fatalf("%s: DedupID %q", tc.name, m.DedupID)
			}
		}
	}
	if _, err := admin.Replay(ctx, pool, &brokertest.Recorder{}, admin.ReplayRequest{Schema: schema,
		Filter: admin.ReplayFilter{Since: now, Until: now.Add(-time.Hour)}}); err == nil || !strings.Contains(err.Error(), "Until") {
		t.Fatalf("until before since: %v", err)
	}
}

// Unavailable answers are retried in order; a permanent refusal stops the replay
// with how far it got.
func TestReplayRetriesAndStops(t *testing.T) {
	t.Parallel()
	pool, schema := pgtest.Migrated(t, 4)
	ctx := context.Background()
	ids := opsEnqueue(t, pool, schema, "acct", 4, 5)
	_, err := pool.Exec(ctx, "UPDATE "+quoted(schema, "outbox_events")+" SET published_at = now()")
	pgtest.Must(t, err, "publish")

	// a02's third event fails twice as unavailable, then goes through.
	failures := 2
	rec := &brokertest.Recorder{Fail: func(m *broker.Message) error {
		if m.AggregateID == "a02" && m.AggregateSequence == 3 && failures > 0 {
			failures--
			return broker.Unavailable(errors.New("no responders"))
		}
		return nil
	}}
	res, err := admin.Replay(ctx, pool, rec, admin.ReplayRequest{Schema: schema})
	pgtest.Must(t, err, "replay")
	if res.Published != 20 || rec.Calls() != 3 {
		t.Fatalf("replay = %+v after %d publish calls, want 20 events in 3 calls", res, rec.Calls())
	}
	want := map[pgoutbox.UUID]bool{}
	for _, id := range ids {
		want[id] = true
	}
	checkReplayed(t, rec.Messages(), want)

	// A permanent refusal of a01's second event stops the replay.
	rec = &brokertest.Recorder{Fail: func(m *broker.Message) error {
		if m.AggregateID == "a01" && m.AggregateSequence == 2 {
			return broker.Permanent(errors.New("invalid subject"))
		}
		return nil
	}}
	res, err = admin.Replay(ctx, pool, rec, admin.ReplayRequest{Schema: schema, BatchSize: 5})
	var re *admin.ReplayError
	if !errors.As(err, &re) || re.Event.AggregateID != "a01" || re.Event.AggregateSequence != 2 || re.Published != 6 || re.Total != 20 {
		t.Fatalf("permanent refusal: %v (%+v)", err, re)
	}
	if res.Published != 6 || !strings.Contains(err.Error(), "after publishing 6 of 20 events") {
		t.Fatalf("result %+v, error %q", res, err)
	}

	// Plain errors stop it after MaxAttempts.
	rec = &brokertest.Recorder{Fail: func(m *broker.Message) error { return errors.New("boom") }}
	_, err = admin.Replay(ctx, pool, rec, admin.ReplayRequest{Schema: schema, MaxAttempts: 2})
	if !errors.As(err, &re) || re.Published != 0 || rec.Calls() != 2 {
		t.Fatalf("plain errors: %v after %d calls", err, rec.Calls())
	}
}

// lanesState is every destination's progress, to prove a replay changed none.
func lanesState(t *testing.T, pool *pgxpool.Pool, schema string) string {
	t.Helper()
	var s string
	pgtest.Must(t, pool.QueryRow(context.Background(), `SELECT coalesce(string_agg(concat_ws('/', destination, aggregate_type,
       aggregate_id, delivered_sequence, attempt_count, quarantined_sequence), ',' ORDER BY destination, aggregate_type, aggregate_id), '')
  FROM `+quoted(schema, "outbox_destination_lanes")).Scan(&s), "lanes state")
	return s
}

// natsDestination is a publisher on a NATS stream of the test's own.
func natsDestination(t *testing.T) (natstest.Target, broker.Publisher) {
	t.Helper()
	target := natstest.New(t, natstest.URL())
	pub, err := natsbroker.New(context.Background(), target.JS, &natsbroker.Config{Stream: target.Stream,
		StreamSubjects: target.Subjects(), Subject: broker.MustParseTemplate(target.Template)})
	pgtest.Must(t, err, "nats publisher")
	t.Cleanup(func() { _ = pub.Close() })
	return target, pub
}

// Acceptance: a relay with two destinations on real NATS streams, services
// (acct events) and warehouse (every event), delivers everything; a replay to
// warehouse reaches warehouse only, in order per aggregate, with the original
// ids; a replay to services takes only the events its rules route there; no
// progress row changes, and the audit names the destination and its broker.
func TestReplayToOneDestination(t *testing.T) {
	t.Parallel()
	pool, schema := pgtest.Migrated(t, 12)
	ctx := context.Background()
	acct := opsEnqueue(t, pool, schema, "acct", 4, 5)
	users := opsEnqueue(t, pool, schema, "user", 2, 3)
	services, servicesPub := natsDestination(t)
	warehouse, warehousePub := natsDestination(t)

	r, err := relay.New(pool, nil, &relay.Config{Schema: schema, Logger: quietLog, PollInterval: 100 * time.Millisecond,
		Destinations: []relay.Destination{
			{Name: "services", Publisher: servicesPub, Start: relay.StartBackfill, Rules: []relay.Rule{{AggregateTypes: []string{"acct"}}}},
			{Name: "warehouse", Publisher: warehousePub, Start: relay.StartBackfill, Rules: []relay.Rule{{All: true}}},
		}})
	pgtest.Must(t, err, "relay")
	pgtest.Must(t, r.Start(ctx), "start relay")
	t.Cleanup(func() {
		stop, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := r.Stop(stop); err != nil {
			t.Errorf("stop relay: %v", err)
		}
	})
	events := quoted(schema, "outbox_events")
	wait.For(t, 60*time.Second, "every event done", func() bool { return countRows(t, pool, events, "published_at IS NULL") == 0 })
	wait.For(t, 60*time.Second, "each stream to hold its events", func() bool {
		return len(services.Read(t)) == 20 && len(warehouse.Read(t)) == 26
	})
	lanes := lanesState(t, pool, schema)

	res, err := admin.Replay(ctx, pool, warehousePub, admin.ReplayRequest{Schema: schema, ToDestination: "warehouse",
		Filter: admin.ReplayFilter{AggregateType: "user"}, Actor: "ops", Reason: "warehouse lost the users", Destination: "nats test stream"})
	pgtest.Must(t, err, "replay to warehouse")
	if res.Total != 6 || res.Published != 6 {
		t.Fatalf("replay to warehouse = %+v, want 6 user events", res)
	}
	got := warehouse.Read(t)
	if len(got) != 32 {
		t.Fatalf("warehouse holds %d messages, want 26 + 6 replayed", len(got))
	}
	want := map[pgoutbox.UUID]bool{}
	for _, id := range users {
		want[id] = true
	}
	checkReplayed(t, got[26:], want)
	if n := len(services.Read(t)); n != 20 {
		t.Fatalf("services holds %d messages after a replay to warehouse, want its 20", n)
	}

	// services' rules take acct events only: the users are not its to replay.
	dry, err := admin.Replay(ctx, pool, nil, admin.ReplayRequest{Schema: schema, ToDestination: "services", DryRun: true,
		Filter: admin.ReplayFilter{AggregateType: "user"}})
	if err != nil || dry.Total != 0 {
		t.Fatalf("users to services: %+v, %v; want none", dry, err)
	}
	res, err = admin.Replay(ctx, pool, servicesPub, admin.ReplayRequest{Schema: schema, ToDestination: "services", Reason: "services asked"})
	pgtest.Must(t, err, "replay to services")
	if res.Total != 20 || res.ByAggregateType["acct"] != 20 || res.Published != 20 {
		t.Fatalf("replay to services = %+v, want its 20 acct events", res)
	}
	want = map[pgoutbox.UUID]bool{}
	for _, id := range acct {
		want[id] = true
	}
	checkReplayed(t, services.Read(t)[20:], want)
	if n := len(warehouse.Read(t)); n != 32 {
		t.Fatalf("warehouse holds %d messages after a replay to services, want 32", n)
	}
	if after := lanesState(t, pool, schema); after != lanes {
		t.Fatalf("a replay changed the destinations' progress:\n%s\nwas\n%s", after, lanes)
	}

	a, err := admin.New(pool, &admin.Config{Schema: schema})
	pgtest.Must(t, err, "admin")
	audit, err := a.Audit(ctx, 10)
	pgtest.Must(t, err, "audit")
	if len(audit) != 2 || audit[1].Action != admin.ActionReplay || audit[1].Selection["destination"] != "warehouse" ||
		audit[1].Selection["broker"] != "nats test stream" || audit[1].Actor != "ops" || audit[1].EventCount != 6 ||
		audit[0].Selection["destination"] != "services" || audit[0].Selection["all"] != true {
		t.Fatalf("audit = %+v", audit)
	}
}

// A replay to a destination takes what its progress passed and its rules
// route there, never what was skipped for it; a hostile or unknown name is
// refused with a typed error, before anything is selected or audited.
func TestReplayDestinationSelectionAndRefusals(t *testing.T) {
	t.Parallel()
	e := newDestEnv(t) // analytics and partners, every event; o/a1 and o/a2, 3 events each
	ctx := context.Background()
	e.lane("analytics", "a1", 3, nil)
	e.lane("analytics", "a2", 1, seq(2))
	count := func(dest string) int64 {
		t.Helper()
		res, err := admin.Replay(ctx, e.pool, nil, admin.ReplayRequest{Schema: e.schema, ToDestination: dest, DryRun: true})
		pgtest.Must(t, err, "dry run to %s", dest)
		return res.Total
	}
	if n := count("analytics"); n != 4 {
		t.Errorf("analytics has %d events to replay, want a1's 3 and a2's first", n)
	}
	if n := count("partners"); n != 0 {
		t.Errorf("partners has %d events to replay, want none: it passed nothing", n)
	}

	// A skip moves analytics past a2 #2 without sending it: never replayed.
	_, err := e.admin.SkipDestination(ctx, admin.DestinationSkipRequest{Destination: "analytics", IDs: []pgoutbox.UUID{e.ids["a2"][1]},
		Reason: "not for analytics"})
	pgtest.Must(t, err, "skip")
	rec := &brokertest.Recorder{}
	res, err := admin.Replay(ctx, e.pool, rec, admin.ReplayRequest{Schema: e.schema, ToDestination: "analytics"})
	pgtest.Must(t, err, "replay")
	checkReplayed(t, rec.Messages(), map[pgoutbox.UUID]bool{e.ids["a1"][0]: true, e.ids["a1"][1]: true, e.ids["a1"][2]: true, e.ids["a2"][0]: true})
	if res.Total != 4 {
		t.Errorf("replay = %+v, want 4", res)
	}

	// An outbox dead letter the cursors passed (routed to no destination, as
	// the relay quarantines it) is replayed once the rules take it; skipped in
	// the outbox, it is not.
	e.quarantine(e.ids["a1"][0], "routed to no destination: no rule matches it")
	if n := count("analytics"); n != 4 {
		t.Errorf("with a1 #1 an outbox dead letter: %d events, want 4", n)
	}
	_, err = e.admin.Skip(ctx, admin.SkipRequest{IDs: []pgoutbox.UUID{e.ids["a1"][0]}, Reason: "sent by hand"})
	pgtest.Must(t, err, "skip in the outbox")
	if n := count("analytics"); n != 3 {
		t.Errorf("with a1 #1 skipped in the outbox: %d events, want 3", n)
	}

	// The rules as registered decide: by event type, by header.
	for rules, want := range map[string]int64{
		`[{"event_types": ["order.changed"]}]`:                              3,
		`[{"event_types": ["other"]}]`:                                      0,
		`[{"headers": {"origin": "test"}}]`:                                 3,
		`[{"headers": {"origin": "x' OR true --"}}]`:                        0,
		`[{"aggregate_types": ["user"]}, {"headers": {"origin": "test"}}]`:  3,
		`[{"aggregate_types": ["user"], "event_types": ["order.changed"]}]`: 0,
		`[{"aggregate_types": ["user"]}, {"all": true}]`:                    3,
	} {
		e.exec(`UPDATE `+e.table("outbox_destinations")+` SET rules = $1::jsonb WHERE name = 'analytics'`, rules)
		if n := count("analytics"); n != want {
			t.Errorf("rules %s: %d events, want %d", rules, n, want)
		}
	}

	audits := e.count("outbox_operator_audit", "action = 'replay'")
	long := strings.Repeat("x", 5000)
	for _, name := range []string{"Analytics", "a'; DROP TABLE outbox_destinations; --", "a\x1b[31mred", "../etc", long, "a b", "名前", "a\x00b"} {
		_, err := admin.Replay(ctx, e.pool, rec, admin.ReplayRequest{Schema: e.schema, ToDestination: name, Reason: "r"})
		if !errors.Is(err, relay.ErrInvalidDestination) || strings.Contains(err.Error(), long) || strings.ContainsAny(err.Error(), "\x1b\x00") {
			t.Errorf("name %.40q: %v, want ErrInvalidDestination, the name quoted and cut", name, err)
		}
	}
	_, err = admin.Replay(ctx, e.pool, rec, admin.ReplayRequest{Schema: e.schema, ToDestination: "nowhere", Reason: "r"})
	if !errors.Is(err, admin.ErrDestinationNotFound) || errors.Is(err, admin.ErrNoDestinations) || !strings.Contains(err.Error(), "nowhere") {
		t.Errorf("unknown destination: %v", err)
	}
	plain, schema := pgtest.Migrated(t, 2)
	_, err = admin.Replay(ctx, plain, rec, admin.ReplayRequest{Schema: schema, ToDestination: "analytics", Reason: "r"})
	if !errors.Is(err, admin.ErrNoDestinations) || !errors.Is(err, admin.ErrDestinationNotFound) || !strings.Contains(err.Error(), "no destination is registered") {
		t.Errorf("an outbox without destinations: %v", err)
	}
	if n := e.count("outbox_operator_audit", "action = 'replay'"); n != audits {
		t.Errorf("refused replays were audited: %d rows, want %d", n, audits)
	}
	if len(rec.Messages()) != 4 {
		t.Errorf("refused replays published: %d messages", len(rec.Messages()))
	}
}
