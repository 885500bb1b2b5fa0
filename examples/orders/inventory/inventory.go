// Package inventory is the inventory consumer of the example: it reserves stock for
// each created order and releases it when the order is cancelled.
//
// Every effect goes through the inbox: the dedup row, the stock change and the
// ledger row commit in one transaction, so a redelivered event (a relay re-publish,
// a consumer killed before its ack) changes nothing. The consumer uses the inbox's
// GapReject policy: an order's events are applied strictly in sequence, so an
// OrderCancelled that overtakes its OrderCreated (another instance still holds it,
// or it is being redelivered) is refused and comes back after it — a release never
// precedes its reservation.
package inventory

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/pgoutbox/examples/orders"
	"github.com/pgoutbox/pgoutbox/inbox"
)

// ConsumerName is the inbox consumer name (and durable JetStream consumer).
const ConsumerName = "inventory"

// DefaultStock is the stock a SKU starts with when the inventory first sees it.
const DefaultStock = 1_000_000

// Handler returns the consumer's inbox handler for the tables in schema.
// initialStock is what an unknown SKU starts with (0 means DefaultStock).
func Handler(schema string, initialStock int64) inbox.Handler[pgx.Tx] {
	if initialStock == 0 {
		initialStock = DefaultStock
	}
	stock := pgx.Identifier{schema, "inventory_stock"}.Sanitize()
	moves := pgx.Identifier{schema, "inventory_movements"}.Sanitize()
	return func(ctx context.Context, tx pgx.Tx, ev inbox.Event) error {
		switch ev.EventType {
		case orders.EventOrderCreated:
			o, err := inbox.UnmarshalPayload[orders.OrderCreated](ev)
			if err != nil {
				return err
			}
			if _, err := tx.Exec(ctx, "INSERT INTO "+stock+" (sku, on_hand) VALUES ($1, $2) ON CONFLICT (sku) DO NOTHING",
				o.SKU, initialStock); err != nil {
				return fmt.Errorf("stock of %s: %w", o.SKU, err)
			}
			tag, err := tx.Exec(ctx, "UPDATE "+stock+" SET reserved = reserved + $2 WHERE sku = $1 AND on_hand - reserved >= $2",
				o.SKU, o.Quantity)
			if err != nil {
				return fmt.Errorf("reserve %d × %s for order %s: %w", o.Quantity, o.SKU, o.OrderID, err)
			}
			kind := "reserve"
			if tag.RowsAffected() == 0 {
				kind = "out_of_stock"
			}
			return move(ctx, tx, moves, o.OrderID, o.SKU, kind, o.Quantity, ev)
		case orders.EventOrderCancelled:
			c, err := inbox.UnmarshalPayload[orders.OrderCancelled](ev)
			if err != nil {
				return err
			}
			// In sequence, so the order's OrderCreated has been applied.
			var sku string
			var qty int
			err = tx.QueryRow(ctx, "SELECT sku, quantity FROM "+moves+" WHERE order_id = $1 AND kind = 'reserve'", c.OrderID).Scan(&sku, &qty)
			if errors.Is(err, pgx.ErrNoRows) {
				return nil // nothing was reserved (out of stock)
			}
			if err != nil {
				return fmt.Errorf("find reservation of order %s: %w", c.OrderID, err)
			}
			if _, err := tx.Exec(ctx, "UPDATE "+stock+" SET reserved = reserved - $2 WHERE sku = $1", sku, qty); err != nil {
				return fmt.Errorf("release %d × %s of order %s: %w", qty, sku, c.OrderID, err)
			}
			return move(ctx, tx, moves, c.OrderID, sku, "release", qty, ev)
		}
		return nil // other events are marked processed without effect
	}
}

func move(ctx context.Context, tx pgx.Tx, table, orderID, sku, kind string, qty int, ev inbox.Event) error {
	if _, err := tx.Exec(ctx, "INSERT INTO "+table+" (order_id, sku, kind, quantity, event_id) VALUES ($1, $2, $3, $4, $5)",
		orderID, sku, kind, qty, ev.EventID); err != nil {
		return fmt.Errorf("record %s of order %s: %w", kind, orderID, err)
	}
	return nil
}

// RunConfig configures Run.
type RunConfig struct {
	// DatabaseURL is the PostgreSQL connection string. Required.
	DatabaseURL string
	// InitialStock is what an unknown SKU starts with. Defaults to DefaultStock.
	InitialStock int64
	// Inbox configures the inbox consumer; Name defaults to ConsumerName, and
	// GapPolicy must stay inbox.GapReject (the default) for in-order application.
	Inbox inbox.Config
	// Consumer says where the events come from.
	Consumer orders.ConsumerConfig
}

// Run runs one inventory consumer instance until ctx ends.
func Run(ctx context.Context, cfg RunConfig) error {
	if cfg.Inbox.Name == "" {
		cfg.Inbox.Name = ConsumerName
	}
	if cfg.Inbox.Schema == "" {
		cfg.Inbox.Schema = "public"
	}
	if cfg.Inbox.GapPolicy != "" && cfg.Inbox.GapPolicy != inbox.GapReject {
		return fmt.Errorf("inventory: GapPolicy %q: a release must never precede its reservation; use %q", cfg.Inbox.GapPolicy, inbox.GapReject)
	}
	return orders.RunInbox(ctx, cfg.DatabaseURL, cfg.Inbox, Handler(cfg.Inbox.Schema, cfg.InitialStock), cfg.Consumer)
}
