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

// failEvents gives n new events of their own aggregates (ids f-<i>, type
// aggType) the error errText (with the event's number in it, as receivers
// put request ids), quarantined or backing off for an hour after attempts.
func failEvents(t *testing.T, e *consoletest.Env, aggType string, n, attempts int, quarantined bool, errText string) {
	t.Helper()
	_, err := e.Pool.Exec(context.Background(), `INSERT INTO `+e.Table("outbox_events")+`
  (event_id, aggregate_type, aggregate_id, aggregate_sequence, event_type, payload, occurred_at, available_at,
   attempt_count, last_error, quarantined_at)
SELECT gen_random_uuid(), $1, 'f-' || i, 1, 'changed', jsonb_build_object('n', i), now() - interval '10 minutes',
       now() + interval '1 hour', $3, replace($2, '#', i::text), CASE WHEN $4 THEN now() END
  FROM generate_series(1, $5) i`, aggType, errText, attempts, quarantined, n)
	pgtest.Must(t, err, "fail events")
}

// Events a receiver keeps refusing, not quarantined yet, are listed from the
// overview's card with their attempts, next attempt and last error.
func TestBrowserRetryingView(t *testing.T) {
	t.Parallel()
	e := consoletest.New(t, nil)
	failEvents(t, e, "order", 3, 4, false, "webhook: POST https://hooks.example/in?req=#: 500 Internal Server Error: \"upstream #\"")
	ctx := browser(t, basicAuth("victor", e.VictorKey))
	run(t, ctx, "overview", navigate(e.Server.URL+"/?schema="+e.Schema, "#backing-off")...)
	if n := text(t, ctx, "#backing-off"); n != "3" {
		t.Fatalf("backing off %q, want 3", n)
	}
	run(t, ctx, "open the retrying view", chromedp.Click(chromedp.CSS("#backing-off a")), chromedp.WaitVisible(chromedp.CSS("#retrying")))
	if rows := eval[int](t, ctx, `document.querySelectorAll("#retrying tbody tr").length`); rows != 3 {
		t.Fatalf("%d rows, want 3", rows)
	}
	if a, errText, next := text(t, ctx, "#retrying td.attempts"), text(t, ctx, "#retrying td.err"), text(t, ctx, "#retrying td.next"); a != "4" ||
		!strings.Contains(errText, "500 Internal Server Error") || !strings.HasPrefix(next, "in ") || !strings.Contains(next, " · 20") {
		t.Fatalf("first row: attempts %q, error %q, next attempt %q", a, errText, next)
	}
	screenshot(t, ctx, "retrying")
}

// The overview tells events stuck behind a dead letter from events waiting
// for a relay, and the lane says what each waits behind.
func TestBrowserBlockedIsNotLagging(t *testing.T) {
	t.Parallel()
	e := consoletest.New(t, nil)
	lane := e.Enqueue("order", "o-7", 4, map[string]int{"n": 1})
	e.Quarantine(lane[0], "nats: maximum payload exceeded")
	e.Enqueue("user", "u-1", 2, map[string]int{"n": 1})
	ctx := browser(t, basicAuth("victor", e.VictorKey))
	run(t, ctx, "overview", navigate(e.Server.URL+"/?schema="+e.Schema, "#blocked")...)
	if w, b := text(t, ctx, "#waiting-relay"), text(t, ctx, "#blocked-count"); w != "2" || b != "3" {
		t.Fatalf("waiting for a relay %q, blocked %q; want 2 and 3", w, b)
	}
	if cls := eval[string](t, ctx, `document.querySelector("#blocked").className`); !strings.Contains(cls, "bad") {
		t.Errorf("the blocked card is not marked: %q", cls)
	}
	run(t, ctx, "the blocked lanes", chromedp.Click(chromedp.CSS("#blocked-count a")), chromedp.WaitVisible(chromedp.CSS("#lanes")))
	if b := text(t, ctx, "#lanes td.behind"); b != "waiting behind #1" {
		t.Errorf("lane row: %q", b)
	}
	run(t, ctx, "the head", chromedp.Click(chromedp.CSS("#lanes a")), chromedp.WaitVisible(chromedp.CSS("#lane")))
	if n := eval[int](t, ctx, `[...document.querySelectorAll("#lane td.behind")].filter(td => td.textContent === "waiting behind #1").length`); n != 3 {
		t.Errorf("%d lane rows say they wait behind #1, want 3", n)
	}
}

// 1,000 dead letters of one cause (their texts differ in ids and numbers)
// are one group, retried in one action with one audit row; the other cause
// stays.
func TestBrowserRetryAGroupOf1000(t *testing.T) {
	t.Parallel()
	e := consoletest.New(t, nil)
	failEvents(t, e, "order", 1000, 10, true, "webhook: event #: POST https://hooks.example/orders/#: 503 Service Unavailable: \"request # throttled\"")
	failEvents(t, e, "invoice", 2, 10, true, "nats: maximum payload exceeded (# bytes)")
	ctx := browser(t, basicAuth("alice", e.AliceKey))
	run(t, ctx, "errors", navigate(e.Server.URL+"/errors?schema="+e.Schema, "#groups")...)
	if rows := eval[int](t, ctx, `document.querySelectorAll("#groups tbody tr").length`); rows != 2 {
		t.Fatalf("%d groups, want 2", rows)
	}
	if d, answer := text(t, ctx, "#groups td.dead"), text(t, ctx, "#groups a.answer"); d != "1000" || !strings.HasPrefix(answer, "503 Service Unavailable") {
		t.Fatalf("first group: %q dead letters, answer %q", d, answer)
	}
	screenshot(t, ctx, "errors")
	_, page := e.Get("/errors?schema=" + e.Schema)
	_, list := e.Get("/dlq?schema=" + e.Schema)
	t.Logf("page sizes with 1,002 dead letters: errors by cause %d bytes, dead letters (first 100) %d bytes", len(page), len(list))
	run(t, ctx, "retry the group", chromedp.SendKeys(chromedp.CSS("#groups .group-reason"), "receiver scaled up, INC-4711"),
		chromedp.Click(chromedp.CSS("#groups .group-retry")))
	waitJS(t, ctx, "the notice", `document.querySelector(".notice") !== null`, 30*time.Second)
	if n := text(t, ctx, ".notice"); !strings.Contains(n, "Retried 1000 event(s) in one action") {
		t.Fatalf("notice %q", n)
	}
	if rows := eval[int](t, ctx, `document.querySelectorAll("#groups tbody tr").length`); rows != 1 {
		t.Errorf("%d groups after the retry, want the other cause alone", rows)
	}
	entries, err := e.Admin.Audit(context.Background(), 5)
	pgtest.Must(t, err, "audit")
	if len(entries) != 1 || entries[0].Action != admin.ActionRetry || entries[0].EventCount != 1000 || len(entries[0].EventIDs) != 1000 ||
		entries[0].Actor != "console:alice" || entries[0].Reason != "receiver scaled up, INC-4711" || entries[0].Selection["error_group"] == nil {
		t.Fatalf("audit: %d rows, first %+v", len(entries), entries[0].Selection)
	}
	run(t, ctx, "audit page", navigate(e.Server.URL+"/audit?schema="+e.Schema, "#audit")...)
	if r := text(t, ctx, "#audit td.reason"); r != "receiver scaled up, INC-4711" {
		t.Errorf("audit page reason %q", r)
	}
}
