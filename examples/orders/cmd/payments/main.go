// Command payments runs one instance of the example's payment worker: for each
// OrderCreated it charges the order at the payment API (cmd/fakepay) with the event
// id as the Idempotency-Key, and records the payment through the inbox.
//
//	DATABASE_URL=... NATS_URL=... PAYMENT_API_URL=http://127.0.0.1:8090 go run ./examples/orders/cmd/payments
package main

import (
	"context"
	"flag"
	"fmt"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/pgoutbox/pgoutbox/examples/orders"
	"github.com/pgoutbox/pgoutbox/examples/orders/payments"
)

func main() {
	var cfg payments.RunConfig
	client := &payments.Client{}
	flag.StringVar(&cfg.DatabaseURL, "database-url", orders.Env("DATABASE_URL", orders.DefaultDatabaseURL), "PostgreSQL connection string (env DATABASE_URL)")
	flag.StringVar(&cfg.Inbox.Schema, "schema", orders.Env("PGOUTBOX_SCHEMA", "public"), "schema of the tables, created if missing (env PGOUTBOX_SCHEMA)")
	flag.StringVar(&cfg.Consumer.NatsURL, "nats-url", orders.Env("NATS_URL", orders.DefaultNatsURL), "NATS server (env NATS_URL)")
	flag.StringVar(&cfg.Consumer.Stream, "stream", orders.Env("PGOUTBOX_NATS_STREAM", "OUTBOX"), "JetStream stream the relay publishes to (env PGOUTBOX_NATS_STREAM)")
	flag.StringVar(&client.BaseURL, "payment-url", orders.Env("PAYMENT_API_URL", "http://127.0.0.1:8090"), "payment API (env PAYMENT_API_URL)")
	timeout := flag.Duration("payment-timeout", 2*time.Second, "give up on one charge request after this long; the retry reuses the key")
	flag.BoolVar(&client.NoIdempotencyKey, "no-idempotency-key", false, "send charges without the key, to see retries double-charge")
	flag.Parse()
	client.HTTP = &http.Client{Timeout: *timeout}
	cfg.Client = client
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := payments.Run(ctx, cfg); err != nil {
		fmt.Fprintln(os.Stderr, "payments:", err)
		os.Exit(1)
	}
}
