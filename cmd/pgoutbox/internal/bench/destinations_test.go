package bench

import (
	"bytes"
	"context"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/pgoutbox/pgoutbox/internal/pgtest"
)

// The destination cells at a tiny size through the real binary: every
// delivery of 1, 2 and 3 destinations is checked done (destinationDrain fails
// otherwise), the 3 destinations are registered for the enqueue cell, and the
// figures hang together. Correctness only: no figure is held to a bound.
func TestDestinationCellsSmall(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the pgoutbox binary")
	}
	dir := t.TempDir()
	build := exec.Command("go", "build", "-o", filepath.Join(dir, "pgoutbox"), "github.com/pgoutbox/pgoutbox/cmd/pgoutbox")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	res, err := Run(ctx, &Config{DatabaseURL: pgtest.URL(), Executable: filepath.Join(dir, "pgoutbox"),
		Scenarios: []string{ScenarioDestinations}, Events: 300, Aggregates: 20, PayloadBytes: 64,
		Duration: time.Second, EnqueueRounds: 2, PollInterval: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	d := res.Destinations
	if d == nil || len(d.Drains) != 3 || d.Enqueue == nil {
		t.Fatalf("destination cells %+v", d)
	}
	for i, r := range d.Drains {
		if r.Destinations != i+1 || r.Deliveries != int64(300*(i+1)) || r.PerDestinationPerSec <= 0 || r.TotalPerSec <= 0 ||
			r.RelayCPUPerDeliveryUs <= 0 || r.RatioToSingle <= 0 {
			t.Errorf("drain to %d destination(s): %+v", i+1, r)
		}
	}
	if d.Drains[0].RatioToSingle != 1 {
		t.Errorf("the single-destination drain's ratio to itself is %v", d.Drains[0].RatioToSingle)
	}
	if e := d.Enqueue; e.NoneTxPerSec <= 0 || e.ThreeTxPerSec <= 0 || e.RatioThreeNone <= 0 {
		t.Errorf("enqueue %+v", e)
	}
	var out bytes.Buffer
	res.WriteText(&out)
	if !strings.Contains(out.String(), "total deliveries/s") || !strings.Contains(out.String(), "3 destinations registered vs none") {
		t.Errorf("text output:\n%s", out.String())
	}
	t.Log(out.String())
}
