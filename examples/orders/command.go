package orders

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

// Main runs one command of the example: run gets a context that ends on SIGINT or
// SIGTERM; if it fails, Main prints the error after name and exits with status 1.
func Main(name string, run func(ctx context.Context) error) {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, name+":", err)
		os.Exit(1)
	}
}
