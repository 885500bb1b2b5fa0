// Command payments runs one instance of the example's payment worker: for each
// OrderCreated it charges the order at the payment API (cmd/fakepay) with the event
// id as the Idempotency-Key, and records the payment through the inbox.
//
//	DATABASE_URL=... NATS_URL=... PAYMENT_API_URL=http://127.0.0.1:8090 go run ./examples/orders/cmd/payments
package main

import (
	"context"
	"flag"
	"net/http"
	"time"

	"github.com/pgoutbox/pgoutbox/examples/orders"
	"github.com/pgoutbox/pgoutbox/examples/orders/payments"
)

func main() {
	var cfg payments.RunConfig
	client := &payments.Client{}
	orders.DatabaseFlags(flag.CommandLine, &cfg.DatabaseURL, &cfg.Inbox.Schema)
	cfg.Consumer.Flags(flag.CommandLine)
	flag.StringVar(&client.BaseURL, "payment-url", orders.Env("PAYMENT_API_URL", "http://127.0.0.1:8090"), "payment API (env PAYMENT_API_URL)")
	timeout := flag.Duration("payment-timeout", 2*time.Second, "give up on one charge request after this long; the retry reuses the key")
	flag.BoolVar(&client.NoIdempotencyKey, "no-idempotency-key", false, "send charges without the key, to see retries double-charge")
	flag.Parse()
	client.HTTP = &http.Client{Timeout: *timeout}
	cfg.Client = client
	orders.Main("payments", func(ctx context.Context) error { return payments.Run(ctx, cfg) })
}
