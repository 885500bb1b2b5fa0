package bench

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
)

func (res *Result) writeTextMore(w io.Writer) {
	if l := res.Latency; l != nil {
		fmt.Fprintf(w, "\nlatency: commit → seen on the %s stream\n", l.Broker)
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintln(tw, "wake-up\toffered/s\tachieved/s\tevents\tp50 ms\tp90 ms\tp99 ms\tmax ms\tpeak RSS MiB\t")
		for _, r := range l.Runs {
			mode := "NOTIFY"
			switch r.Mode {
			case "poll":
				mode = fmt.Sprintf("poll %gs", r.PollIntervalS)
			case SourceCDC:
				mode = "CDC stream"
			}
			fmt.Fprintf(tw, "%s\t%d\t%.0f\t%d\t%.2f\t%.2f\t%.2f\t%.2f\t%.1f\t\n", mode, r.OfferedRate, r.AchievedRate, r.Received,
				r.P50Ms, r.P90Ms, r.P99Ms, r.MaxMs, r.MaxRSSMiB)
		}
		tw.Flush()
	}
	if i := res.Idle; i != nil {
		fmt.Fprintf(w, "\nidle: one relay, nothing to do, %.0fs (poll interval %gs)\n", i.Seconds, i.PollIntervalS)
		fmt.Fprintf(w, "  %.3f queries/s (%d queries, from %s); %.3f transactions/s; peak RSS %.1f MiB\n",
			i.QueriesPerSec, i.Queries, i.Source, i.XactsPerSec, i.MaxRSSMiB)
		for _, s := range i.TopStatements {
			fmt.Fprintf(w, "  %6d × %s\n", s.Calls, oneLine(s.Query, 100))
		}
	}
	if h := res.History; h != nil {
		fmt.Fprintf(w, "\nhistory: pick-up of fresh events (commit → relay marks them) with published rows kept\n")
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintln(tw, "kept rows\ttable MiB\tevents\tp50 ms\tp90 ms\tmax ms\tclaim mean ms\tpeak RSS MiB\t")
		for _, p := range h.Phases {
			claim := "–" // pg_stat_statements is not loaded
			if p.ClaimMeanMs > 0 {
				claim = fmt.Sprintf("%.3f", p.ClaimMeanMs)
			}
			fmt.Fprintf(tw, "%d\t%.1f\t%d\t%.2f\t%.2f\t%.2f\t%s\t%.1f\t\n", p.KeptRows, p.TableMiB, p.Events, p.P50Ms, p.P90Ms, p.MaxMs, claim, p.MaxRSSMiB)
		}
		tw.Flush()
		if h.ClaimRatio > 0 {
			fmt.Fprintf(w, "p50 with history / empty: %.2f; claim statement mean: %.2f\n", h.RatioP50, h.ClaimRatio)
		} else {
			fmt.Fprintf(w, "p50 with history / empty: %.2f (claim statement times need pg_stat_statements)\n", h.RatioP50)
		}
	}
	if t := res.Tenants; t != nil {
		t.writeText(w)
	}
	if d := res.Destinations; d != nil {
		d.writeText(w)
	}
	res.writeCPU(w)
}

// writeCPU prints how busy the machine was during each scenario, and how much of
// its CPU time the host took away.
func (res *Result) writeCPU(w io.Writer) {
	summary, stolen := res.cpuSummary()
	if summary == "" {
		return
	}
	fmt.Fprintf(w, "\nmachine CPU during each scenario (busy / stolen by the host): %s\n", summary)
	if stolen {
		fmt.Fprintln(w, stolenWarning)
	}
}

const stolenWarning = "the host took 5% or more of the CPU time in a scenario: its figures are below what this machine does alone"

// cpuSummary lists each scenario's busy and stolen CPU shares; stolen is true
// when the host took 5% or more in one of them.
func (res *Result) cpuSummary() (summary string, stolen bool) {
	var parts []string
	for _, s := range Scenarios {
		if sh, ok := res.ScenarioCPU[s]; ok {
			parts = append(parts, fmt.Sprintf("%s %.0f%% / %.0f%%", s, sh.BusyPct, sh.StealPct))
			stolen = stolen || sh.StealPct >= 5
		}
	}
	return strings.Join(parts, ", "), stolen
}
