package relay_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/pgoutbox/broker"
	"github.com/pgoutbox/pgoutbox/broker/brokertest"
	"github.com/pgoutbox/pgoutbox/internal/logtest"
	"github.com/pgoutbox/pgoutbox/internal/pgtest"
	"github.com/pgoutbox/pgoutbox/internal/wait"
	"github.com/pgoutbox/pgoutbox/migrate"
	"github.com/pgoutbox/pgoutbox/relay"
)

// tenantGate holds every batch carrying an event of tenant until open is
// closed, then passes it on; held is closed when the first one arrives. The
// other tenants' batches pass at once (gatePublisher holds them all).
type tenantGate struct {
	broker.Publisher
	tenant     string
	held, open chan struct{}
	once       sync.Once
}

func (g *tenantGate) Publish(ctx context.Context, msgs []broker.Message) []error {
	if slices.ContainsFunc(msgs, func(m broker.Message) bool { return m.Tenant == g.tenant }) {
		g.once.Do(func() { close(g.held) })
		select {
		case <-g.open:
		case <-ctx.Done():
		}
	}
	return g.Publisher.Publish(ctx, msgs)
}

func execAll(stmts ...string) func(context.Context, pgx.Tx) error {
	return func(ctx context.Context, tx pgx.Tx) error {
		for _, s := range stmts {
			if _, err := tx.Exec(ctx, s); err != nil {
				return err
			}
		}
		return nil
	}
}

// One tenant's locks cannot stall the others (issue 31). With DisableNotify
// (the PgBouncer set-up: polling alone, one probe statement for the idle
// outboxes of a database), another session holds a lock on tenant a's outbox
// in each way its owner, or a migration of it, can; tenant b's events are
// then enqueued. They are delivered while a's lock is still
// held (so a was not waited on), a is reported by name and alone, no
// connection of the pool the tenants share is closed (neither reset nor
// abandoned), and a's events are all delivered once the lock goes. Without
// the bounds, b's events waited for the lock and the pool was reset every
// 5 s.
func TestGroupTenantLockStallsNoOther(t *testing.T) {
	t.Parallel()
	for _, v := range []struct {
		name string
		// before: the lock is taken before the group starts, on a's committed
		// events, so that a's relay meets it in its first statements on new
		// connections (or discovery in its check of a). Else it is taken
		// while a's first batch is at the broker, which then acknowledges it:
		// recording that meets the lock too.
		before bool
		// refused: a is not served while the lock is held (discovery could
		// not check it), rather than served and stuck.
		refused bool
		// idle: the lock is taken while a is idle, its events written in the
		// lock's own transaction, which commits instead of rolling back.
		idle bool
		lock func(context.Context, pgx.Tx) error
	}{
		// The report of issue 31: an idle tenant's table locked while b's
		// events wait for the probe.
		{name: "idle, lock table", idle: true, lock: execAll(`LOCK TABLE a.outbox_events IN ACCESS EXCLUSIVE MODE`)},
		// A migration run again: its ALTER finds the column and changes
		// nothing, but holds an ACCESS EXCLUSIVE lock until the run commits.
		{name: "idle, migration's alter", idle: true,
			lock: execAll(`ALTER TABLE a.outbox_events ADD COLUMN IF NOT EXISTS last_error text`)},
		{name: "lock table", lock: execAll(`LOCK TABLE a.outbox_events IN ACCESS EXCLUSIVE MODE`)},
		{name: "alter table", lock: execAll(`ALTER TABLE a.outbox_events ADD COLUMN hostile int`)},
		{name: "rows for update", lock: execAll(`SELECT 1 FROM a.outbox_events FOR UPDATE`,
			`SELECT 1 FROM a.outbox_aggregate_sequences FOR UPDATE`)},
		// The tenant's own migrate, as it runs: a migration's CREATE INDEX
		// holds a SHARE lock on outbox_events until the run commits.
		{name: "migrate", lock: func(ctx context.Context, tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, `DELETE FROM a.pgoutbox_migrations WHERE line = 'outbox' AND version = 1`); err != nil {
				return err
			}
			applied, err := migrate.Up(ctx, tx, &migrate.Config{Schema: "a", Lines: []migrate.Line{migrate.LineOutbox}})
			if err == nil && len(applied) != 1 {
				err = errors.New("migrate applied " + strings.Repeat("?", len(applied)) + " migrations, want one")
			}
			return err
		}},
		{name: "locked before start", before: true, lock: execAll(`LOCK TABLE a.outbox_events IN ACCESS EXCLUSIVE MODE`)},
		{name: "migrations table locked at discovery", before: true, refused: true,
			lock: execAll(`LOCK TABLE a.pgoutbox_migrations IN ACCESS EXCLUSIVE MODE`)},
	} {
		// One after another: each holds a database and a few connections.
		t.Run(v.name, func(t *testing.T) {
			ctx := context.Background()
			url := pgtest.Database(t)
			d := &tenantDB{url: url, pool: pgtest.Pool(t, url, 1)}
			d.migrate(t, "a")
			d.migrate(t, "b")
			pool, closed := pgtest.PoolCountingCloses(t, url, 4)
			holder, err := pgx.Connect(ctx, url)
			pgtest.Must(t, err, "connect the lock holder")
			t.Cleanup(func() { _ = holder.Close(context.Background()) })

			var logs logtest.Buffer
			rec := &brokertest.Recorder{}
			gate := &tenantGate{Publisher: rec, tenant: "a", held: make(chan struct{}), open: make(chan struct{})}
			start := func() *relay.Group {
				return startGroup(t, gate, relay.GroupConfig{
					Config: relay.Config{Workers: 2, PollInterval: 100 * time.Millisecond, DisableNotify: true,
						BackoffBase: 10 * time.Millisecond, BackoffMax: 100 * time.Millisecond,
						Logger: logs.Logger()},
					Databases:        []relay.Database{{Name: "db", Pool: pool}},
					DiscoverInterval: 100 * time.Millisecond,
				})
			}
			var g *relay.Group
			var tx pgx.Tx
			if !v.idle {
				d.enqueue(t, "a", 3, 9)
			}
			switch {
			case v.idle:
				close(gate.open)
				g = start()
				wait.For(t, 30*time.Second, "a and b served", func() bool { return g.Healthy() == nil && len(g.Tenants()) == 2 })
				tx, err = holder.Begin(ctx)
				pgtest.Must(t, err, "begin")
				enqueueTx(t, tx, "a", 3, 9)
				pgtest.Must(t, v.lock(ctx, tx), "lock")
			case v.before:
				close(gate.open)
				tx, err = holder.Begin(ctx)
				pgtest.Must(t, err, "begin")
				pgtest.Must(t, v.lock(ctx, tx), "lock")
				g = start()
			default:
				g = start()
				select {
				case <-gate.held:
				case <-time.After(30 * time.Second):
					t.Fatal("a's first batch never reached the broker")
				}
				tx, err = holder.Begin(ctx)
				pgtest.Must(t, err, "begin")
				pgtest.Must(t, v.lock(ctx, tx), "lock")
				close(gate.open)
			}
			t.Cleanup(func() { _ = tx.Rollback(context.Background()) })

			aReported := func() bool {
				if v.refused {
					for _, ts := range g.Tenants() {
						if ts.Schema == "a" {
							return !ts.Serving && ts.Err != nil && strings.Contains(ts.Err.Error(), "55P03")
						}
					}
					return false
				}
				return errors.Is(g.TenantHealthy("db", "a"), relay.ErrOutboxStuck)
			}
			wait.Forf(t, 30*time.Second, func() string { return "a reported; the log:\n" + logs.String() }, aReported)

			began := time.Now()
			d.enqueue(t, "b", 2, 6)
			wait.Forf(t, 60*time.Second, func() string { return "b's events delivered while a is locked; the log:\n" + logs.String() },
				func() bool { return d.pending(t, "b") == 0 })
			t.Logf("b's events delivered %s after their commit, with a locked", time.Since(began).Round(time.Millisecond))

			// The lock is still held, a's events unpublished, a reported.
			if holder.PgConn().TxStatus() != 'T' {
				t.Fatalf("the lock holder's transaction ended (status %q)", holder.PgConn().TxStatus())
			}
			var published int
			pgtest.Must(t, tx.QueryRow(ctx, `SELECT count(*) FROM a.outbox_events WHERE published_at IS NOT NULL`).Scan(&published), "a published")
			if v.idle {
				published = len(rec.Messages()) - 6 // a's events are its own; b's 6 are out
			}
			if published != 0 {
				t.Fatalf("%d of a's events marked published under the lock", published)
			}
			if !aReported() {
				t.Fatalf("a no longer reported while locked: %v", g.TenantHealthy("db", "a"))
			}
			if err := g.TenantHealthy("db", "b"); err != nil {
				t.Fatalf("b: %v", err)
			}
			if err := g.Healthy(); !errors.Is(err, relay.ErrTenant) || !strings.Contains(err.Error(), "schema \"a\"") ||
				strings.Contains(err.Error(), "schema \"b\"") || errors.Is(err, relay.ErrDatabaseUnreachable) {
				t.Fatalf("Healthy = %v, want a named alone, the database reachable", err)
			}
			if n := closed.Load(); n != 0 {
				t.Fatalf("%d connections of the shared pool closed while a was locked; the log:\n%s", n, logs.String())
			}
			log := logs.String()
			for _, bad := range []string{"dropping the pool's connections", "database unreachable"} {
				if strings.Contains(log, bad) {
					t.Fatalf("the log says %q:\n%s", bad, log)
				}
			}
			// Reported once per episode and kind of statement (claim, settle).
			if n := strings.Count(log, `msg="the outbox's statements time out`); !v.refused && (n < 1 || n > 2) {
				t.Fatalf("a's stuck statements logged %d times, want once per kind:\n%s", n, log)
			}

			if v.idle {
				pgtest.Must(t, tx.Commit(ctx), "release the lock")
			} else {
				pgtest.Must(t, tx.Rollback(ctx), "release the lock")
			}
			wait.Forf(t, 60*time.Second, func() string { return "a delivered after the lock; the log:\n" + logs.String() },
				func() bool { return d.pending(t, "a") == 0 && g.Healthy() == nil })
			checkLanes(t, rec.Messages(), map[string]int{"a": 9, "b": 6})
		})
	}
}

// Through PgBouncer's transaction pooling (default_query_exec_mode=exec and
// DisableNotify: the documented set-up), a locked tenant is skipped all the
// same, and the bounds live in each statement's transaction: no server
// session that the pooler hands on to other clients keeps them.
func TestGroupTenantLockThroughPgBouncer(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	bouncer := pgtest.StartBouncer(t, pgtest.BouncerTransaction) + "&default_query_exec_mode=exec"
	a, b := newOutbox(t, 1), newOutbox(t, 1)
	var logs logtest.Buffer
	rec := &brokertest.Recorder{}
	g := startGroup(t, rec, relay.GroupConfig{
		Config: relay.Config{Workers: 1, PollInterval: 100 * time.Millisecond, DisableNotify: true,
			BackoffBase: 10 * time.Millisecond, BackoffMax: 100 * time.Millisecond,
			Logger: logs.Logger()},
		Databases:        []relay.Database{{Name: "db", Pool: pgtest.Pool(t, bouncer, 3), Schemas: selector(t, a.schema+","+b.schema)}},
		DiscoverInterval: 100 * time.Millisecond,
	})
	wait.For(t, bouncerWithin, "both served", func() bool { return g.Healthy() == nil && len(g.Tenants()) == 2 })

	tx, err := a.pool.Begin(ctx) // straight to the server, not through the pooler
	pgtest.Must(t, err, "begin")
	t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
	_, err = tx.Exec(ctx, "LOCK TABLE "+a.table()+" IN ACCESS EXCLUSIVE MODE")
	pgtest.Must(t, err, "lock")
	wait.Forf(t, bouncerWithin, func() string { return "a reported stuck; the log:\n" + logs.String() },
		func() bool { return errors.Is(g.TenantHealthy("db", a.schema), relay.ErrOutboxStuck) })
	b.enqueue(t, 2, 3)
	wait.Forf(t, bouncerWithin, func() string { return "b's events delivered while a is locked; the log:\n" + logs.String() },
		func() bool { return len(rec.Messages()) == 6 })
	if tx.Conn().PgConn().TxStatus() != 'T' {
		t.Fatal("the lock holder's transaction ended")
	}

	// Every server session of the pooler, each held by a transaction of its
	// own, shows the server's settings, not the relay's.
	var want [2]string
	pgtest.Must(t, b.pool.QueryRow(ctx, "SELECT current_setting('lock_timeout'), current_setting('statement_timeout')").Scan(&want[0], &want[1]), "settings")
	var held []*pgx.Conn
	for range pgtest.BouncerPoolSize - 1 { // the relay keeps one in use at most
		c, err := pgx.Connect(ctx, bouncer)
		pgtest.Must(t, err, "connect through the pooler")
		t.Cleanup(func() { _ = c.Close(context.Background()) })
		held = append(held, c)
		_, err = c.Exec(ctx, "BEGIN")
		pgtest.Must(t, err, "begin through the pooler")
		var got [2]string
		pgtest.Must(t, c.QueryRow(ctx, "SELECT current_setting('lock_timeout'), current_setting('statement_timeout')").Scan(&got[0], &got[1]), "settings")
		if got != want {
			t.Fatalf("a server session of the pooler kept lock_timeout, statement_timeout = %v; the server's are %v", got, want)
		}
	}
	for _, c := range held {
		pgtest.Must(t, c.Close(ctx), "close")
	}

	pgtest.Must(t, tx.Rollback(ctx), "release the lock")
	a.enqueue(t, 2, 3)
	wait.Forf(t, bouncerWithin, func() string { return "a delivered after the lock; the log:\n" + logs.String() },
		func() bool { return len(rec.Messages()) == 12 && g.Healthy() == nil })
}
