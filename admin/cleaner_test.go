package admin_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgoutbox/pgoutbox/admin"
	"github.com/pgoutbox/pgoutbox/internal/lifecycle/lifecycletest"
	"github.com/pgoutbox/pgoutbox/internal/pgtest"
	"github.com/pgoutbox/pgoutbox/internal/wait"
)

// cleanerUnderTest is a Cleaner with its database.
type cleanerUnderTest struct {
	*admin.Cleaner
	pool  *pgxpool.Pool
	table string
}

// The Cleaner follows the one lifecycle rule. A run held in flight (its delete
// batch waiting for a lock on the outbox) makes a stop past its deadline hard:
// the statement is cancelled.
func TestCleanerLifecycle(t *testing.T) {
	t.Parallel()
	lifecycletest.Run(t, lifecycletest.Harness{
		New: func(t *testing.T) lifecycletest.Service {
			pool, schema := pgtest.Migrated(t, 4)
			c, err := admin.NewCleaner(pool, &admin.CleanerConfig{Interval: 20 * time.Millisecond, Logger: quietLog,
				Cleanup: admin.CleanupConfig{Schema: schema}})
			pgtest.Must(t, err, "NewCleaner")
			t.Cleanup(func() {
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				defer cancel()
				if err := c.Stop(ctx); err != nil {
					t.Errorf("stop: %v", err)
				}
			})
			return &cleanerUnderTest{Cleaner: c, pool: pool, table: quoted(schema, "outbox_events")}
		},
		Busy: func(t *testing.T, s lifecycletest.Service) func() {
			c := s.(*cleanerUnderTest)
			ctx := context.Background()
			tx, err := c.pool.Begin(ctx)
			pgtest.Must(t, err, "begin")
			_, err = tx.Exec(ctx, "LOCK TABLE "+c.table+" IN ACCESS EXCLUSIVE MODE")
			pgtest.Must(t, err, "lock the outbox")
			var once sync.Once
			release := func() { once.Do(func() { _ = tx.Rollback(ctx) }) }
			t.Cleanup(release)
			wait.For(t, 30*time.Second, "a cleanup batch to wait for the lock", func() bool {
				var n int
				pgtest.Must(t, c.pool.QueryRow(ctx, "SELECT count(*) FROM pg_locks WHERE relation = $1::regclass AND NOT granted",
					c.table).Scan(&n), "pg_locks")
				return n > 0
			})
			return release
		},
	})
}
