package bench

import (
	"bytes"
	"os"
	"strings"
	"testing"
	"time"
)

func sampleTenants() *TenantsResult {
	cell := func(mode string, n, dbs int) TenantCell { return TenantCell{Mode: mode, Tenants: n, Databases: dbs} }
	t := &TenantsResult{Method: "m", Broker: "nats", Counts: []int{1, 10, 100}, IdleSource: "pg_stat_database",
		Idle: []TenantIdleCell{
			{TenantCell: cell(tenantModeSingle, 1, 1), Seconds: 30, QueriesPerSec: 1.5, RSSMiB: 20},
			{TenantCell: cell(tenantModeGroup, 1, 1), Seconds: 30, QueriesPerSec: 0.5, RSSMiB: 20},
			{TenantCell: cell(tenantModeGroup, 10, 1), Seconds: 30, QueriesPerSec: 0.55, RSSMiB: 21},
			{TenantCell: cell(tenantModeGroup, 100, 1), Seconds: 30, QueriesPerSec: 0.6, RSSMiB: 30},
			{TenantCell: cell(tenantModeFile, 100, 2), Seconds: 30, QueriesPerSec: 1.1, RSSMiB: 31},
		},
		Drains: []TenantDrainRun{
			{TenantCell: cell(tenantModeSingle, 1, 1), Events: 1000, EventsPerSec: 12000},
			{TenantCell: cell(tenantModeGroup, 1, 1), Events: 1000, EventsPerSec: 10000},
			{TenantCell: cell(tenantModeGroup, 100, 1), Events: 1000, EventsPerSec: 8000},
			{TenantCell: cell(tenantModeFile, 100, 2), Events: 1000, EventsPerSec: 9000},
		},
		Fairness: &TenantFairness{Tenants: 100, QuietTenants: 99, RatePerTenant: 2, HotBacklog: 1000, HotDrainSeconds: 5,
			Baseline: TenantLatency{Events: 1980, P50Ms: 4, P99Ms: 10}, Hot: TenantLatency{Events: 990, P50Ms: 6, P99Ms: 40}, AfterHot: 990,
			Control: TenantLatency{Events: 1980, P50Ms: 5, P99Ms: 30}, ControlRatioP50: 1.25, ControlRatioP99: 3},
	}
	t.IdleRatio, t.MemoryPerTenantKiB = idleFigures(t.Idle)
	t.ThroughputRatio = throughputFigures(t.Drains)
	t.Fairness.RatioP50 = ratio(t.Fairness.Hot.P50Ms, t.Fairness.Baseline.P50Ms)
	t.Fairness.RatioP99 = ratio(t.Fairness.Hot.P99Ms, t.Fairness.Baseline.P99Ms)
	return t
}

// The figures the issue asks for are derived from the tenant cells of one
// database only: the single-outbox baseline and the two-database cell do not
// enter the ratios nor the memory slope.
func TestTenantsFigures(t *testing.T) {
	tr := sampleTenants()
	if tr.IdleRatio != 1.2 {
		t.Errorf("idle ratio %v, want 0.6 / 0.5 = 1.2", tr.IdleRatio)
	}
	// RSS 20, 21, 30 MiB at 1, 10, 100 tenants: least squares 617472 / 5994 = 103.0 KiB/tenant.
	if kib := tr.MemoryPerTenantKiB; kib != 103.02 {
		t.Errorf("memory per tenant %v KiB, want 103.02", kib)
	}
	if tr.ThroughputRatio != 0.8 || tr.Drains[0].RatioToFewest != 1.2 || tr.Drains[3].RatioToFewest != 0.9 {
		t.Errorf("throughput ratio %v, runs %+v", tr.ThroughputRatio, tr.Drains)
	}
	if got, _ := idleFigures(tr.Idle[:2]); got != 0 {
		t.Errorf("one tenant count only: idle ratio %v, want 0 (nothing to compare)", got)
	}
	m := meanDrain([]TenantDrainRun{{Events: 10, Published: 10, Seconds: 1, EventsPerSec: 10, PeakRSSMiB: 5}, {Events: 10, Published: 10, Seconds: 2, EventsPerSec: 5, PeakRSSMiB: 7}})
	if m.EventsPerSec != 7.5 || m.Seconds != 1.5 || m.PeakRSSMiB != 7 || len(m.RoundEventsPerSec) != 2 || m.RoundEventsPerSec[1] != 5 {
		t.Errorf("mean of two rounds: %+v", m)
	}
	if s := slope([]float64{5}, []float64{1}); s != 0 {
		t.Errorf("slope of one point %v", s)
	}
}

// The events and aggregates of a drain are spread evenly over the tenants:
// every event is somewhere, and each tenant's aggregates hold as many events
// as the single tenant's.
func TestTenantShares(t *testing.T) {
	for _, tc := range []struct{ tenants, events, aggregates int }{{1, 100_000, 1000}, {100, 100_000, 1000}, {3, 10, 40}, {7, 7, 1}} {
		names := make([]string, tc.tenants)
		for i := range names {
			names[i] = tenantName(i)
		}
		sh := shares(names, tc.events, tc.aggregates)
		total := 0
		for _, s := range sh {
			total += s.events
			if s.aggregates < 1 || s.aggregates > s.events {
				t.Errorf("%+v: tenant %s has %d events over %d aggregates", tc, s.s.name, s.events, s.aggregates)
			}
			if s.s.events != `"`+s.s.name+`"."outbox_events"` {
				t.Errorf("table %s", s.s.events)
			}
		}
		if total != tc.events {
			t.Errorf("%+v: %d events spread, want %d", tc, total, tc.events)
		}
	}
	if a, b := shares([]string{"t000"}, 100_000, 1000)[0], shares([]string{"t000", "t001"}, 100_000, 1000)[1]; a.events/a.aggregates != b.events/b.aggregates {
		t.Errorf("events per aggregate %d (1 tenant) and %d (2 tenants)", a.events/a.aggregates, b.events/b.aggregates)
	}
}

// The tables, the HTML report and the targets show the tenants' figures.
func TestTenantsReport(t *testing.T) {
	res := &Result{Context: Context{Started: time.Now(), CPUs: 2}, Tenants: sampleTenants()}
	res.Targets = res.targets()
	met := map[string]bool{}
	for _, tg := range res.Targets {
		met[tg.Name] = tg.Met
	}
	if !met["idle queries/s, 100 tenants / 1"] || !met["quiet tenants' p50 with a hot tenant / without"] ||
		met["quiet tenants' p99 with a hot tenant / without"] {
		t.Errorf("targets %+v", res.Targets)
	}
	var text strings.Builder
	res.WriteText(&text)
	for _, want := range []string{"single outbox (--schema)", "100 tenants in 2 databases", "memory per tenant: 103 KiB",
		"throughput, most / fewest tenants of one database: 0.80", "with / without the hot tenant: p50 1.50, p99 4.00 (990 events", "hot tenant in another process", "/ without: p50 1.25, p99 3.00"} {
		if !strings.Contains(text.String(), want) {
			t.Errorf("text lacks %q:\n%s", want, text.String())
		}
	}
	var page bytes.Buffer
	if err := WriteReport(&page, res); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"Tenants: one relay process", "100 tenants in 2 databases", "hot tenant draining", "<b>4.00</b>", "<b>0.80</b>", "hot tenant in another process (control)", "<b>1.25</b>"} {
		if !strings.Contains(page.String(), want) {
			t.Errorf("report lacks %q", want)
		}
	}
}

// The per-process figures read /proc: this process has used some CPU and
// holds some memory; a process that does not exist reads as zero.
func TestProcFigures(t *testing.T) {
	if _, err := os.Stat("/proc/self/stat"); err != nil {
		t.Skip("no /proc")
	}
	deadline := time.Now().Add(10 * time.Second)
	for procCPU(os.Getpid()) == 0 && time.Now().Before(deadline) {
		for i := range 1_000_000 {
			_ = strings.Repeat("x", i%8)
		}
	}
	if procCPU(os.Getpid()) <= 0 || procRSS(os.Getpid()) < 1<<20 {
		t.Errorf("cpu %v, rss %d", procCPU(os.Getpid()), procRSS(os.Getpid()))
	}
	if procCPU(-1) != 0 || procRSS(-1) != 0 {
		t.Error("a missing process has figures")
	}
}
