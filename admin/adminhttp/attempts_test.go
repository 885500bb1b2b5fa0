package adminhttp_test

import (
	"context"
	"regexp"
	"strings"
	"testing"

	"github.com/pgoutbox/pgoutbox"
	"github.com/pgoutbox/pgoutbox/internal/pgtest"
)

// when is an attempt's time on the event page: relative, then absolute.
var when = regexp.MustCompile(`<td class="when">\d+m\d+s ago · <span class="muted">20\d\d-\d\d-\d\d \d\d:\d\d:\d\dZ</span>`)

// The event page lists the event's failed attempts newest first, each with
// its time relative and absolute, its relay, its destination (— for the
// single-broker relay) and its error; /api/v1/event has them too.
func TestEventAttempts(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	id := e.enqueue("order", "o-1", 1, map[string]int{"n": 1})[0]
	e.backOff([]pgoutbox.UUID{id}, 3, "webhook: 500 Internal Server Error: third")
	_, err := e.pool.Exec(context.Background(), "INSERT INTO "+e.table("outbox_attempts")+` (event_id, attempt, at, relay_id, destination, error) VALUES
	($1, 1, now() - interval '3 minutes', 'relay-a', NULL, 'webhook: 500 Internal Server Error: first'),
	($1, 2, now() - interval '2 minutes', 'relay-b', 'billing', 'webhook: 503 Service Unavailable: second'),
	($1, 3, now() - interval '1 minute', 'relay-a', NULL, 'webhook: 500 Internal Server Error: third')`, id)
	pgtest.Must(t, err, "attempts")

	body := e.get("/event?schema=" + e.schema + "&id=" + id.String()).body
	i3, i2, i1 := strings.Index(body, "third</td>"), strings.Index(body, "second</td>"), strings.Index(body, "first</td>")
	if !strings.Contains(body, `id="attempts"`) || i3 < 0 || i2 < i3 || i1 < i2 {
		t.Fatalf("attempts missing or not newest first (%d, %d, %d):\n%s", i3, i2, i1, body)
	}
	if !when.MatchString(body) {
		t.Errorf("no attempt's time shown both relative and absolute:\n%s", body)
	}
	for _, want := range []string{`<td class="relay">relay-b</td><td>billing</td>`,
		`<td class="relay">relay-a</td><td><span class="muted">—</span></td>`} {
		if !strings.Contains(body, want) {
			t.Errorf("event page lacks %q:\n%s", want, body)
		}
	}

	var got struct {
		Event struct {
			Attempts []struct {
				Attempt     int     `json:"attempt"`
				At          string  `json:"at"`
				Age         float64 `json:"age_seconds"`
				RelayID     string  `json:"relay_id"`
				Destination string  `json:"destination"`
				Error       string  `json:"error"`
			} `json:"attempts"`
		} `json:"event"`
	}
	if st := e.apiGet("/api/v1/event?schema="+e.schema+"&id="+id.String(), "victor", e.victorKey, &got); st != 200 {
		t.Fatalf("api status %d", st)
	}
	a := got.Event.Attempts
	if len(a) != 3 || a[0].Attempt != 3 || a[0].Age < 59 || a[1].Destination != "billing" || a[2].RelayID != "relay-a" ||
		!strings.HasSuffix(a[2].Error, "first") || a[0].At == "" {
		t.Fatalf("api attempts %+v", a)
	}

	// An event that never failed shows no attempts section.
	ok := e.enqueue("order", "o-2", 1, map[string]int{"n": 1})[0]
	if body := e.get("/event?schema=" + e.schema + "&id=" + ok.String()).body; strings.Contains(body, `id="attempts"`) {
		t.Errorf("attempts shown for an event that never failed")
	}
}
