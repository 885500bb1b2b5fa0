// Command fakepay runs the example's fake payment API: POST /v1/charges honours
// Idempotency-Key; --timeout-rate and --fail-rate (or PUT /v1/faults) make it
// misbehave; GET /v1/charges lists what it charged.
//
//	go run ./examples/orders/cmd/fakepay --timeout-rate 0.1
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"strconv"

	"github.com/pgoutbox/pgoutbox/examples/orders"
	"github.com/pgoutbox/pgoutbox/examples/orders/fakepay"
)

func main() {
	addr := flag.String("addr", orders.Env("FAKEPAY_ADDR", "127.0.0.1:8090"), "HTTP listen address (env FAKEPAY_ADDR)")
	timeoutRate := flag.Float64("timeout-rate", envFloat("FAKEPAY_TIMEOUT_RATE"), "share of requests recorded and then left unanswered (env FAKEPAY_TIMEOUT_RATE)")
	failRate := flag.Float64("fail-rate", envFloat("FAKEPAY_FAIL_RATE"), "share of requests answered 503 without charging (env FAKEPAY_FAIL_RATE)")
	flag.Parse()
	srv := fakepay.New(nil)
	if err := srv.SetFaults(*timeoutRate, *failRate); err != nil {
		fmt.Fprintln(os.Stderr, "fakepay:", err)
		os.Exit(2)
	}
	orders.Main("fakepay", func(ctx context.Context) error {
		return fakepay.Run(ctx, *addr, srv, func(a string) { slog.Info("fake payment API listening", slog.String("addr", a)) })
	})
}

func envFloat(name string) float64 {
	f, err := strconv.ParseFloat(orders.Env(name, "0"), 64)
	if err != nil {
		fmt.Fprintf(os.Stderr, "fakepay: %s: %v\n", name, err)
		os.Exit(2)
	}
	return f
}
