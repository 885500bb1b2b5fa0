package deploy

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"go.yaml.in/yaml/v3"

	"github.com/pgoutbox/pgoutbox/broker/brokertest"
	"github.com/pgoutbox/pgoutbox/cdc"
	"github.com/pgoutbox/pgoutbox/cdc/cdcprom"
	"github.com/pgoutbox/pgoutbox/inbox/inboxprom"
	"github.com/pgoutbox/pgoutbox/internal/systool"
	"github.com/pgoutbox/pgoutbox/relay/relayprom"
)

const (
	alertsFile     = "prometheus/alerts.yml"
	alertTestsFile = "prometheus/alerts_test.yml"
	dashboardFile  = "grafana/pgoutbox.json"
	operationsDoc  = "../docs/operations.md"
	// runbookBase is where the alerts' runbook_url annotations point: the
	// "Alert rules" entries of docs/operations.md on the main branch.
	runbookBase = "https://github.com/pgoutbox/pgoutbox/blob/main/docs/operations.md#"
)

// promtool runs promtool with args and fails t, showing its output, when it
// exits non-zero.
func promtool(t *testing.T, args ...string) string {
	t.Helper()
	bin := systool.Need(t, systool.Promtool)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, bin, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

func TestPromtoolCheckRules(t *testing.T) {
	t.Parallel()
	out := promtool(t, "check", "rules", alertsFile)
	if !strings.Contains(out, "SUCCESS") {
		t.Fatalf("promtool check rules did not report SUCCESS:\n%s", out)
	}
}

func TestPromtoolTestRules(t *testing.T) {
	t.Parallel()
	out := promtool(t, "test", "rules", alertTestsFile)
	if !strings.Contains(out, "SUCCESS") {
		t.Fatalf("promtool test rules did not report SUCCESS:\n%s", out)
	}
}

type ruleFile struct {
	Groups []struct {
		Name  string `yaml:"name"`
		Rules []rule `yaml:"rules"`
	} `yaml:"groups"`
}

type rule struct {
	Alert       string            `yaml:"alert"`
	Record      string            `yaml:"record"`
	Expr        string            `yaml:"expr"`
	For         string            `yaml:"for"`
	Labels      map[string]string `yaml:"labels"`
	Annotations map[string]string `yaml:"annotations"`
}

func readYAML(t *testing.T, path string, v any) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(b, v); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
}

func alertRules(t *testing.T) []rule {
	t.Helper()
	var f ruleFile
	readYAML(t, alertsFile, &f)
	var rules []rule
	for _, g := range f.Groups {
		rules = append(rules, g.Rules...)
	}
	if len(rules) == 0 {
		t.Fatalf("%s has no rules", alertsFile)
	}
	return rules
}

// TestAlertRulesShape checks what promtool does not: every alert waits (for:),
// has a severity, a summary, a description and a runbook entry that exists in
// docs/operations.md.
func TestAlertRulesShape(t *testing.T) {
	t.Parallel()
	doc, err := os.ReadFile(operationsDoc)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for _, r := range alertRules(t) {
		if r.Alert == "" {
			t.Errorf("a rule without an alert name (record %q): alerts.yml holds alerts only", r.Record)
			continue
		}
		if seen[r.Alert] {
			t.Errorf("%s: defined twice", r.Alert)
		}
		seen[r.Alert] = true
		if d, err := time.ParseDuration(r.For); err != nil || d <= 0 {
			t.Errorf("%s: for: %q, want a positive duration", r.Alert, r.For)
		}
		if s := r.Labels["severity"]; s != "critical" && s != "warning" {
			t.Errorf("%s: severity %q, want critical or warning", r.Alert, s)
		}
		for _, a := range []string{"summary", "description"} {
			if strings.TrimSpace(r.Annotations[a]) == "" {
				t.Errorf("%s: no %s annotation", r.Alert, a)
			}
		}
		wantURL := runbookBase + strings.ToLower(r.Alert)
		if got := r.Annotations["runbook_url"]; got != wantURL {
			t.Errorf("%s: runbook_url %q, want %q", r.Alert, got, wantURL)
		}
		// GitHub's anchor of the heading "### <Alert>" is the lower-cased name.
		if !regexp.MustCompile(`(?m)^### ` + regexp.QuoteMeta(r.Alert) + `\s*$`).Match(doc) {
			t.Errorf("%s: %s has no heading %q for its runbook_url", r.Alert, operationsDoc, "### "+r.Alert)
		}
	}
}

// TestEveryAlertHasBothCases checks that alerts_test.yml has, for every alert,
// a case where it fires and one where it stays quiet, and no case for an
// alert that does not exist (promtool would pass a test of a deleted alert
// that expects nothing).
func TestEveryAlertHasBothCases(t *testing.T) {
	t.Parallel()
	var f struct {
		RuleFiles []string `yaml:"rule_files"`
		Tests     []struct {
			AlertRuleTest []struct {
				Alertname string `yaml:"alertname"`
				ExpAlerts []any  `yaml:"exp_alerts"`
			} `yaml:"alert_rule_test"`
		} `yaml:"tests"`
	}
	readYAML(t, alertTestsFile, &f)
	if !slices.Equal(f.RuleFiles, []string{"alerts.yml"}) {
		t.Errorf("rule_files %q, want [alerts.yml]", f.RuleFiles)
	}
	fires, quiet := map[string]int{}, map[string]int{}
	for _, tc := range f.Tests {
		for _, a := range tc.AlertRuleTest {
			if len(a.ExpAlerts) > 0 {
				fires[a.Alertname]++
			} else {
				quiet[a.Alertname]++
			}
		}
	}
	alerts := map[string]bool{}
	for _, r := range alertRules(t) {
		alerts[r.Alert] = true
		if fires[r.Alert] == 0 {
			t.Errorf("%s: no test case where it fires", r.Alert)
		}
		if quiet[r.Alert] == 0 {
			t.Errorf("%s: no test case where it stays quiet", r.Alert)
		}
		t.Logf("%s: %d firing, %d quiet cases", r.Alert, fires[r.Alert], quiet[r.Alert])
	}
	for name := range mergeKeys(fires, quiet) {
		if !alerts[name] {
			t.Errorf("%s is tested but is not an alert of %s", name, alertsFile)
		}
	}
}

func mergeKeys(ms ...map[string]int) map[string]bool {
	out := map[string]bool{}
	for _, m := range ms {
		for k := range m {
			out[k] = true
		}
	}
	return out
}

// recordingRegisterer registers on a registry and notes the name of every
// metric each collector describes, and which are histograms.
type recordingRegisterer struct {
	reg        *prometheus.Registry
	names      map[string]bool
	histograms map[string]bool
}

var fqNameRE = regexp.MustCompile(`fqName: "([^"]+)"`)

func (r *recordingRegisterer) Register(c prometheus.Collector) error {
	if err := r.reg.Register(c); err != nil {
		return err
	}
	ch := make(chan *prometheus.Desc)
	go func() {
		c.Describe(ch)
		close(ch)
	}()
	for d := range ch {
		m := fqNameRE.FindStringSubmatch(d.String())
		if m == nil {
			panic(fmt.Sprintf("no fqName in %s", d))
		}
		r.names[m[1]] = true
		switch c.(type) {
		case prometheus.Histogram, *prometheus.HistogramVec:
			r.histograms[m[1]] = true
		}
	}
	return nil
}

func (r *recordingRegisterer) MustRegister(cs ...prometheus.Collector) {
	for _, c := range cs {
		if err := r.Register(c); err != nil {
			panic(err)
		}
	}
}

func (r *recordingRegisterer) Unregister(c prometheus.Collector) bool { return r.reg.Unregister(c) }

// exportedMetrics builds the real collectors of relayprom, cdc, cdcprom and
// inboxprom, the ones `pgoutbox relay` and consumers register, and returns the
// metric names they describe (and which are histograms). Nothing connects to a
// database: describing a collector reads nothing.
func exportedMetrics(t *testing.T) (names, histograms map[string]bool) {
	t.Helper()
	r := &recordingRegisterer{reg: prometheus.NewRegistry(), names: map[string]bool{}, histograms: map[string]bool{}}
	// A pool connects lazily: no connection is made here.
	pool, err := pgxpool.New(context.Background(), "postgres://postgres@127.0.0.1:5432/test")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	if _, err := relayprom.New(r); err != nil {
		t.Fatal(err)
	}
	outbox, err := relayprom.NewOutbox(pool, &relayprom.OutboxConfig{Health: func() error { return nil }})
	if err != nil {
		t.Fatal(err)
	}
	r.MustRegister(outbox)
	if _, err := cdcprom.New(r); err != nil {
		t.Fatal(err)
	}
	src, err := cdc.New(pool, &brokertest.Recorder{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	r.MustRegister(src.Collector())
	if _, err := inboxprom.New(r); err != nil {
		t.Fatal(err)
	}
	// Prometheus' own series of each scrape target.
	r.names["up"] = true
	return r.names, r.histograms
}

// resolve maps a name used in a query to the metric the code registers: a
// histogram's _bucket, _sum and _count series belong to it. ok is false for a
// name the code does not export.
func resolve(name string, names, histograms map[string]bool) (string, bool) {
	if names[name] && !histograms[name] {
		return name, true // a histogram is only queried through its series
	}
	for _, suffix := range []string{"_bucket", "_sum", "_count"} {
		if base, found := strings.CutSuffix(name, suffix); found && histograms[base] {
			return base, true
		}
	}
	return "", false
}

type dashboard struct {
	Title         string  `json:"title"`
	UID           string  `json:"uid"`
	SchemaVersion int     `json:"schemaVersion"`
	Panels        []panel `json:"panels"`
	Templating    struct {
		List []struct {
			Name  string `json:"name"`
			Type  string `json:"type"`
			Query any    `json:"query"`
		} `json:"list"`
	} `json:"templating"`
}

type panel struct {
	ID         int             `json:"id"`
	Type       string          `json:"type"`
	Title      string          `json:"title"`
	Datasource *datasource     `json:"datasource"`
	GridPos    *map[string]int `json:"gridPos"`
	Targets    []struct {
		RefID      string      `json:"refId"`
		Expr       string      `json:"expr"`
		Datasource *datasource `json:"datasource"`
	} `json:"targets"`
	Panels []panel `json:"panels"` // a collapsed row's
}

type datasource struct {
	Type string `json:"type"`
	UID  string `json:"uid"`
}

func readDashboard(t *testing.T) (dashboard, []panel) {
	t.Helper()
	b, err := os.ReadFile(dashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	if !json.Valid(b) {
		t.Fatalf("%s is not valid JSON", dashboardFile)
	}
	var d dashboard
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatalf("%s: %v", dashboardFile, err)
	}
	var flat []panel
	var walk func([]panel)
	walk = func(ps []panel) {
		for _, p := range ps {
			flat = append(flat, p)
			walk(p.Panels)
		}
	}
	walk(d.Panels)
	return d, flat
}

// grafanaSchemaVersion is the dashboard schema of Grafana 11.
const grafanaSchemaVersion = 39

func TestDashboardShape(t *testing.T) {
	t.Parallel()
	d, panels := readDashboard(t)
	if d.Title == "" || d.UID == "" {
		t.Errorf("title %q, uid %q: both needed", d.Title, d.UID)
	}
	if d.SchemaVersion < grafanaSchemaVersion {
		t.Errorf("schemaVersion %d, want at least %d", d.SchemaVersion, grafanaSchemaVersion)
	}
	hasDS := false
	for _, v := range d.Templating.List {
		if v.Name == "datasource" && v.Type == "datasource" && v.Query == "prometheus" {
			hasDS = true
		}
	}
	if !hasDS {
		t.Error(`no templating variable "datasource" of type datasource for prometheus`)
	}
	const dsRef = "${datasource}"
	ids := map[int]bool{}
	queries := 0
	for _, p := range panels {
		if ids[p.ID] {
			t.Errorf("panel %q: id %d used twice", p.Title, p.ID)
		}
		ids[p.ID] = true
		if p.GridPos == nil {
			t.Errorf("panel %q has no gridPos", p.Title)
		}
		if p.Type == "row" {
			continue
		}
		if p.Title == "" {
			t.Errorf("panel %d has no title", p.ID)
		}
		if p.Datasource == nil || p.Datasource.UID != dsRef {
			t.Errorf("panel %q: datasource %+v, want uid %q (no hard-coded datasource)", p.Title, p.Datasource, dsRef)
		}
		if len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
		for _, tg := range p.Targets {
			queries++
			if strings.TrimSpace(tg.Expr) == "" {
				t.Errorf("panel %q: target %s has no expression", p.Title, tg.RefID)
			}
			if tg.Datasource != nil && tg.Datasource.UID != dsRef {
				t.Errorf("panel %q: target %s datasource uid %q, want %q", p.Title, tg.RefID, tg.Datasource.UID, dsRef)
			}
		}
	}
	t.Logf("%d panels, %d queries", len(panels), queries)
}

// queriedMetrics returns every metric name the dashboard's and the rules'
// expressions use, each with where it is used.
func queriedMetrics(t *testing.T) map[string][]string {
	t.Helper()
	used := map[string][]string{}
	add := func(where, expr string) {
		names, err := metricNames(expr)
		if err != nil {
			t.Errorf("%s: %v in %q", where, err, expr)
			return
		}
		if len(names) == 0 {
			t.Errorf("%s: no metric in %q", where, expr)
		}
		for _, n := range names {
			used[n] = append(used[n], where)
		}
	}
	for _, r := range alertRules(t) {
		add("alert "+r.Alert, r.Expr)
	}
	_, panels := readDashboard(t)
	for _, p := range panels {
		for _, tg := range p.Targets {
			add(fmt.Sprintf("panel %q %s", p.Title, tg.RefID), tg.Expr)
		}
	}
	return used
}

// TestQueriedMetricsExist fails when a metric the dashboard or an alert uses is
// renamed or removed in the code.
func TestQueriedMetricsExist(t *testing.T) {
	t.Parallel()
	names, histograms := exportedMetrics(t)
	used := queriedMetrics(t)
	var list []string
	for n, where := range used {
		base, ok := resolve(n, names, histograms)
		if !ok {
			t.Errorf("%s is not a metric the code exports (used by %s)", n, strings.Join(where, ", "))
			continue
		}
		list = append(list, base)
	}
	sort.Strings(list)
	t.Logf("%d metric names used, all exported: %s", len(used), strings.Join(slices.Compact(list), " "))
}

// dashboardOmits are exported metrics the dashboard deliberately leaves out.
var dashboardOmits = map[string]string{
	// cdc.Source's Collector counters repeat cdcprom's (published, failures,
	// quarantined), which the dashboard shows by reason.
	"pgoutbox_cdc_events_published_total":   "same as pgoutbox_cdc_published_total",
	"pgoutbox_cdc_publish_failures_total":   "pgoutbox_cdc_publish_failures_by_reason_total is shown",
	"pgoutbox_cdc_events_quarantined_total": "same as pgoutbox_cdc_quarantined_total",
}

// TestDashboardCoversExports fails when the code exports a metric no panel
// shows (a new metric needs a panel, or a reason in dashboardOmits).
func TestDashboardCoversExports(t *testing.T) {
	t.Parallel()
	names, histograms := exportedMetrics(t)
	_, panels := readDashboard(t)
	shown := map[string]bool{}
	for _, p := range panels {
		for _, tg := range p.Targets {
			ns, err := metricNames(tg.Expr)
			if err != nil {
				t.Fatal(err)
			}
			for _, n := range ns {
				if base, ok := resolve(n, names, histograms); ok {
					shown[base] = true
				}
			}
		}
	}
	for n := range names {
		if _, omitted := dashboardOmits[n]; !shown[n] && !omitted {
			t.Errorf("%s is exported but no dashboard panel shows it", n)
		}
	}
	for n := range dashboardOmits {
		if !names[n] {
			t.Errorf("dashboardOmits names %s, which the code no longer exports", n)
		}
	}
}

// PromQL words that are not metric names: binary and set operators, modifiers.
var promqlKeywords = map[string]bool{
	"and": true, "or": true, "unless": true, "bool": true, "offset": true,
	"inf": true, "nan": true, "atan2": true,
}

// Aggregation operators, which may take a by/without clause before their
// parenthesis.
var promqlAggregations = map[string]bool{
	"sum": true, "min": true, "max": true, "avg": true, "group": true, "stddev": true,
	"stdvar": true, "count": true, "count_values": true, "bottomk": true, "topk": true,
	"quantile": true, "limitk": true, "limit_ratio": true,
}

// Clauses whose parenthesis holds label names, not expressions.
var promqlLabelLists = map[string]bool{
	"by": true, "without": true, "on": true, "ignoring": true, "group_left": true, "group_right": true,
}

// metricNames returns the metric names a PromQL expression selects, in order
// of appearance and without repeats. It tokenizes: strings, label matchers
// ({…}), ranges and subqueries ([…]), numbers and durations, Grafana variables,
// function and aggregation names and the label lists of by/without/on/
// ignoring/group_left/group_right are not names; every other identifier is.
func metricNames(expr string) ([]string, error) {
	var names []string
	s := expr
	isIdentStart := func(c byte) bool { return c == '_' || c == ':' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' }
	isIdent := func(c byte) bool { return isIdentStart(c) || c >= '0' && c <= '9' }
	// skipString returns the index after the string literal starting at i.
	skipString := func(i int) (int, error) {
		q := s[i]
		for j := i + 1; j < len(s); j++ {
			switch {
			case s[j] == '\\' && q != '`':
				j++
			case s[j] == q:
				return j + 1, nil
			}
		}
		return 0, fmt.Errorf("unterminated string at %d", i)
	}
	// skipTo returns the index after the first close outside strings from i.
	skipTo := func(i int, close byte) (int, error) {
		for j := i; j < len(s); {
			switch s[j] {
			case '"', '\'', '`':
				k, err := skipString(j)
				if err != nil {
					return 0, err
				}
				j = k
			case close:
				return j + 1, nil
			default:
				j++
			}
		}
		return 0, fmt.Errorf("no %q after %d", close, i)
	}
	nextNonSpace := func(i int) int {
		for i < len(s) && (s[i] == ' ' || s[i] == '\t' || s[i] == '\n' || s[i] == '\r') {
			i++
		}
		return i
	}
	var err error
	for i := 0; i < len(s); {
		c := s[i]
		switch {
		case c == '"' || c == '\'' || c == '`':
			if i, err = skipString(i); err != nil {
				return nil, err
			}
		case c == '{':
			if i, err = skipTo(i+1, '}'); err != nil {
				return nil, err
			}
		case c == '[':
			if i, err = skipTo(i+1, ']'); err != nil {
				return nil, err
			}
		case c == '#':
			for i < len(s) && s[i] != '\n' {
				i++
			}
		case c == '$': // a Grafana variable
			i++
			for i < len(s) && isIdent(s[i]) {
				i++
			}
		case c >= '0' && c <= '9' || c == '.':
			for i < len(s) && (isIdent(s[i]) || s[i] == '.' || (s[i] == '+' || s[i] == '-') && (s[i-1] == 'e' || s[i-1] == 'E')) {
				i++
			}
		case isIdentStart(c):
			j := i
			for j < len(s) && isIdent(s[j]) {
				j++
			}
			word := s[i:j]
			next := nextNonSpace(j)
			lower := strings.ToLower(word)
			switch {
			case promqlLabelLists[lower] && next < len(s) && s[next] == '(':
				if j, err = skipTo(next+1, ')'); err != nil {
					return nil, err
				}
			case next < len(s) && s[next] == '(', promqlKeywords[lower], promqlAggregations[lower]:
				// a function, an operator or an aggregation
			default:
				if !slices.Contains(names, word) {
					names = append(names, word)
				}
			}
			i = j
		default:
			i++
		}
	}
	return names, nil
}

func TestMetricNames(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		expr string
		want []string
	}{
		{`max(pgoutbox_relay_oldest_pending_age_seconds) > 300`, []string{"pgoutbox_relay_oldest_pending_age_seconds"}},
		{`sum by (reason) (rate(a_total{reason=~"permanent|error", x="}"}[5m])) > 0`, []string{"a_total"}},
		{`histogram_quantile(0.99, sum by (le, consumer) (rate(h_bucket{instance=~"$instance"}[$__rate_interval])))`, []string{"h_bucket"}},
		{"max(p) > 0\n  and on() (sum(rate(q[5m])) or vector(0)) == 0", []string{"p", "q"}},
		{`absent(up{job="pgoutbox-relay"} == 1)`, []string{"up"}},
		{`sum(rate(x_sum[1m])) / sum without (instance) (rate(x_count[1m])) > 1e9 unless y offset 5m`, []string{"x_sum", "x_count", "y"}},
		{`a * on (instance) group_left (version) b`, []string{"a", "b"}},
		{`deriv(max(t)[6h:5m]) > 0 # a comment naming not_a_metric`, []string{"t"}},
		{`sum (a) by (le)`, []string{"a"}},
		{`a{x="unterminated}`, nil},
	} {
		got, err := metricNames(tc.expr)
		if tc.want == nil {
			if err == nil {
				t.Errorf("metricNames(%q) = %q, want an error", tc.expr, got)
			}
			continue
		}
		if err != nil || !slices.Equal(got, tc.want) {
			t.Errorf("metricNames(%q) = %q, %v; want %q", tc.expr, got, err, tc.want)
		}
	}
}

// grafanaBuiltins are the variables Grafana defines itself.
var grafanaBuiltins = map[string]string{"__rate_interval": "5m", "__interval": "1m", "__range": "1h"}

// TestDashboardQueriesParse has promtool parse every dashboard expression (as
// a recording rule, the variables replaced by what Grafana would put there),
// and checks each variable an expression uses is defined.
func TestDashboardQueriesParse(t *testing.T) {
	t.Parallel()
	d, panels := readDashboard(t)
	defined := map[string]bool{}
	for _, v := range d.Templating.List {
		defined[v.Name] = true
	}
	varRE := regexp.MustCompile(`\$\{?([A-Za-z_][A-Za-z0-9_]*)\}?`)
	type recording struct {
		Record string `yaml:"record"`
		Expr   string `yaml:"expr"`
	}
	var rules []recording
	for _, p := range panels {
		for _, tg := range p.Targets {
			expr := varRE.ReplaceAllStringFunc(tg.Expr, func(m string) string {
				name := varRE.FindStringSubmatch(m)[1]
				if v, ok := grafanaBuiltins[name]; ok {
					return v
				}
				if !defined[name] {
					t.Errorf("panel %q %s: variable $%s is not defined in templating", p.Title, tg.RefID, name)
				}
				return ".*" // an "All" selection; every variable is used in a regex matcher
			})
			rules = append(rules, recording{Record: fmt.Sprintf("dashboard:panel%d:%s", p.ID, tg.RefID), Expr: expr})
		}
	}
	b, err := yaml.Marshal(map[string]any{"groups": []any{map[string]any{"name": "dashboard", "rules": rules}}})
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "dashboard_rules.yml")
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
	out := promtool(t, "check", "rules", path)
	if !strings.Contains(out, fmt.Sprintf("SUCCESS: %d rules found", len(rules))) {
		t.Fatalf("promtool check rules of the dashboard's %d expressions:\n%s", len(rules), out)
	}
}
