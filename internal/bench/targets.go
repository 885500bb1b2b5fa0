package bench

import "fmt"

// Target is one of the performance targets of this machine class
// (docs/performance.md, the benchmarks issue) beside the figure this run measured.
type Target struct {
	Name     string `json:"name"`
	Target   string `json:"target"`
	Measured string `json:"measured"`
	Met      bool   `json:"met"`
}

// targets compares res with the targets; scenarios not run are left out.
func (res *Result) targets() []Target {
	var ts []Target
	add := func(name, target, measured string, met bool) {
		ts = append(ts, Target{Name: name, Target: target, Measured: measured, Met: met})
	}
	if d := res.Drain; d != nil {
		for _, r := range d.Runs {
			if r.Relays == 1 && r.BrokerMessages >= 0 && r.Source != SourceCDC { // targets are the polling relay's
				add("drain, 1 relay, "+r.Broker, "≥ 20,000 events/s", fmt.Sprintf("%.0f events/s", r.EventsPerSec), r.EventsPerSec >= 20000)
				add("drain, 1 relay, "+r.Broker+" / SQL ceiling", "≥ 0.5", fmt.Sprintf("%.2f", r.RatioToCeiling), r.RatioToCeiling >= 0.5)
				break
			}
		}
	}
	if d := res.Drain; d != nil {
		for _, r := range d.Runs {
			if r.Relays == 1 && r.Source != SourceCDC && r.CombinedCeilingEventsPerSec > 0 {
				add("drain, 1 relay, "+r.Broker+" / combined SQL + broker ceiling", "≥ 0.8",
					fmt.Sprintf("%.3f (combined %.0f events/s)", r.RatioToCombined, r.CombinedCeilingEventsPerSec), r.RatioToCombined >= 0.8)
				break
			}
		}
	}
	if d := res.Drain; d != nil {
		for _, r := range d.Runs {
			if r.Relays == 1 && r.Source != SourceCDC && r.RelayCPUPerEventUs > 0 {
				add("relay process CPU per event, 1 relay, "+r.Broker, "≤ 20 µs", fmt.Sprintf("%.1f µs", r.RelayCPUPerEventUs), r.RelayCPUPerEventUs <= 20)
				break
			}
		}
	}
	if l := res.Latency; l != nil {
		for _, r := range l.Runs {
			if r.Mode == "notify" {
				add(fmt.Sprintf("latency p50, NOTIFY, %d/s", r.OfferedRate), "≤ 5 ms", fmt.Sprintf("%.2f ms", r.P50Ms), r.P50Ms <= 5)
				add(fmt.Sprintf("latency p99, NOTIFY, %d/s", r.OfferedRate), "≤ 25 ms", fmt.Sprintf("%.2f ms", r.P99Ms), r.P99Ms <= 25)
			}
		}
	}
	if e := res.Enqueue; e != nil {
		rt := e.Ratios
		// floor says what a row of the payload alone cost in the same run.
		floor := func(v float64) string {
			if v == 0 {
				return ""
			}
			return fmt.Sprintf(" (floor %.2f)", v)
		}
		add("enqueue time with / without outbox, 1 producer", "≤ 1.3", fmt.Sprintf("%.2f", rt.OutboxTimeRatio1)+floor(rt.FloorTimeRatio1), rt.OutboxTimeRatio1 <= 1.3)
		add("enqueue time with / without outbox, 16 producers", "≤ 1.3", fmt.Sprintf("%.2f", rt.OutboxTimeRatio16)+floor(rt.FloorTimeRatio16), rt.OutboxTimeRatio16 <= 1.3)
		if rt.BatchedTimeRatio1 > 0 { // runs before QueueTx had no batched cells
			add("the same, batched with the INSERT, 1 producer", "≤ 1.3", fmt.Sprintf("%.2f", rt.BatchedTimeRatio1)+floor(rt.FloorTimeRatio1), rt.BatchedTimeRatio1 <= 1.3)
			add("the same, batched with the INSERT, 16 producers", "≤ 1.3", fmt.Sprintf("%.2f", rt.BatchedTimeRatio16)+floor(rt.FloorTimeRatio16), rt.BatchedTimeRatio16 <= 1.3)
		}
		// withCPU adds the same cells' CPU ratio, when measured, to a time ratio.
		withCPU := func(v float64, name string) string {
			if c, ok := rt.CPU[name]; ok {
				return fmt.Sprintf("%.2f (CPU %.2f)", v, c)
			}
			return fmt.Sprintf("%.2f", v)
		}
		for _, w := range []struct {
			n                int
			enqueue, batched float64
			suffix           string
		}{{1, rt.EnqueueVsWatermill1, rt.BatchedVsWatermill1, "_1"}, {16, rt.EnqueueVsWatermill16, rt.BatchedVsWatermill16, "_16"}} {
			if w.enqueue == 0 || w.batched == 0 { // runs before the watermill-like cells had none
				continue
			}
			add(fmt.Sprintf("QueueTx / %s, %d producer%s", watermillName, w.n, plural(w.n)), "≤ 1.0", withCPU(w.batched, "batched_vs_watermill"+w.suffix), w.batched <= 1.0)
			add(fmt.Sprintf("EnqueueTx / %s, %d producer%s", watermillName, w.n, plural(w.n)), "≤ 1.1", withCPU(w.enqueue, "enqueue_vs_watermill"+w.suffix), w.enqueue <= 1.1)
		}
		add("NOTIFY cost at 16 producers, relay running", "≤ 20% of commits/s", fmt.Sprintf("%.0f%%", 100*e.Ratios.NotifyCost16), e.Ratios.NotifyCost16 <= 0.2)
	}
	if i := res.Idle; i != nil {
		add("idle relay", "≤ 1 query/s", fmt.Sprintf("%.2f queries/s", i.QueriesPerSec), i.QueriesPerSec <= 1)
	}
	if t := res.Tenants; t != nil {
		// Issue 20: idle cost must not grow linearly with the tenants, and a hot
		// tenant's backlog keeps the quiet ones' latency within a small factor.
		if t.IdleRatio > 0 && len(t.Counts) > 1 {
			lo, hi := t.Counts[0], t.Counts[len(t.Counts)-1]
			add(fmt.Sprintf("idle queries/s, %d tenants / %d", hi, lo), "≤ 2", fmt.Sprintf("%.2f", t.IdleRatio), t.IdleRatio <= 2)
		}
		if f := t.Fairness; f != nil && f.RatioP50 > 0 && f.RatioP99 > 0 {
			add("quiet tenants' p50 with a hot tenant / without", "≤ 3", fmt.Sprintf("%.2f", f.RatioP50), f.RatioP50 <= 3)
			add("quiet tenants' p99 with a hot tenant / without", "≤ 3", fmt.Sprintf("%.2f", f.RatioP99), f.RatioP99 <= 3)
		}
	}
	if h := res.History; h != nil && len(h.Phases) == 2 {
		add(fmt.Sprintf("pick-up p50 with %d kept rows / empty", h.HistoryRows), "≤ 1.2", fmt.Sprintf("%.2f", h.RatioP50), h.RatioP50 <= 1.2)
	}
	return ts
}
