package admin_test

import (
	"fmt"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/pgoutbox/pgoutbox/admin"
	"github.com/pgoutbox/pgoutbox/internal/pgtest"
)

// The time StatusOf takes for 205 tenants (the console's overview read, as in
// the browser test TestBrowserTenantsWorstFirst): the first read, then the
// median of 5. A one-off measurement for docs/console.md, not a CI test:
// PGOUTBOX_CONSOLE_MEASURE=1 go test ./admin -run TestStatusOfTenantsFigure -v
func TestStatusOfTenantsFigure(t *testing.T) {
	if os.Getenv("PGOUTBOX_CONSOLE_MEASURE") != "1" {
		t.Skip("a one-off measurement: set PGOUTBOX_CONSOLE_MEASURE=1 to run it")
	}
	const n = 205
	schemas := make([]string, n)
	for i := range n {
		schemas[i] = fmt.Sprintf("tenant_%03d", i)
	}
	start := time.Now()
	_, pool := pgtest.Outboxes(t, 8, schemas...)
	t.Logf("%d tenants migrated in %s", n, time.Since(start).Round(time.Millisecond))
	read := func() time.Duration {
		t0 := time.Now()
		rows, err := admin.StatusOf(t.Context(), pool, schemas, nil)
		pgtest.Must(t, err, "status")
		for _, r := range rows {
			if r.Err != nil {
				t.Fatalf("%s: %v", r.Tenant, r.Err)
			}
		}
		return time.Since(t0)
	}
	first := read()
	var times []time.Duration
	for range 5 {
		times = append(times, read())
	}
	slices.Sort(times)
	t.Logf("status of %d tenants: first read %s, median of 5 %s, max %s", n, first.Round(time.Millisecond),
		times[2].Round(time.Millisecond), times[4].Round(time.Millisecond))
}
