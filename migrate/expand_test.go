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

func TestExpandRefusesPlaceholdersOutsideCode(t *testing.T) {
	t.Parallel()
	for _, src := range []string{
		"SELECT '{{schema}}'",
		"SELECT 'x{{schema_name}}'",
		`SELECT "{{schema}}".t`,
		"SELECT E'\\'{{schema}}'",
		"CREATE FUNCTION f() RETURNS text LANGUAGE plpgsql AS $fn$ BEGIN RETURN '{{schema}}'; END $fn$",
		"DO $a$ BEGIN EXECUTE $b$ SELECT '{{schema_name}}' $b$; END $a$",
		"SELECT {{schema }}",
		"SELECT {{other}}",
		"SELECT $fn$ unterminated",
		"SELECT 'unterminated",
		"SELECT /* unterminated",
	} {
		if out, err := migrate.Expand(src, "s"); err == nil {
			t.Errorf("Expand(%q) = %q, want an error", src, out)
		}
	}
}

func TestExpandContexts(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ schema, src, want string }{
		{"s", "SELECT {{schema}}.t, {{schema_name}}", `SELECT "s".t, 's'`},
		{"a'b", "SELECT {{schema_name}}", `SELECT 'a''b'`},
		{`a\b`, "SELECT {{schema_name}}", `SELECT E'a\\b'`},
		{`a"b`, "SELECT {{schema}}.t", `SELECT "a""b".t`},
		// Comments keep the placeholder as written.
		{"a\nb", "-- {{schema}}\nSELECT 1 /* {{schema_name}} */", "-- {{schema}}\nSELECT 1 /* {{schema_name}} */"},
		// A body whose tag the name holds is retagged.
		{"x$fn$y", "AS $fn$ SELECT {{schema_name}} $fn$", "AS $fn_q1$ SELECT 'x$fn$y' $fn_q1$"},
		{"x$fn_q1$y$fn$", "AS $fn$ SELECT {{schema_name}} $fn$", "AS $fn_q2$ SELECT 'x$fn_q1$y$fn$' $fn_q2$"},
		{"x$$", "DO $$ SELECT {{schema}} $$", `DO $_q1$ SELECT "x$$" $_q1$`},
		{"s", "SELECT $1, a$b, {{schema}}", `SELECT $1, a$b, "s"`},
		// A body ending in what would start the tag.
		{"s$fn", "AS $fn${{schema_name}}$fn$", "AS $fn$'s$fn'$fn$"},
	} {
		got, err := migrate.Expand(tc.src, tc.schema)
		if err != nil || got != tc.want {
			t.Errorf("Expand(%q, %q) = %q, %v; want %q", tc.src, tc.schema, got, err, tc.want)
		}
	}
}

// roundTripSQL puts the schema name in every context a migration may: a
// literal and an identifier in code, in a SQL body nested in a string, in a
// PL/pgSQL function body, in comments.
const roundTripSQL = `SELECT {{schema_name}} AS {{schema}}, -- {{schema}}
    $b$SELECT {{schema_name}} AS {{schema}} /* {{schema_name}} */
$b$ AS body`

const roundTripFunc = `CREATE FUNCTION pg_temp.rt() RETURNS text LANGUAGE plpgsql AS $fn$
DECLARE
    v text := {{schema_name}}; -- {{schema}}
BEGIN
    PERFORM 1 AS {{schema}};
    RETURN v || (SELECT x FROM (SELECT {{schema_name}} AS x) AS {{schema}});
END
$fn$`

// FuzzSchemaName checks that any name ValidateSchema accepts comes back
// unchanged from every context the expansion puts it in, run by PostgreSQL:
// as a literal's value and as an identifier (a column's name), at top level,
// inside a dollar-quoted SQL body and inside a PL/pgSQL function body. A name
// that escaped its context would change the statement's columns or fail it.
func FuzzSchemaName(f *testing.F) {
	for _, n := range hostileSchemaNames("", "nextval('c.s')") {
		f.Add(n)
	}
	for _, n := range []string{"public", "a", "$", "$$", "'", `"`, `\`, "\n", "$fn_q1$", "{{", "}}", "ü", strings.Repeat("x", 63)} {
		f.Add(n)
	}
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, pgtest.URL())
	if err != nil {
		f.Fatalf("connect: %v", err)
	}
	f.Cleanup(func() { conn.Close(ctx) })
	f.Fuzz(func(t *testing.T, name string) {
		if migrate.ValidateSchema(name) != nil {
			return
		}
		ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		q, err := migrate.Expand(roundTripSQL, name)
		if err != nil {
			t.Fatalf("expand: %v", err)
		}
		var v, body string
		rows, err := conn.Query(ctx, q, pgx.QueryExecModeSimpleProtocol)
		if err != nil {
			t.Fatalf("%q: %v", q, err)
		}
		cols := rows.FieldDescriptions()
		if len(cols) != 2 || cols[0].Name != name || cols[1].Name != "body" {
			rows.Close()
			t.Fatalf("%q: columns %v", q, cols)
		}
		if !rows.Next() {
			t.Fatalf("%q: no row: %v", q, rows.Err())
		}
		pgtest.Must(t, rows.Scan(&v, &body), "scan")
		rows.Close()
		if v != name {
			t.Fatalf("literal read back as %q", v)
		}
		var inner string
		rows, err = conn.Query(ctx, body, pgx.QueryExecModeSimpleProtocol)
		if err != nil {
			t.Fatalf("body %q: %v", body, err)
		}
		if cols := rows.FieldDescriptions(); len(cols) != 1 || cols[0].Name != name {
			rows.Close()
			t.Fatalf("body %q: columns %v", body, cols)
		}
		rows.Next()
		pgtest.Must(t, rows.Scan(&inner), "scan body")
		rows.Close()
		if inner != name {
			t.Fatalf("body's literal read back as %q", inner)
		}

		fn, err := migrate.Expand(roundTripFunc, name)
		if err != nil {
			t.Fatalf("expand: %v", err)
		}
		tx, err := conn.Begin(ctx)
		pgtest.Must(t, err, "begin")
		defer tx.Rollback(ctx)
		if _, err := tx.Exec(ctx, fn, pgx.QueryExecModeSimpleProtocol); err != nil {
			t.Fatalf("%q: %v", fn, err)
		}
		var got string
		pgtest.Must(t, tx.QueryRow(ctx, "SELECT pg_temp.rt()").Scan(&got), "call")
		if got != name+name {
			t.Fatalf("function returned %q, want the name twice", got)
		}
	})
}

// For a name without quote, backslash or dollar, the expansion of every embedded
// file is what plain text replacement gave before the lexer: databases migrated
// by earlier versions got the same SQL.
func TestExpandOfPlainNamesIsUnchanged(t *testing.T) {
	t.Parallel()
	all, err := migrate.All()
	pgtest.Must(t, err, "all")
	templates := []string{migrate.PartitionedTemplate}
	for _, m := range all {
		templates = append(templates, migrate.Template(m))
	}
	for _, name := range []string{"public", "outbox", "My Schema", "ünï", "a-b.c"} {
		naive := strings.NewReplacer("{{schema}}", pgx.Identifier{name}.Sanitize(), "{{schema_name}}", "'"+name+"'")
		for i, tpl := range templates {
			got, err := migrate.Expand(tpl, name)
			pgtest.Must(t, err, "expand %d", i)
			if want := naive.Replace(tpl); got != want {
				t.Errorf("template %d, schema %q: the expansion differs from text replacement", i, name)
			}
		}
	}
}

// FuzzExpandTemplate checks, for any migration text, that the expansion never
// panics and that whether it fails does not depend on the schema name (All
// checks each file with one name; Migration.SQL relies on that).
func FuzzExpandTemplate(f *testing.F) {
	all, err := migrate.All()
	if err != nil {
		f.Fatal(err)
	}
	f.Add(migrate.PartitionedTemplate, "$fn$")
	for _, m := range all {
		f.Add(migrate.Template(m), "a'b\"c$$d")
	}
	for _, s := range []string{"$$", "$a$ $b$ {{schema}} $b$ $a$", "'{{schema}}'", "/* /* */ {{schema}} */", "E'\\'' {{schema_name}}", "x$y$ {{schema}}", "$1{{schema}}$2"} {
		f.Add(s, "s")
	}
	f.Fuzz(func(t *testing.T, src, name string) {
		_, errX := migrate.Expand(src, "x")
		_, errN := migrate.Expand(src, name)
		if (errX == nil) != (errN == nil) {
			t.Fatalf("Expand(%q): with name x: %v; with name %q: %v", src, errX, name, errN)
		}
	})
}
