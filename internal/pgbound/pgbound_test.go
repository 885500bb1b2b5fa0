package pgbound_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/goleak"

	"github.com/pgoutbox/pgoutbox/internal/pgbound"
	"github.com/pgoutbox/pgoutbox/internal/pgtest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func settings(t *testing.T, pool *pgxpool.Pool) string {
	t.Helper()
	var lock, stmt string
	pgtest.Must(t, pool.QueryRow(context.Background(),
		"SELECT current_setting('lock_timeout'), current_setting('statement_timeout')").Scan(&lock, &stmt), "settings")
	return lock + "/" + stmt
}

// Whatever holds a statement up — a table lock met when the statement is
// parsed (its first use on a connection) or executed, a row lock, a
// statement too slow — the server ends it with an error Stuck recognises,
// long before the caller's context; the connection goes back to the pool
// usable and without the bounds, and a statement that does not meet them
// commits.
func TestBoundsEndStuckStatements(t *testing.T) {
	t.Parallel()
	// Far past every bound: without them a statement would end here, with a
	// client-side timeout that Stuck does not take for the server's answer.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	setup, schema := pgtest.Schema(t, 2)
	table := pgx.Identifier{schema, "t"}.Sanitize()
	_, err := setup.Exec(ctx, "CREATE TABLE "+table+" (id int PRIMARY KEY, n int)")
	pgtest.Must(t, err, "create")
	_, err = setup.Exec(ctx, "INSERT INTO "+table+" VALUES (1, 0)")
	pgtest.Must(t, err, "insert")

	bd := pgbound.New(5*time.Second, 100*time.Millisecond)
	update := func(p *pgxpool.Pool) error {
		b := &pgx.Batch{}
		b.Queue("UPDATE "+table+" SET n = n + 1 WHERE id = $1", 1)
		return pgbound.Send(ctx, p, bd, b, nil)
	}
	for _, tc := range []struct {
		name string
		hold string // run by another session in an open transaction
		run  func(*pgxpool.Pool) error
		// warm: the statement runs once before the lock, so that it is
		// prepared on the connection and meets the lock when executed.
		warm bool
	}{
		{name: "table lock at parse", hold: "LOCK TABLE " + table + " IN ACCESS EXCLUSIVE MODE", run: update},
		{name: "table lock at execute", hold: "LOCK TABLE " + table + " IN ACCESS EXCLUSIVE MODE", run: update, warm: true},
		{name: "share lock of an index build", hold: "CREATE INDEX ON " + table + " (n)", run: update, warm: true},
		{name: "row lock", hold: "SELECT 1 FROM " + table + " FOR UPDATE", run: update, warm: true},
		{name: "too slow", run: func(p *pgxpool.Pool) error {
			return pgbound.Send(ctx, p, pgbound.New(50*time.Millisecond, 50*time.Millisecond), pgxBatch("SELECT pg_sleep(30)"), nil)
		}},
		// Pool: code written for a pool, each statement or transaction under
		// a lock-only bound.
		{name: "pool exec", hold: "SELECT 1 FROM " + table + " FOR UPDATE", run: func(p *pgxpool.Pool) error {
			_, err := pgbound.LockOnly(100*time.Millisecond).On(p).Exec(ctx, "UPDATE "+table+" SET n = n + 1")
			return err
		}},
		{name: "pool query", hold: "LOCK TABLE " + table + " IN ACCESS EXCLUSIVE MODE", run: func(p *pgxpool.Pool) error {
			rows, err := pgbound.LockOnly(100*time.Millisecond).On(p).Query(ctx, "SELECT n FROM "+table)
			if err != nil {
				return err
			}
			_, err = pgx.CollectRows(rows, pgx.RowTo[int])
			return err
		}, warm: true},
		{name: "pool query row", hold: "LOCK TABLE " + table + " IN ACCESS EXCLUSIVE MODE", run: func(p *pgxpool.Pool) error {
			var n int
			return pgbound.LockOnly(100*time.Millisecond).On(p).QueryRow(ctx, "SELECT n FROM "+table).Scan(&n)
		}},
		{name: "pool begin", hold: "SELECT 1 FROM " + table + " FOR UPDATE", run: func(p *pgxpool.Pool) error {
			tx, err := bd.On(p).Begin(ctx)
			if err != nil {
				return err
			}
			if _, err := tx.Exec(ctx, "UPDATE "+table+" SET n = n + 1"); err != nil {
				_ = tx.Rollback(ctx)
				return err
			}
			return tx.Commit(ctx)
		}, warm: true},
		{name: "in a function's transaction", hold: "LOCK TABLE " + table + " IN ACCESS EXCLUSIVE MODE", run: func(p *pgxpool.Pool) error {
			return pgbound.BeginFunc(ctx, p, bd, func(tx pgx.Tx) error {
				_, err := tx.Exec(ctx, "SELECT count(*) FROM "+table)
				return err
			})
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pool, closed := pgtest.PoolCountingCloses(t, pgtest.URL(), 1)
			before := settings(t, pool)
			if tc.warm {
				pgtest.Must(t, tc.run(pool), "unlocked")
			}
			if tc.hold != "" {
				holder, err := setup.Begin(ctx)
				pgtest.Must(t, err, "begin")
				defer func() { _ = holder.Rollback(ctx) }()
				_, err = holder.Exec(ctx, tc.hold)
				pgtest.Must(t, err, "hold")
			}
			err := tc.run(pool)
			if !pgbound.Stuck(err) {
				t.Fatalf("got %v, want the server to end the statement at its bounds", err)
			}
			if n := closed.Load(); n != 0 {
				t.Fatalf("%d connections closed", n)
			}
			if got := settings(t, pool); got != before {
				t.Fatalf("the connection kept the bounds: %s, was %s", got, before)
			}
		})
	}

	var n int
	pgtest.Must(t, setup.QueryRow(ctx, "SELECT n FROM "+table).Scan(&n), "n")
	pool, _ := pgtest.PoolCountingCloses(t, pgtest.URL(), 1)
	pgtest.Must(t, update(pool), "update, nothing held")
	var after int
	pgtest.Must(t, setup.QueryRow(ctx, "SELECT n FROM "+table).Scan(&after), "n")
	if after != n+1 {
		t.Fatalf("n = %d after an update of %d: not committed", after, n)
	}
	// Pool commits what it ran, and its query's rows are read whole.
	bp := pgbound.LockOnly(time.Second).On(pool)
	_, err = bp.Exec(ctx, "UPDATE "+table+" SET n = n + 1")
	pgtest.Must(t, err, "pool exec, nothing held")
	rows, err := bp.Query(ctx, "SELECT n FROM "+table)
	pgtest.Must(t, err, "pool query")
	got, err := pgx.CollectRows(rows, pgx.RowTo[int])
	pgtest.Must(t, err, "pool rows")
	if len(got) != 1 || got[0] != n+2 {
		t.Fatalf("pool read %v after its exec, want [%d]", got, n+2)
	}
	var stmt string
	pgtest.Must(t, bp.QueryRow(ctx, "SELECT current_setting('statement_timeout')").Scan(&stmt), "pool query row")
	if stmt != "0" {
		t.Fatalf("LockOnly's statement_timeout is %q, want 0 (no limit)", stmt)
	}
}

func pgxBatch(sql string) *pgx.Batch {
	b := &pgx.Batch{}
	b.Queue(sql)
	return b
}

func TestStuckIsTheServersAnswerOnly(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Millisecond)
	defer cancel()
	<-ctx.Done()
	for _, err := range []error{nil, errors.New("55P03"), ctx.Err(), context.Canceled} {
		if pgbound.Stuck(err) {
			t.Errorf("Stuck(%v) = true", err)
		}
	}
	var zero pgbound.Bounds
	if err := pgbound.Send(context.Background(), nil, zero, &pgx.Batch{}, nil); err == nil || !strings.Contains(err.Error(), "New") {
		t.Errorf("Send with zero Bounds: %v", err)
	}
}
