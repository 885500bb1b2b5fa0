package bench

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
)

// CPUShare is how the machine's CPU time was spent while a scenario ran, from
// /proc/stat. Steal is time the hypervisor gave this machine's virtual CPUs to
// other guests: while it is high, every figure of the scenario is lower (or
// slower) than the machine can do, and ratios whose sides ran at different times
// are unreliable.
type CPUShare struct {
	BusyPct  float64 `json:"busy_pct"`  // user, nice, system, irq, softirq
	StealPct float64 `json:"steal_pct"` // taken by the host
}

// cpuTimes is the first line of /proc/stat: the machine's CPU time by kind, in
// clock ticks.
type cpuTimes struct{ busy, steal, total uint64 }

// readCPUTimes reads /proc/stat; ok is false where there is none (not Linux).
func readCPUTimes() (cpuTimes, bool) {
	f, err := os.Open("/proc/stat")
	if err != nil {
		return cpuTimes{}, false
	}
	defer f.Close()
	t, err := parseCPUTimes(f)
	return t, err == nil
}

// parseCPUTimes parses the aggregate "cpu" line: user nice system idle iowait
// irq softirq steal [guest guest_nice] (guest time is already counted in user).
func parseCPUTimes(r io.Reader) (cpuTimes, error) {
	line, err := bufio.NewReader(r).ReadString('\n')
	if err != nil && line == "" {
		return cpuTimes{}, fmt.Errorf("read /proc/stat: %w", err)
	}
	f := strings.Fields(line)
	if len(f) < 9 || f[0] != "cpu" {
		return cpuTimes{}, fmt.Errorf("/proc/stat: unexpected first line %q", line)
	}
	var v [8]uint64
	for i := range v {
		if v[i], err = strconv.ParseUint(f[i+1], 10, 64); err != nil {
			return cpuTimes{}, fmt.Errorf("/proc/stat: %w", err)
		}
	}
	t := cpuTimes{busy: v[0] + v[1] + v[2] + v[5] + v[6], steal: v[7]}
	for _, x := range v {
		t.total += x
	}
	return t, nil
}

// share is the CPU time spent between a and b.
func share(a, b cpuTimes) (CPUShare, bool) {
	total := b.total - a.total
	if b.total <= a.total {
		return CPUShare{}, false
	}
	pct := func(x uint64) float64 { return round2(100 * float64(x) / float64(total)) }
	return CPUShare{BusyPct: pct(b.busy - a.busy), StealPct: pct(b.steal - a.steal)}, true
}
