package cli

import (
	"context"
	"encoding/json"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgoutbox/pgoutbox"
	"github.com/pgoutbox/pgoutbox/internal/pgtest"
	"github.com/pgoutbox/pgoutbox/migrate"
)

// cliTenants is a database of the test's own with several migrated outboxes.
type cliTenants struct {
	t    *testing.T
	url  string
	pool *pgxpool.Pool
}

func newCLITenants(t *testing.T, tenants ...string) *cliTenants {
	t.Helper()
	url, pool := pgtest.Outboxes(t, 4, tenants...)
	return &cliTenants{t: t, url: url, pool: pool}
}

// pending counts tenant's unpublished events.
func (e *cliTenants) pending(tenant string) int {
	e.t.Helper()
	return e.count(tenant, "outbox_events", "published_at IS NULL")
}

func (e *cliTenants) table(tenant, name string) string {
	return pgx.Identifier{tenant, name}.Sanitize()
}

func (e *cliTenants) exec(q string, args ...any) {
	e.t.Helper()
	_, err := e.pool.Exec(context.Background(), q, args...)
	pgtest.Must(e.t, err, "%s", q)
}

func (e *cliTenants) count(tenant, name, where string, args ...any) int {
	e.t.Helper()
	var n int
	pgtest.Must(e.t, e.pool.QueryRow(context.Background(), "SELECT count(*) FROM "+e.table(tenant, name)+" WHERE "+where, args...).Scan(&n), "count")
	return n
}

// enqueue writes n events of aggregate order/1 to tenant, the first aged.
func (e *cliTenants) enqueue(tenant string, n int, aged time.Duration) []pgoutbox.UUID {
	e.t.Helper()
	p, err := pgoutbox.NewProducer(&pgoutbox.Config{Schema: tenant})
	pgtest.Must(e.t, err, "producer")
	var ids []pgoutbox.UUID
	for range n {
		res, err := p.EnqueueTx(context.Background(), e.pool, pgoutbox.Event{AggregateType: "order", AggregateID: "1", EventType: "e"})
		pgtest.Must(e.t, err, "enqueue")
		ids = append(ids, res[0].EventID)
	}
	if aged > 0 {
		e.exec("UPDATE "+e.table(tenant, "outbox_events")+" SET occurred_at = now() - $2::interval WHERE event_id = $1", ids[0], aged.String())
	}
	return ids
}

func (e *cliTenants) quarantine(tenant string, ids ...pgoutbox.UUID) {
	e.t.Helper()
	e.exec("UPDATE "+e.table(tenant, "outbox_events")+" SET quarantined_at = now(), attempt_count = 3, last_error = 'boom' WHERE event_id = ANY($1)", ids)
}

func (e *cliTenants) run(args ...string) (string, string, int) {
	e.t.Helper()
	return run(e.t, append(args, "--database-url", e.url)...)
}

// A hostile name with a newline and an escape sequence: listed quoted.
const ttyHostile = "t_\x1b[31mred\nline"

func TestStatusTenants(t *testing.T) {
	t.Parallel()
	hostile := `t_"; DROP SCHEMA t_old CASCADE; --`
	e := newCLITenants(t, "t_old", "t_new", "t_idle", "t_broken", hostile, ttyHostile, "other")
	e.enqueue("t_old", 2, 300*time.Second)
	e.enqueue("t_new", 1, 20*time.Second)
	e.enqueue(hostile, 1, 100*time.Second)
	e.enqueue(ttyHostile, 1, 50*time.Second)
	e.exec("DROP TABLE " + e.table("t_broken", "outbox_skipped_events") + " CASCADE")

	out, errOut, code := e.run("status", "--tenants", "t_*", "--json")
	if code != 1 || !strings.Contains(errOut, "1 of 6 tenants could not be read") || strings.Count(errOut, "\n") != 1 {
		t.Fatalf("status --tenants --json: code %d, stderr %q", code, errOut)
	}
	var rows []struct {
		Tenant  string   `json:"tenant"`
		Pending *int64   `json:"pending"`
		Age     *float64 `json:"oldest_pending_age_seconds"`
		Live    *int64   `json:"leases_live"`
		Error   *string  `json:"error"`
	}
	pgtest.Must(t, json.Unmarshal([]byte(out), &rows), "parse %q", out)
	var got []string
	for _, r := range rows {
		got = append(got, r.Tenant)
		if r.Pending == nil || r.Age == nil || r.Live == nil {
			t.Errorf("row lacks figures: %+v", r)
		}
		if (r.Error != nil) != (r.Tenant == "t_broken") {
			t.Errorf("row %q error %v", r.Tenant, r.Error)
		}
	}
	if want := []string{"t_broken", "t_old", hostile, ttyHostile, "t_new", "t_idle"}; !slices.Equal(got, want) {
		t.Fatalf("rows %q, want %q", got, want)
	}
	if *rows[1].Pending != 2 || *rows[1].Age < 300 || *rows[1].Age > 400 {
		t.Errorf("t_old: pending %d, age %v", *rows[1].Pending, *rows[1].Age)
	}

	out, _, code = e.run("status", "--tenants", "*")
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if code != 1 || len(lines) != 9 || !strings.HasPrefix(lines[0], "TENANT ") || !strings.HasPrefix(lines[1], "t_broken ") ||
		!strings.Contains(lines[1], "outbox_skipped_events") ||
		!regexp.MustCompile(`^t_old +2 +5m\d+s +0 +0 +0 +0 +0 +-$`).MatchString(lines[2]) ||
		!strings.HasPrefix(lines[4], `"t_\x1b[31mred\nline" `) || strings.Contains(out, "\x1b") ||
		lines[8] != "7 tenants, 1 could not be read" {
		t.Fatalf("status --tenants '*': code %d:\n%s", code, out)
	}
	// The hostile names were listed, never run.
	if n := e.count("t_old", "outbox_events", "true"); n != 2 {
		t.Fatalf("t_old holds %d events", n)
	}

	// Healthy tenants only: exit 0, whatever the backlog.
	if out, errOut, code := e.run("status", "--tenants", "t_old,t_new"); code != 0 || errOut != "" || !strings.HasSuffix(out, "2 tenants\n") {
		t.Fatalf("two tenants: code %d, stderr %q:\n%s", code, errOut, out)
	}
	for _, c := range []struct {
		args []string
		code int
		msg  string
	}{
		{[]string{"--tenants", "nomatch_*"}, 1, "no outbox schema of this database matches --tenants nomatch_*"},
		{[]string{"--tenants", `x"; DROP SCHEMA t_old; --`}, 1, "no outbox schema"},
		{[]string{"--tenants", ""}, 2, "--tenants is empty"},
		{[]string{"--tenants", " , "}, 2, "--tenants is empty"},
		{[]string{"--tenants", "["}, 2, "--tenants"},
		{[]string{"--tenants", strings.Repeat("x", 64)}, 2, "--tenants"},
		{[]string{"--tenants", "a\x00b"}, 2, "--tenants"},
		{[]string{"--tenants", "*", "--schema", "t_old"}, 2, "not both"},
		{[]string{"--tenants", "*", "--inbox-schema", "t_old"}, 2, "--inbox-schema"},
	} {
		_, errOut, code := e.run(append([]string{"status"}, c.args...)...)
		if code != c.code || !strings.Contains(errOut, c.msg) || strings.Count(errOut, "\n") != 1 {
			t.Errorf("status %q: code %d, stderr %q; want %d and %q", c.args, code, errOut, c.code, c.msg)
		}
	}
	if n := e.count("t_old", "outbox_events", "true"); n != 2 {
		t.Fatalf("t_old holds %d events", n)
	}
}

func TestCleanupTenants(t *testing.T) {
	t.Parallel()
	e := newCLITenants(t, "c_a", "c_b", "c_half", ttyHostile)
	for _, tenant := range []string{"c_a", "c_b", "c_half", ttyHostile} {
		ids := e.enqueue(tenant, 3, 0)
		e.exec("UPDATE "+e.table(tenant, "outbox_events")+" SET published_at = now() - interval '10 days' WHERE event_id = ANY($1)", ids[:2])
	}
	// Not fully migrated: reported, the others cleaned.
	e.exec("DELETE FROM " + e.table("c_half", migrate.Table) + " WHERE line = 'outbox' AND version = 2")

	out, errOut, code := e.run("cleanup", "--tenants", "*", "--json", "--inbox-retention", "336h")
	if code != 1 || !strings.Contains(errOut, "cleanup failed for 1 of 4 tenants") {
		t.Fatalf("cleanup --tenants: code %d, stderr %q", code, errOut)
	}
	var rows []struct {
		Tenant  string  `json:"tenant"`
		Deleted int64   `json:"deleted"`
		Error   *string `json:"error"`
	}
	pgtest.Must(t, json.Unmarshal([]byte(out), &rows), "parse %q", out)
	if len(rows) != 4 || rows[0].Tenant != "c_a" || rows[0].Deleted != 2 || rows[0].Error != nil ||
		rows[2].Tenant != "c_half" || rows[2].Error == nil || !strings.Contains(*rows[2].Error, "lacks migration") ||
		rows[3].Tenant != ttyHostile || rows[3].Deleted != 2 {
		t.Fatalf("rows %s", out)
	}
	for tenant, left := range map[string]int{"c_a": 1, "c_b": 1, "c_half": 3, ttyHostile: 1} {
		if n := e.count(tenant, "outbox_events", "true"); n != left {
			t.Errorf("%q: %d events left, want %d", tenant, n, left)
		}
	}

	out, errOut, code = e.run("cleanup", "--tenants", "c_a,c_b", "--dry-run")
	if code != 0 || !regexp.MustCompile(`(?m)^c_a +0 +0 +0 +0 +\S+ +-$`).MatchString(out) || !strings.Contains(out, "dry run: nothing deleted") {
		t.Fatalf("cleanup --dry-run: code %d, stderr %q:\n%s", code, errOut, out)
	}
	for _, args := range [][]string{
		{"--tenants", "*", "--schema", "c_a"},
		{"--tenants", "*", "--inbox-schema", "c_a", "--inbox-retention", "336h"},
		{"--tenants", ","},
	} {
		if _, errOut, code := e.run(append([]string{"cleanup"}, args...)...); code != 2 {
			t.Errorf("cleanup %q: code %d, stderr %q", args, code, errOut)
		}
	}
}

func TestDLQTenants(t *testing.T) {
	t.Parallel()
	e := newCLITenants(t, "d_a", "d_b", ttyHostile)
	a := e.enqueue("d_a", 2, 0)
	b := e.enqueue("d_b", 2, 0)
	h := e.enqueue(ttyHostile, 1, 0)
	e.quarantine("d_a", a[0])
	e.quarantine("d_b", b[0], b[1])
	e.quarantine(ttyHostile, h[0])

	out, errOut, code := e.run("dlq", "list", "--tenants", "*", "--json")
	var evs []struct {
		Tenant string        `json:"tenant"`
		ID     pgoutbox.UUID `json:"event_id"`
	}
	if code != 0 || json.Unmarshal([]byte(out), &evs) != nil || len(evs) != 4 {
		t.Fatalf("dlq list --tenants --json: code %d, stderr %q:\n%s", code, errOut, out)
	}
	per := map[string]int{}
	for _, ev := range evs {
		per[ev.Tenant]++
	}
	if per["d_a"] != 1 || per["d_b"] != 2 || per[ttyHostile] != 1 {
		t.Fatalf("per tenant %v", per)
	}
	out, _, code = e.run("dlq", "list", "--tenants", "d_*")
	if code != 0 || !regexp.MustCompile(`(?m)^d_b +`+b[1].String()+` +order/1 +2 `).MatchString(out) ||
		!strings.HasSuffix(out, "3 quarantined events in 2 tenants\n") {
		t.Fatalf("dlq list --tenants:\n%s", out)
	}
	if out, _, code = e.run("dlq", "show", b[1].String(), "--tenants", "*"); code != 0 || !strings.HasPrefix(out, "tenant  d_b\n") {
		t.Fatalf("dlq show --tenants: code %d:\n%s", code, out)
	}

	// State-changing verbs by filter or --all: one tenant only.
	for _, args := range [][]string{
		{"dlq", "retry", "--all", "--tenants", "*"},
		{"dlq", "retry", "--aggregate-type", "order", "--tenants", "d_*"},
		{"replay", "--all", "--tenants", "d_*", "--dry-run"},
		{"replay", "--aggregate-type", "order", "--event-id", a[1].String(), "--tenants", "*", "--dry-run"},
		{"replay", "--event-id", a[1].String(), "--event-id", b[0].String(), "--tenants", "*", "--dry-run"},
	} {
		_, errOut, code := e.run(args...)
		if code != 2 || !strings.Contains(errOut, "one outbox") {
			t.Errorf("%q: code %d, stderr %q; want 2, refused", args, code, errOut)
		}
	}
	if n := e.count("d_a", "outbox_events", "quarantined_at IS NOT NULL") + e.count("d_b", "outbox_events", "quarantined_at IS NOT NULL"); n != 3 {
		t.Fatalf("%d quarantined after refusals, want 3", n)
	}
	// One tenant matched: the filter acts there.
	if out, errOut, code := e.run("dlq", "retry", "--aggregate-type", "order", "--tenants", "d_a"); code != 0 || out != "tenant d_a: retried 1 event\n" {
		t.Fatalf("retry in one tenant: code %d, stderr %q: %q", code, errOut, out)
	}
	e.quarantine("d_a", a[0])

	// By id: each id in the tenant holding it, audited there.
	out, errOut, code = e.run("dlq", "retry", a[0].String(), b[0].String(), "--tenants", "*", "--reason", "fixed")
	if code != 0 || out != "tenant d_a: retried 1 event\ntenant d_b: retried 1 event\n" {
		t.Fatalf("retry by id: code %d, stderr %q: %q", code, errOut, out)
	}
	for _, tenant := range []string{"d_a", "d_b"} {
		if n := e.count(tenant, "outbox_operator_audit", "action = 'dlq_retry' AND reason = 'fixed'"); n != 1 {
			t.Errorf("%s: %d audit rows", tenant, n)
		}
	}
	unknown := pgoutbox.NewEventID()
	if _, errOut, code := e.run("dlq", "retry", b[1].String(), unknown.String(), "--tenants", "*"); code != 1 || !strings.Contains(errOut, unknown.String()) {
		t.Fatalf("retry unknown id: code %d, stderr %q", code, errOut)
	}

	// Skip: an id that is not quarantined refuses the whole skip, in every tenant.
	_, errOut, code = e.run("dlq", "skip", b[1].String(), a[0].String(), "--tenants", "*", "--reason", "gone")
	if code != 1 || !strings.Contains(errOut, "nothing was skipped") || e.count("d_b", "outbox_skipped_events", "true") != 0 {
		t.Fatalf("skip with a pending id: code %d, stderr %q", code, errOut)
	}
	out, errOut, code = e.run("dlq", "skip", b[1].String(), h[0].String(), "--tenants", "*", "--reason", "gone", "--actor", "ops")
	if code != 0 || !strings.Contains(out, "tenant d_b: skipped 1 event") || !strings.Contains(out, `tenant "t_\x1b[31mred\nline": skipped 1 event`) {
		t.Fatalf("skip by id: code %d, stderr %q: %q", code, errOut, out)
	}
	if e.count("d_b", "outbox_skipped_events", "reason = 'gone'") != 1 || e.count(ttyHostile, "outbox_skipped_events", "reason = 'gone'") != 1 {
		t.Fatalf("skips not recorded per tenant")
	}

	// Replay by ids in one tenant: resolved to it.
	e.exec("UPDATE "+e.table("d_a", "outbox_events")+" SET published_at = now() WHERE event_id = $1", a[1])
	if out, errOut, code := e.run("replay", "--event-id", a[1].String(), "--tenants", "*", "--dry-run"); code != 0 || !strings.HasPrefix(out, "1 events selected") {
		t.Fatalf("replay by id: code %d, stderr %q: %q", code, errOut, out)
	}
}
