package migrate_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/pgoutbox/internal/pgtest"
	"github.com/pgoutbox/pgoutbox/migrate"
)

// partitions lists the partitions of schema's outbox_events.
func partitions(t *testing.T, pool interface {
	Query(context.Context, string, ...any) (pgx.Rows, error)
}, schema string) []string {
	t.Helper()
	rows, err := pool.Query(context.Background(), `SELECT c.relname::text FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
 WHERE i.inhparent = to_regclass($1) ORDER BY 1`, pgx.Identifier{schema, "outbox_events"}.Sanitize())
	pgtest.Must(t, err, "list partitions")
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	pgtest.Must(t, err, "list partitions")
	return names
}

func TestPartitionedUp(t *testing.T) {
	t.Parallel()
	pool, schema := pgtest.Schema(t, 2)
	ctx := context.Background()
	cfg := &migrate.Config{Schema: schema, Partitioned: true}
	applied, err := migrate.Up(ctx, pool, cfg)
	pgtest.Must(t, err, "Up")
	all, _ := migrate.All()
	if len(applied) != len(all) {
		t.Fatalf("applied %v", applied)
	}
	if ok, err := migrate.IsPartitioned(ctx, pool, schema); err != nil || !ok {
		t.Fatalf("IsPartitioned = %v, %v", ok, err)
	}
	// Today (UTC) and the next 7 days, plus the default partition.
	got := partitions(t, pool, schema)
	today := time.Now().UTC()
	want := []string{"outbox_events_default"}
	for d := range migrate.DefaultPartitionsAhead + 1 {
		want = append(want, "outbox_events_p"+today.AddDate(0, 0, d).Format("20060102"))
	}
	if strings.Join(got, ",") != strings.Join(want, ",") {
		t.Fatalf("partitions %v, want %v", got, want)
	}

	// Rows go where their occurred_at says, and one outside every partition goes
	// to the default partition instead of failing.
	ev := pgx.Identifier{schema, "outbox_events"}.Sanitize()
	enq := pgx.Identifier{schema, "outbox_enqueue"}.Sanitize()
	_, err = pool.Exec(ctx, "SELECT "+enq+"('order', '1', 'created', '{}'), "+enq+"('order', '1', 'paid', '{}')")
	pgtest.Must(t, err, "outbox_enqueue")
	_, err = pool.Exec(ctx, "INSERT INTO "+ev+" (event_id, aggregate_type, aggregate_id, aggregate_sequence, event_type, payload, occurred_at) "+
		"VALUES (gen_random_uuid(), 'order', '2', 1, 'created', '{}', now() - interval '30 days')")
	pgtest.Must(t, err, "insert an old event")
	var todays, deflt int
	pgtest.Must(t, pool.QueryRow(ctx, "SELECT (SELECT count(*) FROM "+pgx.Identifier{schema, want[1]}.Sanitize()+"), (SELECT count(*) FROM "+
		pgx.Identifier{schema, "outbox_events_default"}.Sanitize()+")").Scan(&todays, &deflt), "count")
	if todays != 2 || deflt != 1 {
		t.Fatalf("today's partition holds %d rows, the default %d; want 2 and 1", todays, deflt)
	}
	// The per-partition unique index still refuses a repeated sequence.
	_, err = pool.Exec(ctx, "INSERT INTO "+ev+" (event_id, aggregate_type, aggregate_id, aggregate_sequence, event_type, payload) "+
		"VALUES (gen_random_uuid(), 'order', '1', 2, 'paid', '{}')")
	if err == nil || !strings.Contains(err.Error(), "23505") {
		t.Fatalf("repeated sequence in one partition: %v, want a unique violation", err)
	}

	// Again: nothing to apply, no partition to create.
	again, err := migrate.Up(ctx, pool, cfg)
	pgtest.Must(t, err, "Up again")
	if len(again) != 0 {
		t.Fatalf("second Up applied %v", again)
	}
	created, err := migrate.CreatePartitions(ctx, pool, schema, 10)
	pgtest.Must(t, err, "CreatePartitions")
	if len(created) != 3 {
		t.Fatalf("CreatePartitions(10) created %v, want 3 more days", created)
	}
}

func TestPartitionedRefusesPlainTable(t *testing.T) {
	t.Parallel()
	pool, schema := pgtest.Migrated(t, 2)
	ctx := context.Background()
	_, err := migrate.Up(ctx, pool, &migrate.Config{Schema: schema, Partitioned: true})
	if err == nil || !strings.Contains(err.Error(), "is not partitioned") {
		t.Fatalf("Up --partitioned on a plain table: %v", err)
	}
	// A plain table gets no partitions.
	created, err := migrate.CreatePartitions(ctx, pool, schema, 7)
	if err != nil || len(created) != 0 {
		t.Fatalf("CreatePartitions on a plain table = %v, %v", created, err)
	}
}

func TestPartitionedScriptAppliesTwice(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t, pgtest.URL(), 2)
	schema := pgtest.SchemaName(t, pool, `Odd "p'art"`)
	ctx := context.Background()
	script, err := migrate.SQL(&migrate.Config{Schema: schema, Partitioned: true})
	pgtest.Must(t, err, "SQL")
	for i := range 2 {
		if _, err := pool.Exec(ctx, script, pgx.QueryExecModeSimpleProtocol); err != nil {
			t.Fatalf("applying the script, time %d: %v", i+1, err)
		}
	}
	if ok, err := migrate.IsPartitioned(ctx, pool, schema); err != nil || !ok {
		t.Fatalf("IsPartitioned = %v, %v", ok, err)
	}
	if n := len(partitions(t, pool, schema)); n != migrate.DefaultPartitionsAhead+2 {
		t.Fatalf("%d partitions after the script", n)
	}
}
