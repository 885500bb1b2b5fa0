package migrate_test

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/pgoutbox/internal/pgtest"
	"github.com/pgoutbox/pgoutbox/migrate"
)

// Every embedded migration states its compatibility, and a file that states
// none, states it twice or states something else is refused.
func TestEveryMigrationStatesCompat(t *testing.T) {
	t.Parallel()
	all, err := migrate.All()
	pgtest.Must(t, err, "All")
	for _, m := range all {
		if m.Compat != migrate.CompatExpand && m.Compat != migrate.CompatContract {
			t.Errorf("%s/%d %s: compat %q", m.Line, m.Version, m.Name, m.Compat)
		}
	}
	for _, bad := range []string{
		"CREATE TABLE x ();",
		"-- compat: expand: one.\n-- compat: contract: two.\n",
		"-- compat: shrink: no such kind.\n",
		"-- compat:expand\n",
		"SELECT 1; -- compat: expand\n",
	} {
		if c, err := migrate.ParseCompat(bad); err == nil {
			t.Errorf("%q parsed as %q", bad, c)
		}
	}
	for text, want := range map[string]migrate.Compat{
		"-- compat: expand: a new table.\nCREATE TABLE x ();": migrate.CompatExpand,
		"-- why\n-- compat: contract\n":                       migrate.CompatContract,
	} {
		if c, err := migrate.ParseCompat(text); err != nil || c != want {
			t.Errorf("%q: %q, %v; want %q", text, c, err, want)
		}
	}
	w, err := migrate.Window()
	pgtest.Must(t, err, "Window")
	for _, m := range all {
		if m.Compat == migrate.CompatContract && w[m.Line] < m.Version {
			t.Errorf("window %v starts before contract migration %s/%d", w, m.Line, m.Version)
		}
	}
	if s := migrate.WindowString(); !strings.Contains(s, "outbox/"+strconv.Itoa(w[migrate.LineOutbox])+"+") {
		t.Errorf("WindowString() = %q, window %v", s, w)
	}
}

// The compatibility window: a database that a newer binary migrated with
// expand steps only is accepted by this one (CheckCompatible, Up, State); a
// contract step, a step recorded with no compat (by binaries before the
// window), or a known version under another name is refused, naming only the
// migrations outside the window.
func TestCompatibilityWindow(t *testing.T) {
	t.Parallel()
	pool, schema := pgtest.Migrated(t, 2)
	ctx := context.Background()
	table := pgx.Identifier{schema, migrate.Table}.Sanitize()
	all, _ := migrate.All(migrate.LineOutbox)
	newest := all[len(all)-1].Version

	var recorded int
	pgtest.Must(t, pool.QueryRow(ctx, "SELECT count(*) FROM "+table+" WHERE compat IS NULL").Scan(&recorded), "compat recorded")
	if recorded != 0 {
		t.Fatalf("Up left %d migrations without their compat", recorded)
	}

	type row struct {
		version int
		name    string
		compat  any // nil: NULL
	}
	for _, c := range []struct {
		name    string
		rows    []row
		outside []string // names SkewError must list; none: compatible
	}{
		{"one expand", []row{{newest + 1, "add_column", "expand"}}, nil},
		{"two expands", []row{{newest + 1, "add_column", "expand"}, {newest + 2, "add_index", "expand"}}, nil},
		{"a contract", []row{{newest + 1, "add_column", "expand"}, {newest + 2, "drop_column", "contract"}}, []string{"drop_column"}},
		{"no compat recorded", []row{{newest + 1, "before_the_window", nil}}, []string{"before_the_window"}},
		{"a known version renamed", []row{{1, "renamed", "expand"}}, []string{"renamed"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			tx, err := pool.Begin(ctx)
			pgtest.Must(t, err, "begin")
			defer tx.Rollback(ctx)
			for _, r := range c.rows {
				if r.version == 1 {
					_, err = tx.Exec(ctx, "UPDATE "+table+" SET name = $1, compat = $2 WHERE line = 'outbox' AND version = 1", r.name, r.compat)
				} else {
					_, err = tx.Exec(ctx, "INSERT INTO "+table+" (line, version, name, compat) VALUES ('outbox', $1, $2, $3)", r.version, r.name, r.compat)
				}
				pgtest.Must(t, err, "fake row %v", r)
			}
			err = migrate.CheckCompatible(ctx, tx, schema)
			st, serr := migrate.State(ctx, tx, &migrate.Config{Schema: schema})
			pgtest.Must(t, serr, "state")
			var unknown int
			for _, s := range st {
				if s.Unknown {
					unknown++
				}
			}
			if unknown != len(c.rows) {
				t.Errorf("State lists %d unknown migrations, want %d: %+v", unknown, len(c.rows), st)
			}
			sp, serr := tx.Begin(ctx)
			pgtest.Must(t, serr, "savepoint")
			_, uerr := migrate.Up(ctx, sp, &migrate.Config{Schema: schema})
			if len(c.outside) == 0 {
				if err != nil || uerr != nil {
					t.Fatalf("within the window: CheckCompatible = %v, Up = %v", err, uerr)
				}
				return
			}
			var skew *migrate.SkewError
			if !errors.As(err, &skew) || !errors.Is(err, migrate.ErrDatabaseNewer) || !errors.Is(uerr, migrate.ErrDatabaseNewer) {
				t.Fatalf("outside the window: CheckCompatible = %v, Up = %v; want a SkewError", err, uerr)
			}
			var names []string
			for _, s := range skew.Unknown {
				names = append(names, s.Name)
			}
			if strings.Join(names, ",") != strings.Join(c.outside, ",") {
				t.Fatalf("SkewError lists %v, want %v", names, c.outside)
			}
		})
	}
}

// A bookkeeping table made before binaries recorded compat (no column) reads
// as "no compat recorded", and the next Up adds the column without touching the
// rows it has.
func TestBookkeepingBeforeTheWindow(t *testing.T) {
	t.Parallel()
	pool, schema := pgtest.Migrated(t, 2)
	ctx := context.Background()
	table := pgx.Identifier{schema, migrate.Table}.Sanitize()
	all, _ := migrate.All(migrate.LineOutbox)
	_, err := pool.Exec(ctx, "ALTER TABLE "+table+" DROP COLUMN compat")
	pgtest.Must(t, err, "drop compat")
	_, err = pool.Exec(ctx, "INSERT INTO "+table+" (line, version, name) VALUES ('outbox', $1, 'from_an_old_binary')", all[len(all)-1].Version+1)
	pgtest.Must(t, err, "fake row")
	if err := migrate.CheckCompatible(ctx, pool, schema); !errors.Is(err, migrate.ErrDatabaseNewer) || !strings.Contains(err.Error(), "no compat recorded") {
		t.Fatalf("CheckCompatible = %v, want skew saying no compat was recorded", err)
	}
	_, err = pool.Exec(ctx, "DELETE FROM "+table+" WHERE name = 'from_an_old_binary'")
	pgtest.Must(t, err, "remove fake row")
	_, err = migrate.Up(ctx, pool, &migrate.Config{Schema: schema})
	pgtest.Must(t, err, "Up")
	var n int
	pgtest.Must(t, pool.QueryRow(ctx, "SELECT count(*) FROM "+table+" WHERE compat IS NULL").Scan(&n), "count")
	if n != len(all)+2 { // the inbox line's two
		t.Fatalf("%d rows without compat after Up, want the %d recorded before the column existed", n, len(all)+2)
	}
}
