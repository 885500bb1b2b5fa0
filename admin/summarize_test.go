package admin_test

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgoutbox/pgoutbox"
	"github.com/pgoutbox/pgoutbox/admin"
	"github.com/pgoutbox/pgoutbox/internal/pgtest"
	"github.com/pgoutbox/pgoutbox/migrate"
)

// brinFlood is what PostgreSQL logs for each BRIN summarization request that
// autovacuum's work-item queue (256 entries, server-wide) had no room for.
const brinFlood = "request for BRIN range summarization"

// autovacuumWorkItems is the size of autovacuum's work-item queue (NUM_WORKITEMS
// in PostgreSQL's autovacuum.c).
const autovacuumWorkItems = 256

// A sustained enqueue of tens of thousands of events writes no "request for BRIN
// range summarization ... was not recorded" line to the server log, though it
// fills far more page ranges than autovacuum's queue holds (with the index's old
// autosummarize = on, each new range was a request: the queue filled within the
// enqueue and every further range logged a line). The cleanup that follows
// summarizes the new ranges itself, no more than CleanupConfig.SummarizeRanges of
// them per run. The server is the test's own, so that its log is readable and
// holds nobody else's lines; its autovacuum settings are PostgreSQL's defaults.
func TestSustainedEnqueueDoesNotFloodTheServerLog(t *testing.T) {
	t.Parallel()
	cl, err := pgtest.StartCluster(&pgtest.ClusterConfig{MaxConnections: 20})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := cl.Stop(); err != nil {
			t.Error(err)
		}
	})
	ctx := context.Background()
	pool := pgtest.Pool(t, cl.URL, 4)
	const schema = "orders"
	if _, err := migrate.Up(ctx, pool, &migrate.Config{Schema: schema}); err != nil {
		t.Fatal(err)
	}
	index := quoted(schema, "outbox_events_published_at_brin")
	table := quoted(schema, "outbox_events")
	// No VACUUM of this table, which would summarize ranges too: the counts
	// below are then the cleanup's alone. (autovacuum still runs, and still
	// serves its work-item queue.)
	_, err = pool.Exec(ctx, "ALTER TABLE "+table+" SET (autovacuum_enabled = off)")
	pgtest.Must(t, err, "autovacuum off for the table")

	// 40,000 events of about 1 KB, in transactions of 500: several thousand
	// pages, hundreds of 16-page ranges.
	prod, err := pgoutbox.NewProducer(&pgoutbox.Config{Schema: schema})
	pgtest.Must(t, err, "producer")
	payload := map[string]string{"note": strings.Repeat("x", 1000)}
	const events, batch = 40000, 500
	for b := range events / batch {
		evs := make([]pgoutbox.Event, batch)
		for i := range evs {
			evs[i] = pgoutbox.Event{AggregateType: "order", AggregateID: fmt.Sprint((b*batch + i) % 1000),
				EventType: "order.noted", Payload: payload}
		}
		pgtest.Must(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			_, err := prod.EnqueueTx(ctx, tx, evs...)
			return err
		}), "enqueue batch %d", b)
	}
	var ranges int64
	pgtest.Must(t, pool.QueryRow(ctx, `SELECT (pg_relation_size($1::regclass) / current_setting('block_size')::bigint + 15) / 16`,
		table).Scan(&ranges), "table size")
	if ranges <= 2*autovacuumWorkItems {
		t.Fatalf("the enqueue filled %d page ranges, want more than twice autovacuum's %d work items for the test to mean anything",
			ranges, autovacuumWorkItems)
	}

	// The log is written by the inserting backends themselves, synchronously:
	// once the inserts returned, any line they caused is in the file.
	assertNoFlood := func(when string) {
		t.Helper()
		log, err := os.ReadFile(cl.LogFile())
		pgtest.Must(t, err, "read the server log")
		if n := strings.Count(string(log), brinFlood); n > 0 {
			t.Fatalf("%s: the server logged %q %d times; first:\n%s", when, brinFlood, n,
				string(log)[strings.Index(string(log), brinFlood):][:min(300, len(log)-strings.Index(string(log), brinFlood))])
		}
	}
	assertNoFlood(fmt.Sprintf("after %d events (%d page ranges)", events, ranges))

	// Cleanup summarizes, bounded per run; a second run reaches further back.
	res, err := admin.Cleanup(ctx, pool, admin.CleanupConfig{Schema: schema, SummarizeRanges: 100})
	pgtest.Must(t, err, "Cleanup")
	if res.Summarized != 100 {
		t.Fatalf("a run with SummarizeRanges 100 summarized %d ranges, want the newest 100", res.Summarized)
	}
	res, err = admin.Cleanup(ctx, pool, admin.CleanupConfig{Schema: schema, SummarizeRanges: int(ranges)})
	pgtest.Must(t, err, "Cleanup")
	// The first range may have its summary from CREATE INDEX (a BRIN build
	// summarizes the range it ends in, even of an empty table).
	if res.Summarized < ranges-101 || res.Summarized > ranges-100 {
		t.Fatalf("the second run summarized %d ranges, want the %d the first left", res.Summarized, ranges-100)
	}
	var left int64
	pgtest.Must(t, pool.QueryRow(ctx, "SELECT brin_summarize_new_values($1::regclass)", index).Scan(&left), "summarize the rest")
	if left != 0 {
		t.Fatalf("%d ranges were still unsummarized after cleanup", left)
	}
	res, err = admin.Cleanup(ctx, pool, admin.CleanupConfig{Schema: schema})
	pgtest.Must(t, err, "Cleanup")
	if res.Summarized != 0 {
		t.Fatalf("a run over a summarized index summarized %d ranges", res.Summarized)
	}
	assertNoFlood("after cleanup")
}

// No BRIN index of an outbox asks autovacuum to summarize, plain or partitioned
// (whose index migration 10 makes again, and whose partitions made later take its
// definition), and Cleanup summarizes a partitioned outbox's partitions too.
func TestOutboxBRINIndexesAreSummarizedByCleanupOnly(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	plainPool, plain := pgtest.Migrated(t, 2)
	partPool, part := partitionedOutbox(t, 2)
	dayPartition(t, partPool, part, 3) // made after the migrations, as cleanup makes them
	for _, o := range []struct {
		pool   *pgxpool.Pool
		schema string
		want   int // BRIN indexes at least: the plain one; the parent, the default and the daily partitions
	}{{plainPool, plain, 1}, {partPool, part, 3}} {
		prod, err := pgoutbox.NewProducer(&pgoutbox.Config{Schema: o.schema})
		pgtest.Must(t, err, "producer")
		evs := make([]pgoutbox.Event, 200)
		for i := range evs {
			evs[i] = pgoutbox.Event{AggregateType: "order", AggregateID: fmt.Sprint(i), EventType: "order.noted",
				Payload: map[string]string{"note": strings.Repeat("x", 1000)}}
		}
		pgtest.Must(t, pgx.BeginFunc(ctx, o.pool, func(tx pgx.Tx) error {
			_, err := prod.EnqueueTx(ctx, tx, evs...)
			return err
		}), "enqueue")

		var n, autosummarize int
		pgtest.Must(t, o.pool.QueryRow(ctx, `SELECT count(*), count(*) FILTER (WHERE c.reloptions::text[] && ARRAY['autosummarize=on', 'autosummarize=true'])
FROM pg_class c JOIN pg_am am ON am.oid = c.relam AND am.amname = 'brin'
WHERE c.relnamespace = $1::regnamespace`, quoted(o.schema)).Scan(&n, &autosummarize), "indexes")
		if n < o.want || autosummarize != 0 {
			t.Fatalf("%s: %d BRIN indexes, %d of them with autosummarize on", o.schema, n, autosummarize)
		}
		res, err := admin.Cleanup(ctx, o.pool, admin.CleanupConfig{Schema: o.schema})
		pgtest.Must(t, err, "Cleanup %s", o.schema)
		if res.Summarized == 0 {
			t.Fatalf("%s: Cleanup summarized nothing after 200 events of 1 KB", o.schema)
		}
		var left int64
		pgtest.Must(t, o.pool.QueryRow(ctx, `SELECT coalesce(sum(brin_summarize_new_values(c.oid)), 0)::bigint
FROM pg_class c JOIN pg_am am ON am.oid = c.relam AND am.amname = 'brin'
WHERE c.relnamespace = $1::regnamespace AND c.relkind = 'i'`, quoted(o.schema)).Scan(&left), "left")
		if left != 0 {
			t.Fatalf("%s: %d ranges unsummarized after Cleanup", o.schema, left)
		}
	}
}

// Summarizing takes the table's ownership: a cleanup run by the operator role
// (not the owner) still deletes, summarizes nothing, and succeeds; the owner's
// next run summarizes.
func TestCleanupWithoutOwnershipLeavesSummarizationToVacuum(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, schema := pgtest.Migrated(t, 2)
	operator := pgtest.Role(t, pool, "")
	grants, err := migrate.Grants(&migrate.GrantsConfig{Schema: schema, Roles: []migrate.Role{migrate.RoleOperator},
		RoleNames: map[migrate.Role]string{migrate.RoleOperator: operator}})
	pgtest.Must(t, err, "grants")
	_, err = pool.Exec(ctx, grants)
	pgtest.Must(t, err, "grant")
	prod, err := pgoutbox.NewProducer(&pgoutbox.Config{Schema: schema})
	pgtest.Must(t, err, "producer")
	evs := make([]pgoutbox.Event, 100)
	for i := range evs {
		evs[i] = pgoutbox.Event{AggregateType: "order", AggregateID: fmt.Sprint(i), EventType: "order.noted",
			Payload: map[string]string{"note": strings.Repeat("x", 1000)}}
	}
	pgtest.Must(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		_, err := prod.EnqueueTx(ctx, tx, evs...)
		return err
	}), "enqueue")
	_, err = pool.Exec(ctx, "UPDATE "+quoted(schema, "outbox_events")+
		" SET published_at = now() - interval '30 days' WHERE aggregate_id IN ('1', '2')")
	pgtest.Must(t, err, "publish two")

	asOperator := pgtest.Pool(t, pgtest.AsRole(t, pgtest.URL(), operator), 2)
	res, err := admin.Cleanup(ctx, asOperator, admin.CleanupConfig{Schema: schema, Logger: quietLog})
	if err != nil || res.Deleted != 2 || res.Summarized != 0 {
		t.Fatalf("cleanup as the operator: %+v, %v; want 2 deleted, nothing summarized, no error", res, err)
	}
	res, err = admin.Cleanup(ctx, pool, admin.CleanupConfig{Schema: schema})
	if err != nil || res.Summarized == 0 {
		t.Fatalf("cleanup as the owner: %+v, %v; want ranges summarized", res, err)
	}
}
