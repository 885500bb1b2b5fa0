package browsertest_test

import (
	"context"
	"encoding/base64"
	"flag"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/cdproto/cdp"
	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/chromedp"

	"github.com/pgoutbox/pgoutbox"
	"github.com/pgoutbox/pgoutbox/admin"
	"github.com/pgoutbox/pgoutbox/admin/adminhttp"
	"github.com/pgoutbox/pgoutbox/admin/adminhttp/internal/consoletest"
	"github.com/pgoutbox/pgoutbox/broker/null"
	"github.com/pgoutbox/pgoutbox/internal/pgtest"
	"github.com/pgoutbox/pgoutbox/internal/systool"
	"github.com/pgoutbox/pgoutbox/internal/wait"
	"github.com/pgoutbox/pgoutbox/relay"
)

// The browser tests drive Debian's chromium (installed by .ci/run, or by
// internal/systool when missing) headless through the DevTools protocol.
//
// -update-screenshots (or PGOUTBOX_UPDATE_SCREENSHOTS=1) writes the screenshots
// of docs/console.md; without it the tree stays clean.
var updateScreenshots = flag.Bool("update-screenshots", os.Getenv("PGOUTBOX_UPDATE_SCREENSHOTS") == "1",
	"write docs/console/*.png from the browser tests")

// browserTimeout bounds one browser scenario: a hang fails the test, a slow
// machine does not (the cold overview of 205 tenants took 22 s at load 8, and
// more than 90 s beside the whole suite and a CPU hog).
const browserTimeout = 4 * time.Minute

// browser starts a headless chromium for the test and returns its context.
// Requests carry auth as their Authorization header (empty: none), as a
// browser does once basic auth was entered.
func browser(t *testing.T, auth string) context.Context {
	t.Helper()
	exe := systool.Need(t, systool.Chromium)
	opts := append(chromedp.DefaultExecAllocatorOptions[:0:0], chromedp.DefaultExecAllocatorOptions[:]...)
	opts = append(opts, chromedp.ExecPath(exe), chromedp.WindowSize(1280, 900),
		chromedp.Flag("disable-dev-shm-usage", true), chromedp.Flag("lang", "en-US"))
	if os.Geteuid() == 0 {
		opts = append(opts, chromedp.NoSandbox) // chromium refuses its sandbox as root
	}
	ctx, cancel := context.WithTimeout(context.Background(), browserTimeout)
	actx, acancel := chromedp.NewExecAllocator(ctx, opts...)
	bctx, bcancel := chromedp.NewContext(actx)
	t.Cleanup(func() { bcancel(); acancel(); cancel() })
	setup := chromedp.Func(func(ctx context.Context, t *chromedp.Target) error {
		if _, err := cdp.Call(ctx, t, network.Enable, network.EnableParams{}); err != nil {
			return err
		}
		if auth == "" {
			return nil
		}
		_, err := cdp.Call(ctx, t, network.SetExtraHTTPHeaders, network.SetExtraHTTPHeadersParams{Headers: network.Headers{"Authorization": auth}})
		return err
	})
	if err := chromedp.Do(bctx, setup); err != nil {
		t.Fatalf("start chromium: %v", err)
	}
	return bctx
}

type step = chromedp.Action[chromedp.Void]

func run(t *testing.T, ctx context.Context, what string, steps ...step) {
	t.Helper()
	if err := chromedp.Do(ctx, steps...); err != nil {
		t.Fatalf("browser: %s: %v", what, err)
	}
}

func navigate(url, waitFor string) []step {
	return []step{chromedp.Navigate(url), chromedp.WaitVisible(chromedp.CSS(waitFor))}
}

// errorPage is the console's error page's message (pages/error.html).
const errorPage = `p.error[role=alert]`

// navigateOrError is navigate for a page whose loading can fail on the
// server (a slow database): it waits for waitFor or the console's error
// page, and fails at once with the error page's text, not at the browser's
// deadline.
func navigateOrError(url, waitFor string) []step {
	return []step{chromedp.Navigate(url), chromedp.WaitVisible(chromedp.CSS(waitFor + ", " + errorPage)),
		chromedp.Func(func(ctx context.Context, _ *chromedp.Target) error {
			msg, err := chromedp.Run(ctx, chromedp.Evaluate[string](fmt.Sprintf(
				`document.querySelector(%q) ? "" : (document.querySelector(%q)?.textContent ?? "").trim() || document.title`,
				waitFor, errorPage)))
			if err != nil {
				return err
			}
			if msg != "" {
				return fmt.Errorf("%s: an error page instead of %s: %s", url, waitFor, msg)
			}
			_, err = chromedp.Run(ctx, chromedp.WaitVisible(chromedp.CSS(waitFor)))
			return err
		})}
}

// eval evaluates a JavaScript expression in the page (awaiting a promise).
func eval[T any](t *testing.T, ctx context.Context, expr string) T {
	t.Helper()
	v, err := chromedp.Run(ctx, chromedp.Evaluate[T](expr, chromedp.EvalAwaitPromise))
	if err != nil {
		t.Fatalf("browser: evaluate %s: %v", expr, err)
	}
	return v
}

func text(t *testing.T, ctx context.Context, sel string) string {
	t.Helper()
	s, err := chromedp.Run(ctx, chromedp.Text(chromedp.CSS(sel), chromedp.NodeVisible))
	if err != nil {
		t.Fatalf("browser: read %s: %v", sel, err)
	}
	return strings.TrimSpace(s)
}

// waitJS polls a JavaScript condition in the page until it is true.
func waitJS(t *testing.T, ctx context.Context, what, expr string, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	var ok bool
	var err error
	for {
		// A poll dies with the document when the page navigates (a form's
		// submit: "target navigated", "cannot find context"): poll the new one.
		ok, err = chromedp.Run(ctx, chromedp.Poll[bool](expr, chromedp.WithPollingTimeout(time.Until(deadline)),
			chromedp.WithPollingInterval(50*time.Millisecond)))
		if err == nil || ctx.Err() != nil || time.Now().After(deadline) {
			break
		}
		time.Sleep(wait.Interval) // the next document's turn to load

	}
	if err != nil || !ok {
		body, _ := chromedp.Run(ctx, chromedp.Evaluate[string](`document.body ? document.body.innerText : ""`))
		t.Fatalf("browser: waiting for %s: %v\npage:\n%s", what, err, body)
	}
}

func screenshot(t *testing.T, ctx context.Context, name string) {
	t.Helper()
	if !*updateScreenshots {
		return
	}
	png, err := chromedp.Run(ctx, chromedp.CaptureScreenshot())
	pgtest.Must(t, err, "screenshot")
	dir := filepath.Join("..", "..", "..", "docs", "console")
	pgtest.Must(t, os.MkdirAll(dir, 0o755), "mkdir")
	pgtest.Must(t, os.WriteFile(filepath.Join(dir, name+".png"), png, 0o644), "write screenshot")
}

func basicAuth(user, key string) string {
	return "Basic " + base64.StdEncoding.EncodeToString([]byte(user+":"+key))
}

// startRelay runs a relay on the schema, publishing to a null broker, until the
// test ends.
func startRelay(t *testing.T, e *consoletest.Env) *null.Publisher {
	t.Helper()
	pub := &null.Publisher{}
	r, err := relay.New(e.Pool, pub, &relay.Config{Schema: e.Schema, PollInterval: 50 * time.Millisecond, Logger: consoletest.Quiet()})
	pgtest.Must(t, err, "relay")
	pgtest.Must(t, r.Start(context.Background()), "start relay")
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = r.Stop(ctx)
	})
	return pub
}

// An operator opens the overview, sees the quarantined event, skips it with a
// reason, watches the lane drain without reloading, and finds the audit row.
func TestBrowserSkipAndWatchTheLaneDrain(t *testing.T) {
	t.Parallel()
	e := consoletest.New(t, func(c *adminhttp.Config) { c.Refresh = time.Second })
	ids := e.Enqueue("order", "o-42", 5, map[string]any{"total": 99.5, "note": "<script>window.__xss=1</script>"})
	e.Quarantine(ids[0], "nats: maximum payload exceeded")
	ctx := browser(t, basicAuth("alice", e.AliceKey))
	base := e.Server.URL

	run(t, ctx, "overview", navigate(base+"/?schema="+e.Schema, "#pending")...)
	if q, p := text(t, ctx, "#quarantined"), text(t, ctx, "#pending"); q != "1" || p != "4" {
		t.Fatalf("overview: quarantined %q pending %q, want 1 and 4", q, p)
	}
	run(t, ctx, "lanes", navigate(base+"/lanes?schema="+e.Schema, "#lanes")...)
	if w := text(t, ctx, "#lanes td.waiting"); w != "4" {
		t.Fatalf("blocked lane: %q waiting, want 4", w)
	}
	run(t, ctx, "open the head", chromedp.Click(chromedp.CSS("#lanes a")), chromedp.WaitVisible(chromedp.CSS("#state")))
	if s := text(t, ctx, "#state"); s != "quarantined" {
		t.Fatalf("state %q", s)
	}
	// A skip without a reason is stopped by the form (required) and by the server.
	run(t, ctx, "skip", chromedp.SendKeys(chromedp.CSS("#skip-reason"), "poison: payload over the broker's limit, re-sent by billing"),
		chromedp.Click(chromedp.CSS("#skip")))
	waitJS(t, ctx, "the skipped state", `document.querySelector("#state") && document.querySelector("#state").textContent === "skipped"`, 10*time.Second)
	if n := text(t, ctx, ".notice"); !strings.Contains(n, "Skipped 1 event") {
		t.Errorf("notice %q", n)
	}

	// The overview shows the lane's 4 events waiting; a relay starts and the
	// page, refreshing itself, shows them drain — with no reload (the marker
	// set on the page survives).
	run(t, ctx, "overview", navigate(base+"/?schema="+e.Schema, "#pending")...)
	if p := text(t, ctx, "#pending"); p != "4" {
		t.Fatalf("pending before the relay: %q", p)
	}
	eval[bool](t, ctx, `window.__sameDocument = true`)
	pub := startRelay(t, e)
	waitJS(t, ctx, "the lane to drain on the live overview",
		`window.__sameDocument === true && document.querySelector("#pending").textContent.trim() === "0" && document.querySelector("#quarantined").textContent.trim() === "0"`,
		30*time.Second)
	if pub.Published() != 4 {
		t.Errorf("the relay published %d events, want the 4 behind the skipped head", pub.Published())
	}

	run(t, ctx, "audit", navigate(base+"/audit?schema="+e.Schema, "#audit")...)
	if a, r := text(t, ctx, "#audit td.actor"), text(t, ctx, "#audit td.reason"); a != "console:alice" || !strings.HasPrefix(r, "poison: payload") {
		t.Errorf("audit page: actor %q reason %q", a, r)
	}
	entries, err := e.Admin.Audit(context.Background(), 5)
	pgtest.Must(t, err, "audit")
	if len(entries) != 1 || entries[0].Action != admin.ActionSkip || entries[0].Actor != "console:alice" || entries[0].EventIDs[0] != ids[0] {
		t.Fatalf("audit rows: %+v", entries)
	}
	if xss := eval[string](t, ctx, `typeof window.__xss`); xss != "undefined" {
		t.Fatalf("the payload's script ran")
	}
}

// A viewer sees the dead letter but has no action, and a POST from the
// viewer's own page (with the viewer's token) is refused.
func TestBrowserViewerCannotSkip(t *testing.T) {
	t.Parallel()
	e := consoletest.New(t, nil)
	id := e.Enqueue("order", "o-1", 2, map[string]int{"n": 1})[0]
	e.Quarantine(id, "boom")
	ctx := browser(t, basicAuth("victor", e.VictorKey))
	run(t, ctx, "event", navigate(e.Server.URL+"/event?schema="+e.Schema+"&id="+id.String(), "#state")...)
	if buttons := eval[int](t, ctx, `document.querySelectorAll("#skip, #retry, #act").length`); buttons != 0 {
		t.Errorf("the viewer is offered %d action elements", buttons)
	}
	status := eval[int](t, ctx, fmt.Sprintf(`fetch("/dlq/skip", {method: "POST", body: new URLSearchParams({
		csrf: document.querySelector('meta[name="csrf"]').content, schema: %q, id: %q, reason: "viewer tries"})}).then(r => r.status)`,
		e.Schema, id.String()))
	if status != http.StatusForbidden {
		t.Errorf("the viewer's POST: %d, want 403", status)
	}
	if s := e.State(id); s != admin.StateQuarantined {
		t.Fatalf("the event is %s", s)
	}
}

// A page of another origin that posts a skip form to the console — even one
// holding the operator's token, even with the browser sending the operator's
// credentials — is refused, and nothing changes.
func TestBrowserCrossSitePostRefused(t *testing.T) {
	t.Parallel()
	e := consoletest.New(t, nil)
	id := e.Enqueue("order", "o-1", 2, map[string]int{"n": 1})[0]
	e.Quarantine(id, "boom")
	tok := e.CSRF("alice", e.AliceKey)
	evil := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/go.js" {
			w.Header().Set("Content-Type", "text/javascript")
			fmt.Fprint(w, `document.getElementById("f").submit();`)
			return
		}
		w.Header().Set("Content-Type", "text/html")
		fmt.Fprintf(w, `<!doctype html><form id="f" method="post" action="%s/dlq/skip">
<input name="csrf" value="%s"><input name="schema" value="%s"><input name="id" value="%s"><input name="reason" value="evil">
</form><script src="/go.js"></script>`, e.Server.URL, tok, e.Schema, id)
	}))
	defer evil.Close()
	ctx := browser(t, basicAuth("alice", e.AliceKey))
	run(t, ctx, "evil page", chromedp.Navigate(evil.URL+"/"))
	waitJS(t, ctx, "the console's answer to the cross-site form",
		`location.href.indexOf("/dlq/skip") >= 0 && document.body && document.body.innerText.indexOf("cross-origin request refused") >= 0`, 20*time.Second)
	e.Untouched(id, "a cross-site form")
}

// Hostile text in every field an event has stays inert on every page, also
// after the live region refreshed (innerHTML).
func TestBrowserXSSInert(t *testing.T) {
	t.Parallel()
	e := consoletest.New(t, func(c *adminhttp.Config) { c.Refresh = time.Second })
	var ids []pgoutbox.UUID
	for i, h := range []string{`<script>window.__xss="script"</script>`, `"><img src=x onerror="window.__xss='img'">`,
		`<svg onload="window.__xss='svg'">`, `</pre><script>window.__xss="pre"</script>`, `<iframe srcdoc="<script>parent.__xss='iframe'</script>">`} {
		id := e.Enqueue("t"+h, fmt.Sprintf("a%d%s", i, h), 2, map[string]string{"html": h})[0]
		_, err := e.Pool.Exec(context.Background(), "UPDATE "+e.Table("outbox_events")+
			" SET event_type = $2, headers = jsonb_build_object('x-html', $2::text) WHERE event_id = $1", id, h)
		pgtest.Must(t, err, "seed")
		e.Quarantine(id, h)
		ids = append(ids, id)
	}
	ctx := browser(t, basicAuth("alice", e.AliceKey))
	check := func(where string) {
		t.Helper()
		if kind := eval[string](t, ctx, `typeof window.__xss + ":" + String(window.__xss)`); kind != "undefined:undefined" {
			t.Errorf("%s: a hostile text ran: window.__xss is %s", where, kind)
		}
	}
	for _, p := range []string{"/", "/lanes", "/dlq", "/relays", "/audit"} {
		run(t, ctx, p, navigate(e.Server.URL+p+"?schema="+e.Schema, "main")...)
		check(p)
	}
	run(t, ctx, "lanes", navigate(e.Server.URL+"/lanes?schema="+e.Schema, "#lanes")...)
	eval[bool](t, ctx, `window.__refreshed = 0; document.getElementById("live").addEventListener("console:refreshed", () => window.__refreshed++); true`)
	waitJS(t, ctx, "two live refreshes", `window.__refreshed >= 2`, 20*time.Second)
	check("lanes after live refreshes")
	for _, id := range ids {
		run(t, ctx, "event", navigate(e.Server.URL+"/event?schema="+e.Schema+"&id="+id.String(), "#payload")...)
		check("event " + id.String())
	}
	// The texts are on the pages, as text.
	if !eval[bool](t, ctx, `document.querySelector("#payload").textContent.indexOf("<iframe srcdoc=") >= 0`) {
		t.Errorf("the payload is not shown as text")
	}
}

// Screenshots of every page, over a realistic outbox: written to docs/console
// with -update-screenshots; always run, so the pages render in a browser.
func TestBrowserScreenshots(t *testing.T) {
	t.Parallel()
	e := consoletest.New(t, nil)
	ctx0 := context.Background()
	types := []string{"order", "invoice", "customer", "shipment"}
	for i, typ := range types {
		for a := range 6 {
			e.Enqueue(typ, fmt.Sprintf("%s-%d", typ, 1000+a), 3+i, map[string]any{"id": a, "amount": 10 * a, "currency": "EUR"})
		}
	}
	tbl := e.Table("outbox_events")
	// History: most events published over the last hour by two relays; a few
	// quarantined with a lane behind them; a backlog.
	for _, q := range []string{
		`UPDATE ` + tbl + ` SET published_at = now() - (random() * interval '58 minutes'), claimed_by = CASE WHEN random() < .5 THEN 'relay-7d9f-1' ELSE 'relay-7d9f-2' END
		  WHERE aggregate_sequence > 1 OR aggregate_id LIKE '%-100_' AND aggregate_id NOT IN ('order-1001', 'invoice-1003', 'shipment-1005', 'customer-1002')`,
		`UPDATE ` + tbl + ` SET published_at = NULL, claimed_by = NULL WHERE aggregate_id IN ('order-1001', 'invoice-1003', 'shipment-1005', 'customer-1002')`,
		`UPDATE ` + tbl + ` SET claimed_by = 'relay-7d9f-1', claim_until = now() + interval '30 seconds' WHERE aggregate_id = 'customer-1002'`,
		`UPDATE ` + tbl + ` SET occurred_at = coalesce(published_at - interval '40 milliseconds', now() - interval '3 minutes' - aggregate_sequence * interval '7 seconds')`,
	} {
		_, err := e.Pool.Exec(ctx0, q)
		pgtest.Must(t, err, "seed")
	}
	var heads []pgoutbox.UUID
	for _, agg := range []string{"order-1001", "invoice-1003", "shipment-1005"} {
		var id pgoutbox.UUID
		pgtest.Must(t, e.Pool.QueryRow(ctx0, "SELECT event_id FROM "+tbl+" WHERE aggregate_id = $1 ORDER BY aggregate_sequence LIMIT 1", agg).Scan(&id), "head")
		heads = append(heads, id)
	}
	e.Quarantine(heads[0], `nats: maximum payload exceeded (1048576 bytes)`)
	e.Quarantine(heads[1], `kafka: INVALID_RECORD: schema registry rejected subject "invoice-value" version 7`)
	e.Quarantine(heads[2], `webhook: 422 Unprocessable Entity: {"error":"unknown carrier"}`)
	_, err := e.Pool.Exec(ctx0, "UPDATE "+tbl+` SET headers = '{"traceparent":"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01","x-tenant":"acme","authorization":"Bearer eyJhbGciOi...","x-api-key":"k-123"}' WHERE event_id = $1`, heads[0])
	pgtest.Must(t, err, "headers")
	// An audit trail.
	a := e.Admin
	_, err = a.RetryEvents(ctx0, admin.RetryRequest{IDs: []pgoutbox.UUID{heads[2]}, Reason: "carrier list fixed", Actor: "console:alice"})
	pgtest.Must(t, err, "retry")
	e.Quarantine(heads[2], `webhook: 422 Unprocessable Entity: {"error":"unknown carrier"}`)

	ctx := browser(t, basicAuth("alice", e.AliceKey))
	pages := []struct{ name, path, sel string }{
		{"overview", "/", "#pending"},
		{"lanes", "/lanes", "#lanes"},
		{"dead-letters", "/dlq", "#dead-letters"},
		{"event", "/event?id=" + heads[0].String(), "#payload"},
		{"replay", "/replay?preview=1&aggregate_type=order&since=2h", "#preview-result"},
		{"relays", "/relays", "#relays-seen"},
		{"audit", "/audit", "#audit"},
	}
	for _, p := range pages {
		sep := "?"
		if strings.Contains(p.path, "?") {
			sep = "&"
		}
		run(t, ctx, p.name, navigate(e.Server.URL+p.path+sep+"schema="+e.Schema, p.sel)...)
		screenshot(t, ctx, p.name)
	}
}

// An operator previews a replay and runs it; the form sent twice at once, sent
// again, and its result page reloaded publish the events once; the result
// page shows the recorded outcome each time, and a crafted link no notice.
// A right-to-left override in an event shows as an escape.
func TestBrowserReplayOnceAndTruthfulNotices(t *testing.T) {
	t.Parallel()
	pub := &null.Publisher{}
	e := consoletest.New(t, func(c *adminhttp.Config) { c.Publisher, c.Destination = pub, "null://" })
	ids := e.Enqueue("order", "o-1", 3, map[string]string{"note": "invoice\u202egpj.exe"})
	_, err := e.Pool.Exec(context.Background(), "UPDATE "+e.Table("outbox_events")+" SET published_at = now()")
	pgtest.Must(t, err, "publish")
	ctx := browser(t, basicAuth("alice", e.AliceKey))
	base := e.Server.URL

	run(t, ctx, "preview", navigate(base+"/replay?preview=1&aggregate_type=order&schema="+e.Schema, "#run-replay")...)
	run(t, ctx, "reason", chromedp.SendKeys(chromedp.CSS("#replay-reason"), "consumer rebuilt"))
	statuses := eval[string](t, ctx, `(() => { const f = document.querySelector("#run-replay");
		const send = () => fetch(f.action, {method: "POST", body: new URLSearchParams(new FormData(f))}).then(r => r.status);
		return Promise.all([send(), send()]).then(s => s.sort().join(",")); })()`)
	if statuses != "200,200" && statuses != "200,409" {
		t.Errorf("the form sent twice at once: %s", statuses)
	}
	run(t, ctx, "send it again", chromedp.Click(chromedp.CSS("#replay-run")))
	waitJS(t, ctx, "the result page", `document.querySelector("#replay-result") !== null`, 20*time.Second)
	for i := range 2 {
		if n := text(t, ctx, ".notice"); !strings.Contains(n, "Replayed: 3 of 3") {
			t.Errorf("result page (%d): notice %q", i, n)
		}
		run(t, ctx, "reload", chromedp.Reload(), chromedp.WaitVisible(chromedp.CSS("#replay-result")))
	}
	if pub.Published() != 3 {
		t.Errorf("published %d, want 3: the replay ran more than once", pub.Published())
	}
	entries, err := e.Admin.Audit(context.Background(), 10)
	pgtest.Must(t, err, "audit")
	if len(entries) != 1 || entries[0].Action != admin.ActionReplay || entries[0].Reason != "consumer rebuilt" {
		t.Errorf("audit: %+v", entries)
	}

	for _, p := range []string{"/dlq?done=skip&n=5&schema=" + e.Schema, "/replay?result=forged&schema=" + e.Schema} {
		run(t, ctx, p, navigate(base+p, "main")...)
		if n := eval[int](t, ctx, `document.querySelectorAll(".notice, #replay-result").length`); n != 0 {
			t.Errorf("%s shows a notice", p)
		}
	}
	run(t, ctx, "event", navigate(base+"/event?schema="+e.Schema+"&id="+ids[0].String(), "#payload")...)
	if !eval[bool](t, ctx, `document.querySelector("#payload").textContent.indexOf("invoice\\u202egpj.exe") >= 0 &&
		document.body.innerText.indexOf("\u202e") < 0`) {
		t.Errorf("the override is not shown as an escape: %s", text(t, ctx, "#payload"))
	}
}
