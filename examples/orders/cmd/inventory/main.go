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

	"github.com/pgoutbox/pgoutbox/examples/orders"
	"github.com/pgoutbox/pgoutbox/examples/orders/inventory"
)

func main() {
	var cfg inventory.RunConfig
	orders.DatabaseFlags(flag.CommandLine, &cfg.DatabaseURL, &cfg.Inbox.Schema)
	cfg.Consumer.Flags(flag.CommandLine)
	flag.Int64Var(&cfg.InitialStock, "initial-stock", inventory.DefaultStock, "stock of a SKU when first seen")
	flag.Parse()
	orders.Main("inventory", func(ctx context.Context) error { return inventory.Run(ctx, cfg) })
}
