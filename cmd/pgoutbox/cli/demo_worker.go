package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"

	"github.com/pgoutbox/pgoutbox/broker"
	natsbroker "github.com/pgoutbox/pgoutbox/broker/nats"
	"github.com/pgoutbox/pgoutbox/examples/orders"
	"github.com/pgoutbox/pgoutbox/examples/orders/inventory"
	"github.com/pgoutbox/pgoutbox/examples/orders/payments"
	"github.com/pgoutbox/pgoutbox/inbox"
	"github.com/pgoutbox/pgoutbox/internal/redact"
	"github.com/pgoutbox/pgoutbox/relay"
)

// demoWorkerFlags configure one relay or consumer process of the demo.
type demoWorkerFlags struct {
	role, id, dbURL, schema, natsURL, stream, prefix, payURL, logLevel string
	noKey                                                              bool
}

// newDemoWorkerCmd is the hidden verb the demo runs its relays and consumers with,
// as child processes it can kill for real.
func newDemoWorkerCmd() *cobra.Command {
	var f demoWorkerFlags
	cmd := &cobra.Command{
		Use:    "worker",
		Short:  "Run one relay or consumer process of the demo (used by pgoutbox demo itself)",
		Hidden: true,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runDemoWorker(cmd.Context(), &f, cmd.OutOrStdout(), cmd.ErrOrStderr())
		},
	}
	fs := cmd.Flags()
	fs.StringVar(&f.role, "role", "", "relay, inventory or payments")
	fs.StringVar(&f.id, "id", "", "process name, the relay id")
	fs.StringVar(&f.dbURL, "database-url", "", "PostgreSQL connection string (env DATABASE_URL)")
	fs.StringVar(&f.schema, "schema", "", "schema of the demo")
	fs.StringVar(&f.natsURL, "nats-url", "", "NATS server (env PGOUTBOX_DEMO_WORKER_NATS_URL)")
	fs.StringVar(&f.stream, "stream", "", "JetStream stream")
	fs.StringVar(&f.prefix, "subject-prefix", "", "first token of the subjects")
	fs.StringVar(&f.payURL, "payment-url", "", "fake payment API")
	fs.StringVar(&f.logLevel, "log-level", "error", "log level")
	fs.BoolVar(&f.noKey, "no-idempotency-key", false, "charge without the idempotency key")
	return cmd
}

// inboxCounter counts a consumer's outcomes for the demo's view.
type inboxCounter struct{ applied, duplicates, gaps, failed atomic.Int64 }

// Observe counts one outcome; it never blocks.
func (c *inboxCounter) Observe(o inbox.Outcome) {
	switch o.Status {
	case inbox.StatusApplied:
		c.applied.Add(1)
	case inbox.StatusDuplicate:
		c.duplicates.Add(1)
	case inbox.StatusGapRejected:
		c.gaps.Add(1)
	case inbox.StatusFailed:
		c.failed.Add(1)
	}
}

func (c *inboxCounter) stats() workerStats {
	return workerStats{Applied: c.applied.Load(), Duplicates: c.duplicates.Load(), Gaps: c.gaps.Load(), Failed: c.failed.Load()}
}

func runDemoWorker(ctx context.Context, f *demoWorkerFlags, stdout, stderr io.Writer) error {
	if f.dbURL == "" || f.schema == "" || f.natsURL == "" || f.stream == "" || f.prefix == "" {
		return usagef("demo worker: --database-url, --schema, --nats-url, --stream and --subject-prefix are required")
	}
	var level slog.Level
	if err := level.UnmarshalText([]byte(f.logLevel)); err != nil {
		return usagef("--log-level %q: %v", f.logLevel, err)
	}
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level})).With(slog.String("process", f.id))

	// The demo holds our standard input open; EOF means it is gone.
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		_, _ = io.Copy(io.Discard, os.Stdin)
		cancel()
	}()

	counter := &inboxCounter{}
	report := func(s workerStats) {
		b, _ := json.Marshal(s)
		fmt.Fprintf(stdout, "%s\n", b)
	}
	go func() {
		t := time.NewTicker(250 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				report(counter.stats())
			}
		}
	}()
	defer func() { report(counter.stats()) }()

	consumer := orders.ConsumerConfig{NatsURL: f.natsURL, Stream: f.stream, StreamSubjects: []string{f.prefix + ".>"},
		AckWait: demoAckWait, Concurrency: 4, Logger: log}
	icfg := inbox.Config{Schema: f.schema, RetryDelay: 200 * time.Millisecond, MaxRetryDelay: 2 * time.Second,
		Observer: counter, Logger: log}
	switch f.role {
	case "relay":
		return runDemoRelay(ctx, f, log)
	case inventory.ConsumerName:
		return inventory.Run(ctx, inventory.RunConfig{DatabaseURL: f.dbURL, Inbox: icfg, Consumer: consumer})
	case payments.ConsumerName:
		client := &payments.Client{BaseURL: f.payURL, HTTP: &http.Client{Timeout: demoPayTimeout}, NoIdempotencyKey: f.noKey}
		return payments.Run(ctx, payments.RunConfig{DatabaseURL: f.dbURL, Client: client, Inbox: icfg, Consumer: consumer})
	}
	return usagef("demo worker: --role %q: want relay, inventory or payments", f.role)
}

func runDemoRelay(ctx context.Context, f *demoWorkerFlags, log *slog.Logger) error {
	pcfg, err := pgxpool.ParseConfig(f.dbURL)
	if err != nil {
		return usageError{redact.ConnStringError("demo worker --database-url", err)}
	}
	pcfg.MaxConns = 4
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return fmt.Errorf("connect to database: %w", err)
	}
	defer pool.Close()
	pub, err := natsbroker.Dial(ctx, f.natsURL, &natsbroker.Config{
		Stream: f.stream, StreamSubjects: []string{f.prefix + ".>"},
		Subject: broker.MustParseTemplate(f.prefix + ".{aggregate_type}.{event_type}"), Logger: log,
	})
	if err != nil {
		return err
	}
	defer pub.Close()
	r, err := relay.New(pool, pub, &relay.Config{
		ID: f.id, Schema: f.schema, Lease: demoLease, PollInterval: 500 * time.Millisecond,
		BackoffBase: 100 * time.Millisecond, BackoffMax: 2 * time.Second, Logger: log,
	})
	if err != nil {
		return err
	}
	if err := r.Start(context.WithoutCancel(ctx)); err != nil {
		return err
	}
	<-ctx.Done()
	sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return r.Stop(sctx)
}
