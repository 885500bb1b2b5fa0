package browsertest_test

import (
	"context"
	"net"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/pgoutbox/admin/adminhttp"
	"github.com/pgoutbox/pgoutbox/admin/adminhttp/internal/consoletest"
	"github.com/pgoutbox/pgoutbox/internal/pgtest"
	"github.com/pgoutbox/pgoutbox/internal/wait"
	"github.com/pgoutbox/pgoutbox/migrate"
)

// Conditions on the page: the stale banner shown over greyed figures, and
// both gone.
const (
	staleShown = `(() => { const b = document.getElementById("stale"), l = document.getElementById("live");
  return !b.hidden && b.offsetHeight > 0 && l.classList.contains("stale") && parseFloat(getComputedStyle(l).opacity) < 1; })()`
	staleGone = `(() => { const b = document.getElementById("stale"), l = document.getElementById("live");
  return b.hidden && b.offsetHeight === 0 && !l.classList.contains("stale") && getComputedStyle(l).opacity === "1"
    && document.getElementById("updated").textContent.startsWith("updated"); })()`
)

// watchOverview opens the overview of e and waits for a first refresh.
func watchOverview(t *testing.T, e *consoletest.Env) context.Context {
	t.Helper()
	ctx := browser(t, basicAuth("victor", e.VictorKey))
	run(t, ctx, "overview", navigate(e.Server.URL+"/?schema="+e.Schema, "#live")...)
	waitJS(t, ctx, "a first refresh", `document.getElementById("updated").textContent.startsWith("updated")`, 60*time.Second)
	if eval[bool](t, ctx, staleShown) || !eval[bool](t, ctx, `document.getElementById("stale").hidden`) {
		t.Fatal("a stale banner while the console answers")
	}
	return ctx
}

// The console's process goes away: the page keeps its figures, greyed, under
// a banner saying since when they are stale; the console back on the same
// address, the banner goes at the next refresh.
func TestBrowserStaleBannerConsoleGone(t *testing.T) {
	t.Parallel()
	e := consoletest.New(t, func(c *adminhttp.Config) { c.Refresh = time.Second })
	e.Enqueue("order", "o-1", 3, map[string]int{"n": 1})
	ctx := watchOverview(t, e)
	addr := e.Server.Listener.Addr().String()
	e.Server.Close()
	waitJS(t, ctx, "the stale banner", staleShown, 60*time.Second)
	banner := text(t, ctx, "#stale")
	if !strings.HasPrefix(banner, "Stale since ") || !strings.Contains(banner, "the console did not answer") {
		t.Fatalf("banner %q", banner)
	}
	if text(t, ctx, "#pending") == "" {
		t.Fatal("the stale figures were taken off the page")
	}
	screenshot(t, ctx, "stale")

	var l net.Listener
	wait.For(t, 30*time.Second, "the console's address again", func() bool {
		var err error
		l, err = net.Listen("tcp", addr)
		return err == nil
	})
	srv := httptest.NewUnstartedServer(e.Handler)
	_ = srv.Listener.Close()
	srv.Listener = l
	srv.Start()
	t.Cleanup(srv.Close)
	waitJS(t, ctx, "the banner gone", staleGone, 60*time.Second)
}

// The console answers, its database does not (its role may no longer log
// in): the banner says the console answers an error; the database back, it
// goes.
func TestBrowserStaleBannerDatabaseGone(t *testing.T) {
	t.Parallel()
	bg := context.Background()
	pool, schema := pgtest.Migrated(t, 4)
	role := pgtest.Role(t, pool, "")
	grants, err := migrate.Grants(&migrate.GrantsConfig{Schema: schema, Roles: []migrate.Role{migrate.RoleOperator},
		RoleNames: map[migrate.Role]string{migrate.RoleOperator: role}})
	pgtest.Must(t, err, "grants")
	_, err = pool.Exec(bg, grants)
	pgtest.Must(t, err, "grant")
	consolePool := pgtest.Pool(t, pgtest.AsRole(t, pool.Config().ConnString(), role), 4)
	e := consoletest.On(t, consolePool, schema, func(c *adminhttp.Config) { c.Refresh = time.Second }, nil)
	ctx := watchOverview(t, e)

	r := pgx.Identifier{role}.Sanitize()
	_, err = pool.Exec(bg, "ALTER ROLE "+r+" NOLOGIN")
	pgtest.Must(t, err, "refuse the console's logins")
	_, err = pool.Exec(bg, "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = $1", role)
	pgtest.Must(t, err, "end the console's sessions")
	waitJS(t, ctx, "the stale banner", staleShown, 60*time.Second)
	if banner := text(t, ctx, "#stale"); !strings.HasPrefix(banner, "Stale since ") || !strings.Contains(banner, "the console answered HTTP 5") {
		t.Fatalf("banner %q", banner)
	}
	_, err = pool.Exec(bg, "ALTER ROLE "+r+" LOGIN")
	pgtest.Must(t, err, "let the console log in again")
	waitJS(t, ctx, "the banner gone", staleGone, 60*time.Second)
}
