package adminhttp_test

import (
	"net/http"
	"regexp"
	"testing"
)

// overviewBudget is the most the overview may weigh, page and assets: it is
// read on a phone over a VPN at 3 a.m.
const overviewBudget = 64 << 10

// The overview's weight: its HTML and every asset it links (no CDN, no other
// request), within the budget. The figure is logged for docs/console.md.
func TestOverviewPageWeight(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	e.enqueue("order", "o1", 3, map[string]int{"n": 1})
	page := e.get("/?schema=" + e.schema)
	total := len(page.body)
	assets := regexp.MustCompile(`(?:href|src)="(/static/[^"]+)"`).FindAllStringSubmatch(page.body, -1)
	if len(assets) != 2 {
		t.Fatalf("the overview links %d assets, want the style sheet and the script: %v", len(assets), assets)
	}
	for _, m := range assets {
		a := e.get(m[1])
		if a.status != http.StatusOK {
			t.Fatalf("%s: %d", m[1], a.status)
		}
		total += len(a.body)
	}
	if regexp.MustCompile(`(?i)(?:href|src)="(?:https?:)?//`).MatchString(page.body) {
		t.Errorf("the overview loads something from another host")
	}
	t.Logf("overview page weight: %d bytes (HTML %d, assets %d)", total, len(page.body), total-len(page.body))
	if total > overviewBudget {
		t.Errorf("the overview weighs %d bytes, over its budget of %d", total, overviewBudget)
	}
}
