package audit_test

import (
	"context"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/pgoutbox/examples/orders"
	"github.com/pgoutbox/pgoutbox/examples/orders/audit"
	"github.com/pgoutbox/pgoutbox/examples/orders/fakepay"
	"github.com/pgoutbox/pgoutbox/examples/orders/ordersvc"
	"github.com/pgoutbox/pgoutbox/internal/pgtest"
)

// The audit passes a consistent end state and names each way it can break: a
// reservation applied twice, a release missing, a double charge, an unpublished
// event.
func TestCheckFindsEachBrokenPromise(t *testing.T) {
	t.Parallel()
	pool, schema := pgtest.Schema(t, 4)
	ctx := context.Background()
	pgtest.Must(t, orders.Migrate(ctx, pool, schema), "migrate")
	tbl := func(n string) string { return pgx.Identifier{schema, n}.Sanitize() }
	exec := func(sql string, args ...any) {
		t.Helper()
		_, err := pool.Exec(ctx, sql, args...)
		pgtest.Must(t, err, "%s", sql)
	}
	svc, err := ordersvc.New(pool, &ordersvc.Config{Schema: schema})
	pgtest.Must(t, err, "service")
	var charges []fakepay.Charge
	var ids []string
	for i := range 2 {
		o, _, err := svc.Create(ctx, "", ordersvc.CreateOrder{Customer: "c", SKU: "fig", Quantity: 1, AmountCents: 100})
		pgtest.Must(t, err, "create")
		ids = append(ids, o.ID)
		exec("INSERT INTO " + tbl("inventory_stock") + " (sku, on_hand, reserved) VALUES ('fig', 100, 0) ON CONFLICT (sku) DO NOTHING")
		exec("UPDATE " + tbl("inventory_stock") + " SET reserved = reserved + 1")
		exec("INSERT INTO "+tbl("inventory_movements")+" (order_id, sku, kind, quantity, event_id) VALUES ($1, 'fig', 'reserve', 1, gen_random_uuid())", o.ID)
		ch := fakepay.Charge{ID: "ch_" + string(rune('a'+i)), OrderID: o.ID, AmountCents: 100, Requests: 1}
		charges = append(charges, ch)
		exec("INSERT INTO "+tbl("payments")+" (event_id, order_id, charge_id, amount_cents) VALUES (gen_random_uuid(), $1, $2, 100)", o.ID, ch.ID)
	}
	_, _, err = svc.Cancel(ctx, ids[1], "")
	pgtest.Must(t, err, "cancel")
	exec("UPDATE " + tbl("inventory_stock") + " SET reserved = reserved - 1")
	exec("INSERT INTO "+tbl("inventory_movements")+" (order_id, sku, kind, quantity, event_id) VALUES ($1, 'fig', 'release', 1, gen_random_uuid())", ids[1])
	exec("UPDATE " + tbl("outbox_events") + " SET published_at = now()")

	rep, err := audit.Check(ctx, pool, schema, charges)
	pgtest.Must(t, err, "check")
	if !rep.OK() || rep.Orders != 2 || rep.Cancelled != 1 || rep.Events != 3 || rep.ReservedOnce != 2 || rep.ReleasedOnce != 1 || rep.ChargedOnce != 2 {
		t.Fatalf("consistent state: %+v", rep)
	}

	// Break it four ways.
	exec("INSERT INTO "+tbl("inventory_movements")+" (order_id, sku, kind, quantity, event_id) VALUES ($1, 'fig', 'reserve', 1, gen_random_uuid())", ids[0])
	exec("DELETE FROM "+tbl("inventory_movements")+" WHERE order_id = $1 AND kind = 'release'", ids[1])
	exec("UPDATE "+tbl("outbox_events")+" SET published_at = NULL WHERE aggregate_id = $1", ids[1])
	charges = append(charges, fakepay.Charge{ID: "ch_z", OrderID: ids[0], AmountCents: 100, Requests: 1})
	rep, err = audit.Check(ctx, pool, schema, charges)
	pgtest.Must(t, err, "check")
	all := strings.Join(rep.Problems, "\n")
	for _, want := range []string{"reserved 2 times", "released 0 times", "charged 2 times", "unpublished", "disagrees with the ledger"} {
		if !strings.Contains(all, want) {
			t.Errorf("problems lack %q:\n%s", want, all)
		}
	}
	if rep.OK() || rep.DoubleCharges != 1 {
		t.Fatalf("broken state passed: %+v", rep)
	}
}
