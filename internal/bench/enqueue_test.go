package bench

import (
	"reflect"
	"strings"
	"testing"
	"time"
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
