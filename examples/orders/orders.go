// Package orders is the shared part of the order example: the events the order
// service publishes, the business tables of every service, and the plumbing each
// service runs on (configuration from the environment, a NATS JetStream consumer
// loop for the inbox consumers).
//
// The services live in the sub-packages: ordersvc (HTTP order service, the
// producer), inventory (an inbox consumer that reserves and releases stock),
// payments (an inbox consumer that charges a payment API with the event id as the
// idempotency key) and fakepay (that payment API, with fault injection). The
// commands under cmd/ run each one on its own; "pgoutbox demo" runs them all.
package orders

import (
	"context"
	"flag"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/pgoutbox/migrate"
)

// AggregateType is the aggregate of every order event: one ordered lane per order.
const AggregateType = "order"

// Event types published by the order service.
const (
	// EventOrderCreated is published in the transaction that creates the order;
	// it is always an order's sequence 1. Payload: OrderCreated.
	EventOrderCreated = "OrderCreated"
	// EventOrderCancelled is published in the transaction that cancels it, as
	// the next sequence of the same order. Payload: OrderCancelled.
	EventOrderCancelled = "OrderCancelled"
)

// OrderCreated is the payload of EventOrderCreated.
type OrderCreated struct {
	OrderID     string `json:"order_id"`
	Customer    string `json:"customer"`
	SKU         string `json:"sku"`
	Quantity    int    `json:"quantity"`
	AmountCents int64  `json:"amount_cents"`
}

// OrderCancelled is the payload of EventOrderCancelled.
type OrderCancelled struct {
	OrderID string `json:"order_id"`
	Reason  string `json:"reason,omitempty"`
}

// Migrate creates, in schema, the outbox and inbox tables (package migrate) and the
// business tables of every service of the example. It is idempotent and safe to run
// from several processes at once; each service runs it at start-up. In a real
// deployment each service would own its database and create only its own tables.
func Migrate(ctx context.Context, db migrate.DB, schema string) error {
	if _, err := migrate.Up(ctx, db, &migrate.Config{Schema: schema}); err != nil {
		return err
	}
	tx, err := db.Begin(ctx)
	if err != nil {
		return fmt.Errorf("orders: migrate: %w", err)
	}
	defer tx.Rollback(ctx) // after Commit a no-op
	// The same advisory lock key for every process: concurrent CREATE ... IF NOT
	// EXISTS can still collide on the catalog otherwise.
	if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock(hashtext($1))", "pgoutbox-example-orders:"+schema); err != nil {
		return fmt.Errorf("orders: migrate: %w", err)
	}
	if _, err := tx.Exec(ctx, strings.ReplaceAll(schemaSQL, "{{schema}}", pgx.Identifier{schema}.Sanitize())); err != nil {
		return fmt.Errorf("orders: create business tables in %s: %w", schema, err)
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("orders: migrate: %w", err)
	}
	return nil
}

// schemaSQL holds the business tables. Each service touches only its own.
const schemaSQL = `
-- order service
CREATE TABLE IF NOT EXISTS {{schema}}.orders (
    id           text        PRIMARY KEY,
    customer     text        NOT NULL,
    sku          text        NOT NULL,
    quantity     integer     NOT NULL CHECK (quantity > 0),
    amount_cents bigint      NOT NULL CHECK (amount_cents >= 0),
    status       text        NOT NULL DEFAULT 'created' CHECK (status IN ('created', 'cancelled')),
    created_at   timestamptz NOT NULL DEFAULT now(),
    cancelled_at timestamptz
);
-- One row per Idempotency-Key: the first request's answer, replayed to retries.
CREATE TABLE IF NOT EXISTS {{schema}}.order_requests (
    idempotency_key text        PRIMARY KEY,
    request_hash    text        NOT NULL,
    order_id        text        NOT NULL,
    response        jsonb,
    created_at      timestamptz NOT NULL DEFAULT now()
);

-- inventory consumer
CREATE TABLE IF NOT EXISTS {{schema}}.inventory_stock (
    sku      text   PRIMARY KEY,
    on_hand  bigint NOT NULL CHECK (on_hand >= 0),
    reserved bigint NOT NULL DEFAULT 0 CHECK (reserved >= 0 AND reserved <= on_hand)
);
-- An append-only ledger: a reservation applied twice would show as two rows.
CREATE TABLE IF NOT EXISTS {{schema}}.inventory_movements (
    id       bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    order_id text        NOT NULL,
    sku      text        NOT NULL,
    kind     text        NOT NULL CHECK (kind IN ('reserve', 'release', 'out_of_stock')),
    quantity integer     NOT NULL,
    event_id uuid        NOT NULL,
    at       timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS inventory_movements_order_idx ON {{schema}}.inventory_movements (order_id);

-- payment worker
CREATE TABLE IF NOT EXISTS {{schema}}.payments (
    event_id     uuid        PRIMARY KEY,
    order_id     text        NOT NULL,
    charge_id    text        NOT NULL,
    amount_cents bigint      NOT NULL,
    charged_at   timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS payments_order_idx ON {{schema}}.payments (order_id);
`

// Env returns the environment variable name, or def when it is unset or empty: the
// commands use it for their flags' defaults.
func Env(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

// DatabaseFlags registers the flags every service of the example takes for its
// database: --database-url (env DATABASE_URL) and --schema (env PGOUTBOX_SCHEMA).
func DatabaseFlags(fs *flag.FlagSet, databaseURL, schema *string) {
	fs.StringVar(databaseURL, "database-url", Env("DATABASE_URL", DefaultDatabaseURL), "PostgreSQL connection string (env DATABASE_URL)")
	fs.StringVar(schema, "schema", Env("PGOUTBOX_SCHEMA", "public"), "schema of the tables, created if missing (env PGOUTBOX_SCHEMA)")
}

// EnvDuration is Env for a duration; a malformed value is an error naming the variable.
func EnvDuration(name string, def time.Duration) (time.Duration, error) {
	v := os.Getenv(name)
	if v == "" {
		return def, nil
	}
	d, err := time.ParseDuration(v)
	if err != nil {
		return 0, fmt.Errorf("%s=%q: %w", name, v, err)
	}
	return d, nil
}

// DefaultDatabaseURL is the database the commands use without DATABASE_URL.
const DefaultDatabaseURL = "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"

// DefaultNatsURL is the NATS server the commands use without NATS_URL.
const DefaultNatsURL = "nats://127.0.0.1:4222"
