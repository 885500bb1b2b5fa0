package bench

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"
)

func sampleResult() *Result {
	h := hdrhistogram.New(1, 600_000_000, 3)
	for i := range 1000 {
		_ = h.RecordValue(int64(500 + i*10)) // 0.5 .. 10.5 ms
	}
	return &Result{
		Context: Context{Started: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC), CPUs: 2, GoVersion: "go1.26", PostgreSQL: "PostgreSQL 15.20 (Debian)"},
		Drain: &DrainResult{Events: 1000, Aggregates: 10, PayloadBytes: 256, BatchSize: 500, CeilingEventsPerSec: 40000,
			Ceiling: []CeilingRun{{Variant: "limit", Seconds: 0.025, EventsPerSec: 40000, Statements: 3}},
			Runs: []DrainRun{
				{Broker: "null", Relays: 1, Seconds: 0.1, EventsPerSec: 10000, CeilingEventsPerSec: 40000, RatioToCeiling: 0.25, Published: 1000,
					BrokerMessages: -1, RelayRSS: []RelayRSS{{ID: "r1", PeakRSSBytes: 30 << 20, PeakRSSMiB: 30}},
					Series: []Sample{{0.05, 400}, {0.1, 1000}}},
				// A CDC row before the polling one: the targets must still be the polling relay's.
				{Source: SourceCDC, CDCSlot: "pgoutbox_bench_x_1", Broker: "nats", Relays: 1, Seconds: 0.04, EventsPerSec: 25000, CeilingEventsPerSec: 40000,
					RatioToCeiling: 0.625, Published: 1000, BrokerMessages: 1000, Series: []Sample{{0.04, 1000}}},
				{Source: SourcePoll, Broker: "nats", Relays: 1, Seconds: 0.2, EventsPerSec: 5000, CeilingEventsPerSec: 40000, RatioToCeiling: 0.125, Published: 1000,
					BrokerMessages: 1000, Series: []Sample{{0.1, 500}, {0.2, 1000}}},
			}},
		Latency: &LatencyResult{Broker: "nats", Runs: []LatencyRun{{Mode: "notify", OfferedRate: 1000, Offered: 1000, Received: 1000,
			P50Ms: 5.5, P90Ms: 9.5, P99Ms: 10.4, MaxMs: 10.5, Histogram: logBuckets(h),
			Percentiles: []Percentile{{50, 5.5}, {90, 9.5}, {99, 10.4}, {100, 10.5}}},
			{Source: SourceCDC, Mode: SourceCDC, OfferedRate: 1000, Offered: 1000, Received: 1000, P50Ms: 1.5, P90Ms: 2, P99Ms: 3, MaxMs: 4,
				Histogram: logBuckets(h), Percentiles: []Percentile{{50, 1.5}, {90, 2}, {99, 3}, {100, 4}}}}},
		Enqueue: &EnqueueResult{DurationS: 1, Cells: []EnqueueCell{{Producers: 1, CommitsPerSec: 500}, {Producers: 1, Outbox: true, Notify: true, CommitsPerSec: 450},
			{Producers: 1, Outbox: true, Batched: true, Notify: true, CommitsPerSec: 480}, {Producers: 1, Floor: true, CommitsPerSec: 490}},
			Rounds: 3, Ratios: EnqueueRatios{OutboxTimeRatio1: 1.11, BatchedTimeRatio1: 1.04, FloorTimeRatio1: 1.02}},
		Idle:        &IdleResult{QueriesPerSec: 0.5, Source: "pg_stat_statements", TopStatements: []StatementCalls{{Calls: 3, Query: "SELECT <b>1</b>"}}},
		History:     &HistoryResult{HistoryRows: 100, Phases: []HistoryPhase{{KeptRows: 0, P50Ms: 2}, {KeptRows: 100, P50Ms: 2.2}}, RatioP50: 1.1},
		ScenarioCPU: map[string]CPUShare{ScenarioDrain: {BusyPct: 93.4, StealPct: 1}, ScenarioEnqueue: {BusyPct: 70, StealPct: 12.6}},
	}
}

// The report renders every section from a Result alone, escapes what it shows, and
// fetches nothing.
func TestWriteReport(t *testing.T) {
	res := sampleResult()
	res.Targets = res.targets()
	var b bytes.Buffer
	if err := WriteReport(&b, res); err != nil {
		t.Fatal(err)
	}
	page := b.String()
	if n := strings.Count(page, "<svg"); n != 6 { // drain bars + 2 series, latency ×2, enqueue
		t.Errorf("%d charts, want 6", n)
	}
	for _, want := range []string{"At a glance", "Throughput over time → null", "SELECT &lt;b&gt;1&lt;/b&gt;", "1.10",
		"nats CDC", "CDC, 1 relay", "CDC stream", ">cdc</td>", ">batched</td>", "<b>1.04</b>", "outbox batched with the INSERT",
		">floor</td>", "drain 93% / 1%, enqueue 70% / 13%", "the host took 5% or more"} {
		if !strings.Contains(page, want) {
			t.Errorf("report lacks %q", want)
		}
	}
	for _, bad := range []string{"<script", "http://", "https://"} {
		if strings.Contains(strings.ReplaceAll(page, `xmlns="http://www.w3.org/2000/svg"`, ""), bad) {
			t.Errorf("report has %q", bad)
		}
	}
}

func TestLogBucketsCountEverySample(t *testing.T) {
	h := hdrhistogram.New(1, 600_000_000, 3)
	for _, us := range []int64{100, 300, 900, 5_000, 70_000, 2_000_000} {
		_ = h.RecordValue(us)
	}
	var n int64
	bs := logBuckets(h)
	for _, b := range bs {
		n += b.Count
	}
	if n != 6 || bs[0].UpToMs != 0.25 || bs[0].Count != 1 || bs[len(bs)-1].UpToMs < 2000 {
		t.Errorf("buckets %+v", bs)
	}
}

func TestTargetsMetAndMissed(t *testing.T) {
	ts := sampleResult().targets()
	got := map[string]bool{}
	for _, tg := range ts {
		got[tg.Name] = tg.Met
	}
	for _, tg := range ts {
		if tg.Name == "drain, 1 relay, nats" && tg.Measured != "5000 events/s" {
			t.Errorf("drain target measured %s: want the polling relay's 5000 events/s, not CDC's", tg.Measured)
		}
	}
	if got["drain, 1 relay, nats"] || !got["pick-up p50 with 100 kept rows / empty"] || !got["idle relay"] {
		t.Errorf("targets %+v", ts)
	}
}

// Issue 19's targets: the relay's CPU with a real broker (not the null broker's,
// listed first), the CDC source against the polling relay in the same run, and
// latency at 3 and 15 ms.
func TestTargetsOfIssue19(t *testing.T) {
	res := sampleResult()
	res.Drain.Runs[0].RelayCPUPerEventUs = 9  // null
	res.Drain.Runs[1].RelayCPUPerEventUs = 15 // CDC: not the polling relay's target
	res.Drain.Runs[2].RelayCPUPerEventUs = 21 // nats
	want := map[string]struct {
		measured string
		met      bool
	}{
		"relay process CPU per event, 1 relay, nats": {"21.0 µs", false},
		"CDC drain / polling drain, 1 relay, nats":   {"5.00 (25000 / 5000 events/s)", true},
		"latency p50, NOTIFY, 1000/s":                {"5.50 ms", false},
		"latency p99, NOTIFY, 1000/s":                {"10.40 ms", true},
		"CDC latency p50 / NOTIFY's":                 {"0.27 (1.50 / 5.50 ms)", true},
		"CDC latency p99 / NOTIFY's":                 {"0.29 (3.00 / 10.40 ms)", true},
	}
	seen := map[string]bool{}
	for _, tg := range res.targets() {
		if strings.Contains(tg.Name, "with / without outbox") || strings.Contains(tg.Name, "batched with the INSERT") {
			t.Errorf("superseded enqueue target still listed: %+v", tg)
		}
		w, ok := want[tg.Name]
		if !ok {
			continue
		}
		seen[tg.Name] = true
		if tg.Measured != w.measured || tg.Met != w.met {
			t.Errorf("%s: measured %q met %v, want %q %v", tg.Name, tg.Measured, tg.Met, w.measured, w.met)
		}
	}
	for name := range want {
		if !seen[name] {
			t.Errorf("no target %q", name)
		}
	}

	// With the CDC source slower than polling, and no CPU figure but the null
	// broker's, the targets say so.
	res.Drain.Runs[1].EventsPerSec = 4000
	res.Drain.Runs[2].RelayCPUPerEventUs = 0
	for _, tg := range res.targets() {
		switch tg.Name {
		case "CDC drain / polling drain, 1 relay, nats":
			if tg.Met || tg.Measured != "0.80 (4000 / 5000 events/s)" {
				t.Errorf("%+v", tg)
			}
		case "relay process CPU per event, 1 relay, null":
			if !tg.Met || tg.Measured != "9.0 µs" {
				t.Errorf("%+v", tg)
			}
		case "relay process CPU per event, 1 relay, nats":
			t.Errorf("a row without a CPU figure was chosen: %+v", tg)
		}
	}
}

func TestWithDatabase(t *testing.T) {
	for in, want := range map[string]string{
		"postgres://u@h:5432/test?sslmode=disable": "postgres://u@h:5432/other?sslmode=disable",
		"host=h user=u dbname=test":                "host=h user=u dbname=test dbname=other",
	} {
		if got, err := withDatabase(in, "other"); err != nil || got != want {
			t.Errorf("withDatabase(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
}
