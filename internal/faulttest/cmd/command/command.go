// Package command is what the fault-injection suite's programs (cmd/consumer,
// cmd/producer) share around their work: the command line, the failpoints of
// PGOUTBOX_FAILPOINTS and the signals that end them.
package command

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/pgoutbox/pgoutbox/internal/failpoint"
)

// Main parses the command line, refuses a malformed PGOUTBOX_FAILPOINTS, and calls
// run with a context that ends on SIGTERM or SIGINT. If any of it fails, Main
// prints the error after name and exits with status 1.
func Main(name string, run func(ctx context.Context) error) {
	flag.Parse()
	err := failpoint.EnvError()
	if err == nil {
		ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
		err = run(ctx)
		stop()
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, name+":", err)
		os.Exit(1)
	}
}
