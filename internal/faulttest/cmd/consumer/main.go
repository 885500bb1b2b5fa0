// Command consumer is the fault-injection suite's consumer: an inbox.Consumer fed
// by a natsinbox.Subscriber, whose business effect is one row in <schema>.effects
// per application (no unique constraint, so a double application shows). The
// failpoint consumer/after-commit sits between its commit and the ack
// (PGOUTBOX_FAILPOINTS).
//
// It runs until SIGTERM/SIGINT, stops gracefully and prints one "consumed ..."
// line with its counters.
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	natsgo "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/pgoutbox/pgoutbox/inbox"
	"github.com/pgoutbox/pgoutbox/inbox/natsinbox"
	"github.com/pgoutbox/pgoutbox/internal/faulttest/cmd/command"
	"github.com/pgoutbox/pgoutbox/migrate"
)

var (
	dbURL       = flag.String("database-url", os.Getenv("DATABASE_URL"), "database")
	schema      = flag.String("schema", "public", "schema of the inbox tables and of the effects table")
	natsURL     = flag.String("nats", "nats://127.0.0.1:4222", "NATS server")
	stream      = flag.String("stream", "OUTBOX", "JetStream stream")
	name        = flag.String("name", "billing", "inbox consumer name (and durable)")
	ackWait     = flag.Duration("ack-wait", 2*time.Second, "AckWait of the durable, when creating it")
	concurrency = flag.Int("concurrency", 4, "messages processed at once")
	logLevel    = flag.String("log-level", "warn", "log level")
)

func main() { command.Main("consumer", run) }

func run(ctx context.Context) error {
	var level slog.Level
	if err := level.UnmarshalText([]byte(*logLevel)); err != nil {
		return err
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))

	pcfg, err := pgxpool.ParseConfig(*dbURL)
	if err != nil {
		return err
	}
	pcfg.MaxConns = int32(*concurrency + 2)
	pool, err := pgxpool.NewWithConfig(context.Background(), pcfg)
	if err != nil {
		return fmt.Errorf("connect: %w", err)
	}
	defer pool.Close()
	// As an application does at start (docs/design.md, "Version skew").
	if err := migrate.CheckCompatible(ctx, pool, *schema, migrate.LineInbox); err != nil {
		return err
	}
	effects := pgx.Identifier{*schema, "effects"}.Sanitize()
	handler := func(ctx context.Context, tx pgx.Tx, ev inbox.Event) error {
		_, err := tx.Exec(ctx, "INSERT INTO "+effects+" (consumer, event_id, aggregate_type, aggregate_id, sequence) VALUES ($1, $2, $3, $4, $5)",
			*name, ev.EventID, ev.AggregateType, ev.AggregateID, ev.AggregateSequence)
		return err
	}
	cons, err := inbox.New(inbox.Pgx(pool), handler, &inbox.Config{Name: *name, Schema: *schema, Logger: log,
		GapRetryDelay: 20 * time.Millisecond, MaxGapRetryDelay: 500 * time.Millisecond,
		RetryDelay: 100 * time.Millisecond, MaxRetryDelay: time.Second})
	if err != nil {
		return err
	}

	nc, err := natsgo.Connect(*natsURL, natsgo.Name("faulttest consumer"), natsgo.MaxReconnects(-1),
		natsgo.RetryOnFailedConnect(true), natsgo.ReconnectWait(100*time.Millisecond))
	if err != nil {
		return fmt.Errorf("nats: %w", err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	sub, err := natsinbox.New(js, cons, &natsinbox.Config{Stream: *stream, AckWait: *ackWait,
		Concurrency: *concurrency, Logger: log})
	if err != nil {
		return err
	}
	// Start's ctx also governs the Subscriber's life (its end is a hard stop), so
	// it is not the signal context: SIGTERM stops gracefully below.
	if err := sub.Start(context.Background()); err != nil {
		return fmt.Errorf("start: %w", err)
	}
	fmt.Fprintln(os.Stderr, "consumer started")
	<-ctx.Done()
	sctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	serr := sub.Stop(sctx)
	s := cons.Stats()
	fmt.Printf("consumed applied=%d duplicates=%d gaps=%d failed=%d\n", s.Applied, s.Duplicates, s.Gaps, s.Failed)
	return serr
}
