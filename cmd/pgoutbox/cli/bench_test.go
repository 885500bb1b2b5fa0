package cli

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pgoutbox/pgoutbox/cmd/pgoutbox/internal/bench"
	"github.com/pgoutbox/pgoutbox/internal/natstest"
	"github.com/pgoutbox/pgoutbox/internal/pgtest"
)

// benchRun runs cmd, a bench through the binary, in this environment, and
// returns its output; it fails the test when the bench fails.
func benchRun(t *testing.T, cmd *exec.Cmd) (stdout, stderr string) {
	t.Helper()
	if cmd.Env == nil {
		cmd.Env = os.Environ()
	}
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	start := time.Now()
	if err := cmd.Run(); err != nil {
		t.Fatalf("bench: %v\nstdout:\n%s\nstderr:\n%s", err, out.String(), errOut.String())
	}
	t.Logf("bench took %s:\n%s", time.Since(start).Round(time.Millisecond), out.String())
	return out.String(), errOut.String()
}

// benchResult reads and decodes the JSON file a bench wrote.
func benchResult(t *testing.T, path string) bench.Result {
	t.Helper()
	raw, err := os.ReadFile(path)
	pgtest.Must(t, err, "read JSON")
	var res bench.Result
	pgtest.Must(t, json.Unmarshal(raw, &res), "decode JSON")
	return res
}

// Every scenario at toy sizes through the real binary (relays as its subprocesses):
// the JSON holds every figure, and the figures are consistent with what was asked
// (all events published and on the stream, one latency sample per offered event).
// It runs on the throwaway logical cluster, so the default sources include CDC:
// its drain and latency rows pass the same checks, and no slot or publication of
// the run is left behind.
func TestBenchAllScenariosSmall(t *testing.T) {
	t.Parallel()
	server := pgtest.Logical(t)
	admin := pgtest.Pool(t, server, 2)
	dir := t.TempDir()
	jsonFile, report := filepath.Join(dir, "bench.json"), filepath.Join(dir, "bench.html")
	const events, offered = 2000, 100 // offered = rate × duration
	// A database of its own: logical decoding reads every change of its database,
	// and a table that another package's test creates while a CDC run's slot builds
	// its snapshot can make the slot's decoding fail for good ("could not map
	// filenode"); changes of other databases are skipped before that lookup.
	cmd := exec.Command(binary, "bench", "--database-url", pgtest.DatabaseOn(t, server),
		"--scenario", "drain,enqueue,idle,history,latency", "--events", "2000", "--aggregates", "50",
		"--relays", "1,2", "--broker", "null,"+natstest.URL(), "--duration", "500ms", "--rate", "200",
		"--poll-interval", "500ms", "--idle-duration", "2s", "--history-rows", "20000", "--history-trials", "3",
		"--enqueue-rounds", "2", "--json", jsonFile, "--report", report)
	stdout, stderr := benchRun(t, cmd)
	for _, want := range []string{"drain:", "enqueue:", "latency:", "idle:", "history:", "targets"} {
		if !strings.Contains(stdout, want) {
			t.Errorf("stdout lacks %q", want)
		}
	}
	if !strings.Contains(stderr, "bench: drain") {
		t.Errorf("no progress lines on stderr (not a terminal):\n%s", stderr)
	}

	res := benchResult(t, jsonFile)
	if len(res.Errors) > 0 {
		t.Fatalf("scenario errors: %+v", res.Errors)
	}
	if res.Context.CPUs < 1 || res.Context.PostgreSQL == "" || res.Context.GoVersion == "" || res.Settings.Events != events {
		t.Errorf("context/settings incomplete: %+v %+v", res.Context, res.Settings)
	}
	if len(res.ScenarioCPU) != 5 || !strings.Contains(stdout, "machine CPU during each scenario") { // the tests run on Linux
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

	if !slices.Contains(res.Settings.Sources, bench.SourceCDC) {
		t.Errorf("sources %v: want cdc by default on a logical server", res.Settings.Sources)
	}
	var slots []string // every slot the run created

	d := res.Drain
	if d == nil || len(d.Runs) != 6 {
		t.Fatalf("drain: want 6 runs (2 brokers × 1, 2 polling relays, and 1 CDC relay), got %+v", d)
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
		// NATS runs have the broker ceiling beside the SQL one; the null broker has none.
		if (r.Broker != "null") != (r.BrokerCeilingEventsPerSec > 0 && r.CombinedCeilingEventsPerSec > 0 && r.RatioToCombined > 0) {
			t.Errorf("drain to %s: broker ceiling %v, combined %v, ratio %v", r.Broker, r.BrokerCeilingEventsPerSec, r.CombinedCeilingEventsPerSec, r.RatioToCombined)
		}
		if r.RelayCPUPerEventUs <= 0 {
			t.Errorf("drain to %s: relay CPU per event %v", r.Broker, r.RelayCPUPerEventUs)
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
	if cdcDrains != 2 {
		t.Errorf("%d CDC drain runs, want one per broker", cdcDrains)
	}

	e := res.Enqueue
	if e == nil || len(e.Cells) != 14 || e.Rounds != 2 {
		t.Fatalf("enqueue: want 14 cells in 2 rounds, got %+v", e)
	}
	batched, floor, watermill := 0, 0, 0
	for _, c := range e.Cells {
		if c.Batched {
			batched++
		}
		if c.Floor {
			floor++
		}
		if c.Watermill {
			watermill++
		}
	}
	if batched != 2 || floor != 2 || watermill != 2 {
		t.Errorf("enqueue: %d batched, %d floor and %d watermill-like cells, want one of each at 1 and at 16 producers", batched, floor, watermill)
	}
	for _, c := range e.Cells {
		if c.Commits < 1 || c.CommitsPerSec <= 0 || c.P50Ms <= 0 || c.P99Ms < c.P50Ms || len(c.RoundCommitsPerSec) != 2 {
			t.Errorf("enqueue cell %+v", c)
		}
	}
	rt := e.Ratios
	for name, v := range map[string]float64{"outbox_time_ratio_1": rt.OutboxTimeRatio1, "outbox_time_ratio_16": rt.OutboxTimeRatio16,
		"batched_time_ratio_1": rt.BatchedTimeRatio1, "batched_time_ratio_16": rt.BatchedTimeRatio16,
		"floor_time_ratio_1": rt.FloorTimeRatio1, "floor_time_ratio_16": rt.FloorTimeRatio16,
		"watermill_time_ratio_1": rt.WatermillTimeRatio1, "watermill_time_ratio_16": rt.WatermillTimeRatio16,
		"enqueue_vs_watermill_1": rt.EnqueueVsWatermill1, "enqueue_vs_watermill_16": rt.EnqueueVsWatermill16,
		"batched_vs_watermill_1": rt.BatchedVsWatermill1, "batched_vs_watermill_16": rt.BatchedVsWatermill16} {
		if rg, ok := rt.Ranges[name]; v <= 0 || !ok || v < rg[0] || v > rg[1] {
			t.Errorf("enqueue ratio %s = %v, range %v (%v)", name, v, rg, ok)
		}
	}
	checkRSS("enqueue", e.RelayRSS, 1)

	l := res.Latency
	if l == nil || len(l.Runs) < 2 || l.Runs[0].Mode != "notify" || l.Runs[1].Mode != "poll" {
		t.Fatalf("latency: %+v", l)
	}
	if len(l.Runs) != 3 || l.Runs[2].Mode != bench.SourceCDC || l.Runs[2].Source != bench.SourceCDC || l.Runs[2].CDCSlot == "" {
		t.Fatalf("latency: want notify, poll and cdc runs, got %+v", l.Runs)
	}
	slots = append(slots, l.Runs[2].CDCSlot)
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
	// The polling relay's targets are the polling relay's; the CDC source has its
	// own, against the polling relay in the same run (issue 19).
	cdcTargets := 0
	for _, tg := range res.Targets {
		switch {
		case strings.HasPrefix(tg.Name, "CDC drain / polling drain, 1 relay, "), strings.HasPrefix(tg.Name, "CDC latency p50 / NOTIFY's"),
			strings.HasPrefix(tg.Name, "CDC latency p99 / NOTIFY's"):
			cdcTargets++
		case strings.Contains(tg.Name, "CDC") || strings.Contains(tg.Name, "cdc"):
			t.Errorf("target %+v: targets other than the CDC comparisons are the polling relay's", tg)
		}
	}
	if cdcTargets != 4 { // drain to null and to NATS, latency p50 and p99
		t.Errorf("%d CDC targets, want 4: %+v", cdcTargets, res.Targets)
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
	for _, want := range []string{"CDC stream", "cdc"} {
		if !strings.Contains(stdout, want) {
			t.Errorf("stdout lacks %q", want)
		}
	}

	// The tables can be printed again from the JSON alone.
	out, errOut, code := run(t, "bench", "--from-json", jsonFile)
	if code != 0 || out != stdout {
		t.Errorf("--from-json: code %d, stderr %q; stdout differs from the run's:\n%s", code, errOut, out)
	}

	page, err := os.ReadFile(report)
	pgtest.Must(t, err, "read report")
	wantPage := []string{"<svg", "Throughput over time", "Latency histogram", "Business transactions", "At a glance",
		"CDC stream", "CDC, 1 relay", "null CDC"}
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

// The bench shows no credential anywhere: distinct random secrets planted in the
// database URL (password and sslpassword), NATS URLs (user:password and a bare
// token), a webhook URL (basic auth and a query token), its signing secret and a
// RabbitMQ URL whose wrong password makes the last drain fail (so an error text
// travels too) appear in no output, no file it writes, and no command line of a
// child process while it runs. A second run takes the database as a key=value DSN.
func TestBenchKeepsSecrets(t *testing.T) {
	t.Parallel()
	newSecret := func() string { return "Zq" + strings.ToLower(rand.Text()) }
	dbPass, dbSSLPass, natsPass, natsToken := newSecret(), newSecret(), newSecret(), newSecret()
	hookPass, hookToken, hookSecret, amqpPass := newSecret(), newSecret(), newSecret(), newSecret()
	secrets := []string{dbPass, dbSSLPass, natsPass, natsToken, hookPass, hookToken, hookSecret, amqpPass}

	var hooks atomic.Int64
	hook := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hooks.Add(1)
		body, _ := io.ReadAll(r.Body)
		_ = json.NewEncoder(w).Encode(map[string]any{"headers": r.Header, "body": string(body), "url": r.URL.String()})
	}))
	t.Cleanup(hook.Close)
	hookURL := strings.Replace(hook.URL, "http://", "http://hook:"+hookPass+"@", 1) + "/outbox?token=" + hookToken

	u, err := url.Parse(pgtest.DatabaseOn(t, pgtest.Logical(t))) // its sources include cdc
	pgtest.Must(t, err, "parse database URL")
	u.User = url.UserPassword(u.User.Username(), dbPass) // the server trusts: any password works
	q := u.Query()
	q.Set("sslpassword", dbSSLPass)
	u.RawQuery = q.Encode()
	nats, err := url.Parse(natstest.URL())
	pgtest.Must(t, err, "parse NATS URL")

	runBench := func(dbURL string, brokers []string, sources string, wantFail bool) {
		t.Helper()
		dir := t.TempDir()
		jsonFile, report := filepath.Join(dir, "bench.json"), filepath.Join(dir, "bench.html")
		cmd := exec.Command(binary, "bench", "--scenario", "drain", "--events", "200", "--aggregates", "10",
			"--relays", "1", "--batch-size", "50", "--sources", sources, "--broker", strings.Join(brokers, ","),
			"--json", jsonFile, "--report", report)
		cmd.Env = append(os.Environ(), "DATABASE_URL="+dbURL, "PGOUTBOX_WEBHOOK_SECRET="+hookSecret)
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		pgtest.Must(t, cmd.Start(), "start bench")
		// Every child's command line, read while it runs.
		stop, watched := make(chan struct{}), make(chan []string)
		go func() {
			seen := map[int]string{}
			for {
				for pid, cl := range childCmdlines(cmd.Process.Pid) {
					seen[pid] = cl
				}
				select {
				case <-stop:
					var all []string
					for _, cl := range seen {
						all = append(all, cl)
					}
					watched <- all
					return
				case <-time.After(5 * time.Millisecond):
				}
			}
		}()
		err := cmd.Wait()
		close(stop)
		cmdlines := <-watched
		if (err != nil) != wantFail {
			t.Fatalf("bench: %v (want failure: %v)\nstdout:\n%s\nstderr:\n%s", err, wantFail, stdout.String(), stderr.String())
		}
		if !slices.ContainsFunc(cmdlines, func(cl string) bool { return strings.Contains(cl, " relay ") }) {
			t.Fatalf("saw no relay child process of the bench: %q", cmdlines)
		}
		raw, err := os.ReadFile(jsonFile)
		pgtest.Must(t, err, "read JSON")
		page, err := os.ReadFile(report)
		pgtest.Must(t, err, "read report")
		again, againErr, _ := run(t, "bench", "--from-json", jsonFile)
		outputs := map[string]string{"stdout": stdout.String(), "stderr": stderr.String(), "JSON": string(raw),
			"HTML report": string(page), "--from-json stdout": again, "--from-json stderr": againErr}
		for i, cl := range cmdlines {
			outputs[fmt.Sprintf("child command line %d", i)] = cl
		}
		for what, out := range outputs {
			for _, sec := range secrets {
				for _, form := range []string{sec, url.QueryEscape(sec), base64.StdEncoding.EncodeToString([]byte("hook:" + sec))} {
					if strings.Contains(out, form) {
						t.Errorf("%s holds a secret (%q):\n%s", what, form, out)
					}
				}
			}
		}
		var res bench.Result
		pgtest.Must(t, json.Unmarshal(raw, &res), "decode JSON")
		if wantFail && (len(res.Errors) == 0 || !strings.Contains(res.Errors[0].Error, "amqp://guest:xxxxx@")) {
			t.Errorf("want the RabbitMQ drain's error, its URL redacted: %+v", res.Errors)
		}
		if !strings.Contains(string(raw), "nats://nats:xxxxx@") || (len(brokers) > 1 && !strings.Contains(string(raw), "outbox?token=xxxxx")) {
			t.Errorf("the JSON does not name the brokers (redacted): %s", raw)
		}
	}

	brokers := []string{
		"nats://nats:" + natsPass + "@" + nats.Host,
		"nats://" + natsToken + "@" + nats.Host,
		hookURL,
		"amqp://guest:" + amqpPass + "@127.0.0.1:5672/",
	}
	runBench(u.String(), brokers, "poll,cdc", true)
	if hooks.Load() < 200 {
		t.Errorf("the webhook got %d requests, want the 200 events at least", hooks.Load())
	}
	host, port, _ := strings.Cut(u.Host, ":")
	dsn := fmt.Sprintf("host=%s port=%s user=%s dbname=%s password='%s' sslpassword=%s", host, port, u.User.Username(),
		strings.TrimPrefix(u.Path, "/"), dbPass, dbSSLPass)
	runBench(dsn, brokers[:1], "poll", false)
}

// childCmdlines returns the command line of each child process of pid (Linux)
// that has started its own program. A child between fork and exec still shows
// its parent's command line (which the test gave the secrets on purpose), so a
// command line equal to the parent's is not a child's own: it is passed over.
func childCmdlines(pid int) map[int]string {
	out := map[int]string{}
	parent, _ := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline")
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		child, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		stat, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		// pid (comm) state ppid …; comm may hold spaces and parentheses.
		fields := strings.Fields(string(stat[bytes.LastIndexByte(stat, ')')+1:]))
		if len(fields) < 2 || fields[1] != strconv.Itoa(pid) {
			continue
		}
		if cl, err := os.ReadFile("/proc/" + e.Name() + "/cmdline"); err == nil && len(cl) > 0 && !bytes.Equal(cl, parent) {
			out[child] = string(bytes.ReplaceAll(cl, []byte{0}, []byte{' '}))
		}
	}
	return out
}

// On a server without logical decoding (PostgreSQL's default, wal_level =
// replica) the bench leaves CDC out of its default sources with a note, asking
// for it is an error, and the CDC relay refuses to start, naming the setting.
func TestWithoutLogicalDecoding(t *testing.T) {
	t.Parallel()
	c, err := pgtest.StartCluster(&pgtest.ClusterConfig{MaxConnections: 30, Settings: map[string]string{"wal_level": "replica"}})
	pgtest.Must(t, err, "start a cluster with wal_level = replica")
	t.Cleanup(func() {
		if err := c.Stop(); err != nil {
			t.Error(err)
		}
	})
	// The bench runs its relays as subprocesses of its own binary: run the real one.
	drain := func(args ...string) (string, int) {
		cmd := exec.Command(binary, append([]string{"bench", "--database-url", c.URL, "--scenario", "drain", "--events", "200",
			"--aggregates", "5", "--relays", "1", "--broker", "null"}, args...)...)
		out, err := cmd.CombinedOutput()
		if err != nil && cmd.ProcessState == nil {
			t.Fatalf("bench: %v", err)
		}
		return string(out), cmd.ProcessState.ExitCode()
	}
	jsonFile := filepath.Join(t.TempDir(), "bench.json")
	if out, code := drain("--json", jsonFile); code != 0 {
		t.Fatalf("bench: code %d\n%s", code, out)
	}
	res := benchResult(t, jsonFile)
	if !slices.Equal(res.Settings.Sources, []string{bench.SourcePoll}) {
		t.Errorf("sources %v, want poll alone", res.Settings.Sources)
	}
	if !slices.ContainsFunc(res.Context.Notes, func(n string) bool { return strings.Contains(n, "no CDC rows: the server has wal_level = replica") }) {
		t.Errorf("no note that CDC was left out: %v", res.Context.Notes)
	}
	if out, code := drain("--sources", "poll,cdc"); code == 0 || !strings.Contains(out, "wal_level = replica") {
		t.Errorf("bench --sources poll,cdc: code %d, output %q; want an error naming wal_level", code, out)
	}

	if out, errOut, code := run(t, "migrate", "--database-url", c.URL); code != 0 {
		t.Fatalf("migrate: code %d\n%s%s", code, out, errOut)
	}
	if _, errOut, code := run(t, "relay", "--source", "cdc", "--database-url", c.URL, "--broker", "null://"); code == 0 || !strings.Contains(errOut, "wal_level is not logical") {
		t.Errorf("relay --source cdc: code %d, stderr %q; want a refusal naming wal_level", code, errOut)
	}
}
