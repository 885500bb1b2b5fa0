package browsertest_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/pgoutbox/pgoutbox/admin/adminhttp"
	"github.com/pgoutbox/pgoutbox/admin/adminhttp/internal/consoletest"
	"github.com/pgoutbox/pgoutbox/broker/null"
	"github.com/pgoutbox/pgoutbox/internal/pgtest"
	"github.com/pgoutbox/pgoutbox/relay"
)

// The relays page, live: no relay ever ran ("No relay running", red); a real
// relay starts and shows, idle, with its heartbeat's age ("Relays running: 1,
// all idle", in another colour); it stops and shows as stopped, and the page
// says no relay runs again.
func TestBrowserRelayHeartbeats(t *testing.T) {
	t.Parallel()
	e := consoletest.New(t, func(c *adminhttp.Config) { c.Refresh = time.Second })
	ctx := browser(t, basicAuth("victor", e.VictorKey))
	run(t, ctx, "relays page", navigate(e.Server.URL+"/relays?schema="+e.Schema, "#live")...)
	if got := text(t, ctx, "#no-relay"); got != "No relay running." {
		t.Fatalf("no relay ever ran: %q", got)
	}
	noRelayColor := eval[string](t, ctx, `getComputedStyle(document.getElementById("no-relay")).color`)

	r, err := relay.New(e.Pool, &null.Publisher{}, &relay.Config{Schema: e.Schema, ID: "relay-on-call", Logger: consoletest.Quiet()})
	pgtest.Must(t, err, "relay")
	pgtest.Must(t, r.Start(context.Background()), "start relay")
	stopped := false
	t.Cleanup(func() {
		if !stopped {
			_ = r.Stop(context.Background())
		}
	})
	waitJS(t, ctx, "the idle relay", `(() => { const p = document.getElementById("relays-running");
  return p !== null && document.getElementById("no-relay") === null && p.textContent.startsWith("Relays running: 1, all idle"); })()`,
		60*time.Second)
	row := text(t, ctx, "#heartbeats tbody tr")
	if !strings.Contains(row, "relay-on-call") || !strings.Contains(row, "idle") || !strings.Contains(row, "s ago") || !strings.Contains(row, "poll") {
		t.Fatalf("the running relay's row: %q", row)
	}
	if idleColor := eval[string](t, ctx, `getComputedStyle(document.getElementById("relays-running")).color`); idleColor == noRelayColor {
		t.Fatalf("'relays idle' and 'no relay running' look alike: both %s", idleColor)
	}
	screenshot(t, ctx, "relays-heartbeat")

	pgtest.Must(t, r.Stop(context.Background()), "stop relay")
	stopped = true
	waitJS(t, ctx, "the stopped relay", `(() => { const p = document.getElementById("no-relay");
  return p !== null && p.textContent.includes("every relay below stopped") && document.getElementById("relays-running") === null
    && document.querySelector("#heartbeats tbody tr td:nth-child(2)").textContent === "stopped"; })()`, 60*time.Second)
	if c := eval[string](t, ctx, `getComputedStyle(document.getElementById("no-relay")).color`); c != noRelayColor {
		t.Fatalf("no relay running, in %s then %s", noRelayColor, c)
	}
}
