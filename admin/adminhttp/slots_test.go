package adminhttp_test

import (
	"context"
	"net/http/httptest"
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
