// Command orders runs the example's order service: POST /orders (with an optional
// Idempotency-Key header), GET /orders/{id}, POST /orders/{id}/cancel.
//
//	DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres go run ./examples/orders/cmd/orders
package main

import (
	"context"
	"flag"

	"github.com/pgoutbox/pgoutbox/examples/orders"
	"github.com/pgoutbox/pgoutbox/examples/orders/ordersvc"
)

func main() {
	var cfg ordersvc.RunConfig
	orders.DatabaseFlags(flag.CommandLine, &cfg.DatabaseURL, &cfg.Schema)
	flag.StringVar(&cfg.Addr, "addr", orders.Env("ORDERS_ADDR", "127.0.0.1:8080"), "HTTP listen address (env ORDERS_ADDR)")
	flag.Parse()
	orders.Main("orders", func(ctx context.Context) error { return ordersvc.Run(ctx, cfg) })
}
