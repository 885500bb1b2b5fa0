package browsertest_test

import (
	"context"
	"strings"
	"testing"

	"github.com/pgoutbox/pgoutbox/admin/adminhttp/internal/consoletest"
	"github.com/pgoutbox/pgoutbox/internal/pgtest"
)

// The event page of a dead letter lists its failed attempts, newest first,
// with their time relative and absolute, relay, destination and error; a
// receiver's hostile answer reads as text.
func TestBrowserAttemptHistory(t *testing.T) {
	t.Parallel()
	e := consoletest.New(t, nil)
	id := e.Enqueue("order", "o-9", 1, map[string]int{"n": 1})[0]
	e.Quarantine(id, `webhook: 500 Internal Server Error: <img src=x onerror="window.__xss=1">`)
	_, err := e.Pool.Exec(context.Background(), "INSERT INTO "+e.Table("outbox_attempts")+` (event_id, attempt, at, relay_id, destination, error) VALUES
	($1, 1, now() - interval '30 minutes', 'relay-a', NULL, 'webhook: 503 Service Unavailable'),
	($1, 2, now() - interval '20 minutes', 'relay-b', NULL, 'webhook: POST https://hooks.example/in: context deadline exceeded'),
	($1, 3, now() - interval '10 minutes', 'relay-a', NULL, $2)`, id, `webhook: 500 Internal Server Error: <img src=x onerror="window.__xss=1">`)
	pgtest.Must(t, err, "attempts")

	ctx := browser(t, basicAuth("victor", e.VictorKey))
	run(t, ctx, "event page", navigate(e.Server.URL+"/event?schema="+e.Schema+"&id="+id.String(), "#attempts")...)
	if n := eval[int](t, ctx, `document.querySelectorAll("#attempts tbody tr").length`); n != 3 {
		t.Fatalf("%d attempt rows, want 3", n)
	}
	cells := eval[[]string](t, ctx, `Array.from(document.querySelectorAll("#attempts tbody tr:first-child td")).map(td => td.textContent)`)
	if len(cells) != 5 || cells[0] != "3" || !strings.HasPrefix(cells[1], "10m") || !strings.Contains(cells[1], " ago · 20") ||
		cells[2] != "relay-a" || cells[3] != "—" || cells[4] != `webhook: 500 Internal Server Error: <img src=x onerror="window.__xss=1">` {
		t.Fatalf("newest attempt's cells %q", cells)
	}
	if last := eval[string](t, ctx, `document.querySelector("#attempts tbody tr:last-child td").textContent`); last != "1" {
		t.Fatalf("oldest row is attempt %q, want 1", last)
	}
	if eval[bool](t, ctx, `window.__xss !== undefined || document.querySelector("#attempts img") !== null`) {
		t.Fatal("the receiver's answer became markup")
	}
	screenshot(t, ctx, "event-attempts")
}
