package migrate_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/pgoutbox/internal/pgtest"
	"github.com/pgoutbox/pgoutbox/migrate"
)

func TestOutboxesListsMigratedSchemasOnly(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.Pool(t, pgtest.Database(t), 2)
	// A hostile name is a schema like any other: it is listed, never run.
	names := []string{"tenant_a", "tenant_b", `x"; DROP TABLE y; --`, "other"}
	for _, s := range names {
		_, err := migrate.Up(ctx, pool, &migrate.Config{Schema: s})
		pgtest.Must(t, err, "migrate %q", s)
	}
	// Not outboxes: a bare schema, one with only the inbox, one with an
	// outbox_events table of someone else's.
	for _, q := range []string{
		"CREATE SCHEMA bare",
		"CREATE SCHEMA foreign_events",
		"CREATE TABLE foreign_events.outbox_events (id int)",
	} {
		_, err := pool.Exec(ctx, q)
		pgtest.Must(t, err, "%s", q)
	}
	_, err := migrate.Up(ctx, pool, &migrate.Config{Schema: "inbox_only", Lines: []migrate.Line{migrate.LineInbox}})
	pgtest.Must(t, err, "migrate inbox only")

	got, err := migrate.Outboxes(ctx, pool, migrate.Selector{})
	pgtest.Must(t, err, "outboxes")
	want := []string{"other", "tenant_a", "tenant_b", `x"; DROP TABLE y; --`}
	if !slices.Equal(got, want) {
		t.Fatalf("Outboxes = %q, want %q", got, want)
	}
	for in, want := range map[string][]string{
		"tenant_*,other": {"other", "tenant_a", "tenant_b"},
		"tenant_b, oth*": {"other", "tenant_b"},
		"public":         nil,
	} {
		sel, err := migrate.ParseSelector(in)
		pgtest.Must(t, err, "selector %q", in)
		got, err = migrate.Outboxes(ctx, pool, sel)
		pgtest.Must(t, err, "outboxes of %q", in)
		if !slices.Equal(got, want) {
			t.Fatalf("Outboxes(%s) = %q, want %q", sel, got, want)
		}
	}
	var n int
	pgtest.Must(t, pool.QueryRow(ctx, "SELECT count(*) FROM "+pgx.Identifier{`x"; DROP TABLE y; --`, "outbox_events"}.Sanitize()).Scan(&n), "hostile schema intact")
}

func TestParseSelector(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		in    string
		match []string
		skip  []string
	}{
		{"", []string{"a", "tenant_1"}, nil},
		{" , ", []string{"a"}, nil},
		{"tenant_*", []string{"tenant_1", "tenant_"}, []string{"tenant", "a", "xtenant_1"}},
		{"a,b", []string{"a", "b"}, []string{"c", "ab"}},
		{"t?", []string{"t1"}, []string{"t12"}},
		{"[ab]*", []string{"a1", "b"}, []string{"c"}},
	} {
		sel, err := migrate.ParseSelector(tc.in)
		if err != nil {
			t.Fatalf("ParseSelector(%q): %v", tc.in, err)
		}
		for _, s := range tc.match {
			if !sel.Match(s) {
				t.Errorf("%q does not match %q", tc.in, s)
			}
		}
		for _, s := range tc.skip {
			if sel.Match(s) {
				t.Errorf("%q matches %q", tc.in, s)
			}
		}
	}
	// An error names the item by its position, never by its value.
	for bad, want := range map[string]string{
		"[":                          "item 1 is not a valid glob",
		"a, ,s3cr3t[b":               "item 3 is not a valid glob",
		"s3cr3t\\":                   "item 1 is not a valid glob",
		strings.Repeat("s3cr3t", 11): "item 1 is longer than 63 bytes",
		"a,s3cr3t\x00":               "item 2 must be valid UTF-8",
		"s3cr3t\xff":                 "item 1 must be valid UTF-8",
		strings.Repeat("a,", 1001):   "more than 1000 items",
	} {
		_, err := migrate.ParseSelector(bad)
		if !errors.Is(err, migrate.ErrBadSelector) || !strings.Contains(err.Error(), want) || strings.Contains(err.Error(), "s3cr3t") {
			t.Errorf("ParseSelector(%q) = %v, want ErrBadSelector saying %q without the value", bad, err, want)
		}
	}
}

// The zero Selector selects every schema; DefaultSchemaSelector only "public".
func TestSelectorZeroAndDefault(t *testing.T) {
	t.Parallel()
	var zero migrate.Selector
	if !zero.IsZero() || !zero.Match("tenant_1") || zero.String() != "" {
		t.Errorf("zero Selector: IsZero %t, matches tenant_1 %t, String %q; want every schema", zero.IsZero(), zero.Match("tenant_1"), zero)
	}
	def := migrate.DefaultSchemaSelector()
	if def.IsZero() || !def.Match(migrate.DefaultSchema) || def.Match("tenant_1") || def.String() != migrate.DefaultSchema {
		t.Errorf("DefaultSchemaSelector() = %q, want only %q", def, migrate.DefaultSchema)
	}
	if all, err := migrate.ParseSelector(" , "); err != nil || !all.IsZero() {
		t.Errorf("ParseSelector of blanks = %q, %v; want the zero Selector", all, err)
	}
}
