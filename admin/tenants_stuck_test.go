package admin_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/pgoutbox"
	"github.com/pgoutbox/pgoutbox/admin"
	"github.com/pgoutbox/pgoutbox/internal/pgtest"
	"github.com/pgoutbox/pgoutbox/migrate"
)

// Issue 31, item 2: a tenant whose tables another session keeps locked is
// reported stuck (admin.ErrTenantStuck) by the server's bounds, while the lock
// is still held, and the other tenants are read; no connection of the pool is
// closed for it. A tenant's own migrate, running, stalls nobody. The client
// deadline is minutes past every bound: a statement that waited for the lock
// would fail with it instead, which the assertions refuse.
func TestTenantsLockedAreSkippedNotWaitedOn(t *testing.T) {
	t.Parallel()
	for _, v := range []struct {
		name string
		hold func(context.Context, pgx.Tx) error
		// stuck: a is reported stuck; else the lock does not conflict with
		// the reads, and a is read like b.
		stuck bool
	}{
		{name: "lock table", stuck: true, hold: execTx(`LOCK TABLE a.outbox_events IN ACCESS EXCLUSIVE MODE`)},
		{name: "migration's alter", stuck: true,
			hold: execTx(`ALTER TABLE a.outbox_events ADD COLUMN IF NOT EXISTS last_error text`)},
		{name: "migrations table locked", stuck: true, hold: execTx(`LOCK TABLE a.pgoutbox_migrations IN ACCESS EXCLUSIVE MODE`)},
		// The tenant's own migrate, as it runs (a migration again): its
		// CREATE INDEX holds a SHARE lock until the run commits, which the
		// reads of status and dlq list do not wait for.
		{name: "migrate", hold: func(ctx context.Context, tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, `DELETE FROM a.pgoutbox_migrations WHERE line = 'outbox' AND version = 1`); err != nil {
				return err
			}
			applied, err := migrate.Up(ctx, tx, &migrate.Config{Schema: "a", Lines: []migrate.Line{migrate.LineOutbox}})
			if err == nil && len(applied) != 1 {
				err = errors.New("migrate applied other than one migration")
			}
			return err
		}},
	} {
		// One after another: each holds a database and a few connections.
		t.Run(v.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
			defer cancel()
			d := newTenantDB(t, "a", "b")
			ea, eb := d.enqueue("a", 2, 0), d.enqueue("b", 2, 0)
			d.quarantine("a", ea[0])
			d.quarantine("b", eb[0])
			pool, closed := pgtest.PoolCountingCloses(t, d.url, 4)

			holder, err := d.pool.Begin(ctx)
			pgtest.Must(t, err, "begin the holder")
			defer func() { _ = holder.Rollback(context.Background()) }()
			pgtest.Must(t, v.hold(ctx, holder), "hold")

			// A lock bound short enough for the test; a statement bound no
			// loaded machine reaches (its backstop: twice that).
			cfg := &admin.TenantsConfig{Timeout: time.Minute, LockTimeout: 200 * time.Millisecond}
			check := func(what string, tenant string, err error) {
				t.Helper()
				switch {
				case tenant == "a" && v.stuck:
					if !errors.Is(err, admin.ErrTenantStuck) || errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "lock") {
						t.Errorf("%s: tenant a: %v, want it reported stuck", what, err)
					}
				case err != nil:
					t.Errorf("%s: tenant %s: %v", what, tenant, err)
				}
			}

			rows, err := admin.StatusAll(ctx, pool, migrate.Selector{}, cfg)
			pgtest.Must(t, err, "status all")
			if len(rows) != 2 {
				t.Fatalf("status rows %+v", rows)
			}
			for _, r := range rows {
				check("status", r.Tenant, r.Err)
				if r.Err == nil && (r.Pending != 1 || r.Quarantined != 1) {
					t.Errorf("status of %s: %+v", r.Tenant, r)
				}
			}
			if v.stuck && rows[0].Tenant != "a" {
				t.Errorf("the stuck tenant is not first: %q", tenantNames(rows))
			}

			per, err := admin.QuarantinedAll(ctx, pool, migrate.Selector{}, admin.Filter{}, cfg)
			pgtest.Must(t, err, "quarantined all")
			if len(per) != 2 || per[0].Tenant != "a" || per[1].Tenant != "b" {
				t.Fatalf("dlq rows %+v", per)
			}
			for _, te := range per {
				check("dlq list", te.Tenant, te.Err)
			}
			if len(per[1].Events) != 1 || per[1].Events[0].ID != eb[0] {
				t.Errorf("b's dead letters: %+v", per[1].Events)
			}

			// Placing b's ids needs every tenant read (the id could be in
			// a): refused while a is stuck, naming it, without waiting.
			_, err = admin.FindEvents(ctx, pool, []string{"a", "b"}, []pgoutbox.UUID{eb[0]}, cfg)
			if v.stuck && (!errors.Is(err, admin.ErrTenantStuck) || !strings.Contains(err.Error(), `tenant "a"`)) {
				t.Errorf("find events with a stuck: %v", err)
			} else if !v.stuck && err != nil {
				t.Errorf("find events: %v", err)
			}

			// The lock is still held here: a was skipped, not waited on.
			if holder.Conn().PgConn().TxStatus() != 'T' {
				t.Fatalf("the holder's transaction is no longer open")
			}
			if n := closed.Load(); n != 0 {
				t.Errorf("%d pooled connections closed", n)
			}
		})
	}
}

func execTx(sql string) func(context.Context, pgx.Tx) error {
	return func(ctx context.Context, tx pgx.Tx) error {
		_, err := tx.Exec(ctx, sql)
		return err
	}
}

// Issue 32, item 8: when TenantsConfig.Budget runs out, StatusOf answers with
// what it read, and every tenant it did not read is in its row, wrapping
// admin.ErrNotReadInTime, first (worst first). Tenant a's table is locked for
// longer than the budget (its lock bound is minutes), so its read is cut short
// at the budget; b is read. An already spent budget reads nothing and still
// lists every tenant.
func TestTenantsBudgetReportsWhatWasNotRead(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	d := newTenantDB(t, "a", "b")
	holder, err := d.pool.Begin(ctx)
	pgtest.Must(t, err, "begin the holder")
	defer func() { _ = holder.Rollback(context.Background()) }()
	_, err = holder.Exec(ctx, `LOCK TABLE a.outbox_events IN ACCESS EXCLUSIVE MODE`)
	pgtest.Must(t, err, "lock")

	// A budget a loaded machine reads b in, and bounds a lock wait never
	// reaches before it.
	cfg := &admin.TenantsConfig{Timeout: time.Minute, LockTimeout: time.Minute, Budget: 20 * time.Second, Concurrency: 2}
	rows, err := admin.StatusOf(ctx, d.pool, []string{"b", "a"}, cfg)
	pgtest.Must(t, err, "status with a budget")
	if len(rows) != 2 || rows[0].Tenant != "a" || !errors.Is(rows[0].Err, admin.ErrNotReadInTime) ||
		rows[1].Tenant != "b" || rows[1].Err != nil || rows[1].Status == nil {
		t.Fatalf("rows %+v, want a not read in time, then b read", rows)
	}

	rows, err = admin.StatusOf(ctx, d.pool, []string{"b", "a"}, &admin.TenantsConfig{Budget: time.Nanosecond})
	pgtest.Must(t, err, "status with a spent budget")
	if len(rows) != 2 {
		t.Fatalf("%d rows, want 2", len(rows))
	}
	for _, r := range rows {
		if !errors.Is(r.Err, admin.ErrNotReadInTime) || r.Status != nil {
			t.Errorf("tenant %s: %v, want it not read in time", r.Tenant, r.Err)
		}
	}
}
