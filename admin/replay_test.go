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
