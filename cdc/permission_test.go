package cdc_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/pgoutbox/broker/null"
	"github.com/pgoutbox/pgoutbox/cdc"
	"github.com/pgoutbox/pgoutbox/internal/logtest"
	"github.com/pgoutbox/pgoutbox/internal/pgtest"
	"github.com/pgoutbox/pgoutbox/internal/wait"
	"github.com/pgoutbox/pgoutbox/migrate"
)

// A CDC source whose role loses a privilege while it runs says so, like the
// polling relay: Healthy reports ErrPermissionDenied (also
// migrate.ErrPermissionDenied) with PostgreSQL's message, which statement and
// which table, never "database unreachable"; it logs that once, keeps
// retrying, and once granted again marks and reports healthy. The role is a
// non-superuser with REPLICATION and exactly migrate.Grants' cdc grants, less
// SELECT (which the mark's WHERE needs) or UPDATE of published_at. Fresh
// events are not looked up before publishing (nobody can have published them),
// so the broker has them, and the slot waits for the mark.
func TestCDCSourceReportsMissingPrivilege(t *testing.T) {
	t.Parallel()
	for _, privilege := range []string{"SELECT", "UPDATE (published_at)"} {
		t.Run(privilege, func(t *testing.T) {
			t.Parallel()
			testMissingPrivilege(t, privilege)
		})
	}
}

func testMissingPrivilege(t *testing.T, privilege string) {
	ctx := context.Background()
	e := newEnv(t)
	role := cdcRole(t, e)
	grant := func(sql string) {
		t.Helper()
		_, err := e.pool.Exec(ctx, sql+" ON "+e.table()+" "+map[bool]string{true: "FROM", false: "TO"}[strings.HasPrefix(sql, "REVOKE")]+" "+pgx.Identifier{role}.Sanitize())
		pgtest.Must(t, err, "%s", sql)
	}

	var logs logtest.Buffer
	cfg := e.cfg
	cfg.Logger = logs.Logger()
	pool := pgtest.Pool(t, pgtest.AsRole(t, pgtest.URL(), role), 6)
	pub := &null.Publisher{}
	src := startOn(t, pool, pub, cfg)
	if err := src.Healthy(); err != nil {
		t.Fatalf("Healthy() after start = %v", err)
	}

	grant("REVOKE " + privilege)
	const events = 6
	e.enqueue(t, 3, 2, events)
	// Past the commit of every event (pg_current_wal_lsn, the write position,
	// may still be before it under synchronous_commit = off).
	var last string
	pgtest.Must(t, e.pool.QueryRow(ctx, "SELECT pg_current_wal_insert_lsn()::text").Scan(&last), "insert position")

	deadline := time.Now().Add(30 * time.Second)
	for {
		err := src.Healthy()
		if errors.Is(err, cdc.ErrPermissionDenied) {
			if !strings.Contains(err.Error(), "mark events published") ||
				errors.Is(err, cdc.ErrDatabaseUnreachable) || strings.Contains(err.Error(), "unreachable") ||
				!errors.Is(err, migrate.ErrPermissionDenied) ||
				!strings.Contains(err.Error(), "permission denied for table outbox_events") || !strings.Contains(err.Error(), "42501") {
				t.Fatalf("Healthy() = %v", err)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("Healthy() = %v, want ErrPermissionDenied in the mark", err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	// The broker has the events, the table does not say so, and the slot does
	// not move past them.
	if n := pub.Published(); n != events {
		t.Fatalf("%d events sent, want %d", n, events)
	}
	if n := e.count(t, "published_at IS NOT NULL"); n != 0 {
		t.Fatalf("%d events marked published", n)
	}
	if e.slotConfirmedAtLeast(t, last) {
		t.Fatal("the slot confirmed events that are not marked")
	}

	grant("GRANT " + privilege)
	wait.For(t, 30*time.Second, "the events marked and Healthy nil", func() bool {
		return e.count(t, "published_at IS NULL") == 0 && src.Healthy() == nil
	})
	if n := pub.Published(); n != events {
		t.Errorf("%d events sent, want %d (a refused mark retries the mark, not the publish)", n, events)
	}
	wait.For(t, 30*time.Second, "the slot to confirm the events once marked", func() bool { return e.slotConfirmedAtLeast(t, last) })
	out := logs.String()
	if n := strings.Count(out, "level=ERROR msg=\"permission denied: the CDC source's role lacks a privilege"); n != 1 {
		t.Errorf("%d permission-denied ERROR lines, want one:\n%s", n, out)
	}
	if !strings.Contains(out, "mark events published: ERROR: permission denied for table outbox_events (SQLSTATE 42501)") {
		t.Errorf("no log line for the refused mark:\n%s", out)
	}
	if strings.Contains(out, "unreachable") {
		t.Errorf("a missing privilege logged as unreachable:\n%s", out)
	}
}

// cdcRole creates a non-superuser with REPLICATION and exactly migrate.Grants'
// cdc grants on e's schema, and makes the owner's one-time preparation
// (docs/security.md, "The CDC role").
func cdcRole(t *testing.T, e *env) string {
	t.Helper()
	ctx := context.Background()
	role := pgtest.Role(t, e.pool, "", "REPLICATION")
	script, err := migrate.Grants(&migrate.GrantsConfig{Schema: e.schema, RoleNames: map[migrate.Role]string{migrate.RoleCDC: role}, Roles: []migrate.Role{migrate.RoleCDC}})
	pgtest.Must(t, err, "grants")
	_, err = e.pool.Exec(ctx, script, pgx.QueryExecModeSimpleProtocol)
	pgtest.Must(t, err, "apply grants")
	// The owner's one-time preparation (docs/security.md, "The CDC role").
	_, err = e.pool.Exec(ctx, "CREATE PUBLICATION "+pgx.Identifier{e.cfg.Publication}.Sanitize()+" FOR TABLE "+e.table()+
		" WITH (publish = 'insert', publish_via_partition_root = true)")
	pgtest.Must(t, err, "create publication")
	_, err = e.pool.Exec(ctx, "ALTER TABLE "+e.table()+" ALTER COLUMN claimed_by SET DEFAULT 'cdc:"+e.cfg.Slot+
		"', ALTER COLUMN claim_until SET DEFAULT 'infinity'")
	pgtest.Must(t, err, "column defaults")
	return role
}
