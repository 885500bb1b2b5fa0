package relay_test

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/pgoutbox/broker/brokertest"
	"github.com/pgoutbox/pgoutbox/internal/logtest"
	"github.com/pgoutbox/pgoutbox/internal/pgtest"
	"github.com/pgoutbox/pgoutbox/internal/wait"
	"github.com/pgoutbox/pgoutbox/migrate"
	"github.com/pgoutbox/pgoutbox/relay"
)

// A role holding only CREATE on the database makes outboxes under the relay's
// glob, each with one kind of hostile code (pgtest.HostileVariants), and holds
// temporary tables named like an outbox in two sessions. A relay group running
// as a superuser, told to trust the attacker as an owner (so that only the
// integrity check stands in the way), serves the victim and the attacker's
// code-free outboxes, refuses every other one (logged once, named by Healthy
// and Tenants), never lists the temporary schemas, and never runs the
// attacker's code: the victim's events are all delivered, none read or marked
// by the attacker. A second group with the default trust refuses even the
// code-free ones, by their owner. Code added later to a served outbox is found
// at the next listing.
func TestGroupServesOnlyTrustedTenants(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	a := pgtest.NewAttacker(t, "tenant_victim", 8)
	victim := &tenantDB{url: a.URL, pool: a.Pool}
	victim.migrate(t, "tenant_victim")
	victim.enqueue(t, "tenant_victim", 5, 50)
	var login string
	pgtest.Must(t, a.Pool.QueryRow(ctx, "SELECT current_user").Scan(&login), "login")

	variants := pgtest.HostileVariants()
	served := map[string]bool{"tenant_victim": true}
	for _, v := range variants {
		schema := "tenant_evil_" + v.Name
		a.Plant(t, schema, login, v)
		served[schema] = v.Name == "plain" || v.Name == "shadow"
	}
	a.TempOutbox(t)
	a.TempOutbox(t)

	logs := &logtest.Buffer{}
	rec := &brokertest.Recorder{}
	g := startGroup(t, rec, relay.GroupConfig{
		Config: relay.Config{Workers: 1, PollInterval: 100 * time.Millisecond,
			Logger: slog.New(slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: slog.LevelInfo}))},
		Databases:        []relay.Database{{Pool: a.Pool, Schemas: selector(t, "tenant_*"), Trust: migrate.Trust{Owners: []string{a.Role}}}},
		DiscoverInterval: 100 * time.Millisecond,
	})
	wait.For(t, 60*time.Second, "the victim's and the code-free attacker outboxes drained", func() bool {
		return victim.pending(t, "tenant_victim")+victim.pending(t, "tenant_evil_plain")+victim.pending(t, "tenant_evil_shadow") == 0
	})
	checkServed := func(g *relay.Group, want map[string]bool, refusal string) {
		t.Helper()
		states := map[string]relay.TenantState{}
		for _, ts := range g.Tenants() {
			states[ts.Schema] = ts
		}
		for schema, serve := range want {
			ts, ok := states[schema]
			switch {
			case !ok:
				t.Errorf("%s: not listed", schema)
			case ts.Serving != serve:
				t.Errorf("%s: serving %v, want %v (%v)", schema, ts.Serving, serve, ts.Err)
			case !serve && (!errors.Is(ts.Err, migrate.ErrUntrusted) || !strings.Contains(ts.Err.Error(), refusal)):
				t.Errorf("%s: refused with %v, want migrate.ErrUntrusted naming %q", schema, ts.Err, refusal)
			}
		}
		if len(states) != len(want) {
			t.Errorf("tenants %v, want %d", states, len(want))
		}
		err := g.Healthy()
		for schema, serve := range want {
			if named := err != nil && strings.Contains(err.Error(), `schema "`+schema+`"`); named == serve {
				t.Errorf("Healthy names %s: %v, want %v (%v)", schema, named, !serve, err)
			}
		}
		if err != nil && strings.Contains(err.Error(), `schema "pg_`) {
			t.Errorf("Healthy names a system schema: %v", err)
		}
	}
	checkServed(g, served, "")
	if ran := a.RanAsOthers(t); len(ran) > 0 {
		t.Errorf("the attacker's code ran as another role: %q", ran)
	}

	// Each refusal is logged once, not at every listing: a tenant made after
	// they were recorded is served only by a later listing.
	victim.migrate(t, "tenant_late")
	victim.enqueue(t, "tenant_late", 1, 1)
	wait.For(t, 60*time.Second, "tenant_late served", func() bool { return victim.pending(t, "tenant_late") == 0 })
	refusals := map[string]int{}
	for line := range strings.SplitSeq(logs.String(), "\n") {
		var r struct{ Msg, Schema string }
		if line != "" && json.Unmarshal([]byte(line), &r) == nil && r.Msg == "outbox not served" {
			refusals[r.Schema]++
		}
	}
	for schema, serve := range served {
		if want := map[bool]int{true: 0, false: 1}[serve]; refusals[schema] != want {
			t.Errorf("%s: refusal logged %d times, want %d", schema, refusals[schema], want)
		}
	}

	// The default trust: the attacker owns its schemas, so none is served.
	g2 := startGroup(t, &brokertest.Recorder{}, relay.GroupConfig{
		Databases: []relay.Database{{Pool: a.Pool, Schemas: selector(t, "tenant_evil_plain,tenant_evil_shadow")}},
	})
	checkServed(g2, map[string]bool{"tenant_evil_plain": false, "tenant_evil_shadow": false}, `owned by an untrusted role "schema tenant_evil_`)

	// Code added to a served outbox (with no pending event, so that nothing
	// runs it before the next listing) stops its relay at the next listing.
	_, err := a.As.Exec(ctx, `CREATE TRIGGER evil_later BEFORE UPDATE ON tenant_evil_plain.outbox_events
		FOR EACH ROW EXECUTE FUNCTION `+pgx.Identifier{a.Canary}.Sanitize()+`.evil_trigger()`)
	pgtest.Must(t, err, "add a trigger")
	wait.For(t, 60*time.Second, "tenant_evil_plain refused", func() bool {
		for _, ts := range g.Tenants() {
			if ts.Schema == "tenant_evil_plain" {
				return !ts.Serving && errors.Is(ts.Err, migrate.ErrUntrusted)
			}
		}
		return false
	})
	_, err = a.As.Exec(ctx, "SELECT tenant_evil_plain.outbox_enqueue('evil', 'late', 'evil.made', '{}')")
	pgtest.Must(t, err, "enqueue after the trigger")
	victim.enqueue(t, "tenant_victim", 5, 20)
	wait.For(t, 60*time.Second, "the victim's later events delivered", func() bool { return victim.pending(t, "tenant_victim") == 0 })

	if ran := a.RanAsOthers(t); len(ran) > 0 {
		t.Fatalf("the attacker's code ran as another role: %q", ran)
	}
	got := map[string]int{}
	for _, m := range rec.Messages() {
		got[m.Tenant]++
		if m.Tenant == "tenant_victim" && strings.Contains(string(m.Payload), "attacker") {
			t.Errorf("a victim event carries the attacker's payload: %s", m.Payload)
		}
	}
	for schema, serve := range served {
		switch {
		case schema == "tenant_victim" && got[schema] < 70:
			t.Errorf("victim: %d events published, want 70", got[schema])
		case !serve && got[schema] > 0:
			t.Errorf("%s: %d events published from a refused outbox", schema, got[schema])
		}
	}
	if n := victim.pending(t, "tenant_evil_plain"); n != 1 {
		t.Errorf("tenant_evil_plain: %d events pending after it was refused, want 1", n)
	}
}
