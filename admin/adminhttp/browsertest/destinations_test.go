package browsertest_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/pgoutbox/pgoutbox/admin"
	"github.com/pgoutbox/pgoutbox/admin/adminhttp/internal/consoletest"
	"github.com/pgoutbox/pgoutbox/internal/pgtest"
)

// The destinations page shows each destination with its rules, backlog and
// dead letters; a destination's dead letter is retried from its list, at that
// destination alone, with its audit row.
func TestBrowserDestinationRetry(t *testing.T) {
	t.Parallel()
	e := consoletest.New(t, nil)
	ids := e.Enqueue("order", "o-1", 2, map[string]int{"n": 1})
	for _, q := range []string{
		`INSERT INTO ` + e.Table("outbox_destinations") + ` (name, rules, start) VALUES
  ('analytics', '[{"all": true}]', 'backfill'), ('partners', '[{"aggregate_types": ["<img src=x onerror=\"window.__xss=1\">", "order"]}]', 'now')`,
		`INSERT INTO ` + e.Table("outbox_destination_lanes") + ` (destination, aggregate_type, aggregate_id, delivered_sequence,
       attempt_count, last_error, quarantined_at, quarantined_sequence) VALUES
  ('analytics', 'order', 'o-1', 0, 10, 'kafka: MESSAGE_TOO_LARGE', now(), 1), ('partners', 'order', 'o-1', 2, 0, NULL, NULL, NULL)`,
	} {
		_, err := e.Pool.Exec(context.Background(), q)
		pgtest.Must(t, err, "destinations")
	}

	ctx := browser(t, basicAuth("alice", e.AliceKey))
	run(t, ctx, "overview", navigate(e.Server.URL+"/?schema="+e.Schema, "#overview-destinations")...)
	run(t, ctx, "the destinations page", chromedp.Click(chromedp.CSS("h2 a[href*='/destinations']")), chromedp.WaitVisible(chromedp.CSS("#destinations")))
	if n := eval[int](t, ctx, `document.querySelectorAll("#destinations tbody tr").length`); n != 2 {
		t.Fatalf("%d destination rows, want 2", n)
	}
	cells := eval[[]string](t, ctx, `Array.from(document.querySelectorAll("#destinations tr[data-destination=analytics] td")).map(td => td.textContent)`)
	if len(cells) != 9 || cells[1] != "every event" || cells[2] != "backfill" || cells[3] != "1" || cells[4] != "2" || cells[5] != "1" ||
		!strings.Contains(cells[6], " ago · 20") {
		t.Fatalf("analytics row %q", cells)
	}
	if rules := text(t, ctx, "#destinations tr[data-destination=partners] td.rules"); rules != `aggregate type "<img src=x onerror=\"window.__xss=1\">" or "order"` {
		t.Errorf("partners rules %q", rules)
	}
	if eval[bool](t, ctx, `window.__xss !== undefined || document.querySelector("#destinations img") !== null`) {
		t.Fatal("a rule became markup")
	}
	screenshot(t, ctx, "destinations")

	run(t, ctx, "analytics dead letters", chromedp.Click(chromedp.CSS("tr[data-destination=analytics] a.dead-letters")),
		chromedp.WaitVisible(chromedp.CSS("#dead-letters")))
	if d := text(t, ctx, "#destination strong"); d != "analytics" {
		t.Fatalf("dead letters of %q", d)
	}
	run(t, ctx, "retry it", chromedp.Click(chromedp.CSS(`#dead-letters input[value="`+ids[0].String()+`"]`)),
		chromedp.SendKeys(chromedp.CSS("#bulk-reason"), "topic limit raised, INC-42"),
		chromedp.Click(chromedp.CSS(`#bulk button[formaction$="/dlq/retry"]`)))
	waitJS(t, ctx, "the notice", `document.querySelector(".notice") !== null`, 30*time.Second)
	if n := text(t, ctx, ".notice"); !strings.Contains(n, "Destination analytics: Retried 1 event(s)") {
		t.Fatalf("notice %q", n)
	}
	entries, err := e.Admin.Audit(context.Background(), 5)
	pgtest.Must(t, err, "audit")
	if len(entries) != 1 || entries[0].Action != admin.ActionRetry || entries[0].Selection["destination"] != "analytics" ||
		entries[0].Actor != "console:alice" || entries[0].Reason != "topic limit raised, INC-42" || len(entries[0].EventIDs) != 1 || entries[0].EventIDs[0] != ids[0] {
		t.Fatalf("audit: %+v", entries)
	}
	if left, err := e.Admin.ListDestinationQuarantined(context.Background(), "analytics", admin.Filter{}); err != nil || len(left) != 0 {
		t.Fatalf("analytics dead letters after the retry: %+v, %v", left, err)
	}
}
