// Command pgoutbox migrates, runs and operates a pgoutbox transactional outbox.
// Run "pgoutbox --help" for the verbs.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/pgoutbox/pgoutbox/cmd/pgoutbox/cli"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := cli.Run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}
