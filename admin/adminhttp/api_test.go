package adminhttp_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/pgoutbox/pgoutbox/internal/pgtest"
)

// apiGet fetches an API path as user and decodes its JSON into v.
func (e *env) apiGet(path, user, key string, v any) int {
	e.t.Helper()
	r := e.do("GET", path, user, key, nil, nil)
	if ct := r.header.Get("Content-Type"); ct != "application/json" {
		e.t.Fatalf("%s: Content-Type %q, status %d:\n%s", path, ct, r.status, r.body)
	}
	pgtest.Must(e.t, json.Unmarshal([]byte(r.body), v), "decode %s", path)
	return r.status
}

func TestAPIv1(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	ids := e.enqueue("order", "o1", 3, map[string]int{"n": 1})
	_, err := e.pool.Exec(context.Background(), "UPDATE "+e.table("outbox_events")+` SET headers = '{"authorization": "Bearer abc.def"}' WHERE event_id = $1`, ids[0])
	pgtest.Must(t, err, "headers")
	e.quarantine(ids[0], "webhook: POST https://x.example/1: 502 Bad Gateway")
	q := "?schema=" + e.schema

	for _, p := range []string{"overview", "retrying", "dlq", "errors", "lanes", "audit", "event?id=" + ids[0].String() + "&", "session"} {
		path := "/api/v1/" + p
		if !strings.Contains(p, "?") {
			path += "?"
		}
		var v map[string]any
		if st := e.apiGet(path+"schema="+e.schema, "victor", e.victorKey, &v); st != http.StatusOK {
			t.Errorf("viewer GET %s: %d %v", p, st, v)
		}
	}
	var ov struct {
		Status struct {
			Blocked int `json:"blocked_behind_dead_letter"`
		} `json:"status"`
	}
	e.apiGet("/api/v1/overview"+q, "victor", e.victorKey, &ov)
	if ov.Status.Blocked != 2 {
		t.Errorf("overview: blocked %d, want 2", ov.Status.Blocked)
	}
	var ev struct {
		Headers []struct {
			Name, Value string
			Masked      bool
		} `json:"headers"`
	}
	e.apiGet("/api/v1/event"+q+"&id="+ids[0].String(), "victor", e.victorKey, &ev)
	if len(ev.Headers) != 1 || !ev.Headers[0].Masked || strings.Contains(ev.Headers[0].Value, "abc") {
		t.Errorf("event headers not masked: %+v", ev.Headers)
	}
	var groups struct {
		Groups []struct {
			ID          string `json:"id"`
			DeadLetters int    `json:"dead_letters"`
		} `json:"groups"`
	}
	e.apiGet("/api/v1/errors"+q, "victor", e.victorKey, &groups)
	if len(groups.Groups) != 1 || groups.Groups[0].DeadLetters != 1 {
		t.Fatalf("groups: %+v", groups)
	}
	var errAnswer map[string]string
	if st := e.apiGet("/api/v1/nope", "victor", e.victorKey, &errAnswer); st != http.StatusNotFound || errAnswer["error"] == "" {
		t.Errorf("unknown API path: %d %v", st, errAnswer)
	}

	// A viewer's POST is refused, as JSON.
	var sess map[string]string
	e.apiGet("/api/v1/session", "victor", e.victorKey, &sess)
	if sess["csrf"] != "" || sess["once"] != "" || sess["role"] != "viewer" {
		t.Errorf("a viewer's session holds tokens: %v", sess)
	}
	form := url.Values{"csrf": {e.csrfOf("victor", e.victorKey)}, "schema": {e.schema}, "group": {groups.Groups[0].ID}, "expect": {"1"}, "reason": {"x"}}
	if r := e.do("POST", "/api/v1/dlq/retry-matching", "victor", e.victorKey, form, nil); r.status != http.StatusForbidden || !strings.Contains(r.body, `"error"`) {
		t.Errorf("viewer POST: %d %s", r.status, r.body)
	}

	// An operator: a stale count is 409; then the action runs once, sent twice.
	e.apiGet("/api/v1/session", "alice", e.aliceKey, &sess)
	form = url.Values{"csrf": {sess["csrf"]}, "once": {sess["once"]}, "schema": {e.schema}, "group": {groups.Groups[0].ID}, "expect": {"2"}, "reason": {"gateway fixed"}}
	if r := e.do("POST", "/api/v1/dlq/retry-matching", "alice", e.aliceKey, form, nil); r.status != http.StatusConflict || !strings.Contains(r.body, "1 events match now") {
		t.Fatalf("stale count: %d %s", r.status, r.body)
	}
	form.Set("expect", "1")
	for i := range 2 {
		r := e.do("POST", "/api/v1/dlq/retry-matching", "alice", e.aliceKey, form, nil)
		var out struct {
			Count    int  `json:"count"`
			Repeated bool `json:"repeated"`
		}
		pgtest.Must(t, json.Unmarshal([]byte(r.body), &out), "decode %s", r.body)
		if r.status != http.StatusOK || out.Count != 1 || out.Repeated != (i == 1) {
			t.Errorf("send %d: %d %s", i, r.status, r.body)
		}
	}
	if n := e.auditCount("dlq_retry"); n != 1 {
		t.Errorf("%d audit rows, want 1", n)
	}
}
