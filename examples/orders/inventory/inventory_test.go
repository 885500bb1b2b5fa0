package inventory_test

import (
	"context"
	"encoding/json"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgoutbox/pgoutbox"
	"github.com/pgoutbox/pgoutbox/broker"
	"github.com/pgoutbox/pgoutbox/examples/orders"
	"github.com/pgoutbox/pgoutbox/examples/orders/inventory"
	"github.com/pgoutbox/pgoutbox/inbox"
	"github.com/pgoutbox/pgoutbox/internal/pgtest"
)

func event(orderID string, seq int64, typ string, payload any) inbox.Delivery {
	b, _ := json.Marshal(payload)
	return inbox.DeliveryOf(broker.Message{EventID: pgoutbox.NewEventID(), AggregateType: orders.AggregateType, AggregateID: orderID,
		AggregateSequence: seq, EventType: typ, SchemaVersion: 1, OccurredAt: time.Now(), Payload: b})
}

func ledger(t *testing.T, pool *pgxpool.Pool, schema string) string {
	t.Helper()
	var s string
	pgtest.Must(t, pool.QueryRow(context.Background(), "SELECT coalesce(string_agg(order_id || ':' || kind || ':' || quantity, ' ' ORDER BY id), '') FROM "+
		pgx.Identifier{schema, "inventory_movements"}.Sanitize()).Scan(&s), "ledger")
	return s
}

// An order's events are applied in sequence and once each: a cancellation that
// arrives before its creation is refused until the creation is in, and
// redeliveries change nothing. The stock follows the ledger.
func TestReserveAndReleaseInSequenceOnce(t *testing.T) {
	t.Parallel()
	pool, schema := pgtest.Schema(t, 4)
	ctx := context.Background()
	pgtest.Must(t, orders.Migrate(ctx, pool, schema), "migrate")
	c, err := inbox.New(inbox.Pgx(pool), inventory.Handler(schema, 10),
		&inbox.Config{Name: inventory.ConsumerName, Schema: schema, Logger: slog.New(slog.DiscardHandler)})
	pgtest.Must(t, err, "consumer")

	created := event("o-1", 1, orders.EventOrderCreated, orders.OrderCreated{OrderID: "o-1", SKU: "fig", Quantity: 4, AmountCents: 100})
	cancelled := event("o-1", 2, orders.EventOrderCancelled, orders.OrderCancelled{OrderID: "o-1"})
	big := event("o-2", 1, orders.EventOrderCreated, orders.OrderCreated{OrderID: "o-2", SKU: "fig", Quantity: 7, AmountCents: 100})
	bigCancelled := event("o-2", 2, orders.EventOrderCancelled, orders.OrderCancelled{OrderID: "o-2"})
	steps := []struct {
		d    inbox.Delivery
		want inbox.Status
	}{
		{cancelled, inbox.StatusGapRejected}, // overtook its creation
		{created, inbox.StatusApplied},
		{created, inbox.StatusDuplicate}, // a redelivery
		{big, inbox.StatusApplied},       // 4 + 7 > 10 in stock
		{cancelled, inbox.StatusApplied},
		{cancelled, inbox.StatusDuplicate},
		{bigCancelled, inbox.StatusApplied},
	}
	for i, s := range steps {
		if o := c.Process(ctx, s.d); o.Status != s.want {
			t.Fatalf("step %d: %s (%v), want %s", i, o.Status, o.Err, s.want)
		}
	}
	if got, want := ledger(t, pool, schema), "o-1:reserve:4 o-2:out_of_stock:7 o-1:release:4"; got != want {
		t.Fatalf("ledger %q, want %q", got, want)
	}
	var reserved int64
	pgtest.Must(t, pool.QueryRow(ctx, "SELECT reserved FROM "+pgx.Identifier{schema, "inventory_stock"}.Sanitize()+" WHERE sku = 'fig'").Scan(&reserved), "stock")
	if reserved != 0 {
		t.Fatalf("reserved %d after the release, want 0", reserved)
	}
}

func TestRunRefusesGapAccept(t *testing.T) {
	t.Parallel()
	err := inventory.Run(context.Background(), inventory.RunConfig{Inbox: inbox.Config{GapPolicy: inbox.GapAccept}})
	if err == nil || !strings.Contains(err.Error(), "GapPolicy") {
		t.Fatalf("Run with GapAccept: %v", err)
	}
}
