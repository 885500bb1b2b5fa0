package orders

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	natsgo "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/pgoutbox/pgoutbox/inbox"
	"github.com/pgoutbox/pgoutbox/inbox/natsinbox"
)

// ConsumerConfig says where an inbox consumer of the example reads its events.
type ConsumerConfig struct {
	// NatsURL is the NATS server. Defaults to DefaultNatsURL.
	NatsURL string

	// Stream is the JetStream stream the relay publishes to. Defaults to "OUTBOX".
	Stream string

	// StreamSubjects are the stream's subjects, used if the consumer starts before
	// any relay and has to create the stream. Defaults to ["outbox.>"], the relay's
	// default.
	StreamSubjects []string

	// AckWait is how long JetStream waits for an ack before redelivering a message
	// to another instance (after a crash, say). Defaults to 30s.
	AckWait time.Duration

	// Concurrency is how many events one instance processes at once. Defaults to 4.
	Concurrency int

	// StopTimeout bounds the graceful stop once ctx ends. Defaults to 10s.
	StopTimeout time.Duration

	// Logger defaults to slog.Default().
	Logger *slog.Logger
}

// Flags registers the flags of an inbox consumer's source: --nats-url (env
// NATS_URL) and --stream (env PGOUTBOX_NATS_STREAM).
func (c *ConsumerConfig) Flags(fs *flag.FlagSet) {
	fs.StringVar(&c.NatsURL, "nats-url", Env("NATS_URL", DefaultNatsURL), "NATS server (env NATS_URL)")
	fs.StringVar(&c.Stream, "stream", Env("PGOUTBOX_NATS_STREAM", "OUTBOX"), "JetStream stream the relay publishes to (env PGOUTBOX_NATS_STREAM)")
}

// RunConsumer feeds proc (an *inbox.Consumer) from a durable JetStream consumer
// named after it until ctx ends, then stops gracefully: in-flight transactions
// commit and ack, messages pulled but not started go back to the stream. It creates
// the stream if no relay has yet.
func RunConsumer(ctx context.Context, cfg ConsumerConfig, proc inbox.Processor) error {
	if cfg.NatsURL == "" {
		cfg.NatsURL = DefaultNatsURL
	}
	if cfg.Stream == "" {
		cfg.Stream = "OUTBOX"
	}
	if len(cfg.StreamSubjects) == 0 {
		cfg.StreamSubjects = []string{"outbox.>"}
	}
	if cfg.StopTimeout == 0 {
		cfg.StopTimeout = 10 * time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	nc, err := natsgo.Connect(cfg.NatsURL, natsgo.Name("pgoutbox example "+proc.Name()),
		natsgo.MaxReconnects(-1), natsgo.RetryOnFailedConnect(true))
	if err != nil {
		return fmt.Errorf("connect to NATS %s: %w", cfg.NatsURL, err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return fmt.Errorf("jetstream: %w", err)
	}
	if err := ensureStream(ctx, js, cfg.Stream, cfg.StreamSubjects); err != nil {
		return err
	}
	sub, err := natsinbox.New(js, proc, &natsinbox.Config{
		Stream: cfg.Stream, AckWait: cfg.AckWait, Concurrency: cfg.Concurrency, Logger: cfg.Logger,
	})
	if err != nil {
		return err
	}
	if err := sub.Start(ctx); err != nil {
		return err
	}
	<-ctx.Done()
	sctx, cancel := context.WithTimeout(context.Background(), cfg.StopTimeout)
	defer cancel()
	return sub.Stop(sctx)
}

// ensureStream creates the stream unless it exists, retrying while the server is
// unreachable, until ctx ends.
func ensureStream(ctx context.Context, js jetstream.JetStream, name string, subjects []string) error {
	for {
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		_, err := js.Stream(cctx, name)
		if errors.Is(err, jetstream.ErrStreamNotFound) {
			_, err = js.CreateStream(cctx, jetstream.StreamConfig{Name: name, Subjects: subjects, Storage: jetstream.FileStorage})
			if errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
				err = nil // a relay created it meanwhile
			}
		}
		cancel()
		if err == nil {
			return nil
		}
		if ctx.Err() != nil {
			return fmt.Errorf("stream %s: %w", name, err)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("stream %s: %w", name, err)
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// RunInbox runs one instance of an inbox consumer of the example until ctx ends: it
// connects to databaseURL, creates the tables in icfg.Schema if missing, and feeds
// handler h through an inbox.Consumer configured by icfg from JetStream (see
// RunConsumer).
func RunInbox(ctx context.Context, databaseURL string, icfg inbox.Config, h inbox.Handler[pgx.Tx], ccfg ConsumerConfig) error {
	if ccfg.Concurrency == 0 {
		ccfg.Concurrency = 4
	}
	if ccfg.Logger == nil {
		ccfg.Logger = slog.Default()
	}
	if icfg.Logger == nil {
		icfg.Logger = ccfg.Logger
	}
	if icfg.Schema == "" {
		icfg.Schema = "public"
	}
	pcfg, err := pgxpool.ParseConfig(databaseURL)
	if err != nil {
		return fmt.Errorf("database URL: %w", err)
	}
	pcfg.MaxConns = int32(ccfg.Concurrency + 2)
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return fmt.Errorf("connect to database: %w", err)
	}
	defer pool.Close()
	if err := Migrate(ctx, pool, icfg.Schema); err != nil {
		return err
	}
	c, err := inbox.New(inbox.Pgx(pool), h, &icfg)
	if err != nil {
		return err
	}
	return RunConsumer(ctx, ccfg, c)
}
