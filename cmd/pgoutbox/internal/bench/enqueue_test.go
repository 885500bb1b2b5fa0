package bench

import (
	"context"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pgoutbox/pgoutbox/internal/pgtest"
)

// The ratios pair the cells round by round: a round where the machine ran slow
// lowers both sides of its ratio, and the median ignores one outlying round.
func TestEnqueueRatiosPairRounds(t *testing.T) {
	res := &EnqueueResult{Rounds: 3, Cells: []EnqueueCell{
		{Producers: 1, Notify: true, RoundCommitsPerSec: []float64{1000, 500, 1000}},
		{Producers: 1, Outbox: true, Notify: true, RoundCommitsPerSec: []float64{800, 400, 250}},
		{Producers: 1, Outbox: true, RoundCommitsPerSec: []float64{1000, 400, 250}},
		{Producers: 1, Floor: true, Notify: true, RoundCommitsPerSec: []float64{900, 450, 900}},
		// A batched cell with a missing round is not compared.
		{Producers: 1, Outbox: true, Batched: true, Notify: true, RoundCommitsPerSec: []float64{900}},
	}}
	rt := res.ratios()
	res.Ratios = rt
	if rt.OutboxTimeRatio1 != 1.25 || rt.FloorTimeRatio1 != 1.111 || rt.BatchedTimeRatio1 != 0 || rt.OutboxTimeRatio16 != 0 {
		t.Errorf("time ratios %+v", rt)
	}
	// NOTIFY on/off per round: 0.8, 1, 1 → cost 20%, 0, 0.
	if rt.NotifyCost1NoRelay != 0 {
		t.Errorf("notify cost %v, want the median 0", rt.NotifyCost1NoRelay)
	}
	want := map[string][2]float64{
		"outbox_time_ratio_1":    {1.25, 4},
		"floor_time_ratio_1":     {1.111, 1.111},
		"notify_cost_1_no_relay": {0, 0.2},
	}
	if !reflect.DeepEqual(rt.Ranges, want) {
		t.Errorf("ranges %v, want %v", rt.Ranges, want)
	}
	if got := rt.format("outbox_time_ratio_1", rt.OutboxTimeRatio1); got != "1.25 (1.25–4.00)" {
		t.Errorf("format: %q", got)
	}
	var text strings.Builder
	(&Result{Enqueue: res}).WriteText(&text)
	if !strings.Contains(text.String(), "floor (a row of the payload alone) 1.11 (1.11–1.11)") {
		t.Errorf("text:\n%s", text.String())
	}
}

// An enqueue slice too short to time is refused before anything runs.
func TestEnqueueSliceTooShort(t *testing.T) {
	c := Config{DatabaseURL: "postgres://x", Scenarios: []string{ScenarioEnqueue}, Duration: 400 * time.Millisecond, EnqueueRounds: 5}
	if _, err := c.withDefaults(); err == nil || !strings.Contains(err.Error(), "leaves 80ms per cell and round") {
		t.Errorf("withDefaults: %v", err)
	}
	c.EnqueueRounds = 4
	if _, err := c.withDefaults(); err != nil {
		t.Errorf("100ms slices: %v", err)
	}
	c.Scenarios, c.EnqueueRounds, c.Executable = []string{ScenarioIdle}, 5, "pgoutbox"
	if _, err := c.withDefaults(); err != nil {
		t.Errorf("no enqueue scenario: %v", err)
	}
}

// The watermill-like cell is compared with the cell without an outbox and with
// EnqueueTx's and QueueTx's, round by round, and its targets are met or not.
func TestEnqueueWatermillRatios(t *testing.T) {
	res := &EnqueueResult{Rounds: 2, Cells: []EnqueueCell{
		{Producers: 1, Notify: true, RoundCommitsPerSec: []float64{1000, 1000}},
		{Producers: 1, Outbox: true, Notify: true, RoundCommitsPerSec: []float64{500, 500}},
		{Producers: 1, Outbox: true, Batched: true, Notify: true, RoundCommitsPerSec: []float64{800, 800}},
		{Producers: 1, Watermill: true, Notify: true, RoundCommitsPerSec: []float64{625, 625}},
	}}
	res.Ratios = res.ratios()
	rt := res.Ratios
	if rt.WatermillTimeRatio1 != 1.6 || rt.EnqueueVsWatermill1 != 1.25 || rt.BatchedVsWatermill1 != 0.781 || rt.OutboxTimeRatio1 != 2 {
		t.Errorf("ratios %+v", rt)
	}
	met := map[string]bool{}
	for _, tg := range (&Result{Enqueue: res}).targets() {
		met[tg.Name] = tg.Met
	}
	if q, e := "QueueTx / "+watermillName+", 1 producer", "EnqueueTx / "+watermillName+", 1 producer"; !met[q] || met[e] {
		t.Errorf("targets %v", met)
	}
	var text strings.Builder
	(&Result{Enqueue: res}).WriteText(&text)
	if !strings.Contains(text.String(), watermillName+" 1.60 (1.60–1.60); EnqueueTx / it 1.25 (1.25–1.25); QueueTx / it 0.78") {
		t.Errorf("text:\n%s", text.String())
	}
	var html strings.Builder
	if err := WriteReport(&html, &Result{Enqueue: res}); err != nil || !strings.Contains(html.String(), "watermill-like") {
		t.Errorf("report: %v", err)
	}
}

// CPU per commit is compared as commits/s are, round by round, for the same pairs
// of cells (with / without), but not for NOTIFY's cost; a cell whose CPU was not
// read in every round gives no CPU ratio, and a run without CPU figures none.
func TestEnqueueCPURatios(t *testing.T) {
	cell := func(c EnqueueCell, cpu ...float64) EnqueueCell {
		c.RoundCommitsPerSec = []float64{1000, 1000, 1000}
		c.RoundCPUUsPerCommit = cpu
		return c
	}
	res := &EnqueueResult{Rounds: 3, Cells: []EnqueueCell{
		cell(EnqueueCell{Producers: 16, Notify: true}, 100, 100, 100),
		cell(EnqueueCell{Producers: 16, Outbox: true, Notify: true}, 200, 250, 150),
		cell(EnqueueCell{Producers: 16, Outbox: true}, 190, 190, 190),
		cell(EnqueueCell{Producers: 16, Outbox: true, Batched: true, Notify: true}, 180),
		cell(EnqueueCell{Producers: 16, Watermill: true, Notify: true}, 125, 125, 125),
	}}
	rt := res.ratios()
	want := map[string]float64{"outbox_time_ratio_16": 2, "watermill_time_ratio_16": 1.25, "enqueue_vs_watermill_16": 1.6}
	if !reflect.DeepEqual(rt.CPU, want) {
		t.Errorf("CPU ratios %v, want %v", rt.CPU, want)
	}
	if got := rt.CPURanges["outbox_time_ratio_16"]; got != [2]float64{1.5, 2.5} {
		t.Errorf("range %v", got)
	}
	res.Ratios = rt
	values := map[string]string{}
	for _, tg := range (&Result{Enqueue: res}).targets() {
		values[tg.Name] = tg.Measured
	}
	if v := values["EnqueueTx / "+watermillName+", 16 producers"]; !strings.Contains(v, "(CPU 1.60)") {
		t.Errorf("target value %q lacks its CPU twin: %v", v, values)
	}
	var text strings.Builder
	(&Result{Enqueue: res}).WriteText(&text)
	if !strings.Contains(text.String(), "16 producers: EnqueueTx 2.00 (1.50–2.50); QueueTx –;") {
		t.Errorf("text:\n%s", text.String())
	}
	for i := range res.Cells {
		res.Cells[i].RoundCPUUsPerCommit = nil
	}
	if rt := res.ratios(); rt.CPU != nil || rt.CPURanges != nil {
		t.Errorf("without CPU figures: %v %v", rt.CPU, rt.CPURanges)
	}
}

// The CPU of a local server's backends is read from /proc: each pooled connection
// gives its own backend, and work done on them shows in their on-CPU time. A pid
// that is no process gives no figure rather than a zero.
func TestBackendCPU(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.Pool(t, pgtest.URL(), 2)
	pids := backendPids(ctx, pool, 2)
	if len(pids) != 2 || pids[0] == pids[1] {
		t.Fatalf("backend pids %v, want 2 distinct (the test server is local)", pids)
	}
	server0, client0, ok := cpuNs(pids)
	if !ok {
		t.Fatalf("cannot read the CPU of %v", pids)
	}
	var wg sync.WaitGroup
	errs := make([]error, len(pids))
	for i := range pids {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var n int64
			errs[i] = pool.QueryRow(ctx, "SELECT count(*) FROM generate_series(1, 2000000)").Scan(&n)
		}()
	}
	wg.Wait()
	for _, err := range errs {
		pgtest.Must(t, err, "query")
	}
	server1, client1, ok := cpuNs(pids)
	if !ok || server1 <= server0 || client1 < client0 {
		t.Errorf("CPU before %v/%v, after %v/%v (ok %v): the backends' work did not show", server0, client0, server1, client1, ok)
	}
	if _, _, ok := cpuNs(append(pids, -1)); ok {
		t.Errorf("a pid that is no process was read")
	}
}
