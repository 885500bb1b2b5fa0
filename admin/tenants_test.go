package admin_test

import (
	"context"
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgoutbox/pgoutbox"
	"github.com/pgoutbox/pgoutbox/admin"
	"github.com/pgoutbox/pgoutbox/internal/pgtest"
	"github.com/pgoutbox/pgoutbox/migrate"
)

// hostileTenants are schema names an attacker could choose: each must be listed,
// quoted, and never executed.
var hostileTenants = []string{
	`t"; DROP TABLE ok.outbox_events; --`,
	`t'; SELECT pg_sleep(100); --`,
	`t semi;colon`,
	`t_ünïcödé_名前`,
	`t\backslash$1%s`,
}

// tenantDB is a database of the test's own holding several outboxes.
type tenantDB struct {
	t    *testing.T
	url  string
	pool *pgxpool.Pool
}

func newTenantDB(t *testing.T, tenants ...string) *tenantDB {
	t.Helper()
	url, pool := pgtest.Outboxes(t, 8, tenants...)
	return &tenantDB{t: t, url: url, pool: pool}
}

func (d *tenantDB) table(tenant, name string) string { return quoted(tenant, name) }

func (d *tenantDB) exec(q string, args ...any) {
	d.t.Helper()
	_, err := d.pool.Exec(context.Background(), q, args...)
	pgtest.Must(d.t, err, "%s", q)
}

// enqueue writes n events of one aggregate to tenant, the first of them aged
// (occurred that long ago), and returns their ids.
func (d *tenantDB) enqueue(tenant string, n int, aged time.Duration) []pgoutbox.UUID {
	d.t.Helper()
	p, err := pgoutbox.NewProducer(&pgoutbox.Config{Schema: tenant})
	pgtest.Must(d.t, err, "producer")
	var ids []pgoutbox.UUID
	for range n {
		res, err := p.EnqueueTx(context.Background(), d.pool, pgoutbox.Event{AggregateType: "order", AggregateID: "1", EventType: "e"})
		pgtest.Must(d.t, err, "enqueue in %q", tenant)
		ids = append(ids, res[0].EventID)
	}
	if aged > 0 {
		d.exec("UPDATE "+d.table(tenant, "outbox_events")+" SET occurred_at = now() - $2::interval WHERE event_id = $1", ids[0], aged.String())
	}
	return ids
}

func (d *tenantDB) quarantine(tenant string, id pgoutbox.UUID) {
	d.t.Helper()
	d.exec("UPDATE "+d.table(tenant, "outbox_events")+" SET quarantined_at = now(), attempt_count = 3, last_error = 'boom' WHERE event_id = $1", id)
}

func tenantNames(rows []admin.TenantStatus) []string {
	var out []string
	for _, r := range rows {
		out = append(out, r.Tenant)
	}
	return out
}

// StatusAll lists every selected outbox worst first: the broken ones with their
// error, then by oldest pending age; hostile names are listed and never run.
func TestStatusAll(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	tenants := append([]string{"ok", "old", "older", "idle", "broken", "half"}, hostileTenants...)
	d := newTenantDB(t, tenants...)
	d.enqueue("old", 2, 100*time.Second)
	olderIDs := d.enqueue("older", 3, 300*time.Second)
	d.quarantine("older", olderIDs[2])
	d.exec("UPDATE "+d.table("older", "outbox_events")+" SET claimed_by = 'r1', claim_until = now() + interval '1 hour' WHERE event_id = $1", olderIDs[0])
	d.exec("UPDATE "+d.table("older", "outbox_events")+" SET claimed_by = 'r2', claim_until = now() - interval '1 hour' WHERE event_id = $1", olderIDs[1])
	d.enqueue("ok", 1, 10*time.Second)
	for i, h := range hostileTenants {
		d.enqueue(h, 1, time.Duration(200+20*i)*time.Second) // 20s apart: the tenants are read at different instants
	}
	// A tenant with a dropped table, one whose migrations are incomplete.
	d.exec("DROP TABLE " + d.table("broken", "outbox_skipped_events") + " CASCADE")
	d.exec("DELETE FROM "+d.table("half", migrate.Table)+" WHERE line = 'outbox' AND version = $1", 2)
	// Not tenants: a bare schema, and an inbox alone.
	d.exec("CREATE SCHEMA bare")
	_, err := migrate.Up(ctx, d.pool, &migrate.Config{Schema: "inbox_only", Lines: []migrate.Line{migrate.LineInbox}})
	pgtest.Must(t, err, "inbox only")

	rows, err := admin.StatusAll(ctx, d.pool, migrate.Selector{}, nil)
	pgtest.Must(t, err, "status all")
	want := []string{"broken", "half", "older"}
	for i := range hostileTenants {
		want = append(want, hostileTenants[len(hostileTenants)-1-i])
	}
	want = append(want, "old", "ok", "idle")
	if got := tenantNames(rows); !slices.Equal(got, want) {
		t.Fatalf("order %q, want %q", got, want)
	}
	for _, r := range rows[:2] {
		if r.Err == nil || r.Status != nil || r.Pending != 0 {
			t.Errorf("broken tenant %q: %+v", r.Tenant, r)
		}
	}
	if !strings.Contains(rows[0].Err.Error(), "outbox_skipped_events") || !strings.Contains(rows[1].Err.Error(), "lacks migration outbox/2") {
		t.Errorf("errors: %v; %v", rows[0].Err, rows[1].Err)
	}
	older := rows[2]
	if older.Err != nil || older.Pending != 2 || older.Quarantined != 1 || older.LeasesLive != 1 || older.LeasesExpired != 1 ||
		older.OldestPendingAge < admin.Duration(300*time.Second) || older.OldestPendingAge > admin.Duration(360*time.Second) ||
		older.Status == nil || older.Status.Schema != "older" || len(older.Status.Tables) != 3 {
		t.Errorf("older: %+v", older)
	}
	if idle := rows[len(rows)-1]; idle.Err != nil || idle.Pending != 0 || idle.OldestPendingAge != 0 {
		t.Errorf("idle: %+v", idle)
	}
	// The hostile schemas are intact and hold their event.
	for _, h := range hostileTenants {
		var n int
		pgtest.Must(t, d.pool.QueryRow(ctx, "SELECT count(*) FROM "+d.table(h, "outbox_events")).Scan(&n), "count %q", h)
		if n != 1 {
			t.Errorf("%q holds %d events", h, n)
		}
	}

	// A selector chooses; names with glob characters are matched as globs.
	sel, err := migrate.ParseSelector("old*,ok")
	pgtest.Must(t, err, "selector")
	rows, err = admin.StatusAll(ctx, d.pool, sel, &admin.TenantsConfig{Concurrency: 1})
	pgtest.Must(t, err, "status all selected")
	if got := tenantNames(rows); !slices.Equal(got, []string{"older", "old", "ok"}) {
		t.Fatalf("selected %q", got)
	}
}

// The JSON row always has the same keys; "error" is null or the error.
func TestTenantStatusJSON(t *testing.T) {
	t.Parallel()
	for _, r := range []admin.TenantStatus{
		{Tenant: "a", Pending: 3, OldestPendingAge: admin.Duration(1500 * time.Millisecond), Quarantined: 1, BackingOff: 2,
			LeasesLive: 4, LeasesExpired: 5, PublishedLastMinute: 6, Status: &admin.Status{}},
		{Tenant: `b"`, Err: errors.New("relation does not exist")},
	} {
		b, err := json.Marshal(r)
		pgtest.Must(t, err, "marshal")
		var m map[string]any
		pgtest.Must(t, json.Unmarshal(b, &m), "unmarshal %s", b)
		keys := []string{"tenant", "pending", "oldest_pending_age_seconds", "quarantined", "backing_off", "leases_live",
			"leases_expired", "published_last_minute", "error"}
		if len(m) != len(keys) {
			t.Errorf("keys of %s, want %q", b, keys)
		}
		for _, k := range keys {
			if _, ok := m[k]; !ok {
				t.Errorf("%s lacks %q", b, k)
			}
		}
		if r.Err == nil && (m["error"] != nil || m["oldest_pending_age_seconds"] != 1.5 || m["leases_expired"] != 5.0) {
			t.Errorf("row %s", b)
		}
		if r.Err != nil && (m["error"] != r.Err.Error() || m["tenant"] != r.Tenant) {
			t.Errorf("failed row %s", b)
		}
	}
}

// A tenant whose tables are locked past the timeout, and one the role may not
// read, are reported; the others are read.
func TestStatusAllIsolatesSlowAndForbiddenTenants(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	d := newTenantDB(t, "a_locked", "b_fine", "c_forbidden")
	d.enqueue("b_fine", 1, 0)

	role := pgtest.Role(t, d.pool, "")
	for _, tenant := range []string{"a_locked", "b_fine"} {
		s := quoted(tenant)
		d.exec("GRANT USAGE ON SCHEMA " + s + " TO " + quoted(role))
		d.exec("GRANT SELECT ON ALL TABLES IN SCHEMA " + s + " TO " + quoted(role))
	}
	// Dropped first (cleanups run last in, first out): the role's own connections.
	rolePool := pgtest.Pool(t, pgtest.AsRole(t, d.url, role), 4)

	tx, err := d.pool.Begin(ctx)
	pgtest.Must(t, err, "begin")
	defer tx.Rollback(ctx)
	_, err = tx.Exec(ctx, "LOCK TABLE "+d.table("a_locked", "outbox_events")+" IN ACCESS EXCLUSIVE MODE")
	pgtest.Must(t, err, "lock")

	// A short lock timeout finds the locked tenant stuck; the statement
	// timeout stays generous, so a loaded machine does not make the fine
	// tenant look stuck too (it once did with both at 500ms).
	rows, err := admin.StatusAll(ctx, rolePool, migrate.Selector{}, &admin.TenantsConfig{Timeout: 30 * time.Second, LockTimeout: 500 * time.Millisecond})
	pgtest.Must(t, err, "status all")
	if got := tenantNames(rows); !slices.Equal(got, []string{"a_locked", "c_forbidden", "b_fine"}) {
		t.Fatalf("order %q", got)
	}
	if err := rows[0].Err; !errors.Is(err, admin.ErrTenantStuck) || errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("locked tenant: %v", err)
	}
	if err := rows[1].Err; err == nil || !strings.Contains(err.Error(), "permission denied") {
		t.Errorf("forbidden tenant: %v", err)
	}
	if rows[2].Err != nil || rows[2].Pending != 1 {
		t.Errorf("fine tenant: %+v", rows[2])
	}

	// The caller's own cancellation is its error, not the tenants'.
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := admin.StatusAll(cctx, rolePool, migrate.Selector{}, nil); !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled: %v", err)
	}
	if err := (&admin.TenantsConfig{Concurrency: -1, Timeout: -time.Second, LockTimeout: -time.Second}).Validate(); err == nil ||
		!strings.Contains(err.Error(), "TenantsConfig.Concurrency") || !strings.Contains(err.Error(), "TenantsConfig.Timeout") ||
		!strings.Contains(err.Error(), "TenantsConfig.LockTimeout") {
		t.Errorf("Validate: %v", err)
	}
}

// QuarantinedAll lists dead letters per tenant; FindEvents sends each id to the
// one tenant holding it and refuses ids it cannot place.
func TestQuarantinedAllAndFindEvents(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	h := hostileTenants[0]
	d := newTenantDB(t, "a", "b", h, "broken")
	a := d.enqueue("a", 2, 0)
	b := d.enqueue("b", 1, 0)
	x := d.enqueue(h, 1, 0)
	d.quarantine("a", a[0])
	d.quarantine(h, x[0])
	d.exec("DROP TABLE " + d.table("broken", "outbox_skipped_events") + " CASCADE")

	got, err := admin.QuarantinedAll(ctx, d.pool, migrate.Selector{}, admin.Filter{}, nil)
	pgtest.Must(t, err, "quarantined all")
	if len(got) != 4 || got[0].Tenant != "a" || len(got[0].Events) != 1 || got[0].Events[0].ID != a[0] ||
		got[1].Tenant != "b" || len(got[1].Events) != 0 || got[1].Err != nil ||
		got[2].Tenant != "broken" || got[2].Err == nil ||
		got[3].Tenant != h || len(got[3].Events) != 1 || got[3].Events[0].ID != x[0] {
		t.Fatalf("quarantined all: %+v", got)
	}

	fine := []string{"a", "b", h}
	found, err := admin.FindEvents(ctx, d.pool, fine, []pgoutbox.UUID{x[0], a[1], b[0], a[0], a[1]}, nil)
	pgtest.Must(t, err, "find")
	want := []admin.TenantIDs{{Tenant: "a", IDs: []pgoutbox.UUID{a[1], a[0]}}, {Tenant: "b", IDs: []pgoutbox.UUID{b[0]}}, {Tenant: h, IDs: []pgoutbox.UUID{x[0]}}}
	if len(found) != len(want) {
		t.Fatalf("found %+v", found)
	}
	for i := range want {
		if found[i].Tenant != want[i].Tenant || !slices.Equal(found[i].IDs, want[i].IDs) {
			t.Fatalf("found %+v, want %+v", found, want)
		}
	}
	unknown := pgoutbox.NewEventID()
	if _, err := admin.FindEvents(ctx, d.pool, fine, []pgoutbox.UUID{a[0], unknown}, nil); !errors.Is(err, admin.ErrNotFound) ||
		!strings.Contains(err.Error(), unknown.String()) {
		t.Errorf("unknown id: %v", err)
	}
	// A tenant that cannot be read (here: dropped since it was listed) might
	// hold the id: refused.
	if _, err := admin.FindEvents(ctx, d.pool, []string{"a", "gone"}, []pgoutbox.UUID{a[0]}, nil); err == nil || !strings.Contains(err.Error(), `"gone"`) {
		t.Errorf("unreadable tenant: %v", err)
	}
	// The same id in two tenants (an outbox copied into another schema): refused.
	d.exec("UPDATE "+d.table("b", "outbox_events")+" SET event_id = $1 WHERE event_id = $2", a[0], b[0])
	if _, err := admin.FindEvents(ctx, d.pool, fine, []pgoutbox.UUID{a[0]}, nil); !errors.Is(err, admin.ErrAmbiguousEvent) {
		t.Errorf("ambiguous id: %v", err)
	}
}
