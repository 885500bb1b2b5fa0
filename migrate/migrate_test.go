package migrate_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"go.uber.org/goleak"

	"github.com/pgoutbox/pgoutbox/internal/pgtest"
	"github.com/pgoutbox/pgoutbox/migrate"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(pgtest.Main(m)) }

func TestUpTwiceIsNoOp(t *testing.T) {
	t.Parallel()
	pool, schema := pgtest.Schema(t, 2)
	ctx := context.Background()
	cfg := &migrate.Config{Schema: schema}

	st, err := migrate.State(ctx, pool, cfg)
	pgtest.Must(t, err, "state before")
	for _, s := range st {
		if s.Applied {
			t.Fatalf("%s/%d applied before Up", s.Line, s.Version)
		}
	}
	applied, err := migrate.Up(ctx, pool, cfg)
	pgtest.Must(t, err, "first Up")
	all, _ := migrate.All()
	if len(applied) != len(all) {
		t.Fatalf("first Up applied %d migrations, want %d", len(applied), len(all))
	}
	again, err := migrate.Up(ctx, pool, cfg)
	pgtest.Must(t, err, "second Up")
	if len(again) != 0 {
		t.Fatalf("second Up applied %v", again)
	}
	st, err = migrate.State(ctx, pool, cfg)
	pgtest.Must(t, err, "state after")
	for _, s := range st {
		if !s.Applied {
			t.Fatalf("%s/%d pending after Up", s.Line, s.Version)
		}
	}

	// The objects of the contract exist, in the configured schema only.
	for _, rel := range []string{"outbox_events", "outbox_aggregate_sequences", "processed_events", "pgoutbox_migrations",
		"outbox_events_unpublished_idx", "outbox_events_aggregate_sequence_key"} {
		var n int
		pgtest.Must(t, pool.QueryRow(ctx, "SELECT count(*) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = $1 AND c.relname = $2", schema, rel).Scan(&n), "catalog")
		if n != 1 {
			t.Errorf("relation %s.%s: found %d", schema, rel, n)
		}
	}
	var pred string
	pgtest.Must(t, pool.QueryRow(ctx, "SELECT pg_get_expr(i.indpred, i.indrelid) FROM pg_index i WHERE i.indexrelid = $1::regclass",
		pgx.Identifier{schema, "outbox_events_unpublished_idx"}.Sanitize()).Scan(&pred), "index predicate")
	if pred != "(published_at IS NULL)" {
		t.Errorf("partial index predicate = %s", pred)
	}
	var cols []string
	pgtest.Must(t, pool.QueryRow(ctx, "SELECT array_agg(column_name::text ORDER BY ordinal_position) FROM information_schema.columns WHERE table_schema = $1 AND table_name = 'outbox_events'", schema).Scan(&cols), "columns")
	for _, c := range []string{"event_id", "aggregate_type", "aggregate_id", "aggregate_sequence", "event_type", "schema_version", "payload",
		"occurred_at", "available_at", "claimed_by", "claim_until", "published_at", "attempt_count", "last_error", "headers", "quarantined_at"} {
		if !contains(cols, c) {
			t.Errorf("outbox_events lacks column %s (has %v)", c, cols)
		}
	}
}

func contains(s []string, v string) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}

// Many migrators at once: the advisory lock makes one apply each migration and the
// rest find it done; nobody fails on a catalog race, even for a schema that does
// not exist yet.
func TestConcurrentUp(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t, pgtest.URL(), 8)
	schema := pgtest.SchemaName(t, pool, "t")
	ctx := context.Background()

	const n = 8
	var wg sync.WaitGroup
	counts := make([]int, n)
	errs := make([]error, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			applied, err := migrate.Up(ctx, pool, &migrate.Config{Schema: schema})
			counts[i], errs[i] = len(applied), err
		}()
	}
	wg.Wait()
	total := 0
	for i := range n {
		pgtest.Must(t, errs[i], "migrator %d", i)
		total += counts[i]
	}
	all, _ := migrate.All()
	if total != len(all) {
		t.Fatalf("migrators applied %d migrations in all, want each of %d once", total, len(all))
	}
}

func TestLinesAreIndependent(t *testing.T) {
	t.Parallel()
	pool, schema := pgtest.Schema(t, 2)
	ctx := context.Background()
	applied, err := migrate.Up(ctx, pool, &migrate.Config{Schema: schema, Lines: []migrate.Line{migrate.LineInbox}})
	pgtest.Must(t, err, "inbox Up")
	for _, a := range applied {
		if a.Line != migrate.LineInbox {
			t.Fatalf("inbox-only Up applied %v", a)
		}
	}
	var exists bool
	pgtest.Must(t, pool.QueryRow(ctx, "SELECT to_regclass($1) IS NOT NULL", pgx.Identifier{schema, "outbox_events"}.Sanitize()).Scan(&exists), "regclass")
	if exists {
		t.Fatal("inbox-only Up created outbox_events")
	}
	applied, err = migrate.Up(ctx, pool, &migrate.Config{Schema: schema})
	pgtest.Must(t, err, "full Up")
	for _, a := range applied {
		if a.Line != migrate.LineOutbox {
			t.Fatalf("full Up after inbox re-applied %v", a)
		}
	}
}

// The printed script is what teams feed their own tools: it must apply cleanly, be
// safe to apply twice, and leave the bookkeeping so that Up finds nothing to do.
func TestSQLScriptAppliesTwiceAndAgreesWithUp(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t, pgtest.URL(), 2)
	schema := pgtest.SchemaName(t, pool, "t")
	ctx := context.Background()

	script, err := migrate.SQL(&migrate.Config{Schema: schema})
	pgtest.Must(t, err, "SQL")
	if strings.Contains(script, "{{schema}}") {
		t.Fatal("script still has the placeholder")
	}
	for i := range 2 {
		if _, err := pool.Exec(ctx, script, pgx.QueryExecModeSimpleProtocol); err != nil {
			t.Fatalf("applying the script, time %d: %v", i+1, err)
		}
	}
	applied, err := migrate.Up(ctx, pool, &migrate.Config{Schema: schema})
	pgtest.Must(t, err, "Up")
	if len(applied) != 0 {
		t.Fatalf("Up after the script applied %v", applied)
	}
}

func TestOddSchemaNameIsQuoted(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t, pgtest.URL(), 2)
	schema := pgtest.SchemaName(t, pool, `Odd "Name"; DROP`)
	ctx := context.Background()
	if _, err := migrate.Up(ctx, pool, &migrate.Config{Schema: schema}); err != nil {
		t.Fatal(err)
	}
	var id string
	pgtest.Must(t, pool.QueryRow(ctx, "SELECT "+pgx.Identifier{schema, "outbox_enqueue"}.Sanitize()+"('a', '1', 'e', '{}')::text").Scan(&id), "enqueue")
}

func TestConfigErrors(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	if _, err := migrate.Up(ctx, nil, &migrate.Config{Schema: strings.Repeat("x", 64)}); err == nil || !strings.Contains(err.Error(), "63 bytes") {
		t.Errorf("long schema: %v", err)
	}
	if _, err := migrate.Up(ctx, nil, &migrate.Config{Lines: []migrate.Line{"outbox", "nope"}}); err == nil || !strings.Contains(err.Error(), `unknown line "nope"`) {
		t.Errorf("unknown line: %v", err)
	}
	var nilCfg *migrate.Config
	if err := nilCfg.Validate(); err != nil {
		t.Errorf("nil Config: %v", err)
	}
	err := (&migrate.Config{Schema: strings.Repeat("x", 64), Lines: []migrate.Line{"nope"}}).Validate()
	if err == nil || !strings.Contains(err.Error(), "Config.Schema") || !strings.Contains(err.Error(), "Config.Lines") {
		t.Errorf("two invalid fields: %v, want both named", err)
	}
	if _, err := migrate.ParseLines("outbox,bogus"); err == nil {
		t.Error("ParseLines accepted bogus")
	}
	if l, err := migrate.ParseLines("inbox, outbox,inbox"); err != nil || len(l) != 2 || l[0] != migrate.LineInbox {
		t.Errorf("ParseLines = %v, %v", l, err)
	}
}

func TestEmbeddedMigrationsAreWellFormed(t *testing.T) {
	t.Parallel()
	all, err := migrate.All()
	pgtest.Must(t, err, "All")
	if len(all) < 2 || all[0].Line != migrate.LineOutbox {
		t.Fatalf("All() = %v", all)
	}
	for _, m := range all {
		sql := m.SQL("public")
		if !strings.Contains(sql, `"public".`) {
			t.Errorf("%s/%d names no schema-qualified object", m.Line, m.Version)
		}
		up := strings.ToUpper(sql)
		for _, stmt := range []string{"CREATE TABLE ", "CREATE INDEX ", "CREATE UNIQUE INDEX ", "CREATE SCHEMA "} {
			if strings.Count(up, stmt) != strings.Count(up, stmt+"IF NOT EXISTS ") {
				t.Errorf("%s/%d: a %q lacks IF NOT EXISTS: not idempotent", m.Line, m.Version, stmt)
			}
		}
		if strings.Count(up, "CREATE FUNCTION ") > 0 {
			t.Errorf("%s/%d: CREATE FUNCTION without OR REPLACE is not idempotent", m.Line, m.Version)
		}
	}
}

// outbox_wake, in each of its three cases, for a schema whose channel name is too
// long and is hashed: notifications off → false and silent; no relay idle → false
// and silent (the caller now holds the idle lock shared); a relay idle (the lock
// held exclusively elsewhere, as IdleLockClass says) → true and one notification
// on NotifyChannel.
func TestOutboxWake(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.Pool(t, pgtest.URL(), 4)
	schema := pgtest.SchemaName(t, pool, "wake_"+strings.Repeat("w", 45)) // 9 + 62 bytes of channel: hashed
	if _, err := migrate.Up(ctx, pool, &migrate.Config{Schema: schema}); err != nil {
		t.Fatal(err)
	}
	channel := migrate.NotifyChannel(schema)
	if !strings.HasPrefix(channel, "pgoutbox.") || strings.Contains(channel, schema) {
		t.Fatalf("channel %q: want the hashed form", channel)
	}
	listener, err := pgx.Connect(ctx, pgtest.URL())
	pgtest.Must(t, err, "listener")
	defer listener.Close(ctx)
	_, err = listener.Exec(ctx, "LISTEN "+pgx.Identifier{channel}.Sanitize())
	pgtest.Must(t, err, "listen")
	wake := "SELECT " + pgx.Identifier{schema, "outbox_wake"}.Sanitize() + "()"

	// call runs outbox_wake in a transaction of its own, then sends a sentinel: the
	// first notification that arrives tells whether the call notified.
	call := func(setup string) (woke, notified bool) {
		t.Helper()
		pgtest.Must(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			if setup != "" {
				if _, err := tx.Exec(ctx, setup); err != nil {
					return err
				}
			}
			return tx.QueryRow(ctx, wake).Scan(&woke)
		}), "outbox_wake")
		_, err := pool.Exec(ctx, "SELECT pg_notify($1, 'sentinel')", channel)
		pgtest.Must(t, err, "sentinel")
		wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		n, err := listener.WaitForNotification(wctx)
		pgtest.Must(t, err, "wait for a notification")
		if n.Payload != "sentinel" {
			// Drain the sentinel that follows.
			_, err := listener.WaitForNotification(wctx)
			pgtest.Must(t, err, "wait for the sentinel")
			return woke, true
		}
		return woke, false
	}

	if woke, notified := call(""); woke || notified {
		t.Fatalf("no relay idle: returned %v, notified %v", woke, notified)
	}
	// A relay is idle: it holds the lock exclusively on its own session.
	relay, err := pool.Acquire(ctx)
	pgtest.Must(t, err, "acquire")
	defer relay.Release()
	_, err = relay.Exec(ctx, "SELECT pg_advisory_lock(hashtext($1), hashtext($2))", migrate.IdleLockClass, schema)
	pgtest.Must(t, err, "idle lock")
	if woke, notified := call(""); !woke || !notified {
		t.Fatalf("a relay idle: returned %v, notified %v", woke, notified)
	}
	if woke, notified := call("SET LOCAL pgoutbox.notify = 'off'"); woke || notified {
		t.Fatalf("notifications off: returned %v, notified %v", woke, notified)
	}
	_, err = relay.Exec(ctx, "SELECT pg_advisory_unlock(hashtext($1), hashtext($2))", migrate.IdleLockClass, schema)
	pgtest.Must(t, err, "idle unlock")
}
