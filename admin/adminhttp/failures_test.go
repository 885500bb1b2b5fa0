package adminhttp_test

import (
	"context"
	"net/http"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/pgoutbox/pgoutbox"
	"github.com/pgoutbox/pgoutbox/admin"
	"github.com/pgoutbox/pgoutbox/admin/adminhttp"
	"github.com/pgoutbox/pgoutbox/internal/pgtest"
)

// backOff makes ids events that failed attempts times and wait an hour.
func (e *env) backOff(ids []pgoutbox.UUID, attempts int, lastErr string) {
	e.t.Helper()
	_, err := e.pool.Exec(context.Background(), "UPDATE "+e.table("outbox_events")+
		" SET attempt_count = $2, last_error = $3, available_at = now() + interval '1 hour' WHERE event_id = ANY($1)", ids, attempts, lastErr)
	pgtest.Must(e.t, err, "back off")
}

// post sends form as alice with her anti-forgery token and the submit-once
// token of the page at from.
func (e *env) post(path, from string, form url.Values) resp {
	e.t.Helper()
	form.Set("csrf", e.csrfOf("alice", e.aliceKey))
	form.Set("schema", e.schema)
	form.Set("once", e.onceOf(from))
	return e.do("POST", path, "alice", e.aliceKey, form, nil)
}

var (
	groupIDs = regexp.MustCompile(`data-group="([0-9a-f]{16})"`)
	nextLink = regexp.MustCompile(`<a href="([^"]+)" id="next-page"`)
)

func TestRetryingPagesAndBlockedCards(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	var failing []pgoutbox.UUID
	for i := range 5 {
		failing = append(failing, e.enqueue("order", "r"+strconv.Itoa(i), 1, map[string]int{"n": i})...)
	}
	e.backOff(failing, 3, "webhook: POST https://hooks.example/x: 500 Internal Server Error")
	lane := e.enqueue("invoice", "i1", 3, map[string]int{"n": 1})
	e.quarantine(lane[0], "boom")

	ov := e.get("/?schema=" + e.schema).body
	for _, want := range []string{`id="waiting-relay">5<`, `id="blocked-count"><a href="/lanes?schema=` + e.schema + `">2</a>`,
		`<a href="/retrying?schema=` + e.schema + `">5</a>`} {
		if !strings.Contains(ov, want) {
			t.Errorf("overview lacks %q", want)
		}
	}
	if ev := e.get("/event?schema=" + e.schema + "&id=" + lane[0].String()).body; strings.Count(ev, "waiting behind #1") != 2 {
		t.Errorf("the lane's two later events do not say they wait behind #1")
	}
	// Two pages of 3 and 2, in a stable order, every event once.
	seen := map[string]bool{}
	next := "/retrying?schema=" + e.schema + "&limit=3"
	for page := 0; next != "" && page < 3; page++ {
		body := e.get(next).body
		for _, m := range regexp.MustCompile(`<tr data-event="([^"]+)"`).FindAllStringSubmatch(body, -1) {
			if seen[m[1]] {
				t.Errorf("%s on two pages", m[1])
			}
			seen[m[1]] = true
		}
		if !strings.Contains(body, "500 Internal Server Error") || !strings.Contains(body, `class="n attempts">3<`) {
			t.Errorf("retrying page lacks the error or the attempts:\n%s", body)
		}
		next = ""
		if m := nextLink.FindStringSubmatch(body); m != nil {
			next = m[1]
		}
		next = strings.ReplaceAll(next, "&amp;", "&")
	}
	if len(seen) != 5 {
		t.Fatalf("paged through %d retrying events, want 5", len(seen))
	}
	for _, bad := range []string{"&after=x&after_at=2026-01-01T00:00:00Z", "&after_at=yesterday&after=" + failing[0].String(), "&after=" + failing[0].String(), "&limit=1001"} {
		if r := e.get("/retrying?schema=" + e.schema + bad); r.status != http.StatusBadRequest {
			t.Errorf("%s: %d, want 400", bad, r.status)
		}
	}
}

// A group is retried by its opaque id, if its count is still the one
// previewed; a stale preview does nothing (409) and may be confirmed again.
func TestGroupRetryNeedsTheSameCount(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	var ids []pgoutbox.UUID
	for i := range 4 {
		id := e.enqueue("order", "o"+strconv.Itoa(i), 1, map[string]int{"n": i})[0]
		e.quarantine(id, "webhook: event "+id.String()+": 503 Service Unavailable: try again in "+strconv.Itoa(i)+"s")
		ids = append(ids, id)
	}
	page := e.get("/errors?schema=" + e.schema).body
	m := groupIDs.FindStringSubmatch(page)
	if m == nil || !strings.Contains(page, `class="n dead">4<`) {
		t.Fatalf("errors page:\n%s", page)
	}
	form := url.Values{"group": {m[1]}, "expect": {"3"}, "reason": {"receiver back"}}
	if r := e.post("/dlq/retry-matching", "/errors?schema="+e.schema, form); r.status != http.StatusConflict || !strings.Contains(r.body, "4 events match now") {
		t.Fatalf("stale preview: %d\n%s", r.status, r.body)
	}
	if s := e.state(ids[0]); s != admin.StateQuarantined {
		t.Fatalf("a stale preview retried: %s", s)
	}
	for _, bad := range []url.Values{{"group": {"' OR 1=1 --"}, "expect": {"4"}, "reason": {"x"}},
		{"group": {m[1]}, "expect": {"0"}, "reason": {"x"}}, {"group": {m[1]}, "expect": {"4"}}} {
		if r := e.post("/dlq/retry-matching", "/errors?schema="+e.schema, bad); r.status != http.StatusBadRequest {
			t.Errorf("%v: %d, want 400", bad, r.status)
		}
	}
	form.Set("expect", "4")
	r := e.post("/dlq/retry-matching", "/errors?schema="+e.schema, form)
	if r.status != http.StatusSeeOther || !strings.Contains(r.header.Get("Location"), "/errors?") {
		t.Fatalf("group retry: %d %q", r.status, r.header.Get("Location"))
	}
	for _, id := range ids {
		if s := e.state(id); s != admin.StatePending {
			t.Errorf("%s is %s", id, s)
		}
	}
	entries, err := e.admin.Audit(context.Background(), 5)
	pgtest.Must(t, err, "audit")
	if len(entries) != 1 || entries[0].EventCount != 4 || entries[0].Actor != "console:alice" || entries[0].Selection["error_group"] != m[1] {
		t.Fatalf("audit: %+v", entries)
	}
}

// Everything a filter matches is skipped in one action, and the result page
// keeps the filter.
func TestSkipAllMatchingKeepsTheFilter(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	var big []pgoutbox.UUID
	for i := range 3 {
		id := e.enqueue("order", "o"+strconv.Itoa(i), 1, map[string]int{"n": i})[0]
		e.quarantine(id, "nats: maximum payload exceeded")
		big = append(big, id)
	}
	other := e.enqueue("order", "x", 1, map[string]int{"n": 1})[0]
	e.quarantine(other, "nats: no responders")
	list := e.get("/dlq?schema=" + e.schema + "&error=payload&limit=2").body
	if !strings.Contains(list, `id="matching">3<`) || !strings.Contains(list, `id="next-page"`) {
		t.Fatalf("the filtered list does not count 3 or offer a next page:\n%s", list)
	}
	r := e.post("/dlq/skip-matching", "/dlq?schema="+e.schema+"&error=payload", url.Values{"error": {"payload"}, "expect": {"3"}, "reason": {"too big; re-sent by billing"}})
	loc, _ := url.Parse(r.header.Get("Location"))
	if r.status != http.StatusSeeOther || loc == nil || loc.Path != "/dlq" || loc.Query().Get("error") != "payload" {
		t.Fatalf("skip all matching: %d %q", r.status, r.header.Get("Location"))
	}
	for _, id := range big {
		if s := e.state(id); s != admin.StateSkipped {
			t.Errorf("%s is %s", id, s)
		}
	}
	if s := e.state(other); s != admin.StateQuarantined {
		t.Errorf("the other dead letter is %s", s)
	}
	if n := e.get(loc.String()).body; !strings.Contains(n, "Skipped 3 event(s) in one action") || !strings.Contains(n, `name="error" value="payload"`) {
		t.Errorf("the result page lacks the notice or the filter:\n%s", n)
	}
}

// An event id is found in whichever tenant holds it; an unknown one is 404.
func TestFindEventInAnyTenant(t *testing.T) {
	t.Parallel()
	_, pool := pgtest.Outboxes(t, 4, "shop_a", "shop_b", "shop_c")
	e := consoleOn(t, pool, "shop_a", func(c *adminhttp.Config) { c.Schemas = selector(t, "shop_*") })
	p, err := pgoutbox.NewProducer(&pgoutbox.Config{Schema: "shop_c"})
	pgtest.Must(t, err, "producer")
	res, err := p.EnqueueTx(context.Background(), pool, pgoutbox.Event{AggregateType: "order", AggregateID: "o", EventType: "changed", Payload: 1})
	pgtest.Must(t, err, "enqueue")
	if ov := e.get("/").body; !strings.Contains(ov, `action="/find"`) {
		t.Errorf("the overview has no find form")
	}
	r := e.get("/find?id=" + res[0].EventID.String())
	if want := "/event?id=" + res[0].EventID.String() + "&schema=shop_c"; r.status != http.StatusSeeOther || r.header.Get("Location") != want {
		t.Fatalf("find: %d %q, want %q", r.status, r.header.Get("Location"), want)
	}
	if r := e.get("/find?id=" + pgoutbox.UUID{}.String()); r.status != http.StatusNotFound {
		t.Errorf("unknown id: %d", r.status)
	}
	if r := e.get("/find?id=nope"); r.status != http.StatusBadRequest {
		t.Errorf("bad id: %d", r.status)
	}
}
