package bench

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
)

// WriteText writes the human tables of every scenario in res.
func (res *Result) WriteText(w io.Writer) {
	c := res.Context
	fmt.Fprintf(w, "pgoutbox bench — %d CPUs (%s), %s, %s", c.CPUs, c.CPUModel, c.GoVersion, firstWords(c.PostgreSQL, 2))
	if c.NATSServer != "" {
		fmt.Fprintf(w, ", nats-server %s", c.NATSServer)
	}
	fmt.Fprintln(w)
	if d := res.Drain; d != nil {
		fmt.Fprintf(w, "\ndrain: %d events over %d aggregates, %d-byte payloads, batch %d\n", d.Events, d.Aggregates, d.PayloadBytes, d.BatchSize)
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintln(tw, "source\tbroker\trelays\tseconds\tevents/s\tceiling/s\t× ceiling\tpeak RSS MiB\trelay CPU µs/event\t")
		for _, r := range d.Runs {
			fmt.Fprintf(tw, "%s\t%s\t%d\t%.3f\t%.0f\t%.0f\t%.2f\t%.1f\t%.1f\t\n", sourceName(r.Source), r.Broker, r.Relays, r.Seconds, r.EventsPerSec, r.CeilingEventsPerSec, r.RatioToCeiling, r.MaxRSSMiB, r.RelayCPUPerEventUs)
		}
		tw.Flush()
		var cs []string
		for _, cr := range d.Ceiling {
			cs = append(cs, fmt.Sprintf("%s %.0f", cr.Variant, cr.EventsPerSec))
		}
		fmt.Fprintf(w, "SQL ceiling runs (events/s, in order): %s; median %.0f\n", strings.Join(cs, ", "), d.CeilingEventsPerSec)
		for _, r := range d.Runs {
			if r.BrokerCeilingEventsPerSec > 0 {
				fmt.Fprintf(w, "%s, %d %s relay%s: broker alone %.0f events/s; combined with the SQL ceiling %.0f; relay / combined %.3f\n",
					r.Broker, r.Relays, sourceName(r.Source), plural(r.Relays), r.BrokerCeilingEventsPerSec, r.CombinedCeilingEventsPerSec, r.RatioToCombined)
			}
		}
	}
	if e := res.Enqueue; e != nil {
		rounds := ""
		if e.Rounds > 1 {
			rounds = fmt.Sprintf(" in %d interleaved rounds", e.Rounds)
		}
		fmt.Fprintf(w, "\nenqueue: %gs per cell%s, business INSERT + commit\n", e.DurationS, rounds)
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintln(tw, "producers\toutbox\tNOTIFY\trelay\tcommits/s\tp50 ms\tp99 ms\t")
		for _, cl := range e.Cells {
			notify := onOff(cl.Notify)
			if !cl.Outbox {
				notify = "-"
			}
			fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%.0f\t%.2f\t%.2f\t\n", cl.Producers, cl.outboxLabel(), notify, yesNo(cl.Relay), cl.CommitsPerSec, cl.P50Ms, cl.P99Ms)
		}
		tw.Flush()
		rt := e.Ratios
		how := ""
		if len(rt.Ranges) > 0 {
			how = " (median of the rounds' ratios, and their range)"
		}
		fmt.Fprintf(w, "time with outbox / without%s:\n", how)
		for _, p := range []struct {
			n                      int
			enqueue, batched, flor float64
			suffix                 string
		}{{1, rt.OutboxTimeRatio1, rt.BatchedTimeRatio1, rt.FloorTimeRatio1, "_1"}, {16, rt.OutboxTimeRatio16, rt.BatchedTimeRatio16, rt.FloorTimeRatio16, "_16"}} {
			fmt.Fprintf(w, "  %2d producer%s: EnqueueTx (a statement of its own) %s; QueueTx (batched with the INSERT) %s",
				p.n, plural(p.n), rt.format("outbox_time_ratio"+p.suffix, p.enqueue), rt.format("batched_time_ratio"+p.suffix, p.batched))
			if p.flor > 0 {
				fmt.Fprintf(w, "; floor (a row of the payload alone) %s", rt.format("floor_time_ratio"+p.suffix, p.flor))
			}
			fmt.Fprintln(w)
		}
		for _, pr := range rt.peers() {
			for _, p := range pr.at {
				if p.time == 0 {
					continue
				}
				fmt.Fprintf(w, "  %2d producer%s: %s %s; EnqueueTx / it %s; QueueTx / it %s\n", p.n, plural(p.n), pr.name,
					rt.format(pr.key+"_time_ratio"+p.suffix, p.time), rt.format("enqueue_vs_"+pr.key+p.suffix, p.enqueue), rt.format("batched_vs_"+pr.key+p.suffix, p.batched))
			}
		}
		if e.PeerNotRun != "" {
			fmt.Fprintf(w, "  (%s)\n", e.PeerNotRun)
		}
		if len(rt.CPU) > 0 {
			fmt.Fprintf(w, "CPU per commit (the producers' PostgreSQL backends + the bench process; other processes do not count), with / without, median of the rounds:\n")
			for _, p := range []struct {
				n      int
				suffix string
			}{{1, "_1"}, {16, "_16"}} {
				fmt.Fprintf(w, "  %2d producer%s: EnqueueTx %s; QueueTx %s; floor %s; %s %s\n", p.n, plural(p.n),
					rt.formatCPU("outbox_time_ratio"+p.suffix), rt.formatCPU("batched_time_ratio"+p.suffix), rt.formatCPU("floor_time_ratio"+p.suffix),
					watermillName, rt.formatCPU("watermill_time_ratio"+p.suffix))
				fmt.Fprintf(w, "      / %s: EnqueueTx %s; QueueTx %s\n", watermillName,
					rt.formatCPU("enqueue_vs_watermill"+p.suffix), rt.formatCPU("batched_vs_watermill"+p.suffix))
				if _, ok := rt.CPU["watermill_sql_time_ratio"+p.suffix]; ok {
					fmt.Fprintf(w, "      %s (its process + its backends): %s; EnqueueTx / it %s; QueueTx / it %s\n", peerName,
						rt.formatCPU("watermill_sql_time_ratio"+p.suffix), rt.formatCPU("enqueue_vs_watermill_sql"+p.suffix), rt.formatCPU("batched_vs_watermill_sql"+p.suffix))
				}
			}
		}
		fmt.Fprintf(w, "NOTIFY costs %.0f%% of commits/s at 16 with a relay running (%.0f%% without a relay; %.0f%% at 1)\n",
			100*rt.NotifyCost16, 100*rt.NotifyCost16NoRelay, 100*rt.NotifyCost1NoRelay)
	}
	res.writeTextMore(w)
	if len(res.Targets) > 0 {
		fmt.Fprintf(w, "\ntargets (2-core machine, PostgreSQL and broker on the same box)\n")
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		for _, t := range res.Targets {
			met := "MISSED"
			if t.Met {
				met = "met"
			}
			fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\n", t.Name, t.Target, t.Measured, met)
		}
		tw.Flush()
	}
	for _, e := range res.Errors {
		fmt.Fprintf(w, "\n%s FAILED: %s\n", e.Scenario, e.Error)
	}
}

// sourceName shows a run's relay source; JSON of older runs has none: poll.
func sourceName(s string) string {
	if s == "" {
		return SourcePoll
	}
	return s
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}

func firstWords(s string, n int) string {
	f := strings.Fields(s)
	if len(f) > n {
		f = f[:n]
	}
	return strings.Join(f, " ")
}
