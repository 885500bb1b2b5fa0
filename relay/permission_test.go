package relay_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/pgoutbox/broker/null"
	"github.com/pgoutbox/pgoutbox/internal/pgtest"
	"github.com/pgoutbox/pgoutbox/internal/wait"
	"github.com/pgoutbox/pgoutbox/migrate"
	"github.com/pgoutbox/pgoutbox/relay"
)

// A relay whose role lacks a privilege says so in Healthy (SQLSTATE 42501 and
// the table), never "database unreachable", whether the claim or the settle is
// refused; once granted, it drains.
func TestRelayReportsMissingPrivilege(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	o := newOutbox(t, 4)
	o.enqueue(t, 3, 2)
	role := pgtest.Role(t, o.pool, "")
	script, err := migrate.Grants(&migrate.GrantsConfig{Schema: o.schema, RoleNames: map[migrate.Role]string{migrate.RoleRelay: role}, Roles: []migrate.Role{migrate.RoleRelay}})
	pgtest.Must(t, err, "grants")
	_, err = o.pool.Exec(ctx, script, pgx.QueryExecModeSimpleProtocol)
	pgtest.Must(t, err, "apply grants")
	grant := func(sql string) {
		t.Helper()
		_, err := o.pool.Exec(ctx, sql+" ON "+o.table()+" "+map[bool]string{true: "FROM", false: "TO"}[strings.HasPrefix(sql, "REVOKE")]+" "+pgx.Identifier{role}.Sanitize())
		pgtest.Must(t, err, "%s", sql)
	}
	grant("REVOKE UPDATE")

	pool := pgtest.Pool(t, pgtest.AsRole(t, pgtest.URL(), role), 6)
	r, err := relay.New(pool, &null.Publisher{}, &relay.Config{Schema: o.schema, PollInterval: 50 * time.Millisecond, Logger: quietLogger()})
	pgtest.Must(t, err, "new relay")
	pgtest.Must(t, r.Start(ctx), "start")
	t.Cleanup(func() {
		sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		_ = r.Stop(sctx)
	})
	waitDenied := func(what, want string) {
		t.Helper()
		deadline := time.Now().Add(20 * time.Second)
		for {
			err := r.Healthy()
			if errors.Is(err, relay.ErrPermissionDenied) && strings.Contains(err.Error(), want) {
				if errors.Is(err, relay.ErrDatabaseUnreachable) || !errors.Is(err, migrate.ErrPermissionDenied) ||
					!strings.Contains(err.Error(), "permission denied for table outbox_events") || !strings.Contains(err.Error(), "42501") {
					t.Fatalf("%s: Healthy() = %v", what, err)
				}
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: Healthy() = %v, want ErrPermissionDenied", what, err)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	waitDenied("no UPDATE: the claim is refused", "claim batch")
	if n := o.count(t, "claimed_by IS NOT NULL OR published_at IS NOT NULL"); n != 0 {
		t.Fatalf("%d events touched", n)
	}

	// The lease may be written, the outcome not: the settle is refused.
	grant("GRANT UPDATE (claimed_by, claim_until)")
	waitDenied("no UPDATE of published_at: the mark is refused", "settle batch")
	if n := o.count(t, "published_at IS NOT NULL"); n != 0 {
		t.Fatalf("%d events published", n)
	}

	grant("GRANT UPDATE (" + "claimed_by, claim_until, published_at, attempt_count, last_error, available_at, quarantined_at" + ")")
	wait.For(t, 20*time.Second, "the backlog drained", func() bool { return o.count(t, "published_at IS NULL") == 0 })
	wait.For(t, 20*time.Second, "Healthy nil", func() bool { return r.Healthy() == nil })
}
