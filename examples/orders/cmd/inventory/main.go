// Command inventory runs one instance of the example's inventory consumer: it
// reserves stock for OrderCreated and releases it for OrderCancelled, exactly once
// each and in order per order, from the relay's JetStream stream. Run as many
// instances as you like.
//
//	DATABASE_URL=... NATS_URL=nats://127.0.0.1:4222 go run ./examples/orders/cmd/inventory
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/pgoutbox/pgoutbox/examples/orders"
	"github.com/pgoutbox/pgoutbox/examples/orders/inventory"
)

func main() {
	var cfg inventory.RunConfig
	flag.StringVar(&cfg.DatabaseURL, "database-url", orders.Env("DATABASE_URL", orders.DefaultDatabaseURL), "PostgreSQL connection string (env DATABASE_URL)")
	flag.StringVar(&cfg.Inbox.Schema, "schema", orders.Env("PGOUTBOX_SCHEMA", "public"), "schema of the tables, created if missing (env PGOUTBOX_SCHEMA)")
	flag.StringVar(&cfg.Consumer.NatsURL, "nats-url", orders.Env("NATS_URL", orders.DefaultNatsURL), "NATS server (env NATS_URL)")
	flag.StringVar(&cfg.Consumer.Stream, "stream", orders.Env("PGOUTBOX_NATS_STREAM", "OUTBOX"), "JetStream stream the relay publishes to (env PGOUTBOX_NATS_STREAM)")
	flag.Int64Var(&cfg.InitialStock, "initial-stock", inventory.DefaultStock, "stock of a SKU when first seen")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := inventory.Run(ctx, cfg); err != nil {
		fmt.Fprintln(os.Stderr, "inventory:", err)
		os.Exit(1)
	}
}
