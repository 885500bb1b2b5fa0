package relay_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgoutbox/pgoutbox"
	"github.com/pgoutbox/pgoutbox/broker"
	"github.com/pgoutbox/pgoutbox/broker/brokertest"
	"github.com/pgoutbox/pgoutbox/internal/pgtest"
	"github.com/pgoutbox/pgoutbox/internal/wait"
	"github.com/pgoutbox/pgoutbox/migrate"
	"github.com/pgoutbox/pgoutbox/relay"
)

// selector parses s, a schema selector.
func selector(t testing.TB, s string) migrate.Selector {
	t.Helper()
	sel, err := migrate.ParseSelector(s)
	pgtest.Must(t, err, "selector %q", s)
	return sel
}

// tenantDB is a database of its own holding outboxes, one per schema.
type tenantDB struct {
	url  string
	pool *pgxpool.Pool
}

func newTenantDB(t testing.TB, maxConns int32) *tenantDB {
	t.Helper()
	url, pool := pgtest.Outboxes(t, maxConns)
	return &tenantDB{url: url, pool: pool}
}

// migrate makes schema an outbox.
func (d *tenantDB) migrate(t testing.TB, schema string) {
	t.Helper()
	_, err := migrate.Up(context.Background(), d.pool, &migrate.Config{Schema: schema, Lines: []migrate.Line{migrate.LineOutbox}})
	pgtest.Must(t, err, "migrate %s", schema)
}

// enqueue writes n events of aggregates aggregates to schema, in one transaction.
func (d *tenantDB) enqueue(t testing.TB, schema string, aggregates, n int) {
	t.Helper()
	enqueueTx(t, d.pool, schema, aggregates, n)
}

// enqueueTx is tenantDB.enqueue in tx (or a transaction of its own on a pool).
func enqueueTx(t testing.TB, tx pgoutbox.PgxQuerier, schema string, aggregates, n int) {
	t.Helper()
	p, err := pgoutbox.NewProducer(&pgoutbox.Config{Schema: schema})
	pgtest.Must(t, err, "producer")
	evs := make([]pgoutbox.Event, n)
	for i := range evs {
		evs[i] = pgoutbox.Event{AggregateType: "acct", AggregateID: fmt.Sprintf("a%d", i%aggregates),
			EventType: "acct.changed", Payload: map[string]int{"n": i}}
	}
	_, err = p.EnqueueTx(context.Background(), tx, evs...)
	pgtest.Must(t, err, "enqueue into %s", schema)
}

func (d *tenantDB) pending(t testing.TB, schema string) int {
	t.Helper()
	var n int
	pgtest.Must(t, d.pool.QueryRow(context.Background(), "SELECT count(*) FROM "+
		pgx.Identifier{schema, "outbox_events"}.Sanitize()+" WHERE published_at IS NULL").Scan(&n), "pending")
	return n
}

func startGroup(t testing.TB, pub broker.Publisher, cfg relay.GroupConfig) *relay.Group {
	t.Helper()
	if cfg.Config.Logger == nil {
		cfg.Config.Logger = quietLogger()
	}
	g, err := relay.NewGroup(pub, &cfg)
	pgtest.Must(t, err, "NewGroup")
	pgtest.Must(t, g.Start(context.Background()), "start group")
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := g.Stop(ctx); err != nil {
			t.Errorf("stop group: %v", err)
		}
	})
	return g
}

// checkLanes fails unless every message names a tenant of want and each
// tenant's aggregates arrived in sequence order, from 1.
func checkLanes(t testing.TB, msgs []broker.Message, want map[string]int) {
	t.Helper()
	next := map[string]int64{}
	got := map[string]int{}
	for _, m := range msgs {
		key := m.Tenant + "/" + m.AggregateID
		if m.AggregateSequence <= next[key] {
			continue // a duplicate after a lease expired: allowed
		}
		if m.AggregateSequence != next[key]+1 {
			t.Fatalf("tenant %s aggregate %s: sequence %d after %d", m.Tenant, m.AggregateID, m.AggregateSequence, next[key])
		}
		next[key] = m.AggregateSequence
		got[m.Tenant]++
	}
	for tenant, n := range want {
		if got[tenant] != n {
			t.Errorf("tenant %s: %d events published, want %d", tenant, got[tenant], n)
		}
	}
	for tenant := range got {
		if _, ok := want[tenant]; !ok {
			t.Errorf("events of tenant %q published, which is not selected", tenant)
		}
	}
}

// One group serves the selected outboxes of two databases, with the same
// schema names kept apart by a prefix; outboxes added while it runs are
// served, outboxes dropped are let go, a broken one is reported by name while
// the others flow.
func TestGroupServesManyOutboxes(t *testing.T) {
	t.Parallel()
	a, b := newTenantDB(t, 6), newTenantDB(t, 6)
	for _, s := range []string{"t_1", "t_2", "t_3", "other"} {
		a.migrate(t, s)
	}
	for _, s := range []string{"t_1", "t_9"} {
		b.migrate(t, s)
	}
	for _, s := range []string{"t_1", "t_2", "t_3", "other"} {
		a.enqueue(t, s, 7, 200)
	}
	b.enqueue(t, "t_1", 5, 100)
	b.enqueue(t, "t_9", 5, 100)

	rec := &brokertest.Recorder{Jitter: 100 * time.Microsecond}
	g := startGroup(t, rec, relay.GroupConfig{
		Config: relay.Config{Workers: 2, BatchSize: 50, PollInterval: 200 * time.Millisecond},
		Databases: []relay.Database{
			{Name: "a", Pool: a.pool, Schemas: selector(t, "t_*")},
			{Name: "b", Pool: b.pool, Schemas: selector(t, "t_*"), TenantPrefix: "b-"},
		},
		DiscoverInterval: 100 * time.Millisecond,
	})
	want := map[string]int{"t_1": 200, "t_2": 200, "t_3": 200, "b-t_1": 100, "b-t_9": 100}
	wait.For(t, 30*time.Second, "every selected outbox drained", func() bool {
		return a.pending(t, "t_1")+a.pending(t, "t_2")+a.pending(t, "t_3")+b.pending(t, "t_1")+b.pending(t, "t_9") == 0
	})
	if n := a.pending(t, "other"); n != 200 {
		t.Fatalf("schema other is not selected, yet %d of its 200 events are pending", n)
	}
	checkLanes(t, rec.Messages(), want)
	pgtest.Must(t, g.Healthy(), "healthy")

	// Added while running: served without a restart.
	a.migrate(t, "t_new")
	a.enqueue(t, "t_new", 3, 30)
	want["t_new"] = 30
	wait.For(t, 30*time.Second, "the new outbox drained", func() bool { return a.pending(t, "t_new") == 0 })

	// Broken: its migrations' record says it is not migrated. Reported by
	// name; the others keep flowing.
	_, err := a.pool.Exec(context.Background(), `DELETE FROM t_3.pgoutbox_migrations WHERE version = 1`)
	pgtest.Must(t, err, "break t_3")
	_, err = a.pool.Exec(context.Background(), `DROP SCHEMA t_2 CASCADE`)
	pgtest.Must(t, err, "drop t_2")
	a.migrate(t, "t_broken")
	_, err = a.pool.Exec(context.Background(), `DELETE FROM t_broken.pgoutbox_migrations WHERE version = 2`)
	pgtest.Must(t, err, "break t_broken")
	wait.For(t, 30*time.Second, "t_2 let go and t_broken reported", func() bool {
		err := g.Healthy()
		var served []string
		for _, ts := range g.Tenants() {
			if ts.Serving {
				served = append(served, ts.Tenant)
			}
		}
		return errors.Is(err, relay.ErrTenant) && strings.Contains(err.Error(), "t_broken") &&
			!strings.Contains(strings.Join(served, ","), "t_2") && strings.Contains(strings.Join(served, ","), "t_3")
	})
	a.enqueue(t, "t_1", 3, 30)
	b.enqueue(t, "t_9", 3, 30)
	want["t_1"] += 30
	want["b-t_9"] += 30
	wait.For(t, 30*time.Second, "the healthy outboxes keep flowing", func() bool {
		return a.pending(t, "t_1")+b.pending(t, "t_9") == 0
	})
	checkLanes(t, rec.Messages(), want)
	for _, ts := range g.Tenants() {
		if ts.Tenant == "t_broken" && (ts.Serving || ts.Err == nil || !strings.Contains(ts.Err.Error(), "lacks migration")) {
			t.Errorf("t_broken: serving %v, error %v", ts.Serving, ts.Err)
		}
	}
}

// Two outboxes that would have one tenant name (the same schema without a
// prefix, or a prefix and a schema that add up to another's schema) would
// send their events to the same destinations, where a consumer drops one's
// "acct/a0 #1" as a duplicate of the other's: every one of them is refused,
// named beside the other, whatever the order of the databases, and the other
// outboxes flow.
func TestGroupRefusesEveryTenantNameClash(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name             string
		schemaA, schemaB string
		prefixA, prefixB string
		tenant           string
	}{
		{"same schema", "shop", "shop", "", "", "shop"},
		{"prefix and schema", "x", "a_x", "a_", "", "a_x"},
		{"two prefixes", "b_c", "c", "a_", "a_b_", "a_b_c"},
	} {
		for _, reversed := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s reversed=%v", tc.name, reversed), func(t *testing.T) {
				t.Parallel()
				a, b := newTenantDB(t, 4), newTenantDB(t, 4)
				a.migrate(t, tc.schemaA)
				b.migrate(t, tc.schemaB)
				a.migrate(t, "zz_other")
				a.enqueue(t, tc.schemaA, 2, 5)
				b.enqueue(t, tc.schemaB, 2, 5)
				a.enqueue(t, "zz_other", 2, 5)
				dbs := []relay.Database{{Name: "a", Pool: a.pool, TenantPrefix: tc.prefixA}, {Name: "b", Pool: b.pool, TenantPrefix: tc.prefixB}}
				if reversed {
					dbs[0], dbs[1] = dbs[1], dbs[0]
				}
				rec := &brokertest.Recorder{}
				g := startGroup(t, rec, relay.GroupConfig{Databases: dbs, DiscoverInterval: 100 * time.Millisecond})
				wait.For(t, 30*time.Second, "the other outbox drained", func() bool { return a.pending(t, "zz_other") == 0 })
				checkClash(t, g, rec, tc.tenant, tc.schemaA, tc.schemaB)
				if a.pending(t, tc.schemaA) != 5 || b.pending(t, tc.schemaB) != 5 {
					t.Fatalf("pending %d and %d, want 5 and 5", a.pending(t, tc.schemaA), b.pending(t, tc.schemaB))
				}
			})
		}
	}
}

// checkClash checks that neither outbox of tenant is served, that each is
// named with the other, and that none of their events was published.
func checkClash(t *testing.T, g *relay.Group, rec *brokertest.Recorder, tenant, schemaA, schemaB string) {
	t.Helper()
	err := g.Healthy()
	if !errors.Is(err, relay.ErrTenantNameClash) || !strings.Contains(err.Error(), fmt.Sprintf("schema %q of database %q and schema %q of database %q", schemaA, "a", schemaB, "b")) {
		t.Fatalf("Healthy = %v, want both outboxes of %s refused and named", err, tenant)
	}
	for _, ts := range g.Tenants() {
		if ts.Tenant == tenant && (ts.Serving || !errors.Is(ts.Err, relay.ErrTenantNameClash)) {
			t.Errorf("%s/%s: serving %v, error %v", ts.Database, ts.Schema, ts.Serving, ts.Err)
		}
	}
	for _, m := range rec.Messages() {
		if m.Tenant == tenant {
			t.Fatalf("event %s published under the clashing tenant name %s", m.EventID, tenant)
		}
	}
}

// A clash that appears while an outbox is served (another database creates
// the schema later) stops the served one too: the first to be served does
// not win. Once the clash is gone, the outbox is served again.
func TestGroupClashWhileServing(t *testing.T) {
	t.Parallel()
	a, b := newTenantDB(t, 4), newTenantDB(t, 4)
	a.migrate(t, "shop")
	rec := &brokertest.Recorder{}
	g := startGroup(t, rec, relay.GroupConfig{
		Config:           relay.Config{PollInterval: 100 * time.Millisecond},
		Databases:        []relay.Database{{Name: "a", Pool: a.pool}, {Name: "b", Pool: b.pool}},
		DiscoverInterval: 100 * time.Millisecond,
	})
	a.enqueue(t, "shop", 2, 5)
	wait.For(t, 30*time.Second, "a's shop drained", func() bool { return a.pending(t, "shop") == 0 })
	published := len(rec.Messages())

	b.migrate(t, "shop")
	wait.For(t, 30*time.Second, "both shops refused", func() bool { return errors.Is(g.Healthy(), relay.ErrTenantNameClash) })
	wait.For(t, 30*time.Second, "a's shop no longer served", func() bool {
		for _, ts := range g.Tenants() {
			if ts.Serving && ts.Tenant == "shop" {
				return false
			}
		}
		return true
	})
	a.enqueue(t, "shop", 2, 5)
	b.enqueue(t, "shop", 2, 5)
	// Another outbox, served after the clash, shows discovery went on.
	a.migrate(t, "zz_other")
	a.enqueue(t, "zz_other", 1, 3)
	wait.For(t, 30*time.Second, "the other outbox drained", func() bool { return a.pending(t, "zz_other") == 0 })
	checkClash(t, g, &brokertest.Recorder{}, "shop", "shop", "shop")
	if n := len(rec.Messages()) - published; n != 3 {
		t.Fatalf("%d events published during the clash, want only zz_other's 3", n)
	}

	_, err := b.pool.Exec(context.Background(), `DROP SCHEMA shop CASCADE`)
	pgtest.Must(t, err, "drop b's shop")
	wait.For(t, 30*time.Second, "a's shop served again and drained", func() bool { return a.pending(t, "shop") == 0 })
	// Each database is listed on its own: a's listing may serve its shop again
	// before b's next listing forgets the shop it no longer has.
	wait.For(t, 30*time.Second, "healthy once the clash is gone", func() bool { return g.Healthy() == nil })
}

// Hostile schema names are outboxes like any other; those that cannot be a
// tenant name (destinations would carry them) are reported, never run.
func TestGroupTenantNames(t *testing.T) {
	t.Parallel()
	d := newTenantDB(t, 4)
	for _, s := range []string{`x"; DROP TABLE y; --`, "a.b", "a b", "ä", "a*", "a>"} {
		d.migrate(t, s)
	}
	d.migrate(t, "ok_1")
	g := startGroup(t, &brokertest.Recorder{}, relay.GroupConfig{Databases: []relay.Database{{Pool: d.pool}}})
	for _, ts := range g.Tenants() {
		if want := ts.Schema == "ok_1"; ts.Serving != want {
			t.Errorf("schema %q: serving %v, want %v (%v)", ts.Schema, ts.Serving, want, ts.Err)
		}
	}
	for _, name := range []string{"", "a.b", "a b", "ä", "a*", "a>", "x/y", strings.Repeat("a", 101)} {
		if relay.ValidateTenant(name) == nil {
			t.Errorf("ValidateTenant(%q) accepted", name)
		}
	}
	for _, name := range []string{"a", "tenant_1", "T-9", strings.Repeat("a", 100)} {
		pgtest.Must(t, relay.ValidateTenant(name), "ValidateTenant(%q)", name)
	}
}

func TestGroupConfigValidate(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t, pgtest.URL(), 1)
	var none *relay.GroupConfig
	if err := none.Validate(); err == nil || !strings.Contains(err.Error(), "GroupConfig.Databases") {
		t.Errorf("nil GroupConfig: Validate = %v, want an error about GroupConfig.Databases", err)
	}
	for _, tc := range []struct {
		cfg  relay.GroupConfig
		want string
	}{
		{relay.GroupConfig{}, "GroupConfig.Databases"},
		{relay.GroupConfig{Config: relay.Config{Schema: "x"}, Databases: []relay.Database{{Pool: pool}}}, "must be empty"},
		{relay.GroupConfig{Databases: []relay.Database{{Name: "a"}}}, "Pool must not be nil"},
		{relay.GroupConfig{Databases: []relay.Database{{Name: "a", Pool: pool}, {Name: "a", Pool: pool}}}, "unique"},
		{relay.GroupConfig{Databases: []relay.Database{{Pool: pool, TenantPrefix: "a.b"}}}, "TenantPrefix"},
		{relay.GroupConfig{Config: relay.Config{Workers: 1000}, Databases: []relay.Database{{Pool: pool}}}, "Workers"},
	} {
		_, err := relay.NewGroup(&brokertest.Recorder{}, &tc.cfg)
		if err == nil {
			t.Fatalf("NewGroup(%+v) accepted it", tc.cfg)
		}
		if !strings.Contains(err.Error(), tc.want) {
			t.Errorf("NewGroup(%+v) = %v, want an error about %s", tc.cfg, err, tc.want)
		}
		if verr := tc.cfg.Validate(); verr == nil || verr.Error() != err.Error() {
			t.Errorf("Validate(%+v) = %v, want NewGroup's error %v", tc.cfg, verr, err)
		}
	}
}

// A hundred idle outboxes cost one database two sessions beyond the pool, and
// a commit into any of them wakes its relay through the one LISTEN session.
func TestGroupIdleSharesSessions(t *testing.T) {
	t.Parallel()
	d := newTenantDB(t, 4)
	const n = 40
	for i := range n {
		d.migrate(t, fmt.Sprintf("t_%02d", i))
	}
	rec := &brokertest.Recorder{}
	// A poll interval far longer than the test: only a notification can wake.
	g := startGroup(t, rec, relay.GroupConfig{
		Config:    relay.Config{Workers: 2, PollInterval: time.Hour},
		Databases: []relay.Database{{Pool: d.pool}},
	})
	waitServed(t, g, n)
	var listeners int
	wait.For(t, 30*time.Second, "one LISTEN session for all", func() bool {
		pgtest.Must(t, d.pool.QueryRow(context.Background(),
			`SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND query LIKE 'LISTEN%'`).Scan(&listeners), "listeners")
		return listeners == 1
	})
	// The idle locks: producers of an idle outbox notify.
	for i := range n {
		d.enqueue(t, fmt.Sprintf("t_%02d", i), 1, 1)
	}
	wait.Forf(t, 30*time.Second, func() string { return idleReport(t, d, g, rec, n) },
		func() bool { return len(rec.Messages()) == n })
	var sessions int
	pgtest.Must(t, d.pool.QueryRow(context.Background(),
		`SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()`).Scan(&sessions), "sessions")
	if sessions > 4+2 {
		t.Errorf("%d sessions for %d outboxes; want at most the pool (4) and the hub's two", sessions, n)
	}
}

// waitServed waits until g serves n outboxes. Listed is not enough: an outbox
// that the listing found but could not check within its deadline (a loaded
// database) is refused, and counted by Tenants, until the next listing, a
// DiscoverInterval (30s) later; hence the deadline of two listings and more.
func waitServed(t *testing.T, g *relay.Group, n int) {
	t.Helper()
	wait.Forf(t, 2*time.Minute, func() string {
		var served int
		var not []string
		for _, ts := range g.Tenants() {
			if ts.Serving {
				served++
			} else {
				not = append(not, fmt.Sprintf("%s (%v)", ts.Schema, ts.Err))
			}
		}
		return fmt.Sprintf("%d outboxes served: %d of %d served; listed, not served: %s", n, served, n, strings.Join(not, ", "))
	}, func() bool {
		ts := g.Tenants()
		return len(ts) == n && !slices.ContainsFunc(ts, func(ts relay.TenantState) bool { return !ts.Serving })
	})
}

// idleReport says what TestGroupIdleSharesSessions saw when not every commit
// woke its relay: how many events arrived, and for each tenant whose event did
// not, whether it is still pending, whether its relay is served and whether
// the hub holds its idle lock (an event pending for a served relay whose idle
// lock is held was committed while the relay waited: a lost notification).
func idleReport(t *testing.T, d *tenantDB, g *relay.Group, rec *brokertest.Recorder, n int) string {
	got := map[string]int{}
	msgs := rec.Messages()
	for _, m := range msgs {
		got[m.Tenant]++
	}
	served := map[string]error{}
	for _, ts := range g.Tenants() {
		if ts.Serving {
			served[ts.Schema] = ts.Err
		}
	}
	var locked []string
	rows, err := d.pool.Query(context.Background(), `SELECT s FROM generate_series(0, $1 - 1) i, format('t_%s', lpad(i::text, 2, '0')) s
		WHERE EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND granted AND mode = 'ExclusiveLock'
			AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
			AND classid::int4 = hashtext($2) AND objid::int4 = hashtext(s))`, n, migrate.IdleLockClass)
	if err == nil {
		locked, err = pgx.CollectRows(rows, pgx.RowTo[string])
	}
	if err != nil {
		return fmt.Sprintf("every commit woke its relay: %d of %d arrived (idle locks: %v)", len(msgs), n, err)
	}
	var missing []string
	for i := range n {
		s := fmt.Sprintf("t_%02d", i)
		if got[s] == 0 {
			health, ok := served[s]
			missing = append(missing, fmt.Sprintf("%s (pending %d, served %v, health %v, idle lock held %v)",
				s, d.pending(t, s), ok, health, slices.Contains(locked, s)))
		}
	}
	return fmt.Sprintf("every commit woke its relay: %d of %d arrived; missing: %s; idle locks held: %d",
		len(msgs), n, strings.Join(missing, ", "), len(locked))
}

// Groups coordinate through PostgreSQL alone, with each other and with
// single-outbox relays: three racing over the same outboxes keep every
// aggregate in order and lose nothing.
func TestGroupsRacingKeepLaneOrder(t *testing.T) {
	t.Parallel()
	d := newTenantDB(t, 12)
	schemas := []string{"r_1", "r_2", "r_3"}
	for _, s := range schemas {
		d.migrate(t, s)
		d.enqueue(t, s, 20, 600)
	}
	rec := &brokertest.Recorder{Jitter: 200 * time.Microsecond}
	for i := range 2 {
		startGroup(t, rec, relay.GroupConfig{
			Config:    relay.Config{ID: fmt.Sprintf("group-%d", i), Workers: 2, BatchSize: 40, RunLength: 3},
			Databases: []relay.Database{{Pool: d.pool, Schemas: selector(t, "r_*")}},
		})
	}
	r, err := relay.New(d.pool, rec, &relay.Config{ID: "single", Schema: "r_2", Workers: 2, BatchSize: 40, Logger: quietLogger()})
	pgtest.Must(t, err, "relay.New")
	pgtest.Must(t, r.Start(context.Background()), "start relay")
	t.Cleanup(func() { _ = r.Stop(context.Background()) })
	wait.For(t, time.Minute, "every outbox drained", func() bool {
		return d.pending(t, "r_1")+d.pending(t, "r_2")+d.pending(t, "r_3") == 0
	})
	checkLanes(t, rec.Messages(), map[string]int{"r_1": 600, "r_2": 600, "r_3": 600})
}

// An outbox whose table is renamed away under its relay is reported as
// unusable, by tenant name, while the database's other outboxes flow.
func TestGroupOutboxUnusable(t *testing.T) {
	t.Parallel()
	d := newTenantDB(t, 6)
	d.migrate(t, "u_ok")
	d.migrate(t, "u_bad")
	rec := &brokertest.Recorder{}
	g := startGroup(t, rec, relay.GroupConfig{
		Config:    relay.Config{PollInterval: 100 * time.Millisecond, BackoffBase: 10 * time.Millisecond, BackoffMax: 100 * time.Millisecond},
		Databases: []relay.Database{{Pool: d.pool}},
	})
	waitServed(t, g, 2)
	_, err := d.pool.Exec(context.Background(), "ALTER TABLE u_bad.outbox_events RENAME TO moved")
	pgtest.Must(t, err, "rename")
	d.enqueue(t, "u_ok", 2, 20)
	wait.For(t, 30*time.Second, "u_bad unusable, u_ok drained", func() bool {
		err := g.TenantHealthy(g.Tenants()[0].Database, "u_bad")
		return errors.Is(err, relay.ErrOutboxUnusable) && !errors.Is(err, relay.ErrDatabaseUnreachable) && d.pending(t, "u_ok") == 0
	})
	if err := g.TenantHealthy(g.Tenants()[0].Database, "u_ok"); err != nil {
		t.Fatalf("u_ok: %v", err)
	}
	if err := g.Healthy(); !errors.Is(err, relay.ErrTenant) || !strings.Contains(err.Error(), "u_bad") || strings.Contains(err.Error(), "u_ok") {
		t.Fatalf("Healthy = %v, want u_bad named alone", err)
	}
}
