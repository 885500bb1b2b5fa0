package adminhttp_test

import (
	"context"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"sync"
	"testing"

	"github.com/pgoutbox/pgoutbox"
	"github.com/pgoutbox/pgoutbox/admin"
	"github.com/pgoutbox/pgoutbox/admin/adminhttp"
	"github.com/pgoutbox/pgoutbox/broker/null"
	"github.com/pgoutbox/pgoutbox/internal/pgtest"
)

// actionsEnv is an env with a broker to replay to and a second operator, olga.
func actionsEnv(t *testing.T) (*env, *null.Publisher, string) {
	t.Helper()
	pub := &null.Publisher{}
	olgaKey := secret()
	e := newEnv(t, func(c *adminhttp.Config) {
		c.Publisher, c.Destination = pub, "null://"
		c.Users = append(c.Users, adminhttp.User{Name: "olga", Role: adminhttp.RoleOperator, Secret: olgaKey})
	})
	return e, pub, olgaKey
}

// headForm is an actionsEnv holding one aggregate of two events whose head is
// quarantined, with alice's anti-forgery token and a submit-once token of the
// head's page.
type headForm struct {
	*env
	pub        *null.Publisher
	olgaKey    string
	ids        []pgoutbox.UUID
	csrf, once string
}

func newHeadForm(t *testing.T) *headForm {
	t.Helper()
	e, pub, olgaKey := actionsEnv(t)
	ids := e.enqueue("order", "o1", 2, map[string]int{"n": 1})
	e.quarantine(ids[0], "boom")
	return &headForm{env: e, pub: pub, olgaKey: olgaKey, ids: ids, csrf: e.csrfOf("alice", e.aliceKey),
		once: e.onceOf("/event?schema=" + e.schema + "&id=" + ids[0].String())}
}

func (e *env) auditCount(action string) int {
	e.t.Helper()
	entries, err := e.admin.Audit(context.Background(), 100)
	pgtest.Must(e.t, err, "audit")
	n := 0
	for _, a := range entries {
		if a.Action == action {
			n++
		}
	}
	return n
}

func location(e *env, r resp) string {
	e.t.Helper()
	if r.status != http.StatusSeeOther {
		e.t.Fatalf("want a redirect, got %d: %s", r.status, r.body)
	}
	return strings.TrimPrefix(r.header.Get("Location"), e.srv.URL)
}

// A skip, a retry and a replay each run once however often their form is
// sent; the answer to every sending and every reload of the result page shows
// the one run's recorded outcome.
func TestActionsHappenOnce(t *testing.T) {
	t.Parallel()
	h := newHeadForm(t)
	e, pub, ids, tok := h.env, h.pub, h.ids, h.csrf
	skip := url.Values{"csrf": {tok}, "schema": {e.schema}, "id": {ids[0].String()}, "reason": {"poison"}, "once": {h.once}}
	first := location(e, e.do("POST", "/dlq/skip", "alice", e.aliceKey, skip, nil))
	for i := range 3 {
		if again := location(e, e.do("POST", "/dlq/skip", "alice", e.aliceKey, skip, nil)); again != first {
			t.Errorf("sending %d again went to %s, not the first run's result %s", i+2, again, first)
		}
		if r := e.get(first); !strings.Contains(r.body, "Skipped 1 event(s)") {
			t.Errorf("reload %d of the result page: no notice:\n%s", i+1, r.body)
		}
	}
	if n := e.auditCount(admin.ActionSkip); n != 1 {
		t.Errorf("%d skips audited, want 1", n)
	}

	// Concurrent sendings of one retry form: one runs.
	e.quarantine(ids[1], "boom")
	retry := url.Values{"csrf": {tok}, "schema": {e.schema}, "id": {ids[1].String()}, "reason": {"fixed"},
		"once": {e.onceOf("/event?schema=" + e.schema + "&id=" + ids[1].String())}}
	var wg sync.WaitGroup
	statuses := make([]int, 8)
	for i := range statuses {
		wg.Go(func() { statuses[i] = e.do("POST", "/dlq/retry", "alice", e.aliceKey, retry, nil).status })
	}
	wg.Wait()
	for _, s := range statuses {
		if s != http.StatusSeeOther && s != http.StatusConflict {
			t.Errorf("a concurrent sending: %d", s)
		}
	}
	if n := e.auditCount(admin.ActionRetry); n != 1 {
		t.Errorf("%d retries audited for 8 concurrent sendings of one form, want 1", n)
	}

	// A replay: sending its form twice and reloading its result publishes once.
	e.enqueue("user", "u1", 2, map[string]int{"n": 1})
	_, err := e.pool.Exec(context.Background(), "UPDATE "+e.table("outbox_events")+" SET published_at = now() WHERE aggregate_type = 'user'")
	pgtest.Must(t, err, "publish")
	replay := url.Values{"csrf": {tok}, "schema": {e.schema}, "aggregate_type": {"user"}, "reason": {"rebuild"},
		"once": {e.onceOf("/replay?preview=1&aggregate_type=user&schema=" + e.schema)}}
	res := location(e, e.do("POST", "/replay", "alice", e.aliceKey, replay, nil))
	if again := location(e, e.do("POST", "/replay", "alice", e.aliceKey, replay, nil)); again != res {
		t.Errorf("the replay sent again went to %s, not %s", again, res)
	}
	for range 2 {
		if r := e.get(res); !strings.Contains(r.body, "Published <strong>2</strong>") || !strings.Contains(r.body, "Replayed: 2 of 2") {
			t.Errorf("replay result page:\n%s", r.body)
		}
	}
	if pub.Published() != 2 || e.auditCount(admin.ActionReplay) != 1 {
		t.Errorf("published %d, %d replays audited: want 2 and 1", pub.Published(), e.auditCount(admin.ActionReplay))
	}
}

// A form without a valid submit-once token runs nothing: missing, empty,
// made up, another user's, or left over from a restart.
func TestActionsRefuseBadFormTokens(t *testing.T) {
	t.Parallel()
	h := newHeadForm(t)
	e, pub, olgaKey, id := h.env, h.pub, h.olgaKey, h.ids[0]
	page := "/event?schema=" + e.schema + "&id=" + id.String()
	olgas := e.do("GET", page, "olga", olgaKey, nil, nil)
	_, after, _ := strings.Cut(olgas.body, `name="once" value="`)
	olgaOnce, _, _ := strings.Cut(after, `"`)
	tok := e.csrfOf("alice", e.aliceKey)
	for name, once := range map[string][]string{
		"missing": nil, "empty": {""}, "made up": {"AAAAAAAAAAAAAAAAAAAAAAAAAA"}, "olga's": {olgaOnce},
		"a real token's prefix": {e.onceOf(page)[:10]}, "two": {"x", e.onceOf(page)},
	} {
		for _, path := range []string{"/dlq/skip", "/dlq/retry", "/replay"} {
			form := url.Values{"csrf": {tok}, "schema": {e.schema}, "id": {id.String()}, "reason": {"r"}, "all": {"1"}, "once": once}
			if r := e.do("POST", path, "alice", e.aliceKey, form, nil); r.status != http.StatusConflict {
				t.Errorf("%s token, POST %s: %d, want 409", name, path, r.status)
			}
		}
	}
	if n := pub.Published(); n != 0 {
		t.Fatalf("forms without a valid token published %d", n)
	}
	e.console.Untouched(id, "forms without a valid token")
	// Olga's own token works for her.
	olgaTok := e.csrfOf("olga", olgaKey)
	r := e.do("POST", "/dlq/retry", "olga", olgaKey, url.Values{"csrf": {olgaTok}, "schema": {e.schema}, "id": {id.String()},
		"reason": {"r"}, "once": {olgaOnce}}, nil)
	if r.status != http.StatusSeeOther || e.state(id) != admin.StatePending {
		t.Fatalf("olga's retry: %d %s", r.status, e.state(id))
	}
}

// Every action needs a reason, recorded in the audit; a form refused for
// want of one can be sent again with one.
func TestActionsNeedAReason(t *testing.T) {
	t.Parallel()
	h := newHeadForm(t)
	e, pub, ids, tok, once := h.env, h.pub, h.ids, h.csrf, h.once
	for _, reason := range []string{"", "  ", "\t\n", "\r\n "} {
		for _, path := range []string{"/dlq/retry", "/dlq/skip", "/replay"} {
			form := url.Values{"csrf": {tok}, "schema": {e.schema}, "id": {ids[0].String()}, "all": {"1"}, "once": {once}}
			if reason != "" {
				form.Set("reason", reason)
			}
			if r := e.do("POST", path, "alice", e.aliceKey, form, nil); r.status != http.StatusBadRequest || !strings.Contains(r.body, "reason") {
				t.Errorf("POST %s with reason %q: %d", path, reason, r.status)
			}
		}
	}
	if n := pub.Published(); n != 0 {
		t.Fatalf("actions without a reason published %d", n)
	}
	e.console.Untouched(ids[0], "actions without a reason")
	r := e.do("POST", "/dlq/retry", "alice", e.aliceKey, url.Values{"csrf": {tok}, "schema": {e.schema}, "id": {ids[0].String()},
		"reason": {"broker fixed"}, "once": {once}}, nil)
	if r.status != http.StatusSeeOther {
		t.Fatalf("the same form with a reason: %d %s", r.status, r.body)
	}
	entries, _ := e.admin.Audit(context.Background(), 1)
	if len(entries) != 1 || entries[0].Reason != "broker fixed" || entries[0].Actor != "console:alice" {
		t.Fatalf("audit: %+v", entries)
	}
	// The browser asks for the reasons too.
	for _, p := range []string{"/event?schema=" + e.schema + "&id=" + ids[1].String(), "/dlq?schema=" + e.schema} {
		e.quarantine(ids[1], "boom")
		inputs := regexp.MustCompile(`<input name="reason"[^>]*>`).FindAllString(e.get(p).body, -1)
		if len(inputs) == 0 {
			t.Errorf("%s: no reason field", p)
		}
		for _, in := range inputs {
			if !strings.Contains(in, " required") {
				t.Errorf("%s: %s is not required", p, in)
			}
		}
	}
}

// Notices come only from the record of an action the user ran: a crafted
// link shows none.
func TestNoticesComeFromTheRecord(t *testing.T) {
	t.Parallel()
	h := newHeadForm(t)
	e, olgaKey, ids := h.env, h.olgaKey, h.ids
	done := location(e, e.do("POST", "/dlq/retry", "alice", e.aliceKey, url.Values{"csrf": {h.csrf}, "schema": {e.schema},
		"id": {ids[0].String()}, "reason": {"r"}, "once": {h.once}}, nil))
	u, _ := url.Parse(done)
	result := u.Query().Get("result")
	ev := "/event?schema=" + e.schema + "&id=" + ids[1].String()
	for _, p := range []string{
		"/dlq?schema=" + e.schema + "&done=skip&n=5",
		"/dlq?schema=" + e.schema + "&done=retry&n=1000",
		ev + "&done=skip&n=1",
		ev + "&notice=Skipped+1+event",
		"/dlq?schema=" + e.schema + "&result=" + result + "x",
		"/dlq?schema=" + e.schema + "&result=" + strings.ToLower(result),
		"/replay?schema=" + e.schema + "&result=" + result, // a retry's record is not a replay's
		"/replay?schema=" + e.schema + "&result=AAAAAAAAAAAAAAAAAAAAAAAAAA",
	} {
		if r := e.get(p); strings.Contains(r.body, `class="notice"`) || strings.Contains(r.body, `id="replay-result"`) {
			t.Errorf("%s shows a notice:\n%s", p, r.body)
		}
	}
	if r := e.do("GET", done, "olga", olgaKey, nil, nil); strings.Contains(r.body, `class="notice"`) {
		t.Errorf("alice's result shows olga a notice")
	}
	if r := e.get(done); !strings.Contains(r.body, `class="notice"`) || !strings.Contains(r.body, "Retried 1 event(s)") {
		t.Errorf("alice's own result page has no notice:\n%s", r.body)
	}
}
