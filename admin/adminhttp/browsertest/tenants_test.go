package browsertest_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pgoutbox/pgoutbox"
	"github.com/pgoutbox/pgoutbox/admin/adminhttp"
	"github.com/pgoutbox/pgoutbox/admin/adminhttp/internal/consoletest"
	"github.com/pgoutbox/pgoutbox/internal/pgtest"
	"github.com/pgoutbox/pgoutbox/migrate"
)

// outboxTenants migrates n tenants tenant_000.. (the outbox line) in a
// database of the test's own, four at a time, and returns a pool on it.
func outboxTenants(t *testing.T, n int) (*consoletest.Env, []string) {
	t.Helper()
	pool := pgtest.Pool(t, pgtest.Database(t), 8)
	names := make([]string, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	slots := make(chan struct{}, 4)
	for i := range n {
		names[i] = fmt.Sprintf("tenant_%03d", i)
		wg.Go(func() {
			slots <- struct{}{}
			defer func() { <-slots }()
			_, errs[i] = migrate.Up(context.Background(), pool, &migrate.Config{Schema: names[i], Lines: []migrate.Line{migrate.LineOutbox}})
		})
	}
	wg.Wait()
	for i, err := range errs {
		pgtest.Must(t, err, "migrate %s", names[i])
	}
	return consoletest.On(t, pool, "tenant_000", func(c *adminhttp.Config) { c.Schemas = consoletest.Selector(t, "tenant_*") }, nil), names
}

// With 205 tenants, the one with a dead letter is listed first although its
// name sorts past the 200th (the rows shown). (Finding an event by id in any
// tenant: adminhttp's TestFindEventInAnyTenant.)
func TestBrowserTenantsWorstFirst(t *testing.T) {
	t.Parallel()
	start := time.Now()
	e, names := outboxTenants(t, 205)
	t.Logf("205 tenants migrated in %s", time.Since(start).Round(time.Millisecond))
	failing := names[203]
	p, err := pgoutbox.NewProducer(&pgoutbox.Config{Schema: failing})
	pgtest.Must(t, err, "producer")
	res, err := p.EnqueueTx(context.Background(), e.Pool, pgoutbox.Event{AggregateType: "order", AggregateID: "o-1", EventType: "changed", Payload: 1})
	pgtest.Must(t, err, "enqueue")
	_, err = e.Pool.Exec(context.Background(), "UPDATE "+failing+".outbox_events SET quarantined_at = now(), attempt_count = 10, last_error = 'boom' WHERE event_id = $1", res[0].EventID)
	pgtest.Must(t, err, "quarantine")
	// A tenant with a backlog but no dead letter comes after it.
	pBusy, err := pgoutbox.NewProducer(&pgoutbox.Config{Schema: names[204]})
	pgtest.Must(t, err, "producer")
	_, err = pBusy.EnqueueTx(context.Background(), e.Pool, pgoutbox.Event{AggregateType: "user", AggregateID: "u", EventType: "changed", Payload: 1})
	pgtest.Must(t, err, "enqueue")

	ctx := browser(t, basicAuth("victor", e.VictorKey))
	start = time.Now()
	run(t, ctx, "overview", navigateOrError(e.Server.URL+"/", "#tenants")...)
	t.Logf("overview of 205 tenants in %s", time.Since(start).Round(time.Millisecond))
	first := eval[[]string](t, ctx, `[...document.querySelectorAll("#tenants tbody tr td:first-child")].slice(0, 3).map(td => td.textContent.trim())`)
	if len(first) != 3 || first[0] != failing || first[1] != names[204] {
		t.Fatalf("tenants in order %q, want %s (a dead letter) then %s (a backlog) first", first, failing, names[204])
	}
	if rows := eval[int](t, ctx, `document.querySelectorAll("#tenants tbody tr").length`); rows != 200 {
		t.Errorf("%d tenant rows, want 200 (Config.MaxTenants)", rows)
	}
	if w := text(t, ctx, "p.warn"); !strings.HasPrefix(w, "5 more tenants") {
		t.Errorf("note %q", w)
	}
}
