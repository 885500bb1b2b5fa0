package cdc_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/pgoutbox/broker/null"
	"github.com/pgoutbox/pgoutbox/cdc"
	"github.com/pgoutbox/pgoutbox/internal/pgtest"
	"github.com/pgoutbox/pgoutbox/internal/wait"
	"github.com/pgoutbox/pgoutbox/migrate"
)

// A CDC source whose role loses a privilege while it runs says so, like the
// polling relay: Healthy reports ErrPermissionDenied (also
// migrate.ErrPermissionDenied) with PostgreSQL's message, which statement and
// which table, never "database unreachable"; it logs that once per statement,
// keeps retrying, and once granted again publishes and reports healthy. The
// role is a non-superuser with REPLICATION and exactly migrate.Grants' cdc
// grants; first the re-read (SELECT) is refused, then the mark (UPDATE of
// published_at).
func TestCDCSourceReportsMissingPrivilege(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newEnv(t)
	role := cdcRole(t, e)
	grant := func(sql string) {
		t.Helper()
		_, err := e.pool.Exec(ctx, sql+" ON "+e.table()+" "+map[bool]string{true: "FROM", false: "TO"}[strings.HasPrefix(sql, "REVOKE")]+" "+pgx.Identifier{role}.Sanitize())
		pgtest.Must(t, err, "%s", sql)
	}

	var logs syncBuffer
	cfg := e.cfg
	cfg.Logger = slog.New(slog.NewTextHandler(&logs, nil))
	pool := pgtest.Pool(t, pgtest.AsRole(t, pgtest.URL(), role), 6)
	pub := &null.Publisher{}
	src := startOn(t, pool, pub, cfg)
	if err := src.Healthy(); err != nil {
		t.Fatalf("Healthy() after start = %v", err)
	}

	grant("REVOKE SELECT")
	grant("REVOKE UPDATE (published_at)")
	const events = 6
	e.enqueue(t, 3, 2, events)

	waitDenied := func(what, statement, notStatement string) {
		t.Helper()
		deadline := time.Now().Add(30 * time.Second)
		for {
			err := src.Healthy()
			if errors.Is(err, cdc.ErrPermissionDenied) && strings.Contains(err.Error(), statement) &&
				(notStatement == "" || !strings.Contains(err.Error(), notStatement)) {
				if errors.Is(err, cdc.ErrDatabaseUnreachable) || strings.Contains(err.Error(), "unreachable") ||
					!errors.Is(err, migrate.ErrPermissionDenied) ||
					!strings.Contains(err.Error(), "permission denied for table outbox_events") || !strings.Contains(err.Error(), "42501") {
					t.Fatalf("%s: Healthy() = %v", what, err)
				}
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: Healthy() = %v, want ErrPermissionDenied in %q", what, err, statement)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	waitDenied("no SELECT: the re-read is refused", "look up published events", "")
	if n := pub.Published(); n != 0 {
		t.Fatalf("%d events sent before the re-read", n)
	}

	// The re-read may run, the mark not: the broker has the events, the table
	// does not say so, and the slot does not move past them.
	grant("GRANT SELECT")
	waitDenied("no UPDATE of published_at: the mark is refused", "mark events published", "look up published events")
	if n := pub.Published(); n != events {
		t.Fatalf("%d events sent, want %d", n, events)
	}
	if n := e.count(t, "published_at IS NOT NULL"); n != 0 {
		t.Fatalf("%d events marked published", n)
	}

	grant("GRANT UPDATE (published_at)")
	wait.For(t, 30*time.Second, "the events marked and Healthy nil", func() bool {
		return e.count(t, "published_at IS NULL") == 0 && src.Healthy() == nil
	})
	if n := pub.Published(); n != events {
		t.Errorf("%d events sent, want %d (a refused mark retries the mark, not the publish)", n, events)
	}
	out := logs.String()
	for _, statement := range []string{"look up published events", "mark events published"} {
		if n := strings.Count(out, "level=ERROR msg=\"permission denied: the CDC source's role lacks a privilege"); n != 2 {
			t.Errorf("%d permission-denied ERROR lines, want one per refused statement (2):\n%s", n, out)
			break
		}
		if !strings.Contains(out, statement+": ERROR: permission denied for table outbox_events (SQLSTATE 42501)") {
			t.Errorf("no log line for %q:\n%s", statement, out)
		}
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

// syncBuffer is a bytes.Buffer safe for a logger and a reader at once.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
