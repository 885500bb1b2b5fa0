package adminhttp_test

import (
	"context"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/pgoutbox/pgoutbox/internal/pgtest"
)

// The overview, the relays page and the audit take range=1h, 24h or 7d (the
// JSON API too): a week shows what was published and audited two days ago,
// an hour does not; the charts of a week have an hourly bar. Any other range,
// hostile ones included, is a 400 that names the three and echoes nothing.
func TestTimeRanges(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	ctx := context.Background()
	ids := e.enqueue("twodays", "d1", 2, map[string]int{"n": 1})
	e.console.Published(ids[0], 48*time.Hour, "relay-of-tuesday")
	e.quarantine(ids[1], "boom")
	form := url.Values{"csrf": {e.csrfOf("alice", e.aliceKey)}, "once": {e.onceOf("/dlq?schema=" + e.schema)},
		"schema": {e.schema}, "id": {ids[1].String()}, "reason": {"the audit row of two days ago"}}
	if r := e.do("POST", "/dlq/skip", "alice", e.aliceKey, form, nil); r.status != http.StatusSeeOther {
		t.Fatalf("skip: %d %s", r.status, r.body)
	}
	_, err := e.pool.Exec(ctx, "UPDATE "+e.table("outbox_operator_audit")+" SET at = now() - interval '2 days'")
	pgtest.Must(t, err, "age the audit row")

	s := "?schema=" + e.schema
	first := time.Now() // before the first read of the week
	bars := regexp.MustCompile(`<rect class="bar"`)
	for _, c := range []struct {
		path, rng, want string
		shown           bool
	}{
		{"/", "", "<td>twodays</td>", false},
		{"/", "1h", "<td>twodays</td>", false},
		{"/", "24h", "<td>twodays</td>", false},
		{"/", "7d", "<td>twodays</td>", true},
		{"/relays", "1h", "relay-of-tuesday", false},
		{"/relays", "7d", "relay-of-tuesday", true},
		{"/audit", "", "the audit row of two days ago", true}, // no range: the newest 100, any time
		{"/audit", "1h", "the audit row of two days ago", false},
		{"/audit", "7d", "the audit row of two days ago", true},
	} {
		p := c.path + s
		if c.rng != "" {
			p += "&range=" + c.rng
		}
		r := e.get(p)
		if r.status != http.StatusOK || strings.Contains(r.body, c.want) != c.shown {
			t.Errorf("%s: status %d, %q shown %v, want %v", p, r.status, c.want, !c.shown, c.shown)
		}
		if !strings.Contains(r.body, `id="ranges"`) || !strings.Contains(r.body, `aria-current="true"`) {
			t.Errorf("%s: no range selector with the chosen range marked", p)
		}
		if c.path == "/" {
			n := len(bars.FindAllString(r.body, -1)) / 2 // two charts
			want := map[string][2]int{"": {61, 62}, "1h": {61, 62}, "24h": {97, 98}, "7d": {169, 170}}[c.rng]
			if n != want[0] && n != want[1] {
				t.Errorf("%s: %d bars a chart, want %v", p, n, want)
			}
			if c.rng == "7d" && !strings.Contains(r.body, "per-hour average), last week") {
				t.Errorf("%s: the chart's title does not say its range", p)
			}
		}
		if c.path == "/audit" && c.shown && !regexp.MustCompile(`<td class="when">4[78]h\d+m\d+s ago · <span class="muted">20\d\d-`).MatchString(r.body) {
			t.Errorf("%s: the audit row's time is not relative and absolute:\n%s", p, r.body)
		}
	}
	// A week's figures are read once a minute for every tab: an event published
	// since the first read of the week shows only after that minute.
	later := e.enqueue("laterweek", "l1", 1, map[string]int{"n": 1})
	e.console.Published(later[0], 72*time.Hour, "")
	if r := e.get("/" + s + "&range=7d"); strings.Contains(r.body, "<td>laterweek</td>") && time.Since(first) < time.Minute {
		t.Errorf("the week's figures were read again within the minute")
	}
	// The live refresh keeps the range.
	if r := e.get("/" + s + "&range=7d"); !strings.Contains(r.body, "partial=1&amp;range=7d") {
		t.Errorf("the live region's link drops the range")
	}

	var ov struct {
		Activity struct {
			Bucket  float64 `json:"Bucket"`
			Minutes []any   `json:"Minutes"`
		} `json:"activity"`
	}
	if st := e.apiGet("/api/v1/overview"+s+"&range=7d", "victor", e.victorKey, &ov); st != http.StatusOK ||
		ov.Activity.Bucket != 3600 || len(ov.Activity.Minutes) < 169 {
		t.Errorf("api overview 7d: %d, bucket %v, %d buckets", st, ov.Activity.Bucket, len(ov.Activity.Minutes))
	}
	var audit struct {
		Entries []any `json:"entries"`
	}
	for rng, want := range map[string]int{"1h": 0, "7d": 1} {
		if st := e.apiGet("/api/v1/audit"+s+"&range="+rng, "victor", e.victorKey, &audit); st != http.StatusOK || len(audit.Entries) != want {
			t.Errorf("api audit %s: %d, %d entries, want %d", rng, st, len(audit.Entries), want)
		}
	}

	hostile := []string{"", "2h", "1H", "7d ", "7d&range=1h", `"><script>window.__xss=1</script>`, "1h'--", "\u202e7d",
		strings.Repeat("7d", 4000), "%00", "-1h", "1e9h"}
	for _, path := range []string{"/", "/relays", "/audit", "/api/v1/overview", "/api/v1/audit", "/api/overview"} {
		for _, h := range hostile {
			q := s + "&range=" + url.QueryEscape(h)
			if h == "7d&range=1h" {
				q = s + "&range=7d&range=1h" // given twice
			}
			r := e.get(path + q)
			if r.status != http.StatusBadRequest || !strings.Contains(r.body, "range: must be 1h, 24h or 7d") {
				t.Errorf("%s range %.20q: %d\n%.300s", path, h, r.status, r.body)
			}
			if len(h) > 5 && strings.Contains(r.body, h) || strings.Contains(r.body, "<script>") || strings.Contains(r.body, "7d7d") {
				t.Errorf("%s range %.20q: the value is echoed", path, h)
			}
		}
	}
}
