package bench

import (
	_ "embed"
	"encoding/json"
	"fmt"
	"html/template"
	"io"
	"math"
	"slices"
)

//go:embed report.html.tmpl
var reportTemplate string

var reportTmpl = template.Must(template.New("report").Funcs(template.FuncMap{
	"pct":      func(f float64) string { return fmt.Sprintf("%.0f%%", 100*f) },
	"modeName": modeName,
	"source":   sourceName,
	"wmName":   func() string { return watermillName },
	"peerName": func() string { return peerName },
}).Parse(reportTemplate))

type reportData struct {
	R           *Result
	PG          string
	MemGiB      string
	Settings    string
	DrainBars   template.HTML
	DrainLines  []template.HTML
	LatencyHist template.HTML
	LatencyPct  template.HTML
	EnqueueBars template.HTML
	CPU         string // each scenario's busy / stolen CPU shares
	Stolen      string // the warning when the host took 5% or more
}

// WriteReport writes res as one self-contained HTML page: charts drawn as inline
// SVG and tables of every figure, with nothing fetched from the network.
func WriteReport(w io.Writer, res *Result) error {
	d := reportData{R: res, PG: firstWords(res.Context.PostgreSQL, 2),
		MemGiB: fmt.Sprintf("%.0f", float64(res.Context.MemoryBytes)/(1<<30))}
	var stolen bool
	if d.CPU, stolen = res.cpuSummary(); stolen {
		d.Stolen = stolenWarning
	}
	if b, err := json.Marshal(res.Settings); err == nil {
		d.Settings = string(b)
	}
	if dr := res.Drain; dr != nil && len(dr.Runs) > 0 {
		d.DrainBars, d.DrainLines = drainCharts(dr)
	}
	if l := res.Latency; l != nil && len(l.Runs) > 0 {
		d.LatencyHist, d.LatencyPct = latencyCharts(l)
	}
	if e := res.Enqueue; e != nil && len(e.Cells) > 0 {
		d.EnqueueBars = enqueueChart(e)
	}
	return reportTmpl.Execute(w, d)
}

func drainCharts(dr *DrainResult) (template.HTML, []template.HTML) {
	// Bars: events/s per relay count, one colour per broker (and per broker for
	// the CDC source, which runs one relay), the ceiling dashed.
	var brokers, keys []string
	var counts []int
	for _, r := range dr.Runs {
		if !slices.Contains(brokers, r.Broker) {
			brokers = append(brokers, r.Broker)
		}
		if !slices.Contains(keys, drainKey(r)) {
			keys = append(keys, drainKey(r))
		}
		if !slices.Contains(counts, r.Relays) {
			counts = append(counts, r.Relays)
		}
	}
	var groups []barGroup
	for _, n := range counts {
		g := barGroup{label: fmt.Sprintf("%d relay%s", n, plural(n))}
		for _, k := range keys {
			v := 0.0
			for _, r := range dr.Runs {
				if drainKey(r) == k && r.Relays == n {
					v = r.EventsPerSec
				}
			}
			g.values = append(g.values, v)
		}
		groups = append(groups, g)
	}
	bars := barChart("Drain throughput (events/s)", "events/s", keys, groups, dr.CeilingEventsPerSec,
		fmt.Sprintf("SQL ceiling %s/s", fmtNum(dr.CeilingEventsPerSec)))
	// Lines: throughput over time, per broker, one line per relay count.
	var lines []template.HTML
	for _, b := range brokers {
		var ss []series
		tmax := 0.0
		for i, r := range dr.Runs {
			if r.Broker != b {
				continue
			}
			name := fmt.Sprintf("%d relay%s", r.Relays, plural(r.Relays))
			if r.Source == SourceCDC {
				name = "CDC, 1 relay"
			}
			ss = append(ss, series{name: name, color: palette[i%len(palette)], points: rateSeries(r.Series)})
			if len(r.Series) > 0 {
				tmax = max(tmax, r.Series[len(r.Series)-1].T)
			}
		}
		if dr.CeilingEventsPerSec > 0 {
			ss = append(ss, series{name: "SQL ceiling", color: "#111", dashed: true,
				points: []point{{0, dr.CeilingEventsPerSec}, {tmax, dr.CeilingEventsPerSec}}})
		}
		lines = append(lines, template.HTML(lineChart("Throughput over time → "+b+" (1 s sliding window)", "seconds since the backlog was committed", "events/s", ss)))
	}
	return template.HTML(bars), lines
}

// rateSeries turns cumulative samples into events/s over a sliding window of about
// one second (a relay publishes in batches, so 200 ms deltas are mostly jitter).
func rateSeries(s []Sample) []point {
	const window = 1.0
	out := []point{{0, 0}}
	j := -1 // index of the window's start sample; -1 is (0 s, 0 events)
	for i, x := range s {
		for j+1 < i && s[j+1].T <= x.T-window {
			j++
		}
		t0, n0 := 0.0, int64(0)
		if j >= 0 {
			t0, n0 = s[j].T, s[j].Published
		}
		if dt := x.T - t0; dt > 0 {
			out = append(out, point{x.T, float64(x.Published-n0) / dt})
		}
	}
	return out
}

func latencyCharts(l *LatencyResult) (template.HTML, template.HTML) {
	// Histogram: share of events per power-of-two bucket, grouped by mode.
	var names []string
	var edges []float64
	for _, r := range l.Runs {
		names = append(names, modeName(r))
		for _, b := range r.Histogram {
			if !slices.Contains(edges, b.UpToMs) {
				edges = append(edges, b.UpToMs)
			}
		}
	}
	slices.Sort(edges)
	var groups []barGroup
	for _, e := range edges {
		g := barGroup{label: "≤" + fmtNum(e)}
		for _, r := range l.Runs {
			v := 0.0
			for _, b := range r.Histogram {
				if b.UpToMs == e && r.Received > 0 {
					v = 100 * float64(b.Count) / float64(r.Received)
				}
			}
			g.values = append(g.values, round2(v))
		}
		groups = append(groups, g)
	}
	// Leave out the empty buckets below the first one that has events.
	for len(groups) > 1 && slices.Max(groups[0].values) == 0 {
		groups = groups[1:]
	}
	hist := barChart("Latency histogram (% of events per bucket, ms)", "% of events", names, groups, 0, "")
	// Percentiles: latency (ms) at each percentile, one line per mode; x is the
	// percentile's rank on a "nines" scale so the tail gets room.
	var ss []series
	for i, r := range l.Runs {
		s := series{name: modeName(r), color: palette[i%len(palette)]}
		for _, p := range r.Percentiles {
			if p.Percentile >= 100 {
				continue
			}
			s.points = append(s.points, point{nines(p.Percentile), p.Ms})
		}
		ss = append(ss, s)
	}
	pct := lineChart("Latency by percentile", "percentile: 1 = 90%, 2 = 99%, 3 = 99.9%, 4 = 99.99%", "ms", ss)
	return template.HTML(hist), template.HTML(pct)
}

func enqueueChart(e *EnqueueResult) template.HTML {
	names := []string{"no outbox", "outbox, NOTIFY on", "outbox, NOTIFY off", "outbox batched with the INSERT", "floor: a row of the payload alone", watermillName, peerName}
	var groups []barGroup
	for _, k := range []struct {
		p     int
		relay bool
	}{{1, false}, {16, false}, {16, true}} {
		g := barGroup{label: fmt.Sprintf("%d producer%s", k.p, plural(k.p)), values: make([]float64, len(names))}
		if k.relay {
			g.label += ", relay running"
		}
		for _, c := range e.Cells {
			if c.Producers != k.p || c.Relay != k.relay {
				continue
			}
			switch {
			case c.Floor:
				g.values[4] = c.CommitsPerSec
			case c.Watermill:
				g.values[5] = c.CommitsPerSec
			case c.WatermillSQL:
				g.values[6] = c.CommitsPerSec
			case c.Batched:
				g.values[3] = c.CommitsPerSec
			case !c.Outbox:
				g.values[0] = c.CommitsPerSec
			case c.Notify:
				g.values[1] = c.CommitsPerSec
			default:
				g.values[2] = c.CommitsPerSec
			}
		}
		groups = append(groups, g)
	}
	return template.HTML(barChart("Business transactions (commits/s)", "commits/s", names, groups, 0, ""))
}

// drainKey names a drain run's bar series: the broker, for CDC with " CDC".
func drainKey(r DrainRun) string {
	if r.Source == SourceCDC {
		return r.Broker + " CDC"
	}
	return r.Broker
}

func modeName(r LatencyRun) string {
	switch r.Mode {
	case "poll":
		return fmt.Sprintf("polling every %gs", r.PollIntervalS)
	case SourceCDC:
		return "CDC stream"
	}
	return "NOTIFY"
}

// nines maps a percentile to -math.Log10(1 - p/100): 90 → 1, 99 → 2, 99.9 → 3.
func nines(p float64) float64 {
	if p >= 100 {
		return 5
	}
	return round3(-math.Log10(1 - p/100))
}

func plural(n int) string {
	if n == 1 {
		return ""
	}
	return "s"
}
