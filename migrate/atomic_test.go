package migrate_test

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgoutbox/pgoutbox/internal/pgtest"
	"github.com/pgoutbox/pgoutbox/migrate"
)

// objects lists the relations and functions of schema, and whether the schema exists.
func objects(ctx context.Context, t *testing.T, pool *pgxpool.Pool, schema string) (exists bool, names []string) {
	t.Helper()
	pgtest.Must(t, pool.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = $1)", schema).Scan(&exists), "schema")
	rows, err := pool.Query(ctx, `SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = $1
UNION ALL SELECT p.proname FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace WHERE n.nspname = $1 ORDER BY 1`, schema)
	pgtest.Must(t, err, "objects")
	names, err = pgx.CollectRows(rows, pgx.RowTo[string])
	pgtest.Must(t, err, "objects")
	return exists, names
}

// A failure in the middle of a run leaves nothing of the run: not the schema,
// not the bookkeeping table, not the migrations before the failing one.
func TestFailedUpLeavesNothing(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t, pgtest.URL(), 2)
	ctx := context.Background()
	all, err := migrate.All()
	pgtest.Must(t, err, "all")

	failures := map[string]string{
		"division by zero":   "CREATE TABLE {{schema}}.half_made (id int); SELECT 1/0;",
		"syntax error":       "CREATE TABLE {{schema}}.half_made (id int); SELEC 1;",
		"raise in a DO body": "CREATE TABLE {{schema}}.half_made (id int); DO $$BEGIN RAISE EXCEPTION 'boom'; END$$;",
		"undefined object":   "CREATE TABLE {{schema}}.half_made (id int); ALTER TABLE {{schema}}.nope ADD COLUMN x int;",
	}
	for name, sql := range failures {
		for _, at := range []int{0, 3, len(all) - 1} {
			schema := pgtest.SchemaName(t, pool, "fail")
			list := append(append(append([]migrate.Migration{}, all[:at]...), migrate.NewTestMigration(all[at].Line, all[at].Version, "boom", sql)), all[at+1:]...)
			applied, err := migrate.UpMigrations(ctx, pool, &migrate.Config{Schema: schema}, list)
			if err == nil || len(applied) != 0 {
				t.Fatalf("%s at %d: Up = %v, %v; want an error and nothing applied", name, at, applied, err)
			}
			if !strings.Contains(err.Error(), "nothing of this run was kept") {
				t.Errorf("%s at %d: error %q does not say the run was rolled back", name, at, err)
			}
			if exists, objs := objects(ctx, t, pool, schema); exists || len(objs) > 0 {
				t.Fatalf("%s at %d: the schema exists=%v with %v after a failed Up", name, at, exists, objs)
			}
			st, err := migrate.State(ctx, pool, &migrate.Config{Schema: schema})
			pgtest.Must(t, err, "state")
			for _, s := range st {
				if s.Applied {
					t.Fatalf("%s at %d: %s/%d applied after a failed Up", name, at, s.Line, s.Version)
				}
			}
		}
	}
}

// A conflicting object that already exists (an outbox_wake returning another
// type) fails migration 4 of 5: the schema keeps only what was there before,
// and Up succeeds once the conflict is gone.
func TestConflictingObjectLeavesNothing(t *testing.T) {
	t.Parallel()
	pool, schema := pgtest.Schema(t, 2)
	ctx := context.Background()
	fn := pgx.Identifier{schema, "outbox_wake"}.Sanitize()
	pgtest.Must(t, exec(ctx, pool, "CREATE FUNCTION "+fn+"() RETURNS integer LANGUAGE sql AS 'SELECT 1'"), "conflicting function")
	_, before := objects(ctx, t, pool, schema)

	_, err := migrate.Up(ctx, pool, &migrate.Config{Schema: schema})
	if err == nil || !strings.Contains(err.Error(), "0004_quiet_notify") {
		t.Fatalf("Up = %v, want the failure of outbox/0004", err)
	}
	if _, after := objects(ctx, t, pool, schema); strings.Join(after, ",") != strings.Join(before, ",") {
		t.Fatalf("objects after a failed Up: %v, want %v", after, before)
	}
	pgtest.Must(t, exec(ctx, pool, "DROP FUNCTION "+fn+"()"), "drop")
	_, err = migrate.Up(ctx, pool, &migrate.Config{Schema: schema})
	pgtest.Must(t, err, "Up after the conflict is gone")
}

// A database with a migration this binary does not know is refused by
// CheckCompatible and Up, and listed by State.
func TestVersionSkew(t *testing.T) {
	t.Parallel()
	pool, schema := pgtest.Migrated(t, 2)
	ctx := context.Background()
	if err := migrate.CheckCompatible(ctx, pool, schema); err != nil {
		t.Fatalf("up-to-date database: %v", err)
	}
	// Not migrated at all, or behind, is not skew; inside a transaction, an
	// absent schema does not abort it.
	tx, err := pool.Begin(ctx)
	pgtest.Must(t, err, "begin")
	if err := migrate.CheckCompatible(ctx, tx, pgtest.Name("absent")); err != nil {
		t.Fatalf("absent schema: %v", err)
	}
	if _, err := migrate.State(ctx, tx, &migrate.Config{Schema: pgtest.Name("absent")}); err != nil {
		t.Fatalf("state of an absent schema: %v", err)
	}
	pgtest.Must(t, tx.Commit(ctx), "the transaction is still usable")
	table := pgx.Identifier{schema, migrate.Table}.Sanitize()
	pgtest.Must(t, exec(ctx, pool, "DELETE FROM "+table+" WHERE line = 'inbox' AND version = 2"), "fake an older inbox")
	if err := migrate.CheckCompatible(ctx, pool, schema); err != nil {
		t.Fatalf("older database: %v", err)
	}

	all, _ := migrate.All(migrate.LineOutbox)
	newest := all[len(all)-1].Version
	for _, row := range []struct {
		line    string
		version int
		name    string
	}{
		{"outbox", newest + 1, "from_the_future"},
		{"outbox", 1, "renamed"}, // a known version under another name
	} {
		t.Run(row.name, func(t *testing.T) {
			tx, err := pool.Begin(ctx)
			pgtest.Must(t, err, "begin")
			defer tx.Rollback(ctx)
			if row.version == 1 {
				_, err = tx.Exec(ctx, "UPDATE "+table+" SET name = $1 WHERE line = $2 AND version = 1", row.name, row.line)
			} else {
				_, err = tx.Exec(ctx, "INSERT INTO "+table+" (line, version, name) VALUES ($1, $2, $3)", row.line, row.version, row.name)
			}
			pgtest.Must(t, err, "fake row")

			err = migrate.CheckCompatible(ctx, tx, schema, migrate.LineOutbox)
			var skew *migrate.SkewError
			if !errors.Is(err, migrate.ErrDatabaseNewer) || !errors.As(err, &skew) {
				t.Fatalf("CheckCompatible = %v, want a SkewError", err)
			}
			if len(skew.Unknown) != 1 || skew.Unknown[0].Version != row.version || skew.Unknown[0].Name != row.name || !skew.Unknown[0].Unknown {
				t.Fatalf("SkewError.Unknown = %+v", skew.Unknown)
			}
			for _, want := range []string{row.name, "newer pgoutbox", "outbox/" + strconv.Itoa(newest)} {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("error %q does not say %q", err, want)
				}
			}
			if err := migrate.CheckCompatible(ctx, tx, schema, migrate.LineInbox); err != nil {
				t.Fatalf("inbox line only: %v", err)
			}
			st, err := migrate.State(ctx, tx, &migrate.Config{Schema: schema})
			pgtest.Must(t, err, "state")
			var unknown int
			for _, s := range st {
				if s.Unknown {
					unknown++
					if s.Name != row.name || !s.Applied {
						t.Errorf("unknown status %+v", s)
					}
				}
			}
			if unknown != 1 {
				t.Fatalf("State lists %d unknown migrations, want 1: %+v", unknown, st)
			}
			sp, err := tx.Begin(ctx)
			pgtest.Must(t, err, "savepoint")
			if _, err := migrate.Up(ctx, sp, &migrate.Config{Schema: schema}); !errors.Is(err, migrate.ErrDatabaseNewer) {
				t.Fatalf("Up = %v, want ErrDatabaseNewer", err)
			}
		})
	}
}
