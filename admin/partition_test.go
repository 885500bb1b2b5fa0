package admin_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgoutbox/pgoutbox"
	"github.com/pgoutbox/pgoutbox/admin"
	"github.com/pgoutbox/pgoutbox/broker"
	"github.com/pgoutbox/pgoutbox/broker/brokertest"
	"github.com/pgoutbox/pgoutbox/internal/pgtest"
	"github.com/pgoutbox/pgoutbox/internal/wait"
	"github.com/pgoutbox/pgoutbox/relay"
)

func tableExists(t *testing.T, pool *pgxpool.Pool, schema, name string) bool {
	t.Helper()
	var ok bool
	pgtest.Must(t, pool.QueryRow(context.Background(), "SELECT to_regclass($1) IS NOT NULL", quoted(schema, name)).Scan(&ok), "to_regclass")
	return ok
}

// Acceptance: on a partitioned outbox, cleanup drops a partition whose rows were
// all published before the cutoff, and deletes old rows in batches from the
// partitions it must keep (a quarantined row, the default partition's
// unpublished row survive).
func TestPartitionedCleanupDropsPartition(t *testing.T) {
	t.Parallel()
	pool, schema := partitionedOutbox(t, 4)
	ctx := context.Background()
	table := quoted(schema, "outbox_events")
	clean := dayPartition(t, pool, schema, 10)
	kept := dayPartition(t, pool, schema, 9)
	insert := func(aggType string, n int, occurred, published, quarantined string) {
		t.Helper()
		_, err := pool.Exec(ctx, "INSERT INTO "+table+` (event_id, aggregate_type, aggregate_id, aggregate_sequence, event_type, payload, occurred_at, published_at, quarantined_at, available_at)
SELECT gen_random_uuid(), $1, 'x' || i, 1, 'e', '{}', `+occurred+", "+published+", "+quarantined+", now() + interval '1 day' FROM generate_series(1, $2::int) AS i", aggType, n)
		pgtest.Must(t, err, "insert %s", aggType)
	}
	day := func(daysAgo int) string {
		return fmt.Sprintf("date_trunc('day', now() AT TIME ZONE 'UTC') AT TIME ZONE 'UTC' - interval '%d days' + interval '12 hours'", daysAgo)
	}
	insert("clean", 1000, day(10), day(10)+" + interval '1 minute'", "NULL")
	insert("nine", 100, day(9), day(9)+" + interval '1 minute'", "NULL")
	insert("poison", 1, day(9), "NULL", day(9))
	insert("ancient", 50, day(30), day(30)+" + interval '1 minute'", "NULL")
	insert("stuck", 1, day(30), "NULL", "NULL")
	insert("fresh", 20, "now()", "now()", "NULL")
	// Every event failed once: the attempt history goes with the events
	// cleanup deletes (in a dropped partition, or in batches), and only with them.
	attempts := quoted(schema, "outbox_attempts")
	_, err := pool.Exec(ctx, "INSERT INTO "+attempts+" (event_id, attempt, relay_id, error) SELECT event_id, 1, 'r', 'failed' FROM "+table)
	pgtest.Must(t, err, "attempts")

	// A dry run first: it says what the run below does, and changes nothing.
	var before int
	pgtest.Must(t, pool.QueryRow(ctx, "SELECT count(*) FROM "+table).Scan(&before), "count")
	dry, err := admin.Cleanup(ctx, pool, admin.CleanupConfig{Schema: schema, BatchSize: 40, Logger: quietLog, DryRun: true})
	pgtest.Must(t, err, "dry run")
	if len(dry.DroppedPartitions) != 1 || dry.DroppedPartitions[0] != clean || dry.DroppedRows != 1000 || dry.Deleted != 150 ||
		dry.Batches != 0 || len(dry.CreatedPartitions) != 0 {
		t.Fatalf("dry run = %+v, want %s (1000 rows) dropped and 150 deleted", dry, clean)
	}
	var after int
	pgtest.Must(t, pool.QueryRow(ctx, "SELECT count(*) FROM "+table).Scan(&after), "count")
	if after != before || !tableExists(t, pool, schema, clean) {
		t.Fatalf("the dry run changed the outbox: %d rows of %d, partition %s there: %v", after, before, clean, tableExists(t, pool, schema, clean))
	}

	var progress []admin.CleanupProgress
	res, err := admin.Cleanup(ctx, pool, admin.CleanupConfig{Schema: schema, BatchSize: 40, Logger: quietLog,
		Progress: func(p admin.CleanupProgress) { progress = append(progress, p) }})
	pgtest.Must(t, err, "cleanup")
	if len(res.DroppedPartitions) != 1 || res.DroppedPartitions[0] != clean || res.DroppedRows != 1000 {
		t.Fatalf("dropped %v (%d rows), want only %s", res.DroppedPartitions, res.DroppedRows, clean)
	}
	if res.Deleted != 150 || len(progress) == 0 || progress[0].DroppedPartitions != 1 {
		t.Fatalf("cleanup = %+v, progress %v", res, progress)
	}
	if tableExists(t, pool, schema, clean) {
		t.Fatalf("partition %s is still there", clean)
	}
	if !tableExists(t, pool, schema, kept) {
		t.Fatalf("partition %s with a quarantined event was dropped", kept)
	}
	var left []string
	rows, err := pool.Query(ctx, "SELECT aggregate_type || ':' || count(*) FROM "+table+" GROUP BY aggregate_type ORDER BY 1")
	pgtest.Must(t, err, "left")
	left, err = pgx.CollectRows(rows, pgx.RowTo[string])
	pgtest.Must(t, err, "left")
	if fmt.Sprint(left) != "[fresh:20 poison:1 stuck:1]" {
		t.Fatalf("rows left: %v", left)
	}
	var history, orphans int
	pgtest.Must(t, pool.QueryRow(ctx, "SELECT count(*), count(*) FILTER (WHERE NOT EXISTS (SELECT 1 FROM "+table+
		" e WHERE e.event_id = a.event_id)) FROM "+attempts+" a").Scan(&history, &orphans), "attempts left")
	if history != 22 || orphans != 0 {
		t.Fatalf("%d attempt rows left (%d of deleted events), want the 22 of the events kept", history, orphans)
	}
	// A second run finds nothing to do.
	res, err = admin.Cleanup(ctx, pool, admin.CleanupConfig{Schema: schema, Logger: quietLog})
	if err != nil || res.Deleted != 0 || len(res.DroppedPartitions) != 0 {
		t.Fatalf("second cleanup = %+v, %v", res, err)
	}
}

// Every write path works unchanged on a partitioned outbox: the producer (with
// lanes spanning the default partition, today's and tomorrow's), outbox_enqueue,
// the relay's claim, mark and fail, quarantine, admin.Retry and a replay; each
// aggregate's events reach the broker in order.
func TestRelayOverPartitionedOutbox(t *testing.T) {
	t.Parallel()
	pool, schema := partitionedOutbox(t, 8)
	ctx := context.Background()
	prod, err := pgoutbox.NewProducer(&pgoutbox.Config{Schema: schema})
	pgtest.Must(t, err, "producer")
	var ids []pgoutbox.UUID
	var poison pgoutbox.UUID
	now := time.Now()
	for s := range 12 {
		var evs []pgoutbox.Event
		for a := range 8 {
			ev := pgoutbox.Event{AggregateType: "acct", AggregateID: fmt.Sprintf("a%d", a), EventType: "e", Payload: s}
			switch s % 3 { // occurred_at hops between partitions within each lane
			case 0:
				ev.OccurredAt = now.Add(-30 * 24 * time.Hour) // default partition
			case 2:
				ev.OccurredAt = now.Add(24 * time.Hour) // tomorrow's
			}
			evs = append(evs, ev)
		}
		res, err := prod.EnqueueTx(ctx, pool, evs...)
		pgtest.Must(t, err, "enqueue")
		for _, r := range res {
			ids = append(ids, r.EventID)
		}
	}
	poison = ids[8*4+3] // a3's fifth event
	var sqlID pgoutbox.UUID
	pgtest.Must(t, pool.QueryRow(ctx, "SELECT "+quoted(schema, "outbox_enqueue")+"('acct', 'a0', 'e', '{}')").Scan(&sqlID), "outbox_enqueue")
	ids = append(ids, sqlID)

	refuse := make(chan struct{})
	rec := &brokertest.Recorder{Fail: func(m *broker.Message) error {
		select {
		case <-refuse:
			return nil
		default:
		}
		if m.EventID == poison {
			return broker.Permanent(errors.New("refused"))
		}
		return nil
	}}
	r, err := relay.New(pool, rec, &relay.Config{Schema: schema, Logger: quietLog, BatchSize: 10, RunLength: 3, PollInterval: 200 * time.Millisecond})
	pgtest.Must(t, err, "relay")
	pgtest.Must(t, r.Start(ctx), "start")
	defer func() {
		sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		pgtest.Must(t, r.Stop(sctx), "stop")
	}()
	table := quoted(schema, "outbox_events")
	waitUntil := func(what string, cond func() bool) {
		t.Helper()
		wait.For(t, 60*time.Second, what, cond)
	}
	// Everything but a3 from its poison event on: quarantined, and its lane blocked.
	waitUntil("all lanes but a3's to drain", func() bool {
		return countRows(t, pool, table, "published_at IS NULL") == 8 &&
			countRows(t, pool, table, "quarantined_at IS NOT NULL") == 1
	})
	close(refuse)
	a, err := admin.New(pool, &admin.Config{Schema: schema})
	pgtest.Must(t, err, "admin")
	retried, err := a.Retry(ctx, poison)
	if err != nil || len(retried) != 1 {
		t.Fatalf("retry = %v, %v", retried, err)
	}
	waitUntil("a3's lane to drain", func() bool { return countRows(t, pool, table, "published_at IS NULL") == 0 })

	want := map[pgoutbox.UUID]bool{}
	for _, id := range ids {
		want[id] = true
	}
	checkReplayed(t, rec.Messages(), want)

	// A replay reads the lanes across partitions in order too.
	rr := &brokertest.Recorder{}
	res, err := admin.Replay(ctx, pool, rr, admin.ReplayRequest{Schema: schema, BatchSize: 7})
	pgtest.Must(t, err, "replay")
	if res.Published != int64(len(ids)) {
		t.Fatalf("replay = %+v", res)
	}
	checkReplayed(t, rr.Messages(), want)
}
