package adminhttp_test

import (
	"context"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/pgoutbox/pgoutbox"
	"github.com/pgoutbox/pgoutbox/admin"
	"github.com/pgoutbox/pgoutbox/internal/pgtest"
)

// destConsole is a console on an outbox with two destinations: analytics
// (every event) whose lane o1 stopped at its first event, and partners (an
// event type whose name is markup) that has o1 through its second.
type destConsole struct {
	*env
	ids []pgoutbox.UUID
}

func newDestConsole(t *testing.T) *destConsole {
	t.Helper()
	e := newEnv(t, nil)
	ids := e.enqueue("order", "o1", 3, map[string]int{"n": 1})
	exec := func(sql string, args ...any) {
		t.Helper()
		_, err := e.pool.Exec(context.Background(), sql, args...)
		pgtest.Must(t, err, "exec %s", sql)
	}
	exec(`INSERT INTO ` + e.table("outbox_destinations") + ` (name, rules, start) VALUES
  ('analytics', '[{"all": true}]', 'backfill'),
  ('partners', '[{"event_types": ["<b>x</b>", "order.changed"], "headers": {"region": "eu"}}, {"aggregate_types": ["order"]}]', 'now')`)
	lanes := `INSERT INTO ` + e.table("outbox_destination_lanes") + ` (destination, aggregate_type, aggregate_id, delivered_sequence,
       attempt_count, last_error, quarantined_at, quarantined_sequence) VALUES `
	exec(lanes + `('analytics', 'order', 'o1', 0, 10, 'nats: no responders <i>', now(), 1), ('partners', 'order', 'o1', 2, 0, NULL, NULL, NULL)`)
	return &destConsole{env: e, ids: ids}
}

// An outbox without destinations shows none, and its pages ask nothing more.
func TestConsoleWithoutDestinations(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	ids := e.enqueue("order", "o1", 1, map[string]int{"n": 1})
	if r := e.get("/?schema=" + e.schema); r.status != http.StatusOK || strings.Contains(r.body, "overview-destinations") {
		t.Errorf("overview without destinations: %d, destinations shown", r.status)
	}
	if r := e.get("/event?schema=" + e.schema + "&id=" + ids[0].String()); r.status != http.StatusOK || strings.Contains(r.body, `id="destinations"`) {
		t.Errorf("event page without destinations: %d, destinations shown", r.status)
	}
	if r := e.get("/destinations?schema=" + e.schema); r.status != http.StatusOK || !strings.Contains(r.body, "no destinations") {
		t.Errorf("destinations page without destinations: %d\n%s", r.status, r.body)
	}
	var v struct {
		Destinations []any `json:"destinations"`
	}
	if st := e.apiGet("/api/v1/destinations?schema="+e.schema, "victor", e.victorKey, &v); st != http.StatusOK || v.Destinations == nil || len(v.Destinations) != 0 {
		t.Errorf("API destinations: %d %+v", st, v)
	}
}

func TestConsoleDestinations(t *testing.T) {
	t.Parallel()
	e := newDestConsole(t)
	q := "?schema=" + url.QueryEscape(e.schema)

	r := e.get("/" + q)
	if !strings.Contains(r.body, `id="overview-destinations"`) || !strings.Contains(r.body, "destination=analytics") {
		t.Errorf("overview: no destinations section:\n%s", r.body)
	}
	r = e.get("/destinations" + q)
	for _, want := range []string{`data-destination="analytics"`, "every event", `data-destination="partners"`,
		`event type &#34;&lt;b&gt;x&lt;/b&gt;&#34; or &#34;order.changed&#34; and header &#34;region&#34; = &#34;eu&#34;; aggregate type &#34;order&#34;`,
		"/dlq?destination=analytics&amp;schema=", " ago · "} {
		if !strings.Contains(r.body, want) {
			t.Errorf("destinations page lacks %s:\n%s", want, r.body)
		}
	}
	if strings.Contains(r.body, "<b>x") {
		t.Errorf("destinations page shows rules unescaped")
	}

	// The destination's dead letters, with a retry form carrying it.
	r = e.get("/dlq" + q + "&destination=analytics")
	if r.status != http.StatusOK || !strings.Contains(r.body, `data-event="`+e.ids[0].String()+`"`) ||
		!strings.Contains(r.body, `name="destination" value="analytics"`) || strings.Contains(r.body, `id="all-matching"`) ||
		!strings.Contains(r.body, "nats: no responders &lt;i&gt;") {
		t.Fatalf("analytics dead letters: %d\n%s", r.status, r.body)
	}
	if r := e.get("/dlq" + q + "&destination=partners"); r.status != http.StatusOK || !strings.Contains(r.body, "No dead letter matches") {
		t.Errorf("partners dead letters: %d\n%s", r.status, r.body)
	}

	// The event page: its state at each destination.
	r = e.get("/event" + q + "&id=" + e.ids[1].String())
	for _, want := range []string{`data-destination="analytics"`, `state blocked`, "waiting behind #1", `data-destination="partners"`, "state delivered"} {
		if !strings.Contains(r.body, want) {
			t.Errorf("event page lacks %s:\n%s", want, r.body)
		}
	}
	var ev struct {
		Destinations []admin.EventDestination `json:"destinations"`
	}
	e.apiGet("/api/v1/event"+q+"&id="+e.ids[0].String(), "victor", e.victorKey, &ev)
	if len(ev.Destinations) != 2 || ev.Destinations[0].State != admin.DestQuarantined || ev.Destinations[1].State != admin.DestDelivered {
		t.Errorf("API event destinations: %+v", ev.Destinations)
	}
	var ds struct {
		Destinations []admin.Destination `json:"destinations"`
	}
	e.apiGet("/api/v1/destinations"+q, "victor", e.victorKey, &ds)
	if len(ds.Destinations) != 2 || ds.Destinations[0].DeadLetters != 1 || ds.Destinations[0].OldestPendingAt == nil {
		t.Errorf("API destinations: %+v", ds.Destinations)
	}
	var dl struct {
		Events   []admin.Event `json:"events"`
		Matching int           `json:"matching"`
	}
	e.apiGet("/api/v1/dlq"+q+"&destination=analytics", "victor", e.victorKey, &dl)
	if len(dl.Events) != 1 || dl.Events[0].ID != e.ids[0] || dl.Events[0].Destination != "analytics" || dl.Matching != 1 {
		t.Errorf("API analytics dead letters: %+v", dl)
	}
	// Paged as the outbox's: a full page gives the next one's position.
	var page struct {
		Events []admin.Event `json:"events"`
		Next   *struct {
			AfterAt string `json:"after_at"`
			After   string `json:"after"`
		} `json:"next"`
	}
	e.apiGet("/api/v1/dlq"+q+"&destination=analytics&limit=1", "victor", e.victorKey, &page)
	if len(page.Events) != 1 || page.Next == nil || page.Next.After != e.ids[0].String() {
		t.Fatalf("API analytics page of 1: %+v", page)
	}
	e.apiGet("/api/v1/dlq"+q+"&destination=analytics&limit=1&after_at="+url.QueryEscape(page.Next.AfterAt)+"&after="+page.Next.After,
		"victor", e.victorKey, &page)
	if len(page.Events) != 0 || page.Next != nil {
		t.Errorf("API analytics page after the last: %+v", page)
	}

	// A viewer cannot retry; an operator without a reason cannot either.
	retry := url.Values{"csrf": {e.csrfOf("victor", e.victorKey)}, "schema": {e.schema}, "destination": {"analytics"},
		"id": {e.ids[0].String()}, "reason": {"nats back"}}
	if r := e.do("POST", "/dlq/retry", "victor", e.victorKey, retry, nil); r.status != http.StatusForbidden {
		t.Errorf("viewer retry: %d", r.status)
	}
	retry.Set("csrf", e.csrfOf("alice", e.aliceKey))
	retry.Set("once", e.onceOf("/dlq"+q+"&destination=analytics"))
	retry.Set("reason", " ")
	if r := e.do("POST", "/dlq/retry", "alice", e.aliceKey, retry, nil); r.status != http.StatusBadRequest {
		t.Errorf("retry without a reason: %d", r.status)
	}
	// The retry, sent twice, runs once, at that destination only.
	retry.Set("reason", "nats back")
	first := location(e.env, e.do("POST", "/dlq/retry", "alice", e.aliceKey, retry, nil))
	if again := location(e.env, e.do("POST", "/dlq/retry", "alice", e.aliceKey, retry, nil)); again != first {
		t.Errorf("sent again: %s, not %s", again, first)
	}
	if r := e.get(first); !strings.Contains(r.body, "Destination analytics: Retried 1 event(s)") {
		t.Errorf("result page:\n%s", r.body)
	}
	entries, err := e.admin.Audit(context.Background(), 10)
	pgtest.Must(t, err, "audit")
	if len(entries) != 1 || entries[0].Action != admin.ActionRetry || entries[0].Selection["destination"] != "analytics" ||
		entries[0].Actor != "console:alice" || entries[0].EventCount != 1 {
		t.Errorf("audit: %+v", entries)
	}
	if left, err := e.admin.ListDestinationQuarantined(context.Background(), "analytics", admin.Filter{}); err != nil || len(left) != 0 {
		t.Errorf("analytics dead letters after the retry: %+v, %v", left, err)
	}
	if e.state(e.ids[0]) != "pending" {
		t.Errorf("the event's outbox state after the retry: %s", e.state(e.ids[0]))
	}
}

// A skip at one destination through the API: the same one-shot and audit.
func TestConsoleDestinationSkipAPI(t *testing.T) {
	t.Parallel()
	e := newDestConsole(t)
	var sess map[string]string
	e.apiGet("/api/v1/session", "alice", e.aliceKey, &sess)
	form := url.Values{"csrf": {sess["csrf"]}, "once": {sess["once"]}, "schema": {e.schema}, "destination": {"analytics"},
		"id": {e.ids[0].String()}, "reason": {"poison for analytics"}}
	r := e.do("POST", "/api/v1/dlq/skip", "alice", e.aliceKey, form, nil)
	if r.status != http.StatusOK || !strings.Contains(r.body, `"count": 1`) {
		t.Fatalf("skip: %d %s", r.status, r.body)
	}
	// Not a dead letter of partners: refused, nothing done.
	e.apiGet("/api/v1/session", "alice", e.aliceKey, &sess)
	form.Set("once", sess["once"])
	form.Set("destination", "partners")
	if r := e.do("POST", "/api/v1/dlq/skip", "alice", e.aliceKey, form, nil); r.status != http.StatusConflict {
		t.Errorf("skip of a non dead letter: %d %s", r.status, r.body)
	}
	if n := e.auditCount(admin.ActionSkip); n != 1 {
		t.Errorf("%d skips audited, want 1", n)
	}
}

// Hostile destination parameters are refused before any SQL, on every path
// that takes one; an unknown name is 404.
func TestConsoleDestinationParameterHostile(t *testing.T) {
	t.Parallel()
	e := newDestConsole(t)
	q := "?schema=" + url.QueryEscape(e.schema)
	hostile := []string{"analytics' OR '1'='1", "../analytics", "Analytics", "<script>alert(1)</script>", "a\x00b", "a\x1b[31mb",
		strings.Repeat("a", 64), strings.Repeat("a", 5000), "analytics;DROP TABLE x", "\u202eanalytics"}
	for _, d := range hostile {
		for _, path := range []string{"/dlq", "/api/v1/dlq"} {
			r := e.get(path + q + "&destination=" + url.QueryEscape(d))
			if r.status != http.StatusBadRequest {
				t.Errorf("GET %s destination %q: %d", path, d, r.status)
			}
			if strings.Contains(r.body, "<script>") || strings.Contains(r.body, "\x1b") || strings.Contains(r.body, "\u202e") {
				t.Errorf("GET %s destination %q echoes it raw", path, d)
			}
		}
		var sess map[string]string
		e.apiGet("/api/v1/session", "alice", e.aliceKey, &sess)
		form := url.Values{"csrf": {sess["csrf"]}, "once": {sess["once"]}, "schema": {e.schema}, "destination": {d},
			"id": {e.ids[0].String()}, "reason": {"x"}}
		if r := e.do("POST", "/api/v1/dlq/retry", "alice", e.aliceKey, form, nil); r.status != http.StatusBadRequest {
			t.Errorf("POST retry destination %q: %d %s", d, r.status, r.body)
		}
	}
	if r := e.get("/dlq" + q + "&destination=nosuch"); r.status != http.StatusNotFound {
		t.Errorf("unknown destination: %d", r.status)
	}
	if n := e.auditCount(admin.ActionRetry); n != 0 {
		t.Errorf("%d retries audited after hostile requests", n)
	}
}
