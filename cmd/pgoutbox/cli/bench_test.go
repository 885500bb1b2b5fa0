package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/pgoutbox/pgoutbox/internal/bench"
	"github.com/pgoutbox/pgoutbox/internal/natstest"
	"github.com/pgoutbox/pgoutbox/internal/pgtest"
)

// Every scenario at toy sizes through the real binary (relays as its subprocesses):
// the JSON holds every figure, and the figures are consistent with what was asked
// (all events published and on the stream, one latency sample per offered event).
// On a server with wal_level = logical (CI's) the default sources include CDC: its
// drain and latency rows pass the same checks, and no slot or publication of the
// run is left behind.
func TestBenchAllScenariosSmall(t *testing.T) {
	t.Parallel()
	admin := pgtest.Pool(t, pgtest.URL(), 2)
	var walLevel string
	pgtest.Must(t, admin.QueryRow(context.Background(), "SHOW wal_level").Scan(&walLevel), "wal_level")
	withCDC := walLevel == "logical"
	dir := t.TempDir()
	jsonFile, report := filepath.Join(dir, "bench.json"), filepath.Join(dir, "bench.html")
	const events, offered = 2000, 100 // offered = rate × duration
	// A database of its own: logical decoding reads every change of its database,
	// and a table that another package's test creates while a CDC run's slot builds
	// its snapshot can make the slot's decoding fail for good ("could not map
	// filenode"); changes of other databases are skipped before that lookup.
	cmd := exec.Command(binary, "bench", "--database-url", pgtest.Database(t),
		"--scenario", "drain,enqueue,idle,history,latency", "--events", "2000", "--aggregates", "50",
		"--relays", "1,2", "--broker", "null,"+natstest.URL(), "--duration", "500ms", "--rate", "200",
		"--poll-interval", "500ms", "--idle-duration", "2s", "--history-rows", "20000", "--history-trials", "3",
		"--enqueue-rounds", "2", "--json", jsonFile, "--report", report)
	cmd.Env = os.Environ()
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	start := time.Now()
	if err := cmd.Run(); err != nil {
		t.Fatalf("bench: %v\nstdout:\n%s\nstderr:\n%s", err, stdout.String(), stderr.String())
	}
	t.Logf("bench took %s:\n%s", time.Since(start).Round(time.Millisecond), stdout.String())
	for _, want := range []string{"drain:", "enqueue:", "latency:", "idle:", "history:", "targets"} {
		if !strings.Contains(stdout.String(), want) {
			t.Errorf("stdout lacks %q", want)
		}
	}
	if !strings.Contains(stderr.String(), "bench: drain") {
		t.Errorf("no progress lines on stderr (not a terminal):\n%s", stderr.String())
	}

	raw, err := os.ReadFile(jsonFile)
	pgtest.Must(t, err, "read JSON")
	var res bench.Result
	pgtest.Must(t, json.Unmarshal(raw, &res), "decode JSON")
	if len(res.Errors) > 0 {
		t.Fatalf("scenario errors: %+v", res.Errors)
	}
	if res.Context.CPUs < 1 || res.Context.PostgreSQL == "" || res.Context.GoVersion == "" || res.Settings.Events != events {
		t.Errorf("context/settings incomplete: %+v %+v", res.Context, res.Settings)
	}
	if len(res.ScenarioCPU) != 5 || !strings.Contains(stdout.String(), "machine CPU during each scenario") { // the tests run on Linux
		t.Errorf("scenario CPU shares %+v", res.ScenarioCPU)
	}
	for s, sh := range res.ScenarioCPU {
		if sh.BusyPct <= 0 || sh.BusyPct > 100 || sh.StealPct < 0 || sh.BusyPct+sh.StealPct > 100.01 {
			t.Errorf("%s: CPU share %+v", s, sh)
		}
	}
	checkRSS := func(what string, rs []bench.RelayRSS, want int) {
		t.Helper()
		if len(rs) != want {
			t.Errorf("%s: %d RSS figures, want %d", what, len(rs), want)
		}
		for _, r := range rs {
			if r.PeakRSSBytes < 1<<20 || r.PeakRSSBytes > 4<<30 {
				t.Errorf("%s: relay %s peak RSS %d bytes is not plausible", what, r.ID, r.PeakRSSBytes)
			}
		}
	}

	if withCDC != slices.Contains(res.Settings.Sources, bench.SourceCDC) {
		t.Errorf("wal_level %s, sources %v: want cdc exactly when logical", walLevel, res.Settings.Sources)
	}
	if !withCDC && !slices.ContainsFunc(res.Context.Notes, func(n string) bool { return strings.Contains(n, "no CDC rows") }) {
		t.Errorf("wal_level %s: no note that CDC was left out: %v", walLevel, res.Context.Notes)
	}
	var slots []string // every slot the run created

	d := res.Drain
	wantRuns := 4
	if withCDC {
		wantRuns = 6
	}
	if d == nil || len(d.Runs) != wantRuns {
		t.Fatalf("drain: want %d runs (2 brokers × 1, 2 polling relays, and 1 CDC relay if logical), got %+v", wantRuns, d)
	}
	cdcDrains := 0
	if d.CeilingEventsPerSec <= 0 || len(d.Ceiling) < 3 {
		t.Errorf("drain ceiling: %+v", d.Ceiling)
	}
	for _, r := range d.Runs {
		if r.Published != events || r.EventsPerSec <= 0 || r.RatioToCeiling <= 0 || len(r.Series) == 0 ||
			r.Series[len(r.Series)-1].Published != events {
			t.Errorf("drain run %+v", r)
		}
		if r.Broker != "null" && r.BrokerMessages != events {
			t.Errorf("drain to %s: %d distinct events on the stream, want %d", r.Broker, r.BrokerMessages, events)
		}
		checkRSS("drain", r.RelayRSS, r.Relays)
		switch r.Source {
		case bench.SourcePoll:
		case bench.SourceCDC:
			cdcDrains++
			if r.Relays != 1 || r.CDCSlot == "" {
				t.Errorf("CDC drain run: %d relays, slot %q; want 1 relay and its slot", r.Relays, r.CDCSlot)
			}
			slots = append(slots, r.CDCSlot)
		default:
			t.Errorf("drain run with source %q", r.Source)
		}
	}
	if withCDC && cdcDrains != 2 {
		t.Errorf("%d CDC drain runs, want one per broker", cdcDrains)
	}

	e := res.Enqueue
	if e == nil || len(e.Cells) != 12 || e.Rounds != 2 {
		t.Fatalf("enqueue: want 12 cells in 2 rounds, got %+v", e)
	}
	batched, floor := 0, 0
	for _, c := range e.Cells {
		if c.Batched {
			batched++
		}
		if c.Floor {
			floor++
		}
	}
	if batched != 2 || floor != 2 {
		t.Errorf("enqueue: %d batched and %d floor cells, want one of each at 1 and at 16 producers", batched, floor)
	}
	for _, c := range e.Cells {
		if c.Commits < 1 || c.CommitsPerSec <= 0 || c.P50Ms <= 0 || c.P99Ms < c.P50Ms || len(c.RoundCommitsPerSec) != 2 {
			t.Errorf("enqueue cell %+v", c)
		}
	}
	rt := e.Ratios
	for name, v := range map[string]float64{"outbox_time_ratio_1": rt.OutboxTimeRatio1, "outbox_time_ratio_16": rt.OutboxTimeRatio16,
		"batched_time_ratio_1": rt.BatchedTimeRatio1, "batched_time_ratio_16": rt.BatchedTimeRatio16,
		"floor_time_ratio_1": rt.FloorTimeRatio1, "floor_time_ratio_16": rt.FloorTimeRatio16} {
		if rg, ok := rt.Ranges[name]; v <= 0 || !ok || v < rg[0] || v > rg[1] {
			t.Errorf("enqueue ratio %s = %v, range %v (%v)", name, v, rg, ok)
		}
	}
	checkRSS("enqueue", e.RelayRSS, 1)

	l := res.Latency
	if l == nil || len(l.Runs) < 2 || l.Runs[0].Mode != "notify" || l.Runs[1].Mode != "poll" {
		t.Fatalf("latency: %+v", l)
	}
	if withCDC {
		if len(l.Runs) != 3 || l.Runs[2].Mode != bench.SourceCDC || l.Runs[2].Source != bench.SourceCDC || l.Runs[2].CDCSlot == "" {
			t.Fatalf("latency: want notify, poll and cdc runs, got %+v", l.Runs)
		}
		slots = append(slots, l.Runs[2].CDCSlot)
	} else if len(l.Runs) != 2 {
		t.Fatalf("latency: want notify and poll runs, got %+v", l.Runs)
	}
	for _, r := range l.Runs {
		var n int64
		for _, b := range r.Histogram {
			n += b.Count
		}
		if r.Offered != offered || r.Received != r.Offered || n != int64(r.Offered) {
			t.Errorf("latency %s: offered %d, received %d, histogram holds %d; want %d each", r.Mode, r.Offered, r.Received, n, offered)
		}
		if !(r.P50Ms <= r.P90Ms && r.P90Ms <= r.P99Ms && r.P99Ms <= r.MaxMs) || r.MaxMs <= 0 {
			t.Errorf("latency %s percentiles out of order: %+v", r.Mode, r)
		}
		checkRSS("latency", r.RelayRSS, 1)
	}

	i := res.Idle
	if i == nil || i.Seconds < 2 || i.Queries < 1 || i.QueriesPerSec <= 0 {
		t.Errorf("idle: a relay polling every 500ms sent no query? %+v", i)
	} else {
		checkRSS("idle", i.RelayRSS, 1)
	}

	h := res.History
	if h == nil || len(h.Phases) != 2 || h.Phases[0].KeptRows != 0 || h.Phases[1].KeptRows != 20000 {
		t.Fatalf("history: %+v", h)
	}
	for _, p := range h.Phases {
		if p.Events != 3*10 || p.P50Ms <= 0 || p.MaxMs < p.P50Ms {
			t.Errorf("history phase %+v", p)
		}
		checkRSS("history", p.RelayRSS, 1)
	}
	if h.Phases[1].TableMiB <= h.Phases[0].TableMiB || h.RatioP50 <= 0 {
		t.Errorf("history: table sizes %.1f → %.1f MiB, ratio %.2f", h.Phases[0].TableMiB, h.Phases[1].TableMiB, h.RatioP50)
	}
	if len(res.Targets) < 8 {
		t.Errorf("targets: %+v", res.Targets)
	}
	for _, tg := range res.Targets {
		if strings.Contains(tg.Name, "CDC") || strings.Contains(tg.Name, "cdc") {
			t.Errorf("target %+v: targets are the polling relay's", tg)
		}
	}

	// No replication slot (it would retain WAL for ever) nor publication is left.
	for _, slot := range slots {
		var left int
		pgtest.Must(t, admin.QueryRow(context.Background(), `SELECT (SELECT count(*) FROM pg_replication_slots WHERE slot_name = $1)
     + (SELECT count(*) FROM pg_publication WHERE pubname = $1)`, slot).Scan(&left), "look for slot %s", slot)
		if left != 0 {
			t.Errorf("slot or publication %s left behind", slot)
		}
	}
	if withCDC {
		for _, want := range []string{"CDC stream", "cdc"} {
			if !strings.Contains(stdout.String(), want) {
				t.Errorf("stdout lacks %q", want)
			}
		}
	}

	// The tables can be printed again from the JSON alone.
	out, errOut, code := run(t, "bench", "--from-json", jsonFile)
	if code != 0 || out != stdout.String() {
		t.Errorf("--from-json: code %d, stderr %q; stdout differs from the run's:\n%s", code, errOut, out)
	}

	page, err := os.ReadFile(report)
	pgtest.Must(t, err, "read report")
	wantPage := []string{"<svg", "Throughput over time", "Latency histogram", "Business transactions", "At a glance"}
	if withCDC {
		wantPage = append(wantPage, "CDC stream", "CDC, 1 relay", "null CDC")
	}
	for _, want := range wantPage {
		if !bytes.Contains(page, []byte(want)) {
			t.Errorf("report lacks %q", want)
		}
	}
	for _, bad := range []string{"<script src", "<link ", "src=\"http", "url(http"} {
		if bytes.Contains(page, []byte(bad)) {
			t.Errorf("report is not self-contained: has %q", bad)
		}
	}
}

func TestBenchUsageErrors(t *testing.T) {
	t.Parallel()
	cases := []struct {
		args []string
		want string
	}{
		{[]string{"bench", "--database-url", "postgres://x@127.0.0.1:1/db", "--scenario", "drain,nope"}, `--scenario "nope"`},
		{[]string{"bench", "--database-url", "postgres://x@127.0.0.1:1/db", "--events", "10", "--aggregates", "20"}, "--aggregates 20"},
		{[]string{"bench", "--database-url", "postgres://x@127.0.0.1:1/db", "--relays", "0"}, "--relays 0"},
		{[]string{"bench", "--database-url", "postgres://x@127.0.0.1:1/db", "--duration", "0s"}, "--duration must be positive"},
		{[]string{"bench", "--database-url", "postgres://x@127.0.0.1:1/db", "--sources", "poll,wal"}, `--sources "wal"`},
	}
	for _, tc := range cases {
		_, errOut, code := run(t, tc.args...)
		if code != exitUsage || !strings.Contains(errOut, tc.want) || strings.Count(errOut, "\n") != 1 {
			t.Errorf("%v: code %d, stderr %q; want exit %d and one line with %q", tc.args, code, errOut, exitUsage, tc.want)
		}
	}
}
