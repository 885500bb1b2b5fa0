package migrate_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgoutbox/pgoutbox"
	"github.com/pgoutbox/pgoutbox/admin"
	"github.com/pgoutbox/pgoutbox/broker/brokertest"
	"github.com/pgoutbox/pgoutbox/cdc"
	"github.com/pgoutbox/pgoutbox/inbox"
	"github.com/pgoutbox/pgoutbox/internal/pgtest"
	"github.com/pgoutbox/pgoutbox/migrate"
	"github.com/pgoutbox/pgoutbox/relay"
)

// hostileSchemaNames returns schema names, each at most 63 bytes, that would run
// canary (an expression with a side effect) if any SQL context pgoutbox puts a
// schema name in were not quoted for that context: dollar-quoted bodies,
// string literals, identifiers, comments, format() patterns, placeholders. Each
// name starts with tag, so that concurrent runs do not collide.
func hostileSchemaNames(tag, canary string) []string {
	c := canary // e.g. nextval('cn_x.s')
	names := []string{
		"$s$||" + c + "||$s$",              // the partitioned function's old $s$ literal
		"$fn$;SELECT " + c + ";$fn$",       // ends a function body
		"$$;SELECT " + c + ";$$",           // ends an anonymous dollar quote
		"';SELECT " + c + ";--",            // ends a string literal
		"'';SELECT " + c + ";--",           // doubled quote
		`";SELECT ` + c + `;--`,            // ends a quoted identifier
		`"";SELECT ` + c + `--`,            // doubled double quote
		"a;SELECT " + c,                    // statement separator
		"--\nSELECT " + c + ";",            // newline after a line comment
		"/*/SELECT " + c + "*/",            // block comment
		`\';SELECT ` + c + `;--`,           // backslash before a quote (E'' strings)
		"%I%s%L%%;SELECT " + c,             // format() patterns
		"{{schema}};SELECT " + c,           // placeholders inside the name
		"{{schema_name}}'||" + c + "||'",   // placeholder and a literal break-out
		"ünï😀$s$';SELECT " + c + "--",      // unicode
		"UPPER Case $fn$ " + c,             // upper case and spaces
		"E'\\x';SELECT " + c + ";--",       // an escape string
		"$1;SELECT " + c + ";$2",           // parameter markers
		"\t\r\n;SELECT " + c,               // control characters
		"x$fn_q1$;SELECT " + c + "$fn_q1$", // the expander's own fallback tag
	}
	out := make([]string, 0, len(names)+1)
	for _, n := range names {
		out = append(out, trim63(tag+n))
	}
	// Exactly 63 bytes.
	long := tag + "$s$'\";SELECT " + c + ";--"
	for len(long) < 63 {
		long += "$"
	}
	return append(out, trim63(long))
}

func trim63(s string) string {
	for len(s) > 63 {
		_, n := utf8.DecodeLastRuneInString(s)
		s = s[:len(s)-n]
	}
	return s
}

// TestHostileSchemaNames runs every path that puts the schema name in SQL
// (migrate plain and partitioned, inbox migrate, enqueue through the Go API and
// through outbox_enqueue, a relay draining to a publisher with LISTEN/NOTIFY and
// the idle lock, status, retry, cleanup and partition creation) under many
// hostile names, and proves that no injected expression ran: the canary
// sequence, whose nextval survives rollback, was never advanced.
func TestHostileSchemaNames(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t, pgtest.URL(), 8)
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()

	canarySchema := pgtest.SchemaName(t, pool, "cn")
	pgtest.Must(t, exec(ctx, pool, "CREATE SCHEMA "+pgx.Identifier{canarySchema}.Sanitize()), "create canary schema")
	pgtest.Must(t, exec(ctx, pool, "CREATE SEQUENCE "+pgx.Identifier{canarySchema, "s"}.Sanitize()), "create canary sequence")
	canary := fmt.Sprintf("nextval('%s.s')", canarySchema)
	// The canary works: an expression that runs it is seen.
	assertCanary(ctx, t, pool, canarySchema, false)

	b := make([]byte, 2)
	_, _ = rand.Read(b)
	tag := hex.EncodeToString(b)
	names := hostileSchemaNames(tag, canary)
	if len(names) < 15 {
		t.Fatalf("only %d names", len(names))
	}
	for i, name := range names {
		for mode, prefix := range []string{"e", "p", "s"} {
			// Plain, partitioned and scripted get different names: replace the
			// tag's first character.
			schema := prefix + name[1:]
			partitioned, scripted := mode == 1, mode == 2
			if err := migrate.ValidateSchema(schema); err != nil {
				t.Fatalf("name %d %q: %v", i, schema, err)
			}
			t.Cleanup(func() {
				if _, err := pool.Exec(context.Background(), "DROP SCHEMA IF EXISTS "+pgx.Identifier{schema}.Sanitize()+" CASCADE"); err != nil {
					t.Errorf("drop schema %q: %v", schema, err)
				}
			})
			t.Run(fmt.Sprintf("%02d/%s", i, []string{"up", "partitioned", "script"}[mode]), func(t *testing.T) {
				hostileRound(ctx, t, pool, schema, partitioned, scripted)
			})
		}
	}
	assertCanary(ctx, t, pool, canarySchema, false)
}

func exec(ctx context.Context, db interface {
	Exec(context.Context, string, ...any) (pgconn.CommandTag, error)
}, sql string, args ...any) error {
	_, err := db.Exec(ctx, sql, args...)
	return err
}

func assertCanary(ctx context.Context, t *testing.T, pool *pgxpool.Pool, schema string, want bool) {
	t.Helper()
	var called bool
	pgtest.Must(t, pool.QueryRow(ctx, "SELECT is_called FROM "+pgx.Identifier{schema, "s"}.Sanitize()).Scan(&called), "read canary")
	if called != want {
		t.Fatalf("canary sequence called = %v, want %v: an injected expression ran", called, want)
	}
}

func hostileRound(ctx context.Context, t *testing.T, pool *pgxpool.Pool, schema string, partitioned, scripted bool) {
	cfg := &migrate.Config{Schema: schema, Partitioned: partitioned}
	if scripted {
		// The script of "pgoutbox migrate print", as psql would run it.
		script, err := migrate.SQL(cfg)
		pgtest.Must(t, err, "script")
		_, err = pool.Exec(ctx, script, pgx.QueryExecModeSimpleProtocol)
		pgtest.Must(t, err, "run the script for %q", schema)
	} else {
		applied, err := migrate.Up(ctx, pool, cfg)
		pgtest.Must(t, err, "migrate %q", schema)
		all, _ := migrate.All()
		if len(applied) != len(all) {
			t.Fatalf("applied %d of %d migrations", len(applied), len(all))
		}
	}
	if _, err := migrate.Up(ctx, pool, cfg); err != nil { // partition creation again, nothing to apply
		t.Fatalf("second migrate: %v", err)
	}
	st, err := migrate.State(ctx, pool, cfg)
	pgtest.Must(t, err, "state")
	for _, s := range st {
		if !s.Applied || s.Unknown {
			t.Fatalf("after Up: %+v", s)
		}
	}
	if err := migrate.CheckCompatible(ctx, pool, schema); err != nil {
		t.Fatal(err)
	}
	if got, err := migrate.IsPartitioned(ctx, pool, schema); err != nil || got != partitioned {
		t.Fatalf("IsPartitioned = %v, %v", got, err)
	}
	// The functions' bodies hold no statement of the name: the SQL-visible
	// name of each object is the schema given.
	var nfuncs int
	pgtest.Must(t, pool.QueryRow(ctx, `SELECT count(*) FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace WHERE n.nspname = $1`, schema).Scan(&nfuncs), "count functions")
	if want := 2 + btoi(partitioned); nfuncs < want {
		t.Fatalf("%d functions in the schema, want at least %d", nfuncs, want)
	}

	// A listener on the schema's channel that holds the idle lock, as an idle
	// relay does, is notified of the commit below.
	listener, err := pool.Acquire(ctx)
	pgtest.Must(t, err, "acquire")
	defer listener.Release()
	channel := migrate.NotifyChannel(schema)
	pgtest.Must(t, exec(ctx, listener.Conn(), "LISTEN "+pgx.Identifier{channel}.Sanitize()), "listen")
	pgtest.Must(t, exec(ctx, listener.Conn(), "SELECT pg_advisory_lock(hashtext($1), hashtext($2))", migrate.IdleLockClass, schema), "idle lock")

	// Enqueue through the Go API and through outbox_enqueue.
	p, err := pgoutbox.NewProducer(&pgoutbox.Config{Schema: schema})
	pgtest.Must(t, err, "producer")
	tx, err := pool.Begin(ctx)
	pgtest.Must(t, err, "begin")
	_, err = p.EnqueueTx(ctx, tx, pgoutbox.Event{AggregateType: "order", AggregateID: "1", EventType: "created", Payload: map[string]any{"n": 1}})
	pgtest.Must(t, err, "enqueue")
	var id pgoutbox.UUID
	pgtest.Must(t, tx.QueryRow(ctx, "SELECT "+pgx.Identifier{schema, "outbox_enqueue"}.Sanitize()+"($1, $2, $3, $4)",
		"order", "1", "paid", `{"n": 2}`).Scan(&id), "outbox_enqueue")
	pgtest.Must(t, tx.Commit(ctx), "commit")
	wctx, wcancel := context.WithTimeout(ctx, 10*time.Second)
	n, err := listener.Conn().WaitForNotification(wctx)
	wcancel()
	pgtest.Must(t, err, "wait for the notification")
	if n.Channel != channel {
		t.Fatalf("notified on %q, want %q", n.Channel, channel)
	}
	pgtest.Must(t, exec(ctx, listener.Conn(), "SELECT pg_advisory_unlock(hashtext($1), hashtext($2))", migrate.IdleLockClass, schema), "idle unlock")
	pgtest.Must(t, exec(ctx, listener.Conn(), "UNLISTEN *"), "unlisten")

	// A relay drains both, with LISTEN/NOTIFY and the idle lock on.
	rec := &brokertest.Recorder{}
	r, err := relay.New(pool, rec, &relay.Config{Schema: schema, PollInterval: 50 * time.Millisecond, Logger: slog.New(slog.DiscardHandler)})
	pgtest.Must(t, err, "relay")
	pgtest.Must(t, r.Start(ctx), "start relay")
	deadline := time.Now().Add(30 * time.Second)
	for len(rec.Messages()) < 2 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	// A third event after the relay went idle exercises outbox_wake's notify.
	tx, err = pool.Begin(ctx)
	pgtest.Must(t, err, "begin")
	_, err = p.EnqueueTx(ctx, tx, pgoutbox.Event{AggregateType: "order", AggregateID: "1", EventType: "shipped", Payload: 3})
	pgtest.Must(t, err, "enqueue")
	pgtest.Must(t, tx.Commit(ctx), "commit")
	for len(rec.Messages()) < 3 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	stopCtx, stopCancel := context.WithTimeout(ctx, 10*time.Second)
	pgtest.Must(t, r.Stop(stopCtx), "stop relay")
	stopCancel()
	if n := len(rec.Messages()); n != 3 {
		t.Fatalf("relay published %d events, want 3", n)
	}

	// A consumer applies the published events once, in the same schema's inbox.
	c, err := inbox.New(inbox.Pgx(pool), func(context.Context, pgx.Tx, inbox.Event) error { return nil },
		&inbox.Config{Name: "c'$s$\"", Schema: schema, Logger: slog.New(slog.DiscardHandler)})
	pgtest.Must(t, err, "consumer")
	for round, want := range []inbox.Status{inbox.StatusApplied, inbox.StatusDuplicate} {
		for _, m := range rec.Messages() {
			if o := c.Process(ctx, inbox.DeliveryOf(m)); o.Status != want {
				t.Fatalf("consumer round %d: %s (%v), want %s", round, o.Status, o.Err, want)
			}
		}
	}

	// Operator paths: status, retry, the dead letter queue, replay, cleanup (with
	// partition creation).
	a, err := admin.New(pool, &admin.Config{Schema: schema})
	pgtest.Must(t, err, "admin")
	tx, err = pool.Begin(ctx)
	pgtest.Must(t, err, "begin")
	enq, err := p.EnqueueTx(ctx, tx, pgoutbox.Event{AggregateType: "order", AggregateID: "2", EventType: "poison", Payload: 4})
	pgtest.Must(t, err, "enqueue")
	pgtest.Must(t, tx.Commit(ctx), "commit")
	pgtest.Must(t, exec(ctx, pool, "UPDATE "+pgx.Identifier{schema, "outbox_events"}.Sanitize()+
		" SET quarantined_at = now(), attempt_count = 1, last_error = 'refused' WHERE event_id = $1", enq[0].EventID), "quarantine")
	dead, err := a.ListQuarantined(ctx, admin.Filter{AggregateType: "order"})
	pgtest.Must(t, err, "list quarantined")
	if len(dead) != 1 || dead[0].ID != enq[0].EventID {
		t.Fatalf("quarantined: %+v", dead)
	}
	skipped, err := a.Skip(ctx, admin.SkipRequest{IDs: []pgoutbox.UUID{enq[0].EventID}, Reason: "test", Actor: "hostile"})
	pgtest.Must(t, err, "skip")
	if len(skipped) != 1 {
		t.Fatalf("skipped %v", skipped)
	}
	rr, err := admin.Replay(ctx, pool, rec, admin.ReplayRequest{Schema: schema, Filter: admin.ReplayFilter{AggregateType: "order"}})
	pgtest.Must(t, err, "replay")
	if rr.Total != 3 || rr.Published != 3 {
		t.Fatalf("replay: %+v, want the 3 published events (not the skipped one)", rr)
	}
	status, err := a.Status(ctx)
	pgtest.Must(t, err, "status")
	if status.Pending != 0 {
		t.Fatalf("status: %d pending", status.Pending)
	}
	if _, err := a.Retry(ctx, id); err != nil {
		t.Fatalf("retry: %v", err)
	}
	res, err := admin.Cleanup(ctx, pool, admin.CleanupConfig{Schema: schema, Retention: time.Microsecond, InboxRetention: time.Hour, InboxReplayHorizon: time.Microsecond})
	pgtest.Must(t, err, "cleanup")
	if res.Deleted+res.DroppedRows != 4 {
		t.Fatalf("cleanup deleted %d rows and dropped %d, want 4 in all", res.Deleted, res.DroppedRows)
	}
	if partitioned {
		created, err := migrate.CreatePartitions(ctx, pool, schema, migrate.DefaultPartitionsAhead+3)
		pgtest.Must(t, err, "create partitions")
		if len(created) != 3 {
			t.Fatalf("created partitions %v, want 3 more", created)
		}
	}
	script, err := migrate.SQL(cfg)
	pgtest.Must(t, err, "script")
	if !strings.Contains(script, pgx.Identifier{schema}.Sanitize()) {
		t.Fatalf("script does not name the schema")
	}
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

// TestHostileSchemaNamesCDC runs the CDC source (publication, slot, column
// defaults, streaming, Disable) under some of the hostile names: slots are a
// scarce server resource, so not all of them. It runs on the test binary's
// throwaway logical cluster.
func TestHostileSchemaNamesCDC(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t, pgtest.Logical(t), 8)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	canarySchema := pgtest.SchemaName(t, pool, "cn")
	pgtest.Must(t, exec(ctx, pool, "CREATE SCHEMA "+pgx.Identifier{canarySchema}.Sanitize()), "create canary schema")
	pgtest.Must(t, exec(ctx, pool, "CREATE SEQUENCE "+pgx.Identifier{canarySchema, "s"}.Sanitize()), "create canary sequence")
	b := make([]byte, 2)
	_, _ = rand.Read(b)
	names := hostileSchemaNames("c"+hex.EncodeToString(b)[1:], fmt.Sprintf("nextval('%s.s')", canarySchema))
	for _, i := range []int{0, 1, 3, 5, 8, 11, 14, 20} {
		schema := names[i]
		t.Cleanup(func() {
			if _, err := pool.Exec(context.Background(), "DROP SCHEMA IF EXISTS "+pgx.Identifier{schema}.Sanitize()+" CASCADE"); err != nil {
				t.Errorf("drop schema %q: %v", schema, err)
			}
		})
		t.Run(strconv.Itoa(i), func(t *testing.T) {
			_, err := migrate.Up(ctx, pool, &migrate.Config{Schema: schema, Lines: []migrate.Line{migrate.LineOutbox}})
			pgtest.Must(t, err, "migrate")
			cfg := &cdc.Config{Schema: schema, Logger: slog.New(slog.DiscardHandler)}
			rec := &brokertest.Recorder{}
			src, err := cdc.New(pool, rec, cfg)
			pgtest.Must(t, err, "cdc.New")
			pgtest.Must(t, src.Start(ctx), "start")
			p, err := pgoutbox.NewProducer(&pgoutbox.Config{Schema: schema})
			pgtest.Must(t, err, "producer")
			_, err = p.EnqueueTx(ctx, pool, pgoutbox.Event{AggregateType: "order", AggregateID: "1", EventType: "created", Payload: 1})
			pgtest.Must(t, err, "enqueue")
			deadline := time.Now().Add(30 * time.Second)
			for len(rec.Messages()) < 1 && time.Now().Before(deadline) {
				time.Sleep(5 * time.Millisecond)
			}
			stopCtx, stopCancel := context.WithTimeout(ctx, 20*time.Second)
			defer stopCancel()
			pgtest.Must(t, src.Stop(stopCtx), "stop")
			if n := len(rec.Messages()); n != 1 {
				t.Fatalf("cdc published %d events, want 1", n)
			}
			pgtest.Must(t, cdc.Disable(ctx, pool, cfg), "disable")
		})
	}
	assertCanary(ctx, t, pool, canarySchema, false)
}
