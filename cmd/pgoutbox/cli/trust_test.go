package cli

import (
	"encoding/json"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/pgoutbox/pgoutbox"
	"github.com/pgoutbox/pgoutbox/internal/pgtest"
	"github.com/pgoutbox/pgoutbox/internal/wait"
)

// The operator verbs with --tenants, run as a superuser, beside outboxes that
// a role holding only CREATE on the database made under the same glob, each
// with one kind of hostile code, and its temporary tables: status, cleanup and
// dlq list name every attacker outbox as refused and serve the victim; the
// verbs acting on one tenant refuse an attacker's; none of the attacker's code
// runs as the operator, and no temporary schema is listed.
func TestTenantVerbsRefuseHostileTenants(t *testing.T) {
	t.Parallel()
	a := pgtest.NewAttacker(t, "tenant_victim", 4)
	e := &cliTenants{t: t, url: a.URL, pool: a.Pool}
	pgtest.MigrateSchema(t, a.Pool, "tenant_victim")
	ids := e.enqueue("tenant_victim", 4, 0)
	e.exec("UPDATE "+e.table("tenant_victim", "outbox_events")+" SET published_at = now() - interval '10 days' WHERE event_id = ANY($1)", ids[:2])
	e.quarantine("tenant_victim", ids[3])

	variants := pgtest.HostileVariants()
	evil := map[string]bool{}
	for _, v := range variants {
		schema := "tenant_evil_" + v.Name
		a.Plant(t, schema, "postgres", v)
		evil[schema] = true
		// Old published and quarantined events of its own, for cleanup and dlq
		// to touch (the attacker's own updates run its code as itself).
		_, err := a.As.Exec(t.Context(), "UPDATE "+e.table(schema, "outbox_events")+
			" SET published_at = CASE WHEN aggregate_id = 'e0' THEN now() - interval '10 days' END,"+
			" quarantined_at = CASE WHEN aggregate_id = 'e1' THEN now() END")
		pgtest.Must(t, err, "age %s", schema)
	}
	a.TempOutbox(t)
	a.TempOutbox(t)
	attackerEvent := func(schema string) pgoutbox.UUID {
		var id pgoutbox.UUID
		pgtest.Must(t, a.Pool.QueryRow(t.Context(), "SELECT event_id FROM "+e.table(schema, "outbox_events")+
			" WHERE aggregate_id = 'e1'").Scan(&id), "attacker event")
		return id
	}

	type row struct {
		Tenant string  `json:"tenant"`
		Error  *string `json:"error"`
	}
	checkRows := func(what, out string, trusted map[string]bool) {
		t.Helper()
		var rows []row
		if err := json.Unmarshal([]byte(out), &rows); err != nil {
			t.Fatalf("%s: %v:\n%s", what, err, out)
		}
		if len(rows) != len(evil)+1 {
			t.Errorf("%s: %d rows, want %d:\n%s", what, len(rows), len(evil)+1, out)
		}
		for _, r := range rows {
			refused := r.Error != nil && strings.Contains(*r.Error, "outbox refused")
			if want := evil[r.Tenant] && !trusted[r.Tenant]; refused != want || (!want && r.Error != nil) {
				t.Errorf("%s: tenant %q error %v, want refused %v", what, r.Tenant, r.Error, want)
			}
		}
	}

	out, errOut, code := e.run("status", "--tenants", "tenant_*", "--json")
	if code != 1 || !strings.Contains(errOut, "tenants could not be read") {
		t.Errorf("status: code %d, stderr %q", code, errOut)
	}
	checkRows("status", out, nil)
	// Named as a trusted owner, the attacker's code-free outboxes are read; the
	// others are still refused, by their code.
	out, _, _ = e.run("status", "--tenants", "tenant_*", "--json", "--tenant-owner", a.Role)
	checkRows("status --tenant-owner", out, map[string]bool{"tenant_evil_plain": true, "tenant_evil_shadow": true})

	out, errOut, code = e.run("cleanup", "--tenants", "tenant_*", "--json", "--inbox-retention", "336h")
	if code != 1 || !strings.Contains(errOut, "cleanup failed for") {
		t.Errorf("cleanup: code %d, stderr %q", code, errOut)
	}
	checkRows("cleanup", out, nil)
	if n := e.count("tenant_victim", "outbox_events", "true"); n != 2 {
		t.Errorf("victim: %d events left after cleanup, want 2", n)
	}

	out, errOut, code = e.run("dlq", "list", "--tenants", "tenant_*", "--json")
	if !strings.Contains(out, ids[3].String()) || !strings.Contains(errOut, "outbox refused") || code == 0 {
		t.Errorf("dlq list: code %d, stderr %q:\n%s", code, errOut, out)
	}
	// By id in the victim: found and retried there.
	if out, errOut, code := e.run("dlq", "retry", ids[3].String(), "--tenants", "tenant_victim", "--reason", "fixed"); code != 0 {
		t.Errorf("dlq retry in the victim: code %d, stderr %q: %q", code, errOut, out)
	}
	// In an attacker's outbox: refused, whichever way the tenant is chosen.
	for _, v := range variants {
		schema := "tenant_evil_" + v.Name
		id := attackerEvent(schema).String()
		for _, args := range [][]string{
			{"dlq", "retry", id, "--tenants", schema, "--reason", "x"},
			{"dlq", "skip", id, "--tenants", "tenant_*", "--reason", "x"},
			{"dlq", "retry", "--all", "--tenants", schema, "--reason", "x"},
			{"dlq", "show", id, "--tenants", schema},
			{"replay", "--event-id", id, "--tenants", schema, "--dry-run"},
			{"replay", "--all", "--tenants", schema, "--dry-run"},
		} {
			if out, errOut, code := e.run(args...); code != 1 || !strings.Contains(errOut, "outbox refused") {
				t.Errorf("%q: code %d, stderr %q: %q; want 1, refused", args, code, errOut, out)
			}
		}
	}

	if ran := a.RanAsOthers(t); len(ran) > 0 {
		t.Fatalf("the attacker's code ran as another role: %q", ran)
	}
	for schema := range evil {
		if n := e.count(schema, "outbox_events", "quarantined_at IS NOT NULL"); n != 1 {
			t.Errorf("%s: %d quarantined events, want its 1 untouched", schema, n)
		}
	}
}

// A relay process serving 'tenant_*' as a superuser beside the attacker's
// outboxes and temporary tables: the victim's events are published, /readyz
// names each refused outbox (never a system schema), each refusal is logged
// once, and none of the attacker's code runs. Bad --tenant-owner values are
// refused before anything starts.
func TestRelayTenantsRefusesHostileTenants(t *testing.T) {
	t.Parallel()
	a := pgtest.NewAttacker(t, "tenant_victim", 4)
	e := &cliTenants{t: t, url: a.URL, pool: a.Pool}
	pgtest.MigrateSchema(t, a.Pool, "tenant_victim")
	e.enqueue("tenant_victim", 20, 0)
	var refused []string
	for _, v := range pgtest.HostileVariants() {
		schema := "tenant_evil_" + v.Name
		a.Plant(t, schema, "postgres", v)
		refused = append(refused, schema)
	}
	a.TempOutbox(t)
	a.TempOutbox(t)

	p := startOpsRelay(t, nil, "--database-url", a.URL, "--tenants", "tenant_*", "--broker", "null://",
		"--discover-interval", "200ms", "--metrics-addr", "127.0.0.1:0", "--workers", "1")
	wait.For(t, time.Minute, "the victim drained", func() bool { return e.pending("tenant_victim") == 0 })
	// A tenant made now is served by a later listing: by then every refusal
	// has been met at least twice.
	pgtest.MigrateSchema(t, a.Pool, "tenant_late")
	e.enqueue("tenant_late", 1, 0)
	wait.For(t, time.Minute, "tenant_late drained", func() bool { return e.pending("tenant_late") == 0 })

	code, body := p.get(t, "/readyz")
	if code != 503 || strings.Contains(body, `schema "pg_`) || strings.Contains(body, `"tenant_victim"`) || strings.Contains(body, `"tenant_late"`) {
		t.Errorf("/readyz %d:\n%s", code, body)
	}
	logs := p.stderr.String()
	for _, schema := range refused {
		if !strings.Contains(body, `schema "`+schema+`"): migrate: outbox refused`) {
			t.Errorf("/readyz does not name %s as refused:\n%s", schema, body)
		}
		once := regexp.MustCompile(`outbox not served.*schema=` + schema + `( |$)`)
		if n := len(once.FindAllString(logs, -1)); n != 1 {
			t.Errorf("%s: refusal logged %d times, want 1", schema, n)
		}
	}
	p.sigterm(t)
	if ran := a.RanAsOthers(t); len(ran) > 0 {
		t.Fatalf("the attacker's code ran as another role: %q", ran)
	}

	for _, owners := range []string{"public", "pg_monitor", "a\x01b", strings.Repeat("r,", 101)} {
		for _, args := range [][]string{
			{"relay", "--tenants", "tenant_*", "--broker", "null://"},
			{"status", "--tenants", "tenant_*"},
			{"cleanup", "--tenants", "tenant_*"},
		} {
			if _, errOut, code := e.run(append(args, "--tenant-owner", owners)...); code != 2 || !strings.Contains(errOut, "--tenant-owner") {
				t.Errorf("%q --tenant-owner %q: code %d, stderr %q; want 2", args, owners, code, errOut)
			}
		}
	}
}
