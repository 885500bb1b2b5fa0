package bench

import (
	"strings"
	"testing"
)

func TestCPUShare(t *testing.T) {
	a, err := parseCPUTimes(strings.NewReader("cpu  100 0 50 800 10 0 0 40 0 0\ncpu0 1 2 3 4 5 6 7 8 9 10\n"))
	if err != nil {
		t.Fatal(err)
	}
	// Over the next 1,000 ticks: 300 user, 100 system, 20 softirq, 100 steal, 480 idle.
	b, err := parseCPUTimes(strings.NewReader("cpu  400 0 150 1280 10 0 20 140 0 0\n"))
	if err != nil {
		t.Fatal(err)
	}
	got, ok := share(a, b)
	if want := (CPUShare{BusyPct: 42, StealPct: 10}); !ok || got != want {
		t.Errorf("share = %+v, %v; want %+v", got, ok, want)
	}
	if _, ok := share(b, b); ok {
		t.Error("share over no time: ok")
	}
	for _, bad := range []string{"", "intr 1 2 3\n", "cpu 1 2 3\n", "cpu 1 2 3 4 5 6 7 x\n"} {
		if _, err := parseCPUTimes(strings.NewReader(bad)); err == nil {
			t.Errorf("parseCPUTimes(%q): no error", bad)
		}
	}
	if _, ok := readCPUTimes(); !ok {
		t.Log("no /proc/stat here")
	}
}

// The text names each scenario's busy and stolen shares, and warns when the host
// took enough to lower the figures.
func TestWriteTextCPU(t *testing.T) {
	for _, c := range []struct {
		steal float64
		warn  bool
	}{{1, false}, {12.6, true}} {
		res := &Result{ScenarioCPU: map[string]CPUShare{ScenarioDrain: {BusyPct: 93.4, StealPct: c.steal}, ScenarioIdle: {BusyPct: 3}}}
		var b strings.Builder
		res.WriteText(&b)
		out := b.String()
		if !strings.Contains(out, "(busy / stolen by the host): drain 93% / ") || !strings.Contains(out, "idle 3% / 0%") {
			t.Errorf("text:\n%s", out)
		}
		if strings.Contains(out, stolenWarning) != c.warn {
			t.Errorf("steal %v: warning shown = %v\n%s", c.steal, !c.warn, out)
		}
	}
}
