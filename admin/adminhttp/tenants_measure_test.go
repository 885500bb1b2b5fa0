package adminhttp_test

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/pgoutbox/pgoutbox/admin/adminhttp"
	"github.com/pgoutbox/pgoutbox/internal/pgtest"
)

// The overview's server time at 10 and 100 tenants: the first load, then the
// median of 10 loads as open tabs refresh it, each tenant with a few events.
// A one-off measurement for docs/console.md, not a CI test:
// PGOUTBOX_CONSOLE_MEASURE=1 go test ./admin/adminhttp -run TestOverviewTenantsFigure -v
func TestOverviewTenantsFigure(t *testing.T) {
	if os.Getenv("PGOUTBOX_CONSOLE_MEASURE") != "1" {
		t.Skip("a one-off measurement: set PGOUTBOX_CONSOLE_MEASURE=1 to run it")
	}
	for _, n := range []int{10, 100} {
		var schemas []string
		for i := range n {
			schemas = append(schemas, fmt.Sprintf("tenant_%03d", i))
		}
		start := time.Now()
		_, pool := pgtest.Outboxes(t, 8, schemas...)
		t.Logf("%d tenants migrated in %s", n, time.Since(start).Round(time.Millisecond))
		for _, s := range schemas {
			_, err := pool.Exec(t.Context(), `INSERT INTO `+s+`.outbox_events (event_id, aggregate_type, aggregate_id, aggregate_sequence,
  event_type, payload, occurred_at, available_at) SELECT gen_random_uuid(), 'order', 'o' || i, 1, 'changed', '{}', now(), now()
  FROM generate_series(1, 20) i`)
			pgtest.Must(t, err, "events")
		}
		h, err := adminhttp.New(pool, &adminhttp.Config{Schemas: selector(t, "tenant_*"), NoAuth: true, Logger: quiet()})
		pgtest.Must(t, err, "console")
		srv := httptest.NewServer(h)
		size := 0
		load := func() time.Duration {
			t0 := time.Now()
			res, err := http.Get(srv.URL + "/")
			pgtest.Must(t, err, "get")
			b, _ := io.ReadAll(res.Body)
			size = len(b)
			res.Body.Close()
			if res.StatusCode != 200 {
				t.Fatalf("overview: %d", res.StatusCode)
			}
			return time.Since(t0)
		}
		first := load()
		var times []time.Duration
		for range 10 {
			times = append(times, load())
		}
		slices.Sort(times)
		srv.Close()
		t.Logf("overview at %d tenants: first load %s, median of 10 %s, max %s; HTML %d bytes", n, first.Round(time.Millisecond),
			times[5].Round(time.Millisecond), times[9].Round(time.Millisecond), size)
	}
}
