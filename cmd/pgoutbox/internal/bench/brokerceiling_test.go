package bench

import (
	"strings"
	"testing"
)

// The combined ceiling is the rate of doing both ceilings' work on the same
// CPUs, and the 1-relay run is held to 0.8 of it.
func TestCombinedCeiling(t *testing.T) {
	if got := combinedCeiling(40000, 60000); got != 24000 {
		t.Errorf("combined %v, want 24000", got)
	}
	if got := combinedCeiling(40000, 0); got != 0 {
		t.Errorf("without a broker ceiling: %v, want 0", got)
	}
	for _, tc := range []struct {
		eps float64
		met bool
	}{{20000, true}, {19000, false}} {
		res := &Result{Drain: &DrainResult{Runs: []DrainRun{{Broker: "nats", Relays: 1, EventsPerSec: tc.eps,
			CeilingEventsPerSec: 40000, BrokerCeilingEventsPerSec: 60000, CombinedCeilingEventsPerSec: 24000,
			RatioToCombined: ratio(tc.eps, 24000)}}}}
		var found bool
		for _, tg := range res.targets() {
			if strings.Contains(tg.Name, "combined") {
				found = true
				if tg.Met != tc.met {
					t.Errorf("%v events/s: %+v, want met %v", tc.eps, tg, tc.met)
				}
			}
		}
		if !found {
			t.Errorf("no combined-ceiling target in %+v", res.targets())
		}
		var text strings.Builder
		res.WriteText(&text)
		if !strings.Contains(text.String(), "broker alone 60000 events/s; combined with the SQL ceiling 24000") {
			t.Errorf("text:\n%s", text.String())
		}
	}
}
