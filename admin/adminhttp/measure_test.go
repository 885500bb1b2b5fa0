package adminhttp_test

import (
	"context"
	"net/http"
	"os"
	"regexp"
	"slices"
	"testing"
	"time"

	"github.com/pgoutbox/pgoutbox/internal/pgtest"
)

// overviewBudget is the most the overview may weigh, page and assets: it is
// read on a phone over a VPN at 3 a.m.
const overviewBudget = 64 << 10

// The overview's weight: its HTML and every asset it links (no CDN, no other
// request), within the budget. The figure is logged for docs/console.md.
func TestOverviewPageWeight(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	e.enqueue("order", "o1", 3, map[string]int{"n": 1})
	page := e.get("/?schema=" + e.schema)
	total := len(page.body)
	assets := regexp.MustCompile(`(?:href|src)="(/static/[^"]+)"`).FindAllStringSubmatch(page.body, -1)
	if len(assets) != 2 {
		t.Fatalf("the overview links %d assets, want the style sheet and the script: %v", len(assets), assets)
	}
	for _, m := range assets {
		a := e.get(m[1])
		if a.status != http.StatusOK {
			t.Fatalf("%s: %d", m[1], a.status)
		}
		total += len(a.body)
	}
	if regexp.MustCompile(`(?i)(?:href|src)="(?:https?:)?//`).MatchString(page.body) {
		t.Errorf("the overview loads something from another host")
	}
	t.Logf("overview page weight: %d bytes (HTML %d, assets %d)", total, len(page.body), total-len(page.body))
	if total > overviewBudget {
		t.Errorf("the overview weighs %d bytes, over its budget of %d", total, overviewBudget)
	}
}

// The overview's server time by range with a million events published over
// the last week, and the rows its bucketed reads return: the page's first
// load reads the range (the API's loads then share it, for a day or a week). A one-off
// measurement (docs/console.md, "Time ranges"), not a CI test:
// PGOUTBOX_CONSOLE_BIG=1 runs it.
func TestOverviewRangeServerTime(t *testing.T) {
	if os.Getenv("PGOUTBOX_CONSOLE_BIG") != "1" {
		t.Skip("a one-off measurement: set PGOUTBOX_CONSOLE_BIG=1 to run it")
	}
	e := newEnv(t, nil)
	ctx := context.Background()
	start := time.Now()
	// A week of history in insertion order (published_at grows with the rows,
	// as a relay writes them): 1,000,000 events over 100,000 aggregates of 20
	// types and 4 relays; the last 1,000 (10 minutes) still pending, 10 of them quarantined.
	e.console.History(1000000, 1000, 604*time.Millisecond, false)
	t.Logf("generated 1,000,000 events over a week in %s", time.Since(start).Round(time.Millisecond))

	for _, rng := range []string{"1h", "24h", "7d"} {
		for _, p := range []string{"/?schema=" + e.schema + "&range=" + rng, "/api/v1/overview?schema=" + e.schema + "&range=" + rng} {
			var times []time.Duration
			var size int
			for range 5 {
				t0 := time.Now()
				r := e.get(p)
				times = append(times, time.Since(t0))
				if r.status != http.StatusOK {
					t.Fatalf("%s: %d %.300s", p, r.status, r.body)
				}
				size = len(r.body)
			}
			// The first load of a day or a week reads; the next ones share it
			// (within a minute). The page after the API: the same read.
			cold := times[0]
			slices.Sort(times[1:])
			t.Logf("%s: first load %s, then median of 4 %s (min %s, max %s), %d bytes", p, cold.Round(time.Millisecond),
				times[2].Round(time.Millisecond), times[1].Round(time.Millisecond), times[4].Round(time.Millisecond), size)
		}
		var rows int
		pgtest.Must(t, e.pool.QueryRow(ctx, `SELECT count(DISTINCT date_bin($2::interval, e.published_at, now() - $1::interval)) +
       count(DISTINCT (e.aggregate_type, e.claimed_by)) FROM `+e.table("outbox_events")+` e WHERE e.published_at >= now() - $1::interval`,
			map[string]string{"1h": "1 hour", "24h": "24 hours", "7d": "7 days"}[rng],
			map[string]string{"1h": "1 minute", "24h": "15 minutes", "7d": "1 hour"}[rng]).Scan(&rows), "rows")
		t.Logf("range %s: the publishes' read returns %d rows (buckets + types × relays)", rng, rows)
	}
}
