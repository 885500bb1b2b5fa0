package migrate_test

import (
	"context"
	"testing"
	"time"

	"github.com/pgoutbox/pgoutbox/internal/pgtest"
	"github.com/pgoutbox/pgoutbox/migrate"
)

// Migrations through PgBouncer's transaction pooling, with pgx's exec query
// mode: the run is one transaction and its advisory lock is transaction-scoped
// (docs/operations.md, "Connection poolers"); two runs at once wait for each
// other and apply everything once.
func TestUpThroughPgBouncerTransactionPooling(t *testing.T) {
	t.Parallel()
	_, schema := pgtest.Schema(t, 2)
	via := pgtest.Pool(t, pgtest.StartBouncer(t, pgtest.BouncerTransaction)+"&default_query_exec_mode=exec", 4)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cfg := &migrate.Config{Schema: schema}
	type run struct {
		applied []migrate.Applied
		err     error
	}
	runs := make(chan run, 2)
	for range 2 {
		go func() {
			a, err := migrate.Up(ctx, via, cfg)
			runs <- run{a, err}
		}()
	}
	total := 0
	for range 2 {
		r := <-runs
		pgtest.Must(t, r.err, "Up through PgBouncer")
		total += len(r.applied)
	}
	all, _ := migrate.All()
	if total != len(all) {
		t.Fatalf("two concurrent runs applied %d migrations in all, want %d", total, len(all))
	}
	st, err := migrate.State(ctx, via, cfg)
	pgtest.Must(t, err, "state through PgBouncer")
	for _, s := range st {
		if !s.Applied {
			t.Fatalf("%s/%d not applied", s.Line, s.Version)
		}
	}
}
