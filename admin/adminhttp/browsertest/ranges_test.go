package browsertest_test

import (
	"context"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/pgoutbox/pgoutbox"
	"github.com/pgoutbox/pgoutbox/admin"
	"github.com/pgoutbox/pgoutbox/admin/adminhttp/internal/consoletest"
	"github.com/pgoutbox/pgoutbox/internal/pgtest"
)

// An event published two days ago and an audit row of two days ago: the
// range selector's "last week" shows them (the overview's per-type table and
// its hourly chart, the audit), "last hour" does not; a range typed into the
// URL that is not one of the three is the error page, whatever it holds.
func TestBrowserTimeRanges(t *testing.T) {
	t.Parallel()
	e := consoletest.New(t, nil)
	ctx := context.Background()
	ids := e.Enqueue("twodays", "d-1", 2, map[string]int{"n": 1})
	e.Published(ids[0], 48*time.Hour, "relay-tuesday")
	e.Quarantine(ids[1], "boom")
	a, err := admin.New(e.Pool, &admin.Config{Schema: e.Schema})
	pgtest.Must(t, err, "admin")
	_, err = a.Skip(ctx, admin.SkipRequest{IDs: []pgoutbox.UUID{ids[1]}, Reason: "skipped two days ago", Actor: "bob"})
	pgtest.Must(t, err, "skip")
	_, err = e.Pool.Exec(ctx, "UPDATE "+e.Table("outbox_operator_audit")+" SET at = now() - interval '2 days'")
	pgtest.Must(t, err, "age the audit row")

	b := browser(t, basicAuth("victor", e.VictorKey))
	base := e.Server.URL
	shown := `document.querySelector("#live").textContent.includes("twodays")`
	current := `document.querySelector("#ranges a[aria-current]").textContent`

	run(t, b, "overview", navigate(base+"/?schema="+e.Schema, "#ranges")...)
	if c := eval[string](t, b, current); c != "last hour" || eval[bool](t, b, shown) {
		t.Fatalf("the default range: %q chosen, the event of two days ago shown: %v", c, eval[bool](t, b, shown))
	}
	run(t, b, "choose the week", chromedp.Click(chromedp.CSS(`#ranges a[href*="range=7d"]`)))
	waitJS(t, b, "the week's overview", `location.search.includes("range=7d") && !!document.querySelector("#by-type")`, 30*time.Second)
	if c := eval[string](t, b, current); c != "last week" || !eval[bool](t, b, shown) {
		t.Fatalf("the week: %q chosen, the event of two days ago shown: %v", c, eval[bool](t, b, shown))
	}
	if n := eval[int](t, b, `document.querySelectorAll("svg.chart")[0].querySelectorAll("rect.bar").length`); n != 169 && n != 170 {
		t.Errorf("the week's chart has %d bars, want one an hour (169 or 170)", n)
	}
	if h := text(t, b, "#by-type thead"); !strings.Contains(h, "published (last week)") {
		t.Errorf("the per-type table's heading %q", h)
	}
	if bar := eval[int](t, b, `[...document.querySelectorAll("svg.chart")[0].querySelectorAll("rect.bar")].filter(r => parseFloat(r.getAttribute("height")) > 0).length`); bar != 1 {
		t.Errorf("%d bars with publishes in the week, want 1 (two days ago)", bar)
	}
	run(t, b, "back to the hour", chromedp.Click(chromedp.CSS(`#ranges a[href*="range=1h"]`)))
	waitJS(t, b, "the hour's overview", `location.search.includes("range=1h") && !!document.querySelector("#live")`, 30*time.Second)
	if eval[bool](t, b, shown) {
		t.Error("the hour shows the event of two days ago")
	}

	row := `document.querySelector("#live").textContent.includes("skipped two days ago")`
	run(t, b, "the audit, a week", navigate(base+"/audit?schema="+e.Schema+"&range=7d", "#audit")...)
	if !eval[bool](t, b, row) {
		t.Fatal("the week's audit lacks the row of two days ago")
	}
	if when := text(t, b, "#audit td.when"); !strings.Contains(when, "h") || !strings.Contains(when, " ago · 20") {
		t.Errorf("the audit row's time %q is not relative and absolute", when)
	}
	run(t, b, "the audit, an hour", navigate(base+"/audit?schema="+e.Schema+"&range=1h", "#ranges")...)
	if eval[bool](t, b, row) {
		t.Error("the hour's audit shows the row of two days ago")
	}

	// Ranges typed into the URL: the error page, the value not echoed, nothing run.
	for _, bad := range []string{"week", "2h", `"><img src=x onerror="window.__xss=1">`, `'onmouseover='window.__xss=1`,
		"<script>window.__xss=1</script>", strings.Repeat("7d", 3000), "7d\u202e"} {
		for _, p := range []string{"/", "/relays", "/audit"} {
			run(t, b, "a bad range", navigate(base+p+"?schema="+e.Schema+"&range="+url.QueryEscape(bad), "p.error")...)
			msg := text(t, b, "p.error")
			if !strings.Contains(msg, "range: must be 1h, 24h or 7d") || eval[string](t, b, `document.querySelector("h1").textContent`) != "Bad Request" {
				t.Errorf("%s range %.20q: %q", p, bad, msg)
			}
			if eval[bool](t, b, `window.__xss !== undefined || document.body.innerHTML.includes("onerror") || document.body.innerHTML.includes("7d7d")`) {
				t.Errorf("%s range %.20q: the value reached the page", p, bad)
			}
		}
	}
}
