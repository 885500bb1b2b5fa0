package orders

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

// DatabaseFlags registers the flags every service of the example takes for its
// database: --database-url (env DATABASE_URL) and --schema (env PGOUTBOX_SCHEMA).
func DatabaseFlags(fs *flag.FlagSet, databaseURL, schema *string) {
	fs.StringVar(databaseURL, "database-url", Env("DATABASE_URL", DefaultDatabaseURL), "PostgreSQL connection string (env DATABASE_URL)")
	fs.StringVar(schema, "schema", Env("PGOUTBOX_SCHEMA", "public"), "schema of the tables, created if missing (env PGOUTBOX_SCHEMA)")
}

// Flags registers the flags of an inbox consumer's source: --nats-url (env
// NATS_URL) and --stream (env PGOUTBOX_NATS_STREAM).
func (c *ConsumerConfig) Flags(fs *flag.FlagSet) {
	fs.StringVar(&c.NatsURL, "nats-url", Env("NATS_URL", DefaultNatsURL), "NATS server (env NATS_URL)")
	fs.StringVar(&c.Stream, "stream", Env("PGOUTBOX_NATS_STREAM", "OUTBOX"), "JetStream stream the relay publishes to (env PGOUTBOX_NATS_STREAM)")
}

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
