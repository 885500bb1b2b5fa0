package browsertest_test

import (
	"context"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/pgoutbox/pgoutbox/admin/adminhttp/internal/consoletest"
	"github.com/pgoutbox/pgoutbox/internal/pgtest"
)

// Time to first render of the overview with a million events in the table,
// against the same page on an empty outbox in the same run. A one-off
// measurement (docs/console.md), not a CI test: PGOUTBOX_CONSOLE_BIG=1 runs it.
func TestBrowserFirstRenderMillionEvents(t *testing.T) {
	if os.Getenv("PGOUTBOX_CONSOLE_BIG") != "1" {
		t.Skip("a one-off measurement: set PGOUTBOX_CONSOLE_BIG=1 to run it")
	}
	big := consoletest.New(t, nil)
	empty := consoletest.New(t, nil)
	start := time.Now()
	// A day of history in insertion order (published_at grows with the rows, as
	// a relay writes them): 1,000,000 events over 100,000 aggregates of 20
	// types; the last 1% still pending, 100 of them quarantined.
	big.History(1000000, 10000, 86*time.Millisecond, true)
	t.Logf("generated 1,000,000 events in %s", time.Since(start).Round(time.Millisecond))

	measure := func(e *consoletest.Env) (server, paint time.Duration) {
		ctx := browser(t, basicAuth("alice", e.AliceKey))
		var servers, paints []time.Duration
		for range 5 {
			run(t, ctx, "overview", navigate(e.Server.URL+"/?schema="+e.Schema, "#pending")...)
			// The navigation's own timing: request sent to response end (the
			// server's work), and navigation start to first contentful paint.
			waitJS(t, ctx, "the first contentful paint", `performance.getEntriesByName("first-contentful-paint").length > 0`, 10*time.Second)
			srv := eval[float64](t, ctx, `(() => { const n = performance.getEntriesByType("navigation")[0]; return n.responseEnd - n.requestStart })()`)
			fcp := eval[float64](t, ctx, `(() => { const p = performance.getEntriesByName("first-contentful-paint")[0]; return p ? p.startTime : -1 })()`)
			if fcp < 0 {
				t.Fatal("no first-contentful-paint entry")
			}
			servers = append(servers, time.Duration(srv*float64(time.Millisecond)))
			paints = append(paints, time.Duration(fcp*float64(time.Millisecond)))
		}
		slices.Sort(servers)
		slices.Sort(paints)
		return servers[2], paints[2]
	}
	ms := func(d time.Duration) string { return d.Round(time.Millisecond).String() }
	es, ep := measure(empty)
	// Right after the bulk load, before any vacuum: the BRIN index on
	// published_at has not summarised the new pages, so the last hour's
	// publishes are counted by reading the whole table.
	bs, bp := measure(big)
	// Once (auto)vacuum has run, as it does after a bulk insert.
	_, err := big.Pool.Exec(context.Background(), "VACUUM ANALYZE "+big.Table("outbox_events"))
	pgtest.Must(t, err, "vacuum")
	vs, vp := measure(big)
	_, page := big.Get("/?schema=" + big.Schema)
	t.Logf("overview HTML with 1M events: %d bytes", len(page))
	t.Logf("overview, median of 5: empty outbox: server %s, first contentful paint %s; "+
		"1M events after VACUUM: server %s, first contentful paint %s (%.1fx the empty outbox); "+
		"1M events freshly bulk-loaded, before any vacuum: server %s, first contentful paint %s (%.1fx)",
		ms(es), ms(ep), ms(vs), ms(vp), float64(vp)/float64(ep), ms(bs), ms(bp), float64(bp)/float64(ep))
}
