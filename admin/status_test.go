package admin

import (
	"context"
	"encoding/json"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/pgoutbox"
	"github.com/pgoutbox/pgoutbox/internal/pgtest"
	"github.com/pgoutbox/pgoutbox/migrate"
)

// Rows in every state give exact figures.
func TestStatusFigures(t *testing.T) {
	t.Parallel()
	pool, schema := pgtest.Migrated(t, 4)
	ctx := context.Background()
	p, err := pgoutbox.NewProducer(&pgoutbox.Config{Schema: schema})
	pgtest.Must(t, err, "producer")
	// One aggregate per row, named after the state the row is put in.
	names := []string{"pending1", "pending-old", "backoff", "quar1", "quar2", "live1", "live2", "expired1", "expired2",
		"pub1", "pub2", "pub3", "pub-old1", "pub-old2", "pub-leftover-claim", "skipped"}
	var evs []pgoutbox.Event
	for _, n := range names {
		evs = append(evs, pgoutbox.Event{AggregateType: "t", AggregateID: n, EventType: "e"})
	}
	res, err := p.EnqueueTx(ctx, pool, evs...)
	pgtest.Must(t, err, "enqueue")
	table := pgx.Identifier{schema, "outbox_events"}.Sanitize()
	for _, u := range []string{
		"occurred_at = now() - interval '90 seconds' WHERE aggregate_id = 'pending-old'",
		"available_at = now() + interval '1 hour', attempt_count = 1, last_error = 'x' WHERE aggregate_id = 'backoff'",
		// Quarantined events are older than every pending one: they must not count as oldest pending.
		"quarantined_at = now(), occurred_at = now() - interval '1 day' WHERE aggregate_id IN ('quar1', 'quar2', 'skipped')",
		"claimed_by = 'relay-1', claim_until = now() + interval '1 hour' WHERE aggregate_id IN ('live1', 'live2')",
		"claimed_by = 'relay-1', claim_until = now() - interval '1 minute' WHERE aggregate_id = 'expired1'",
		"claimed_by = 'relay-2', claim_until = now() - interval '1 second' WHERE aggregate_id = 'expired2'",
		"published_at = now() WHERE aggregate_id IN ('pub1', 'pub2', 'pub3')",
		"published_at = now() - interval '10 minutes' WHERE aggregate_id IN ('pub-old1', 'pub-old2')",
		// The relay's mark keeps claimed_by on published rows: not a lease.
		"published_at = now(), claimed_by = 'relay-3' WHERE aggregate_id = 'pub-leftover-claim'",
	} {
		_, err := pool.Exec(ctx, "UPDATE "+table+" SET "+u)
		pgtest.Must(t, err, "seed %s", u)
	}
	a, err := New(pool, &Config{Schema: schema})
	pgtest.Must(t, err, "admin")
	_, err = a.Skip(ctx, SkipRequest{IDs: []pgoutbox.UUID{res[len(res)-1].EventID}, Reason: "test", Actor: "t"})
	pgtest.Must(t, err, "skip")

	st, err := a.Status(ctx)
	pgtest.Must(t, err, "status")
	want := Status{Schema: schema, InboxSchema: schema, Pending: 7, Quarantined: 2, BackingOff: 1, WaitingForRelay: 7,
		Leases:              []Lease{{RelayID: "relay-1", Live: 2, Expired: 1}, {RelayID: "relay-2", Expired: 1}},
		PublishedLastMinute: 4, Skipped: 1, Relays: []RelayHeartbeat{}}
	got := *st
	got.At, got.OldestPendingAge, got.OldestWaitingForRelayAge, got.Tables, got.Dedup = time.Time{}, 0, 0, nil, nil
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("status\n got %+v\nwant %+v", got, want)
	}
	if age := time.Duration(st.OldestPendingAge); age < 90*time.Second || age > 150*time.Second {
		t.Fatalf("oldest pending age %s, want about 90s", age)
	}
	if st.At.IsZero() || time.Since(st.At).Abs() > time.Minute {
		t.Fatalf("status taken at %s", st.At)
	}
	var tables []string
	for _, ts := range st.Tables {
		tables = append(tables, ts.Name)
		if ts.Schema != schema || ts.TotalBytes < ts.TableBytes+ts.IndexBytes || ts.IndexBytes <= 0 {
			t.Errorf("table size %+v", ts)
		}
	}
	if fmt.Sprint(tables) != "[outbox_events outbox_aggregate_sequences outbox_skipped_events]" {
		t.Fatalf("tables %v", tables)
	}
	if st.Tables[0].TableBytes <= 0 {
		t.Fatalf("outbox_events has no heap bytes: %+v", st.Tables[0])
	}
	if st.Dedup == nil || st.Dedup.Name != "processed_events" || st.Dedup.IndexBytes <= 0 {
		t.Fatalf("dedup table %+v", st.Dedup)
	}

	// JSON: snake_case, durations in seconds, and it reads back as it was.
	b, err := json.Marshal(st)
	pgtest.Must(t, err, "marshal")
	var raw map[string]any
	pgtest.Must(t, json.Unmarshal(b, &raw), "unmarshal raw")
	if secs, ok := raw["oldest_pending_age_seconds"].(float64); !ok || secs < 90 || secs > 150 {
		t.Fatalf("oldest_pending_age_seconds = %v in %s", raw["oldest_pending_age_seconds"], b)
	}
	for _, k := range []string{"pending", "quarantined", "backing_off", "leases", "published_last_minute", "tables", "dedup_table"} {
		if _, ok := raw[k]; !ok {
			t.Errorf("JSON lacks %q: %s", k, b)
		}
	}
	var back Status
	pgtest.Must(t, json.Unmarshal(b, &back), "unmarshal")
	if back.OldestPendingAge.String() != st.OldestPendingAge.String() || !reflect.DeepEqual(back.Leases, st.Leases) ||
		!reflect.DeepEqual(back.Tables, st.Tables) || back.Pending != st.Pending {
		t.Fatalf("JSON round trip changed the status:\n%+v\n%+v", back, *st)
	}

	// An inbox schema without processed_events: the dedup table is absent, not an error.
	a2, err := New(pool, &Config{Schema: schema, InboxSchema: schema + "_no_inbox"})
	pgtest.Must(t, err, "admin")
	st2, err := a2.Status(ctx)
	pgtest.Must(t, err, "status without inbox")
	if st2.Dedup != nil {
		t.Fatalf("dedup table %+v in a schema that does not exist", st2.Dedup)
	}
	if b, _ := json.Marshal(st2); !strings.Contains(string(b), `"dedup_table":null`) {
		t.Fatalf("absent dedup table in JSON: %s", b)
	}
}

// An empty outbox: zero figures, no leases (an empty list in JSON, not null).
func TestStatusEmpty(t *testing.T) {
	t.Parallel()
	pool, schema := pgtest.Migrated(t, 2)
	a, err := New(pool, &Config{Schema: schema})
	pgtest.Must(t, err, "admin")
	st, err := a.Status(context.Background())
	pgtest.Must(t, err, "status")
	if st.Pending != 0 || st.OldestPendingAge != 0 || st.Quarantined != 0 || len(st.Leases) != 0 || st.PublishedLastMinute != 0 {
		t.Fatalf("empty outbox: %+v", st)
	}
	if b, _ := json.Marshal(st); !strings.Contains(string(b), `"leases":[]`) {
		t.Fatalf("JSON: %s", b)
	}
}

// On a table with a long published history the status queries read unpublished
// rows through the partial index and the last minute's publishes through the BRIN
// index: neither scans the table.
func TestStatusQueriesUseIndexes(t *testing.T) {
	t.Parallel()
	pool, schema := pgtest.Migrated(t, 2)
	ctx := context.Background()
	table := pgx.Identifier{schema, "outbox_events"}.Sanitize()
	_, err := pool.Exec(ctx, `INSERT INTO `+table+` (event_id, aggregate_type, aggregate_id, aggregate_sequence, event_type, payload,
        occurred_at, published_at, attempt_count)
    SELECT gen_random_uuid(), 'acct', 'a' || (g % 500), g, 'e', '{"n": 1}',
           now() - (30000 - g) * interval '1 second', now() - (30000 - g) * interval '1 second' + interval '5 ms', 1
      FROM generate_series(1, 30000) g`)
	pgtest.Must(t, err, "seed published history")
	_, err = pool.Exec(ctx, `INSERT INTO `+table+` (event_id, aggregate_type, aggregate_id, aggregate_sequence, event_type, payload)
    SELECT gen_random_uuid(), 'acct', 'b' || g, 1, 'e', '{}' FROM generate_series(1, 50) g`)
	pgtest.Must(t, err, "seed pending")
	_, err = pool.Exec(ctx, "ANALYZE "+table)
	pgtest.Must(t, err, "analyze")
	// What autovacuum does as ranges fill up (autosummarize); this test server may run without it.
	_, err = pool.Exec(ctx, "SELECT brin_summarize_new_values($1::regclass)", schema+".outbox_events_published_at_brin")
	pgtest.Must(t, err, "summarize")

	a, err := New(pool, &Config{Schema: schema})
	pgtest.Must(t, err, "admin")
	for _, c := range []struct{ sql, index string }{
		{fmt.Sprintf(statusUnpublishedSQL, a.events), "outbox_events_unpublished_idx"},
		{fmt.Sprintf(statusPublishedSQL, a.events, a.skipped, a.table("outbox_destinations")), "outbox_events_published_at_brin"},
	} {
		rows, err := pool.Query(ctx, "EXPLAIN "+c.sql)
		pgtest.Must(t, err, "explain")
		lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
		pgtest.Must(t, err, "explain")
		plan := strings.Join(lines, "\n")
		if !strings.Contains(plan, c.index) || strings.Contains(plan, "Seq Scan on outbox_events ") {
			t.Errorf("plan does not use %s:\n%s", c.index, plan)
		}
	}
	st, err := a.Status(ctx)
	pgtest.Must(t, err, "status")
	if st.Pending != 50 || st.PublishedLastMinute < 30 || st.PublishedLastMinute > 61 {
		t.Fatalf("pending %d (want 50), published last minute %d (want at most 61, the last minute of history)", st.Pending, st.PublishedLastMinute)
	}
}

// On a partitioned outbox the sizes are the partitions' sum (the parent alone
// weighs nothing) and the figures are read the same way.
func TestStatusPartitioned(t *testing.T) {
	t.Parallel()
	pool, schema := pgtest.Schema(t, 2)
	ctx := context.Background()
	_, err := migrate.Up(ctx, pool, &migrate.Config{Schema: schema, Partitioned: true})
	pgtest.Must(t, err, "migrate partitioned")
	p, err := pgoutbox.NewProducer(&pgoutbox.Config{Schema: schema})
	pgtest.Must(t, err, "producer")
	_, err = p.EnqueueTx(ctx, pool, pgoutbox.Event{AggregateType: "t", AggregateID: "1", EventType: "e"},
		pgoutbox.Event{AggregateType: "t", AggregateID: "2", EventType: "e"})
	pgtest.Must(t, err, "enqueue")
	_, err = pool.Exec(ctx, "UPDATE "+pgx.Identifier{schema, "outbox_events"}.Sanitize()+" SET published_at = now() WHERE aggregate_id = '2'")
	pgtest.Must(t, err, "publish")
	a, err := New(pool, &Config{Schema: schema})
	pgtest.Must(t, err, "admin")
	st, err := a.Status(ctx)
	pgtest.Must(t, err, "status")
	if st.Pending != 1 || st.PublishedLastMinute != 1 || st.Tables[0].Name != "outbox_events" ||
		st.Tables[0].TableBytes <= 0 || st.Tables[0].IndexBytes <= 0 {
		t.Fatalf("partitioned status: %+v, tables %+v", st, st.Tables)
	}
}
