package adminhttp_test

import (
	"context"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/pgoutbox/admin"
	"github.com/pgoutbox/pgoutbox/admin/adminhttp"
	"github.com/pgoutbox/pgoutbox/cdc"
	"github.com/pgoutbox/pgoutbox/internal/pgtest"
)

// On a database with a CDC slot, the relays page shows the slot and its lag,
// which grows with the WAL nobody confirmed.
func TestRelaysPageShowsCDCSlotLag(t *testing.T) {
	t.Parallel()
	pool, schema := pgtest.MigratedOn(t, pgtest.Logical(t), 4)
	slot := cdc.DefaultSlot(schema)
	ctx := context.Background()
	_, err := pool.Exec(ctx, "SELECT pg_create_logical_replication_slot($1, 'pgoutput')", slot)
	pgtest.Must(t, err, "create slot")
	t.Cleanup(func() { _, _ = pool.Exec(context.Background(), "SELECT pg_drop_replication_slot($1)", slot) })
	a, err := admin.New(pool, &admin.Config{Schema: schema})
	pgtest.Must(t, err, "admin")
	before := lagOf(t, a, slot)
	// WAL the slot has not confirmed: an enqueue.
	_, err = pool.Exec(ctx, "SELECT "+pgx.Identifier{schema}.Sanitize()+".outbox_enqueue('order', 'o1', 'created', '{\"n\": 1}')")
	pgtest.Must(t, err, "enqueue")
	if after := lagOf(t, a, slot); after <= before {
		t.Errorf("lag did not grow: %d then %d", before, after)
	}

	e := &env{t: t, pool: pool, schema: schema, aliceKey: secret()}
	h, err := adminhttp.New(pool, &adminhttp.Config{Schemas: selector(t, schema), Logger: quiet(),
		Users: []adminhttp.User{{Name: "alice", Role: adminhttp.RoleOperator, Secret: e.aliceKey}}})
	pgtest.Must(t, err, "console")
	e.srv = httptest.NewServer(h)
	t.Cleanup(e.srv.Close)
	body := e.get("/relays?schema=" + schema).body
	if !strings.Contains(body, "<td>"+slot+"</td>") || !strings.Contains(body, "<td>pgoutput</td>") || strings.Contains(body, "CDC is not used") {
		t.Errorf("relays page:\n%s", body)
	}
}

func lagOf(t *testing.T, a *admin.Admin, slot string) int64 {
	t.Helper()
	slots, err := a.ReplicationSlots(context.Background())
	pgtest.Must(t, err, "slots")
	for _, s := range slots {
		if s.Name == slot {
			if s.LagBytes == nil || s.RetainedBytes == nil || s.Plugin != "pgoutput" || s.Active || s.WALStatus == "" {
				t.Fatalf("slot %+v", s)
			}
			return *s.LagBytes
		}
	}
	t.Fatalf("slot %s not listed: %+v", slot, slots)
	return 0
}

// The relays page says "No relay running" when no relay is alive, and lists
// each relay's heartbeat: a stopped relay as stopped, a silent one as gone.
func TestRelaysPageHeartbeats(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	if body := e.get("/relays?schema=" + e.schema).body; !strings.Contains(body, `id="no-relay"`) {
		t.Fatalf("no relay ever ran:\n%s", body)
	}
	_, err := e.pool.Exec(context.Background(), "INSERT INTO "+e.table("outbox_relays")+
		` (relay_id, source, version, host, pid, state, beat_every, started_at, last_seen) VALUES
		('r-idle', 'poll', 'v9', 'host-a', 7, 'idle', '15s', now(), now()),
		('r-stopped', 'poll', 'v9', 'host-b', 8, 'stopped', '15s', now(), now() - interval '5 minutes'),
		('r-gone', 'poll', 'v9', 'host-c', 9, 'busy', '15s', now(), now() - interval '5 minutes')`)
	pgtest.Must(t, err, "heartbeats")
	body := e.get("/relays?schema=" + e.schema).body
	for _, want := range []string{"<td>r-idle</td><td class=\"\">idle</td>", "<td>r-stopped</td><td class=\"muted\">stopped</td>",
		"<td>r-gone</td><td class=\"bad\">gone (busy when last seen)</td>", "<td>host-a</td>"} {
		if !strings.Contains(body, want) {
			t.Errorf("relays page lacks %q:\n%s", want, body)
		}
	}
	if strings.Contains(body, `id="no-relay"`) {
		t.Errorf("an idle relay runs, but the page says none does:\n%s", body)
	}
	if !regexp.MustCompile(`<td>r-stopped</td><td class="muted">stopped</td><td class="when">5m\d+s ago · <span class="muted">20\d\d-\d\d-\d\d \d\d:\d\d:\d\dZ</span>`).MatchString(body) {
		t.Errorf("the stopped relay's last seen is not shown relative and absolute:\n%s", body)
	}
	if !strings.Contains(body, `<p class="ok" id="relays-running">Relays running: 1, all idle`) {
		t.Errorf("one idle relay runs, the page does not say so:\n%s", body)
	}
	_, err = e.pool.Exec(context.Background(), "UPDATE "+e.table("outbox_relays")+" SET state = 'busy' WHERE relay_id = 'r-idle'")
	pgtest.Must(t, err, "busy")
	if body := e.get("/relays?schema=" + e.schema).body; !strings.Contains(body, `id="relays-running">Relays running: 1, 1 busy.`) {
		t.Errorf("one busy relay runs, the page does not say so:\n%s", body)
	}
}
