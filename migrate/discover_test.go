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

	got, err := migrate.Outboxes(ctx, pool)
	pgtest.Must(t, err, "outboxes")
	want := []string{"other", "tenant_a", "tenant_b", `x"; DROP TABLE y; --`}
	if !slices.Equal(got, want) {
		t.Fatalf("Outboxes = %q, want %q", got, want)
	}
	got, err = migrate.Outboxes(ctx, pool, "tenant_*", "other")
	pgtest.Must(t, err, "outboxes selected")
	if want := []string{"other", "tenant_a", "tenant_b"}; !slices.Equal(got, want) {
		t.Fatalf("Outboxes(tenant_*, other) = %q, want %q", got, want)
	}
	sel, err := migrate.ParseSelector("tenant_b, oth*")
	pgtest.Must(t, err, "selector")
	got, err = migrate.SelectOutboxes(ctx, pool, sel)
	pgtest.Must(t, err, "outboxes of a parsed selector")
	if want := []string{"other", "tenant_b"}; !slices.Equal(got, want) {
		t.Fatalf("SelectOutboxes(%s) = %q, want %q", sel, got, want)
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
	for _, bad := range []string{"[", "a,[b", "tenant_\\", strings.Repeat("x", 64), "a\x00", "\xff", strings.Repeat("a,", 1001)} {
		if _, err := migrate.ParseSelector(bad); !errors.Is(err, migrate.ErrBadSelector) {
			t.Errorf("ParseSelector(%q) = %v, want ErrBadSelector", bad, err)
		}
	}
}
