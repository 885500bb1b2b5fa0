package cli

import (
	"context"
	"strconv"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/pgoutbox/internal/pgtest"
	"github.com/pgoutbox/pgoutbox/migrate"
)

// migratedByANewerBinary returns a migrated schema whose bookkeeping table has
// rows this binary does not know, inserted by "INSERT INTO <table> "+rows, where
// $1 is future, the outbox line's version after this binary's newest.
func migratedByANewerBinary(t *testing.T, rows string) (schema string, future int) {
	t.Helper()
	pool, schema := pgtest.Migrated(t, 2)
	all, _ := migrate.All(migrate.LineOutbox)
	future = all[len(all)-1].Version + 1
	table := pgx.Identifier{schema, migrate.Table}.Sanitize()
	if _, err := pool.Exec(context.Background(), "INSERT INTO "+table+" "+rows, future); err != nil {
		t.Fatal(err)
	}
	return schema, future
}

// A database migrated by a newer pgoutbox (a tracking row this binary does not
// know) is refused by every command that uses it, with exit 2 and a message
// naming the unknown migration; "migrate status" lists it.
func TestVersionSkewIsRefused(t *testing.T) {
	t.Parallel()
	schema, future := migratedByANewerBinary(t, "(line, version, name) VALUES ('outbox', $1, 'from_the_future'), ('inbox', 99, 'inbox_future')")
	url := pgtest.URL()
	db := []string{"--database-url", url, "--schema", schema}
	for _, args := range [][]string{
		{"relay", "--broker", "null://"},
		{"relay", "--source", "cdc", "--broker", "null://"},
		{"status"},
		{"status", "--json"},
		{"cleanup"},
		{"dlq", "list"},
		{"dlq", "retry", "--all"},
		{"replay", "--aggregate-type", "order", "--broker", "null://"},
		{"migrate"},
		{"migrate", "--lines", "outbox"},
	} {
		args := append(args, db...)
		_, errOut, code := run(t, args...)
		if code != 2 || !strings.Contains(errOut, "from_the_future") || !strings.Contains(errOut, "newer pgoutbox") || strings.Count(errOut, "\n") != 1 {
			t.Errorf("%v: code %d, stderr %q; want exit 2 naming the unknown migration on one line", args[:len(args)-4], code, errOut)
		}
	}
	// The inbox line alone is checked against the inbox's rows.
	_, errOut, code := run(t, "migrate", "--lines", "inbox", "--database-url", url, "--schema", schema)
	if code != 2 || !strings.Contains(errOut, "inbox_future") || strings.Contains(errOut, "from_the_future") {
		t.Errorf("migrate --lines inbox: code %d, stderr %q", code, errOut)
	}
	_, errOut, code = run(t, "cleanup", "--inbox-retention", "720h", "--retention", "24h", "--database-url", url, "--schema", schema)
	if code != 2 {
		t.Errorf("cleanup with the inbox: code %d, stderr %q", code, errOut)
	}

	out, errOut, code := run(t, "migrate", "status", "--database-url", url, "--schema", schema)
	if code != 0 {
		t.Fatalf("migrate status: code %d, stderr %q", code, errOut)
	}
	for _, want := range []string{"outbox  " + strconv.Itoa(future) + "  from_the_future", "inbox   99  inbox_future"} {
		var line string
		for l := range strings.Lines(out) {
			if strings.Contains(strings.Join(strings.Fields(l), "  "), strings.Join(strings.Fields(want), "  ")) {
				line = l
			}
		}
		if !strings.Contains(line, "applied, unknown to this binary (newer?)") {
			t.Errorf("migrate status does not list %q as unknown:\n%s", want, out)
		}
	}
}

// A database a newer pgoutbox migrated with expand steps only is within this
// binary's window: every command that uses it runs, "migrate status" says so,
// and "version" prints the window.
func TestVersionSkewWithinTheWindow(t *testing.T) {
	t.Parallel()
	schema, _ := migratedByANewerBinary(t, "(line, version, name, compat) VALUES ('outbox', $1, 'add_a_column', 'expand')")
	db := []string{"--database-url", pgtest.URL(), "--schema", schema}
	for _, args := range [][]string{
		{"status"},
		{"dlq", "list"},
		{"cleanup"},
		{"migrate"},
	} {
		if _, errOut, code := run(t, append(args, db...)...); code != 0 {
			t.Errorf("%v: code %d, stderr %q; want it to run within the window", args, code, errOut)
		}
	}
	out, errOut, code := run(t, append([]string{"migrate", "status"}, db...)...)
	if code != 0 {
		t.Fatalf("migrate status: code %d, stderr %q", code, errOut)
	}
	var line string
	for l := range strings.Lines(out) {
		if strings.Contains(l, "add_a_column") {
			line = l
		}
	}
	if !strings.Contains(line, "expand") || !strings.Contains(line, "within this binary's window") || !strings.Contains(out, "window: binaries that know outbox/") {
		t.Errorf("migrate status:\n%s", out)
	}
	if out, _, code := run(t, "version"); code != 0 || !strings.Contains(out, "window   outbox/") {
		t.Errorf("version: code %d:\n%s", code, out)
	}
}
