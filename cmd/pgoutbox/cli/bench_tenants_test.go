package cli

import (
	"bytes"
	"context"
	"crypto/rand"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/pgoutbox/pgoutbox/cmd/pgoutbox/internal/bench"
	"github.com/pgoutbox/pgoutbox/internal/natstest"
	"github.com/pgoutbox/pgoutbox/internal/pgtest"
)

// The tenants scenario at toy sizes through the real binary: every cell (a
// single-outbox relay, `relay --tenants` at each count, `relay --tenants-file`
// over two databases) idles, drains every event onto the stream, the fairness
// run sees every quiet event with and without the hot backlog, and the
// databases it made are gone afterwards.
func TestBenchTenantsSmall(t *testing.T) {
	t.Parallel()
	dbURL := pgtest.Database(t)
	admin := pgtest.Pool(t, dbURL, 2)
	dir := t.TempDir()
	jsonFile, report := filepath.Join(dir, "bench.json"), filepath.Join(dir, "bench.html")
	const events, rate, quiet = 1200, 10, 3 // quiet = the largest count − the hot tenant
	cmd := exec.Command(binary, "bench", "--database-url", dbURL, "--scenario", "tenants",
		"--tenant-counts", "4,1", "--events", "1200", "--aggregates", "40", "--broker", natstest.URL(),
		"--idle-duration", "2s", "--duration", "1s", "--tenant-rate", "10", "--poll-interval", "500ms",
		"--json", jsonFile, "--report", report)
	stdout, _ := benchRun(t, cmd)

	res := benchResult(t, jsonFile)
	if len(res.Errors) > 0 {
		t.Fatalf("scenario errors: %+v", res.Errors)
	}
	tr := res.Tenants
	if tr == nil || len(tr.Counts) != 2 || tr.Counts[0] != 1 || tr.Counts[1] != 4 {
		t.Fatalf("tenants: %+v", tr)
	}
	want := []bench.TenantCell{{Mode: "single", Tenants: 1, Databases: 1}, {Mode: "tenants", Tenants: 1, Databases: 1},
		{Mode: "tenants", Tenants: 4, Databases: 1}, {Mode: "tenants-file", Tenants: 4, Databases: 2}}
	if len(tr.Idle) != len(want) || len(tr.Drains) != len(want) {
		t.Fatalf("want %d idle cells and drains, got %+v and %+v", len(want), tr.Idle, tr.Drains)
	}
	var queries int64
	for i, c := range tr.Idle {
		if c.TenantCell != want[i] || c.Seconds < 2 || c.Queries < 0 || c.RSSMiB < 1 || c.RSSMiB > 4096 || c.PeakRSSMiB < c.RSSMiB {
			t.Errorf("idle cell %d: %+v, want %+v", i, c, want[i])
		}
		queries += c.Queries
	}
	if queries < 1 {
		t.Errorf("five relays polling every 500ms ran no query in their databases? %+v", tr.Idle)
	}
	for i, r := range tr.Drains {
		if r.TenantCell != want[i] || r.Events != events || r.Published != events || r.BrokerMessages != events ||
			r.EventsPerSec <= 0 || r.RatioToFewest <= 0 || r.RelayCPUPerEventUs <= 0 || r.PeakRSSMiB < 1 || len(r.RoundEventsPerSec) != 2 {
			t.Errorf("drain %d: %+v", i, r)
		}
	}
	if tr.ThroughputRatio <= 0 || tr.IdleRatio < 0 || tr.Broker == "" {
		t.Errorf("ratios: throughput %v, idle %v, broker %q", tr.ThroughputRatio, tr.IdleRatio, tr.Broker)
	}
	f := tr.Fairness
	if f == nil || f.Tenants != 4 || f.QuietTenants != quiet || f.HotBacklog != events || f.HotDrainSeconds <= 0 {
		t.Fatalf("fairness: %+v", f)
	}
	// Every offered quiet event was seen: all in the baseline, and split
	// between during and after the hot backlog in the second run.
	offered := rate * quiet // × 1 s
	if f.Baseline.Events != offered || f.Hot.Events+f.AfterHot != offered {
		t.Errorf("fairness: %d baseline events, %d + %d with the hot tenant; want %d each", f.Baseline.Events, f.Hot.Events, f.AfterHot, offered)
	}
	if f.Control.Events > offered || f.ControlDrainSeconds <= 0 {
		t.Errorf("fairness control: %+v, drained in %vs", f.Control, f.ControlDrainSeconds)
	}
	if b := f.Baseline; !(b.P50Ms > 0 && b.P50Ms <= b.P99Ms && b.P99Ms <= b.MaxMs) || f.RatioP50 < 0 || f.RatioP99 < 0 {
		t.Errorf("fairness percentiles: %+v", f)
	}

	// The databases the run made are gone.
	if len(tr.Databases) < 1+len(want)+1 { // the template, the cells' (5), the fairness run's
		t.Errorf("databases %v", tr.Databases)
	}
	for _, db := range tr.Databases {
		var n int
		pgtest.Must(t, admin.QueryRow(context.Background(), "SELECT count(*) FROM pg_database WHERE datname = $1", db).Scan(&n), "look for %s", db)
		if n != 0 || !strings.HasPrefix(db, "pgoutbox_bench_tenants_") {
			t.Errorf("database %s left behind (%d)", db, n)
		}
	}
	for _, want := range []string{"tenants: one relay process serving many outboxes", "4 tenants in 2 databases", "hot tenant draining", "quiet tenants' p99"} {
		if !strings.Contains(stdout, want) {
			t.Errorf("stdout lacks %q", want)
		}
	}
	page, err := os.ReadFile(report)
	pgtest.Must(t, err, "read report")
	if !bytes.Contains(page, []byte("Tenants: one relay process serving many outboxes")) {
		t.Error("the report has no tenants section")
	}
	// The tables can be printed again from the JSON alone.
	out, errOut, code := run(t, "bench", "--from-json", jsonFile)
	if code != 0 || out != stdout {
		t.Errorf("--from-json: code %d, stderr %q; stdout differs from the run's:\n%s", code, errOut, out)
	}
}

func TestBenchTenantsUsageErrors(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--tenant-counts", "0"}, "--tenant-counts 0"},
		{[]string{"--tenant-counts", "1,1001"}, "--tenant-counts 1001"},
		{[]string{"--tenant-rate", "0"}, "--tenant-rate must be positive"},
		{[]string{"--tenant-rate", "-1"}, "--tenant-rate -1"},
		{[]string{"--tenant-rate", "5000"}, "--tenant-rate 5000"},
	} {
		args := append([]string{"bench", "--database-url", "postgres://x@127.0.0.1:1/db", "--scenario", "tenants"}, tc.args...)
		_, errOut, code := run(t, args...)
		if code != exitUsage || !strings.Contains(errOut, tc.want) || strings.Count(errOut, "\n") != 1 {
			t.Errorf("%v: code %d, stderr %q; want exit %d and one line with %q", tc.args, code, errOut, exitUsage, tc.want)
		}
	}
}

// The tenants scenario shows no database password: not in its output, files,
// nor in the command line of any relay it starts (--tenants-file names the
// databases' URLs by url_env; the URLs travel in the relays' environment).
func TestBenchTenantsKeepsSecrets(t *testing.T) {
	t.Parallel()
	secret := "Zq" + strings.ToLower(rand.Text())
	u, err := url.Parse(pgtest.Database(t))
	pgtest.Must(t, err, "parse database URL")
	u.User = url.UserPassword(u.User.Username(), secret) // the server trusts: any password works
	dir := t.TempDir()
	jsonFile, report := filepath.Join(dir, "bench.json"), filepath.Join(dir, "bench.html")
	cmd := exec.Command(binary, "bench", "--scenario", "tenants", "--tenant-counts", "2", "--events", "200",
		"--aggregates", "10", "--broker", natstest.URL(), "--idle-duration", "1s", "--duration", "400ms",
		"--tenant-rate", "10", "--poll-interval", "500ms", "--json", jsonFile, "--report", report)
	cmd.Env = append(os.Environ(), "DATABASE_URL="+u.String())
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	pgtest.Must(t, cmd.Start(), "start bench")
	seen := map[int]string{}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	var runErr error
watch:
	for {
		for pid, cl := range childCmdlines(cmd.Process.Pid) {
			seen[pid] = cl
		}
		select {
		case runErr = <-done:
			break watch
		case <-time.After(5 * time.Millisecond):
		}
	}
	if runErr != nil {
		t.Fatalf("bench: %v\nstdout:\n%s\nstderr:\n%s", runErr, stdout.String(), stderr.String())
	}
	files := 0
	for _, cl := range seen {
		if strings.Contains(cl, "--tenants-file") {
			files++
		}
	}
	if files == 0 || len(seen) < 4 {
		t.Fatalf("saw %d relays, %d with --tenants-file: %v", len(seen), files, seen)
	}
	raw, err := os.ReadFile(jsonFile)
	pgtest.Must(t, err, "read JSON")
	page, err := os.ReadFile(report)
	pgtest.Must(t, err, "read report")
	outputs := map[string]string{"stdout": stdout.String(), "stderr": stderr.String(), "JSON": string(raw), "report": string(page)}
	for pid, cl := range seen {
		outputs["command line of "+strconv.Itoa(pid)] = cl
	}
	for what, out := range outputs {
		for _, form := range []string{secret, url.QueryEscape(secret)} {
			if strings.Contains(out, form) {
				t.Errorf("%s holds the password:\n%s", what, out)
			}
		}
	}
}
