package adminhttp_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"html"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/goleak"

	"github.com/pgoutbox/pgoutbox"
	"github.com/pgoutbox/pgoutbox/admin"
	"github.com/pgoutbox/pgoutbox/admin/adminhttp"
	"github.com/pgoutbox/pgoutbox/admin/adminhttp/internal/consoletest"
	"github.com/pgoutbox/pgoutbox/broker/null"
	"github.com/pgoutbox/pgoutbox/internal/pgtest"
	"github.com/pgoutbox/pgoutbox/internal/visible"
	"github.com/pgoutbox/pgoutbox/internal/wait"
	"github.com/pgoutbox/pgoutbox/migrate"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(pgtest.Main(m)) }

func secret() string { return consoletest.Secret() }

func quiet() *slog.Logger { return consoletest.Quiet() }

func selector(t testing.TB, s string) migrate.Selector { return consoletest.Selector(t, s) }

// env is a migrated schema with a console on it, an operator (alice) and a
// viewer (victor).
type env struct {
	t                   *testing.T
	pool                *pgxpool.Pool
	schema              string
	h                   *adminhttp.Handler
	srv                 *httptest.Server
	aliceKey, victorKey string
	admin               *admin.Admin
	clock               *clock
	console             *consoletest.Env
}

// clock is the time the console's sign-in limiter reads: tests move it.
type clock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *clock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.now }

func (c *clock) Add(d time.Duration) { c.mu.Lock(); defer c.mu.Unlock(); c.now = c.now.Add(d) }

func newEnv(t *testing.T, mod func(*adminhttp.Config)) *env {
	t.Helper()
	pool, schema := pgtest.Migrated(t, 6)
	return consoleOn(t, pool, schema, mod)
}

// consoleOn is newEnv on the outbox schema of pool, which the test made.
func consoleOn(t *testing.T, pool *pgxpool.Pool, schema string, mod func(*adminhttp.Config)) *env {
	t.Helper()
	c := &clock{now: time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)}
	ce := consoletest.On(t, pool, schema, mod, func(h *adminhttp.Handler) { adminhttp.SetClock(h, c.Now) })
	return &env{t: t, pool: pool, schema: schema, h: ce.Handler, srv: ce.Server, aliceKey: ce.AliceKey,
		victorKey: ce.VictorKey, admin: ce.Admin, clock: c, console: ce}
}

func (e *env) table(n string) string { return e.console.Table(n) }

// enqueue writes n events to one aggregate and returns their ids.
func (e *env) enqueue(aggType, aggID string, n int, payload any) []pgoutbox.UUID {
	e.t.Helper()
	return e.console.Enqueue(aggType, aggID, n, payload)
}

func (e *env) quarantine(id pgoutbox.UUID, lastErr string) {
	e.t.Helper()
	e.console.Quarantine(id, lastErr)
}

type resp struct {
	status int
	body   string
	header http.Header
}

// do sends a request as user ("" for none) with key as its basic-auth password.
func (e *env) do(method, path, user, key string, form url.Values, hdr map[string]string) resp {
	e.t.Helper()
	var body io.Reader
	if form != nil {
		body = strings.NewReader(form.Encode())
	}
	req, err := http.NewRequest(method, e.srv.URL+path, body)
	pgtest.Must(e.t, err, "request")
	if form != nil {
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	}
	if user != "" {
		req.SetBasicAuth(user, key)
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	c := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	res, err := c.Do(req)
	pgtest.Must(e.t, err, "%s %s", method, path)
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return resp{status: res.StatusCode, body: string(b), header: res.Header}
}

func (e *env) get(path string) resp { return e.do("GET", path, "alice", e.aliceKey, nil, nil) }

// csrfOf reads the anti-forgery token from a page of user's.
func (e *env) csrfOf(user, key string) string {
	e.t.Helper()
	r := e.do("GET", "/?schema="+e.schema, user, key, nil, nil)
	_, after, ok := strings.Cut(r.body, `<meta name="csrf" content="`)
	if !ok {
		e.t.Fatalf("no csrf token on the page of %s (status %d)", user, r.status)
	}
	tok, _, _ := strings.Cut(after, `"`)
	return tok
}

// onceOf reads the submit-once token of the forms on alice's page at path.
func (e *env) onceOf(path string) string {
	e.t.Helper()
	r := e.get(path)
	_, after, ok := strings.Cut(r.body, `name="once" value="`)
	if !ok {
		e.t.Fatalf("no submit-once token on %s (status %d):\n%s", path, r.status, r.body)
	}
	tok, _, _ := strings.Cut(after, `"`)
	return tok
}

func (e *env) state(id pgoutbox.UUID) string {
	e.t.Helper()
	return e.console.State(id)
}

func TestAuthenticationRequired(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	for _, path := range []string{"/", "/lanes", "/dlq", "/event?id=00000000-0000-0000-0000-000000000000", "/replay", "/relays",
		"/audit", "/api/overview", "/static/console.js", "/nope"} {
		r := e.do("GET", path, "", "", nil, nil)
		if r.status != http.StatusUnauthorized || !strings.HasPrefix(r.header.Get("WWW-Authenticate"), "Basic ") {
			t.Errorf("GET %s without credentials: %d %q", path, r.status, r.header.Get("WWW-Authenticate"))
		}
		if strings.Contains(r.body, e.schema) {
			t.Errorf("GET %s without credentials shows data: %s", path, r.body)
		}
	}
	bad := map[string]map[string]string{
		"wrong password":            {"Authorization": basic("alice", e.victorKey+"x")},
		"other user's password":     {"Authorization": basic("alice", e.victorKey)},
		"unknown user":              {"Authorization": basic("mallory", e.aliceKey+"!")},
		"empty basic":               {"Authorization": "Basic "},
		"garbage basic":             {"Authorization": "Basic !!!!"},
		"empty bearer":              {"Authorization": "Bearer "},
		"wrong bearer":              {"Authorization": "Bearer " + secret()},
		"prefix of a token":         {"Authorization": "Bearer " + e.aliceKey[:len(e.aliceKey)-1]},
		"token plus suffix":         {"Authorization": "Bearer " + e.aliceKey + "0"},
		"token in other scheme":     {"Authorization": "Token " + e.aliceKey},
		"sha256 form as the secret": {"Authorization": "Bearer sha256:" + e.aliceKey},
		"huge header":               {"Authorization": "Bearer " + strings.Repeat("a", 5000)},
		"token as query only":       {"X-Token": e.aliceKey},
	}
	for name, hdr := range bad {
		e.clock.Add(time.Hour) // past the sign-in limits: this test is about each answer
		if r := e.do("GET", "/", "", "", nil, hdr); r.status != http.StatusUnauthorized {
			t.Errorf("%s: status %d, want 401", name, r.status)
		}
	}
	e.clock.Add(time.Hour)
	if r := e.do("GET", "/?token="+e.aliceKey, "", "", nil, nil); r.status != http.StatusUnauthorized {
		t.Errorf("token in the query: %d, want 401", r.status)
	}
	for name, hdr := range map[string]map[string]string{
		"basic":                  {"Authorization": basic("alice", e.aliceKey)},
		"bearer":                 {"Authorization": "Bearer " + e.victorKey},
		"bearer, any case":       {"Authorization": "bearer " + e.aliceKey},
		"basic of a viewer":      {"Authorization": basic("victor", e.victorKey)},
		"bearer with the spaces": {"Authorization": "Bearer  " + e.aliceKey + " "},
	} {
		if r := e.do("GET", "/", "", "", nil, hdr); r.status != http.StatusOK {
			t.Errorf("%s: status %d, want 200: %s", name, r.status, r.body)
		}
	}
}

func basic(user, pass string) string {
	r, _ := http.NewRequest("GET", "/", nil)
	r.SetBasicAuth(user, pass)
	return r.Header.Get("Authorization")
}

func TestSecurityHeaders(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	for _, r := range []resp{e.get("/"), e.get("/static/console.css"), e.do("GET", "/", "", "", nil, nil), e.get("/event?id=zzz")} {
		csp := r.header.Get("Content-Security-Policy")
		for _, want := range []string{"default-src 'self'", "script-src 'self'", "frame-ancestors 'none'", "object-src 'none'"} {
			if !strings.Contains(csp, want) {
				t.Errorf("status %d: CSP %q lacks %q", r.status, csp, want)
			}
		}
		if strings.Contains(csp, "unsafe-inline") || strings.Contains(csp, "unsafe-eval") {
			t.Errorf("CSP allows inline code: %q", csp)
		}
		for k, v := range map[string]string{"X-Frame-Options": "DENY", "X-Content-Type-Options": "nosniff", "Referrer-Policy": "no-referrer"} {
			if r.header.Get(k) != v {
				t.Errorf("status %d: %s = %q, want %q", r.status, k, r.header.Get(k), v)
			}
		}
	}
	page := e.get("/")
	if strings.Contains(page.body, "<script>") || strings.Contains(page.body, " style=") || strings.Contains(page.body, " onclick") {
		t.Errorf("the page has inline script or style:\n%s", page.body)
	}
	if page.header.Get("Cache-Control") != "no-store" {
		t.Errorf("pages are cacheable: %q", page.header.Get("Cache-Control"))
	}
}

func TestViewerCannotAct(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	id := e.enqueue("order", "o1", 1, map[string]int{"n": 1})[0]
	e.quarantine(id, "boom")
	tok := e.csrfOf("victor", e.victorKey)
	page := e.do("GET", "/event?schema="+e.schema+"&id="+id.String(), "victor", e.victorKey, nil, nil)
	if strings.Contains(page.body, `id="skip"`) || strings.Contains(page.body, `id="retry"`) {
		t.Errorf("a viewer is offered the actions")
	}
	for _, path := range []string{"/dlq/skip", "/dlq/retry", "/replay", "/dlq/retry-matching", "/dlq/skip-matching"} {
		r := e.do("POST", path, "victor", e.victorKey, url.Values{"csrf": {tok}, "schema": {e.schema}, "id": {id.String()},
			"reason": {"because"}, "all": {"1"}, "expect": {"1"}}, nil)
		if r.status != http.StatusForbidden {
			t.Errorf("viewer POST %s: %d, want 403", path, r.status)
		}
	}
	e.console.Untouched(id, "the viewer's attempts")
}

func TestCrossSiteAndForgedPostsRefused(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	id := e.enqueue("order", "o1", 1, map[string]int{"n": 1})[0]
	e.quarantine(id, "boom")
	tok := e.csrfOf("alice", e.aliceKey)
	form := func(csrf string) url.Values {
		v := url.Values{"schema": {e.schema}, "id": {id.String()}, "reason": {"forged"}}
		if csrf != "" {
			v.Set("csrf", csrf)
		}
		return v
	}
	cases := []struct {
		name string
		form url.Values
		hdr  map[string]string
	}{
		{"cross-site fetch metadata", form(tok), map[string]string{"Sec-Fetch-Site": "cross-site"}},
		{"same-site other origin", form(tok), map[string]string{"Sec-Fetch-Site": "same-site"}},
		{"foreign Origin", form(tok), map[string]string{"Origin": "https://evil.example"}},
		{"foreign Origin, same host other port", form(tok), map[string]string{"Origin": "http://127.0.0.1:1"}},
		{"null Origin", form(tok), map[string]string{"Origin": "null"}},
		{"no token", form(""), nil},
		{"empty token", url.Values{"schema": {e.schema}, "id": {id.String()}, "reason": {"x"}, "csrf": {""}}, nil},
		{"wrong token", form(tok[:len(tok)-2] + "AA"), nil},
		{"viewer's token", form(e.csrfOf("victor", e.victorKey)), nil},
		{"token in the query only", form(""), nil},
	}
	for _, c := range cases {
		for _, path := range []string{"/dlq/skip", "/dlq/retry"} {
			p := path
			if c.name == "token in the query only" {
				p += "?csrf=" + url.QueryEscape(tok)
			}
			r := e.do("POST", p, "alice", e.aliceKey, c.form, c.hdr)
			if r.status != http.StatusForbidden {
				t.Errorf("%s, POST %s: %d, want 403", c.name, path, r.status)
			}
		}
	}
	if s := e.state(id); s != admin.StateQuarantined {
		t.Fatalf("after forged posts the event is %s", s)
	}
	// The same form with the token and same-origin metadata works: the refusals
	// above were the checks, not a broken form.
	genuine := form(tok)
	genuine.Set("once", e.onceOf("/event?schema="+e.schema+"&id="+id.String()))
	r := e.do("POST", "/dlq/retry", "alice", e.aliceKey, genuine, map[string]string{"Sec-Fetch-Site": "same-origin", "Origin": e.srv.URL})
	if r.status != http.StatusSeeOther {
		t.Fatalf("genuine retry: %d %s", r.status, r.body)
	}
	if s := e.state(id); s == admin.StateQuarantined {
		t.Fatalf("genuine retry left the event quarantined")
	}
}

func TestSkipNeedsReasonAndAuditsUser(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	ids := e.enqueue("order", "o1", 3, map[string]int{"n": 1})
	e.quarantine(ids[0], "boom")
	tok := e.csrfOf("alice", e.aliceKey)
	for _, reason := range []string{"", "   ", "\t\n"} {
		r := e.do("POST", "/dlq/skip", "alice", e.aliceKey, url.Values{"csrf": {tok}, "schema": {e.schema}, "id": {ids[0].String()}, "reason": {reason}}, nil)
		if r.status != http.StatusBadRequest || !strings.Contains(r.body, "reason") {
			t.Errorf("skip with reason %q: %d", reason, r.status)
		}
	}
	for name, reason := range map[string]string{"too long": strings.Repeat("x", admin.MaxAuditText+1), "NUL": "a\x00b", "bad UTF-8": "a\xffb"} {
		r := e.do("POST", "/dlq/skip", "alice", e.aliceKey, url.Values{"csrf": {tok}, "schema": {e.schema}, "id": {ids[0].String()}, "reason": {reason}}, nil)
		if r.status != http.StatusBadRequest {
			t.Errorf("skip with a %s reason: %d", name, r.status)
		}
	}
	if s := e.state(ids[0]); s != admin.StateQuarantined {
		t.Fatalf("skips without a valid reason changed the event: %s", s)
	}
	page := "/event?schema=" + e.schema + "&id=" + ids[0].String()
	otherTab := e.onceOf(page)
	r := e.do("POST", "/dlq/skip", "alice", e.aliceKey, url.Values{"csrf": {tok}, "schema": {e.schema}, "id": {ids[0].String()},
		"reason": {"poison: <b>bad</b> schema v3"}, "once": {e.onceOf(page)}}, nil)
	if r.status != http.StatusSeeOther || !strings.Contains(r.header.Get("Location"), "result=") {
		t.Fatalf("skip: %d %q %s", r.status, r.header.Get("Location"), r.body)
	}
	if s := e.state(ids[0]); s != admin.StateSkipped {
		t.Fatalf("after the skip the event is %s", s)
	}
	entries, err := e.admin.Audit(context.Background(), 10)
	pgtest.Must(t, err, "audit")
	if len(entries) != 1 || entries[0].Action != admin.ActionSkip || entries[0].Actor != "console:alice" ||
		entries[0].Reason != "poison: <b>bad</b> schema v3" || entries[0].EventCount != 1 || entries[0].EventIDs[0] != ids[0] {
		t.Fatalf("audit: %+v", entries)
	}
	// The audit page shows it, escaped.
	audit := e.get("/audit?schema=" + e.schema)
	if !strings.Contains(audit.body, "console:alice") || !strings.Contains(audit.body, "poison: &lt;b&gt;bad&lt;/b&gt;") {
		t.Errorf("audit page:\n%s", audit.body)
	}
	// Skipping it again, from the same page open in another tab, is a
	// conflict, not a second skip.
	r = e.do("POST", "/dlq/skip", "alice", e.aliceKey, url.Values{"csrf": {tok}, "schema": {e.schema}, "id": {ids[0].String()}, "reason": {"again"},
		"once": {otherTab}}, nil)
	if r.status != http.StatusConflict {
		t.Errorf("second skip: %d", r.status)
	}
}

func TestRetryFromList(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	a := e.enqueue("order", "o1", 1, map[string]int{"n": 1})[0]
	b := e.enqueue("order", "o2", 1, map[string]int{"n": 1})[0]
	e.quarantine(a, "boom")
	e.quarantine(b, "boom")
	tok := e.csrfOf("alice", e.aliceKey)
	r := e.do("POST", "/dlq/retry", "alice", e.aliceKey, url.Values{"csrf": {tok}, "schema": {e.schema},
		"id": {a.String(), b.String()}, "reason": {"broker fixed"}, "once": {e.onceOf("/dlq?schema=" + e.schema)}}, nil)
	if r.status != http.StatusSeeOther || !strings.Contains(r.header.Get("Location"), "/dlq?") {
		t.Fatalf("retry: %d %q", r.status, r.header.Get("Location"))
	}
	for _, id := range []pgoutbox.UUID{a, b} {
		if s := e.state(id); s != admin.StatePending {
			t.Errorf("%s is %s after the retry", id, s)
		}
	}
	entries, _ := e.admin.Audit(context.Background(), 1)
	if len(entries) != 1 || entries[0].Actor != "console:alice" || entries[0].Reason != "broker fixed" || entries[0].EventCount != 2 {
		t.Fatalf("audit: %+v", entries)
	}
}

// hostile are texts a producer or a broker may put in an event, each with a
// marker that must never appear unescaped.
var hostile = []string{
	`<script>window.__xss=1</script>`,
	`"><img src=x onerror=alert(1)>`,
	`'><svg onload=alert(1)>`,
	`</pre><script>alert(1)</script>`,
	`</textarea><script>alert(1)</script>`,
	`<iframe src="javascript:alert(1)">`,
	`javascript:alert(1)`,
	`<a href="javascript:alert(1)">x</a>`,
	`{{.CSRF}}`,
	`<style>*{display:none}</style>`,
	`<!--`,
	`<meta http-equiv="refresh" content="0;url=https://evil.example">`,
	"<scr\u0000ipt>",
	`&lt;script&gt;`,
	`\u003cscript\u003e`,
}

func TestHostileTextIsEscaped(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	var ids []pgoutbox.UUID
	for i, h := range hostile {
		clean := strings.ReplaceAll(h, "\u0000", "")
		id := e.enqueue("t"+clean, "a"+clean, 2, map[string]string{"html": clean})[0]
		_, err := e.pool.Exec(context.Background(), "UPDATE "+e.table("outbox_events")+
			" SET event_type = $2, headers = jsonb_build_object('x-note', $3::text) WHERE event_id = $1", id, "e"+clean, clean)
		pgtest.Must(t, err, "seed %d", i)
		e.quarantine(id, "error: "+clean)
		_, err = e.pool.Exec(context.Background(), "INSERT INTO "+e.table("outbox_attempts")+
			" (event_id, attempt, relay_id, destination, error) VALUES ($1, 1, $2, $3, $4)", id, "r"+clean, "d"+clean, "attempt: "+clean)
		pgtest.Must(t, err, "seed the attempt %d", i)
		ids = append(ids, id)
	}
	pages := []string{"/?schema=" + e.schema, "/lanes?schema=" + e.schema, "/dlq?schema=" + e.schema,
		"/relays?schema=" + e.schema, "/lanes?partial=1&schema=" + e.schema, "/errors?schema=" + e.schema, "/retrying?schema=" + e.schema}
	for _, id := range ids {
		pages = append(pages, "/event?schema="+e.schema+"&id="+id.String())
	}
	for _, p := range pages {
		body := e.get(p).body
		for _, h := range hostile {
			clean := strings.ReplaceAll(h, "\u0000", "")
			if strings.ContainsAny(clean, `<>"'`) && strings.Contains(body, clean) {
				t.Errorf("%s shows %q unescaped", p, clean)
			}
		}
		for _, bad := range []string{"<script>window", "<img src=x", "<svg onload", "<iframe", "<style>*", "<meta http-equiv"} {
			if strings.Contains(body, bad) {
				t.Errorf("%s holds %q", p, bad)
			}
		}
	}
	// The texts are there, escaped: the checks above looked at pages that show them.
	ev := e.get("/event?schema=" + e.schema + "&id=" + ids[0].String()).body
	for _, want := range []string{html.EscapeString(`<script>window.__xss=1</script>`), "x-note"} {
		if !strings.Contains(ev, want) && !strings.Contains(ev, strings.ReplaceAll(want, "&#34;", "&quot;")) {
			t.Errorf("event page lacks %q:\n%s", want, ev)
		}
	}
	if !strings.Contains(e.get("/dlq?schema="+e.schema).body, "&lt;script&gt;window.__xss=1&lt;/script&gt;") {
		t.Errorf("dead-letter list does not show the hostile last error escaped")
	}
}

func TestSecretHeadersMasked(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	id := e.enqueue("order", "o1", 1, map[string]int{"n": 1})[0]
	secrets := map[string]string{}
	for _, name := range []string{"Authorization", "authorization", "X-Api-Key", "api_key", "X-Auth-Token", "token", "Cookie",
		"Set-Cookie", "X-Hub-Signature-256", "client_secret", "Password", "DB_PASSWD", "x-session-id", "Proxy-Authorization",
		"X-Amz-Security-Token", "private-key", "jwt", "X-Credential"} {
		secrets[name] = "S3CRET-" + secret()
	}
	// Credentials in the values of headers with plain names.
	valueSecrets := map[string]string{}
	for name, form := range map[string]string{"x-note": "Bearer %s", "x-basic": "Basic %s", "x-callback": "https://app:%s@hooks.example/cb",
		"x-link": "https://hooks.example/cb?access_token=%s&state=1", "x-raw": "access_token=%s", "x-fragment": "https://h.example/#access_token=%s",
		"x-id-token": "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxIn0.%s"} {
		v := "S3CRET-" + secret()
		valueSecrets[v] = name
		secrets[name] = fmt.Sprintf(form, v)
	}
	plain := map[string]string{"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "x-tenant": "acme", "content-language": "fr",
		"x-home": "https://shop.example/orders/42"}
	all := map[string]string{}
	for k, v := range secrets {
		all[k] = v
	}
	for k, v := range plain {
		all[k] = v
	}
	_, err := e.pool.Exec(context.Background(), "UPDATE "+e.table("outbox_events")+" SET headers = $2 WHERE event_id = $1", id, all)
	pgtest.Must(t, err, "headers")
	e.quarantine(id, "boom")
	for _, role := range []struct{ user, key string }{{"alice", e.aliceKey}, {"victor", e.victorKey}} {
		body := e.do("GET", "/event?schema="+e.schema+"&id="+id.String(), role.user, role.key, nil, nil).body
		for v, k := range valueSecrets {
			if strings.Contains(body, v) || strings.Contains(body, v[7:]) {
				t.Errorf("%s sees the credential in the value of %s", role.user, k)
			}
		}
		if n := strings.Count(body, `class="masked"`); n != len(secrets) {
			t.Errorf("%s: %d headers masked, want %d", role.user, n, len(secrets))
		}
	}
	body := e.get("/event?schema=" + e.schema + "&id=" + id.String()).body
	if !strings.Contains(body, "hooks.example") {
		t.Errorf("a masked URL's host is not shown")
	}
	for k, v := range secrets {
		if strings.Contains(body, v) || strings.Contains(body, v[7:]) {
			t.Errorf("the value of %s is shown", k)
		}
		if !strings.Contains(body, html.EscapeString(k)) {
			t.Errorf("header %s is not listed", k)
		}
	}
	for k, v := range plain {
		if !strings.Contains(body, v) {
			t.Errorf("plain header %s=%s is not shown", k, v)
		}
	}
}

func TestBoundedInput(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	id := e.enqueue("order", "o1", 1, map[string]int{"n": 1})[0]
	e.quarantine(id, "boom")
	tok := e.csrfOf("alice", e.aliceKey)
	long := strings.Repeat("x", 1025)
	for _, p := range []string{
		"/dlq?aggregate_type=" + long, "/dlq?error=" + long, "/dlq?aggregate_id=%00", "/dlq?event_type=%ff%fe",
		"/dlq?limit=0", "/dlq?limit=1001", "/dlq?limit=-1", "/dlq?limit=1e3", "/dlq?limit=" + strings.Repeat("9", 30),
		"/lanes?limit=100000", "/event?id=", "/event?id=not-a-uuid", "/event?id=" + id.String() + "," + id.String() + "0",
		"/replay?preview=1&since=yesterday", "/replay?preview=1&until=2024-01-01&since=2024-02-01",
		"/replay?preview=1&aggregate_type=" + long,
	} {
		if r := e.get(p + "&schema=" + e.schema); r.status != http.StatusBadRequest {
			t.Errorf("GET %s: %d, want 400", truncate(p), r.status)
		}
	}
	for _, p := range []string{"/?schema=nope", "/?schema=" + url.QueryEscape(`"; DROP TABLE x; --`), "/dlq?schema=pg_catalog",
		"/?schema=public", "/?schema=" + strings.Repeat("s", 2000), "/event?schema=" + e.schema + "&id=00000000-0000-7000-8000-000000000000"} {
		if r := e.get(p); r.status != http.StatusNotFound && r.status != http.StatusBadRequest {
			t.Errorf("GET %s: %d, want 404 or 400", truncate(p), r.status)
		}
	}
	many := make([]string, 1001)
	for i := range many {
		many[i] = pgoutbox.NewEventID().String()
	}
	r := e.do("POST", "/dlq/retry", "alice", e.aliceKey, url.Values{"csrf": {tok}, "schema": {e.schema}, "id": {strings.Join(many, ",")}}, nil)
	if r.status != http.StatusBadRequest {
		t.Errorf("1001 ids: %d", r.status)
	}
	r = e.do("POST", "/dlq/retry", "alice", e.aliceKey, url.Values{"csrf": {tok}, "schema": {e.schema}, "id": {"x"}, "pad": {strings.Repeat("p", 200<<10)}}, nil)
	if r.status != http.StatusBadRequest && r.status != http.StatusRequestEntityTooLarge {
		t.Errorf("a 200 KiB form: %d", r.status)
	}
	r = e.do("POST", "/dlq/retry", "alice", e.aliceKey, url.Values{"csrf": {tok}, "schema": {e.schema}, "id": {pgoutbox.NewEventID().String()},
		"reason": {"r"}, "once": {e.onceOf("/dlq?schema=" + e.schema)}}, nil)
	if r.status != http.StatusNotFound {
		t.Errorf("retry of an unknown id: %d", r.status)
	}
	if s := e.state(id); s != admin.StateQuarantined {
		t.Errorf("bad input changed the event: %s", s)
	}
}

func truncate(s string) string {
	if len(s) > 60 {
		return s[:60] + "…"
	}
	return s
}

func TestPagesShowFigures(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	ids := e.enqueue("order", "o1", 4, map[string]int{"n": 1})
	e.enqueue("user", "u1", 2, map[string]int{"n": 1})
	e.quarantine(ids[0], "invalid subject")
	_, err := e.pool.Exec(context.Background(), "UPDATE "+e.table("outbox_events")+
		" SET published_at = now(), claimed_by = 'relay-a' WHERE aggregate_type = 'user'")
	pgtest.Must(t, err, "publish")

	ov := e.get("/?schema=" + e.schema).body
	for _, want := range []string{`id="pending">3<`, `<a href="/dlq?schema=` + e.schema + `">1</a>`, `<svg class="chart"`, "<td>order</td>", "<td>user</td>"} {
		if !strings.Contains(ov, want) {
			t.Errorf("overview lacks %q", want)
		}
	}
	lanes := e.get("/lanes?schema=" + e.schema).body
	if !strings.Contains(lanes, `<td class="n waiting">3</td>`) || !strings.Contains(lanes, "order/o1") {
		t.Errorf("lanes page:\n%s", lanes)
	}
	part := e.get("/lanes?partial=1&schema=" + e.schema).body
	if strings.Contains(part, "<html") || !strings.Contains(part, `class="n waiting">3<`) {
		t.Errorf("the live part of lanes:\n%s", part)
	}
	relays := e.get("/relays?schema=" + e.schema).body
	if !strings.Contains(relays, "<td>relay-a</td>") || !strings.Contains(relays, "No logical replication slot") {
		t.Errorf("relays page:\n%s", relays)
	}
	api := e.get("/api/overview?schema=" + e.schema)
	if api.header.Get("Content-Type") != "application/json" || !strings.Contains(api.body, `"pending": 3`) {
		t.Errorf("api: %s %s", api.header.Get("Content-Type"), api.body)
	}
}

func TestTenants(t *testing.T) {
	t.Parallel()
	pool, prefix := pgtest.Schema(t, 4) // a schema whose name is the tenants' prefix
	_ = prefix
	var schemas []string
	for range 2 {
		p2, s := pgtest.Migrated(t, 2)
		_ = p2
		schemas = append(schemas, s)
	}
	// The two tenants are picked by their names; a third migrated schema
	// outside the selection must not appear.
	_, other := pgtest.Migrated(t, 2)
	h, err := adminhttp.New(pool, &adminhttp.Config{Schemas: selector(t, strings.Join(schemas, ",")), NoAuth: true, Logger: quiet()})
	pgtest.Must(t, err, "console")
	srv := httptest.NewServer(h)
	defer srv.Close()
	get := func(p string) (int, string) {
		res, err := http.Get(srv.URL + p)
		pgtest.Must(t, err, "get")
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		return res.StatusCode, string(b)
	}
	st, body := get("/")
	if st != 200 || !strings.Contains(body, `id="tenants"`) || !strings.Contains(body, schemas[0]) || !strings.Contains(body, schemas[1]) {
		t.Fatalf("overview: %d\n%s", st, body)
	}
	if strings.Contains(body, other) {
		t.Errorf("a schema outside the selection is shown")
	}
	if st, _ := get("/dlq?schema=" + schemas[1]); st != 200 {
		t.Errorf("second tenant: %d", st)
	}
	if st, _ := get("/dlq?schema=" + other); st != 404 {
		t.Errorf("schema outside the selection: %d", st)
	}
}

// The zero Config.Schemas keeps meaning the one schema "public", not every
// outbox as the zero migrate.Selector does elsewhere; "*" shows them all.
func TestZeroSchemasMeansPublic(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool := pgtest.Pool(t, pgtest.Database(t), 4)
	for _, s := range []string{migrate.DefaultSchema, "tenant_a"} {
		_, err := migrate.Up(ctx, pool, &migrate.Config{Schema: s})
		pgtest.Must(t, err, "migrate %s", s)
	}
	for sel, want := range map[string]map[string]int{
		"":  {migrate.DefaultSchema: 200, "tenant_a": 404},
		"*": {migrate.DefaultSchema: 200, "tenant_a": 200},
	} {
		h, err := adminhttp.New(pool, &adminhttp.Config{Schemas: selector(t, sel), NoAuth: true, Logger: quiet()})
		pgtest.Must(t, err, "console")
		for schema, code := range want {
			req := httptest.NewRequest("GET", "/dlq?schema="+schema, nil)
			req.Host = "127.0.0.1:8080"
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, req)
			if rec.Code != code {
				t.Errorf("Schemas %q: /dlq?schema=%s answered %d, want %d", sel, schema, rec.Code, code)
			}
		}
	}
}

func TestNoAuthAnswersOnlyLoopbackHosts(t *testing.T) {
	t.Parallel()
	pool, schema := pgtest.Migrated(t, 2)
	h, err := adminhttp.New(pool, &adminhttp.Config{Schemas: selector(t, schema), NoAuth: true, Logger: quiet()})
	pgtest.Must(t, err, "console")
	for host, want := range map[string]int{"127.0.0.1:8080": 200, "localhost:8080": 200, "[::1]:8080": 200, "localhost": 200,
		"evil.example": 421, "evil.example:8080": 421, "127.0.0.1.evil.example": 421, "10.0.0.1:8080": 421, "": 421} {
		req := httptest.NewRequest("GET", "/", nil)
		req.Host = host
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		if rec.Code != want {
			t.Errorf("Host %q: %d, want %d", host, rec.Code, want)
		}
	}
}

func TestReplayPreviewAndRun(t *testing.T) {
	t.Parallel()
	pub := &null.Publisher{}
	e := newEnv(t, nil)
	e.enqueue("order", "o1", 3, map[string]int{"n": 1})
	e.enqueue("user", "u1", 2, map[string]int{"n": 1})
	_, err := e.pool.Exec(context.Background(), "UPDATE "+e.table("outbox_events")+" SET published_at = now()")
	pgtest.Must(t, err, "publish")

	page := e.get("/replay?schema=" + e.schema)
	if !strings.Contains(page.body, `id="preview-only"`) {
		t.Errorf("a console without a broker does not say replay is preview only")
	}
	prev := e.get("/replay?preview=1&aggregate_type=order&schema=" + e.schema)
	if prev.status != 200 || !strings.Contains(prev.body, `id="preview-total">3<`) || strings.Contains(prev.body, `id="run-replay"`) {
		t.Errorf("preview: %d\n%s", prev.status, prev.body)
	}
	if r := e.get("/replay?preview=1&schema=" + e.schema); r.status != 400 {
		t.Errorf("preview without a selection: %d", r.status)
	}
	if r := e.get("/replay?preview=1&all=1&schema=" + e.schema); !strings.Contains(r.body, `id="preview-total">5<`) {
		t.Errorf("preview of all: %s", r.body)
	}
	tok := e.csrfOf("alice", e.aliceKey)
	if r := e.do("POST", "/replay", "alice", e.aliceKey, url.Values{"csrf": {tok}, "schema": {e.schema}, "all": {"1"}}, nil); r.status != http.StatusConflict {
		t.Errorf("replay without a broker: %d", r.status)
	}
	if pub.Published() != 0 {
		t.Fatal("published")
	}

	// With a broker.
	e2 := newEnv(t, func(c *adminhttp.Config) { c.Publisher, c.Destination = pub, "null://" })
	e2.enqueue("order", "o1", 3, map[string]int{"n": 1})
	_, err = e2.pool.Exec(context.Background(), "UPDATE "+e2.table("outbox_events")+" SET published_at = now()")
	pgtest.Must(t, err, "publish")
	prev = e2.get("/replay?preview=1&aggregate_type=order&schema=" + e2.schema)
	if !strings.Contains(prev.body, `id="run-replay"`) {
		t.Fatalf("no run form:\n%s", prev.body)
	}
	// A relative time is carried to the run as the instant the preview used.
	rel := e2.get("/replay?preview=1&aggregate_type=order&since=2h&schema=" + e2.schema)
	if strings.Contains(rel.body, `name="since" value="2h"`) || !strings.Contains(rel.body, `name="since" value="20`) {
		t.Errorf("the run form does not carry an instant for since=2h")
	}
	tok = e2.csrfOf("alice", e2.aliceKey)
	r := e2.do("POST", "/replay", "alice", e2.aliceKey, url.Values{"csrf": {tok}, "schema": {e2.schema}, "aggregate_type": {"order"},
		"reason": {"consumer rebuilt"}, "once": {e2.onceOf("/replay?preview=1&aggregate_type=order&schema=" + e2.schema)}}, nil)
	if r.status != http.StatusSeeOther || pub.Published() != 3 {
		t.Fatalf("replay: %d published %d\n%s", r.status, pub.Published(), r.body)
	}
	r = e2.get(strings.TrimPrefix(r.header.Get("Location"), e2.srv.URL))
	if r.status != 200 || !strings.Contains(r.body, "Published <strong>3</strong>") {
		t.Fatalf("replay result page: %d\n%s", r.status, r.body)
	}
	a, _ := admin.New(e2.pool, &admin.Config{Schema: e2.schema})
	entries, _ := a.Audit(context.Background(), 1)
	if len(entries) != 1 || entries[0].Action != admin.ActionReplay || entries[0].Actor != "console:alice" || entries[0].Reason != "consumer rebuilt" {
		t.Fatalf("audit: %+v", entries)
	}
}

func TestConfigValidate(t *testing.T) {
	t.Parallel()
	const tok = "0123456789abcdef0123456789abcdef"
	good := []adminhttp.User{{Name: "a", Role: adminhttp.RoleOperator, Secret: tok}}
	for name, c := range map[string]adminhttp.Config{
		"nobody":           {},
		"both":             {NoAuth: true, Users: good},
		"refresh":          {NoAuth: true, Refresh: 10},
		"tenants":          {NoAuth: true, MaxTenants: -1},
		"csrf key":         {NoAuth: true, CSRFKey: []byte("short")},
		"publisher, no to": {NoAuth: true, Publisher: &null.Publisher{}},
		"base path":        {NoAuth: true, BasePath: "console"},
		"base path chars":  {NoAuth: true, BasePath: `/c"onsole`},
		"short secret":     {Users: []adminhttp.User{{Name: "a", Role: adminhttp.RoleViewer, Secret: "short"}}},
		"16-byte secret":   {Users: []adminhttp.User{{Name: "a", Role: adminhttp.RoleViewer, Secret: "0123456789abcdef"}}},
		"sha256 of test": {Users: []adminhttp.User{{Name: "a", Role: adminhttp.RoleViewer,
			Secret: "sha256:9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"}}},
		"bad name":    {Users: []adminhttp.User{{Name: "a b", Role: adminhttp.RoleViewer, Secret: tok}}},
		"no role":     {Users: []adminhttp.User{{Name: "a", Secret: tok}}},
		"same secret": {Users: append(good, adminhttp.User{Name: "b", Role: adminhttp.RoleViewer, Secret: tok})},
	} {
		err := c.Validate()
		if err == nil {
			t.Errorf("%s: valid", name)
			continue
		}
		if strings.Contains(err.Error(), "0123456789abcdef") || strings.Contains(err.Error(), "9f86d0") {
			t.Errorf("%s: the error shows the secret: %v", name, err)
		}
	}
	if err := (&adminhttp.Config{Users: good}).Validate(); err != nil {
		t.Errorf("good: %v", err)
	}
	if _, err := adminhttp.New(nil, &adminhttp.Config{NoAuth: true}); !errors.Is(err, adminhttp.ErrNoPool) {
		t.Errorf("nil pool: %v", err)
	}
}

func TestParseUsers(t *testing.T) {
	t.Parallel()
	const s1, s2 = "first-secret-0123456789abcdefghij", "second-secret-0123456789abcdefghi"
	users, err := adminhttp.ParseUsers(strings.NewReader("# console users\n\nalice operator " + s1 + "\n  bob   viewer   " +
		bobHash + "\n"))
	if err != nil || len(users) != 2 || users[0].Role != adminhttp.RoleOperator || users[1].Name != "bob" {
		t.Fatalf("%+v %v", users, err)
	}
	for name, text := range map[string]string{
		"empty":                              "",
		"only comments":                      "# x\n",
		"two fields":                         "alice operator",
		"four fields":                        "alice operator " + s1 + " extra",
		"bad role":                           "alice admin " + s1,
		"short secret":                       "alice viewer short",
		"bad hash":                           "alice viewer sha256:abc",
		"sha256 hash":                        "alice viewer sha256:9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08",
		"SHA256 hash":                        "alice viewer SHA256:9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08",
		"31-byte token":                      "alice viewer " + s1[:31],
		"few runes":                          "alice viewer " + strings.Repeat("ab", 20),
		"cheap bcrypt":                       "alice viewer " + cheapHash,
		"cut bcrypt":                         "alice viewer " + bobHash[:59],
		"argon2id":                           "alice viewer $argon2id$v=19$m=65536,t=3,p=4$c2FsdHNhbHRzYWx0$aGFzaGhhc2hoYXNoaGFzaGhhc2hoYXNoaGFzaA",
		"dollar":                             "alice viewer $" + s1,
		"bad name":                           "al<ice viewer " + s1,
		"long name":                          strings.Repeat("a", 65) + " viewer " + s1,
		"twice":                              "alice viewer " + s1 + "\nalice operator " + s2,
		"shared secret":                      "alice viewer " + s1 + "\nbob operator " + s1,
		"huge":                               strings.Repeat("#", 2<<20),
		"NUL in secret":                      "alice viewer " + s1 + "\x00x",
		"secret first":                       s1 + " viewer alice",
		"secret second":                      "alice " + s1 + " viewer",
		"secret as the name of a later line": "alice viewer " + s2 + "\n" + s1 + " operator short",
	} {
		_, err := adminhttp.ParseUsers(strings.NewReader(text))
		if !errors.Is(err, adminhttp.ErrUsers) {
			t.Errorf("%s: %v", name, err)
		}
		if err != nil && (strings.Contains(err.Error(), s1) || strings.Contains(err.Error(), s2)) {
			t.Errorf("%s: the error shows a secret: %v", name, err)
		}
	}
}

// A page whose queries wait on a lock answers 503 once Config.QueryTimeout
// passes, instead of hanging with the database.
func TestQueryTimeout(t *testing.T) {
	t.Parallel()
	// Long enough for an overview on a loaded machine (at 300ms, one beside
	// the whole suite could not answer for 30 s); the lock holds it past any.
	e := newEnv(t, func(c *adminhttp.Config) { c.QueryTimeout = 3 * time.Second })
	ctx := context.Background()
	tx, err := e.pool.Begin(ctx)
	pgtest.Must(t, err, "begin")
	defer tx.Rollback(ctx)
	_, err = tx.Exec(ctx, "LOCK TABLE "+e.table("outbox_events")+" IN ACCESS EXCLUSIVE MODE")
	pgtest.Must(t, err, "lock")
	r := e.get("/?schema=" + e.schema)
	if r.status != http.StatusServiceUnavailable || !strings.Contains(r.body, "did not answer in time") {
		t.Fatalf("overview on a locked table: %d %s", r.status, r.body)
	}
	pgtest.Must(t, tx.Rollback(ctx), "rollback")
	// Once the lock is gone the page answers again; on a loaded machine one
	// answer may still take longer than the bound, so wait for one.
	wait.For(t, 30*time.Second, "the overview after the lock", func() bool { return e.get("/?schema="+e.schema).status == http.StatusOK })
}

// hidden are producer texts whose characters steer a terminal or the
// direction of text, or cannot be seen.
var hidden = []string{
	"invoice\u202egpj.exe",              // right-to-left override
	"\u2066admin\u2069 \u2067x\u2068",   // isolates
	"zero\u200bwidth\u200c\u200d\ufeff", // zero-width
	"\u200e\u200fmarks\u061c",           // direction marks
	"\x1b]0;pwned\x07\x1b[2J",           // terminal escapes
	"c1\u009b31m\u0085",                 // C1 controls
	"line\u2028sep\u2029",               // separators
	"forged\nline\rback\tabs",           // C0 layout
}

// Hidden characters in every field an event has are shown as visible escapes
// on every page, in the live regions and in the JSON answer.
func TestHiddenCharactersShownEscaped(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	var ids []pgoutbox.UUID
	for i, h := range hidden {
		id := e.enqueue("order", fmt.Sprintf("o%d", i), 2, map[string]int{"n": 1})[0]
		_, err := e.pool.Exec(context.Background(), "UPDATE "+e.table("outbox_events")+` SET aggregate_type = $2, aggregate_id = $3,
		  event_type = $3, headers = jsonb_build_object('x-note', $2::text, $2::text, 'v'), payload = jsonb_build_object('note', $2::text),
		  claimed_by = $2 WHERE aggregate_id = $4 OR event_id = $1`, id, "t"+h, fmt.Sprintf("a%d%s", i, h), fmt.Sprintf("o%d", i))
		pgtest.Must(t, err, "seed %d", i)
		e.quarantine(id, "error: "+h)
		ids = append(ids, id)
	}
	pages := []string{"/", "/?partial=1", "/lanes", "/lanes?partial=1", "/dlq", "/relays", "/relays?partial=1", "/api/overview",
		"/replay?preview=1&all=1"}
	for _, id := range ids {
		pages = append(pages, "/event?id="+id.String())
	}
	for _, p := range pages {
		sep := "?"
		if strings.Contains(p, "?") {
			sep = "&"
		}
		r := e.get(p + sep + "schema=" + e.schema)
		if r.status != http.StatusOK {
			t.Fatalf("%s: %d", p, r.status)
		}
		for _, c := range r.body {
			if c != '\n' && c != '\t' && visible.Hidden(c) {
				t.Errorf("%s holds %U raw", p, c)
				break
			}
		}
	}
	ev := e.get("/event?schema=" + e.schema + "&id=" + ids[0].String()).body
	if !strings.Contains(ev, `invoice\u202egpj.exe`) {
		t.Errorf("the event page does not show the override as an escape:\n%s", ev)
	}
	api := e.get("/api/overview?schema=" + e.schema).body
	var doc map[string]any
	if err := json.Unmarshal([]byte(api), &doc); err != nil {
		t.Fatalf("the JSON answer is not JSON: %v", err)
	}
	if !strings.Contains(fmt.Sprint(doc), "invoice\u202egpj.exe") {
		t.Errorf("the JSON answer lost the producer's text: %s", api)
	}
}
