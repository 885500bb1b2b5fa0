// Command orders runs the example's order service: POST /orders (with an optional
// Idempotency-Key header), GET /orders/{id}, POST /orders/{id}/cancel.
//
//	DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres go run ./examples/orders/cmd/orders
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/pgoutbox/pgoutbox/examples/orders"
	"github.com/pgoutbox/pgoutbox/examples/orders/ordersvc"
)

func main() {
	var cfg ordersvc.RunConfig
	flag.StringVar(&cfg.DatabaseURL, "database-url", orders.Env("DATABASE_URL", orders.DefaultDatabaseURL), "PostgreSQL connection string (env DATABASE_URL)")
	flag.StringVar(&cfg.Schema, "schema", orders.Env("PGOUTBOX_SCHEMA", "public"), "schema of the tables, created if missing (env PGOUTBOX_SCHEMA)")
	flag.StringVar(&cfg.Addr, "addr", orders.Env("ORDERS_ADDR", "127.0.0.1:8080"), "HTTP listen address (env ORDERS_ADDR)")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := ordersvc.Run(ctx, cfg); err != nil {
		fmt.Fprintln(os.Stderr, "orders:", err)
		os.Exit(1)
	}
}
