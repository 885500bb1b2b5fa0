package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"
	"github.com/ThreeDotsLabs/watermill"
	wmsql "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"
	"github.com/ThreeDotsLabs/watermill/components/forwarder"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Topic is the topic every message is published to, and ForwarderTopic the
// watermill-sql topic the forwarder's envelope is written to: its table is
// "watermill_" + ForwarderTopic in the round's schema.
const (
	Topic          = "orders"
	ForwarderTopic = "outbox"
)

// maxProducers bounds -producers: each is a connection of its own.
const maxProducers = 64

// roundConfig is one round: Producers connections each loop BEGIN; BusinessSQL
// with the next row id as $1; the forwarder's Publish of one message with
// Payload marshalled; COMMIT, for Duration.
type roundConfig struct {
	DatabaseURL string
	Schema      string
	BusinessSQL string
	Producers   int
	Duration    time.Duration
	FirstID     int64 // the first business row id; each transaction takes the next
	Payload     map[string]any
}

// validate checks c's bounds; a missing setting is named.
func (c *roundConfig) validate() error {
	switch {
	case c.DatabaseURL == "":
		return errors.New("no database: set DATABASE_URL")
	case c.Schema == "":
		return errors.New("no schema: set -schema")
	case c.BusinessSQL == "":
		return errors.New("no business statement: set -business-sql")
	case c.Producers < 1 || c.Producers > maxProducers:
		return fmt.Errorf("-producers %d: want 1..%d", c.Producers, maxProducers)
	case c.Duration <= 0:
		return fmt.Errorf("-duration %s: want more than 0", c.Duration)
	case c.Payload == nil:
		return errors.New("no payload: set -payload")
	}
	return nil
}

// roundResult is what a round measured, printed as one JSON line.
type roundResult struct {
	Commits int64   `json:"commits"`
	Seconds float64 `json:"seconds"`
	// CPUNs is this process's user + system CPU time over the timed part, in
	// ns (getrusage, as the bench takes its own for its in-process cells).
	CPUNs float64 `json:"cpu_ns"`
	// LastID is the last business row id taken, warm-up included.
	LastID int64 `json:"last_id"`
	// Latency is the histogram of the commits' times in µs.
	Latency *hdrhistogram.Snapshot `json:"latency"`
}

// peer is a round's connections and the messages table.
type peer struct {
	cfg    roundConfig
	pool   *pgxpool.Pool
	schema wmsql.DefaultPostgreSQLSchema
	next   atomic.Int64
}

// open connects cfg.Producers connections, creates the forwarder's messages
// table in cfg.Schema if it is missing (watermill-sql's own DDL), empties it,
// and warms every connection with one transaction.
func open(ctx context.Context, cfg roundConfig) (*peer, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	pc, err := pgxpool.ParseConfig(cfg.DatabaseURL)
	if err != nil {
		return nil, errors.New("DATABASE_URL cannot be parsed") // the parser's error may quote it
	}
	pc.MaxConns, pc.MinConns = int32(cfg.Producers), int32(cfg.Producers)
	pool, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		return nil, fmt.Errorf("connect: %w", err)
	}
	p := &peer{cfg: cfg, pool: pool, schema: wmsql.DefaultPostgreSQLSchema{
		GenerateMessagesTableName: func(topic string) string {
			return pgx.Identifier{cfg.Schema, "watermill_" + topic}.Sanitize()
		},
		InitializeSchemaWithoutTransaction: true,
	}}
	p.next.Store(cfg.FirstID - 1)
	if err := p.prepare(ctx); err != nil {
		pool.Close()
		return nil, err
	}
	return p, nil
}

// prepare creates and empties the messages table and warms the connections.
func (p *peer) prepare(ctx context.Context) error {
	qs, err := p.schema.SchemaInitializingQueries(wmsql.SchemaInitializingQueriesParams{Topic: ForwarderTopic})
	if err != nil {
		return fmt.Errorf("watermill-sql schema: %w", err)
	}
	for _, q := range qs {
		if _, err := p.pool.Exec(ctx, q.Query, q.Args...); err != nil {
			return fmt.Errorf("create the messages table: %w", err)
		}
	}
	if _, err := p.pool.Exec(ctx, "TRUNCATE "+p.schema.MessagesTable(ForwarderTopic)); err != nil {
		return fmt.Errorf("empty the messages table: %w", err)
	}
	errs := make([]error, p.cfg.Producers)
	var wg sync.WaitGroup
	for i := range p.cfg.Producers {
		wg.Go(func() { errs[i] = p.tx1(ctx) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("warm-up: %w", err)
	}
	return nil
}

// close closes the connections.
func (p *peer) close() { p.pool.Close() }

// backendPids are the PostgreSQL process ids of the round's connections.
func (p *peer) backendPids(ctx context.Context) ([]int, error) {
	var conns []*pgxpool.Conn
	defer func() {
		for _, c := range conns {
			c.Release()
		}
	}()
	var pids []int
	for range p.cfg.Producers {
		c, err := p.pool.Acquire(ctx)
		if err != nil {
			return nil, err
		}
		conns = append(conns, c)
		var pid int
		if err := c.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&pid); err != nil {
			return nil, err
		}
		pids = append(pids, pid)
	}
	return pids, nil
}

// tx1 commits one business transaction with one message, as watermill's outbox
// pattern does: a watermill-sql publisher on the transaction, wrapped by the
// forwarder's publisher, both made per transaction.
func (p *peer) tx1(ctx context.Context) error {
	id := p.next.Add(1)
	return pgx.BeginFunc(ctx, p.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, p.cfg.BusinessSQL, id); err != nil {
			return fmt.Errorf("business statement: %w", err)
		}
		pub, err := wmsql.NewPublisher(wmsql.TxFromPgx(tx), wmsql.PublisherConfig{SchemaAdapter: p.schema}, watermill.NopLogger{})
		if err != nil {
			return err
		}
		fwd := forwarder.NewPublisher(pub, forwarder.PublisherConfig{ForwarderTopic: ForwarderTopic})
		// Marshalled per transaction, as the bench's producer encodes each event.
		doc, err := json.Marshal(p.cfg.Payload)
		if err != nil {
			return err
		}
		msg := message.NewMessage(watermill.NewUUID(), doc)
		msg.Metadata.Set("name", "order.placed")
		msg.SetContext(ctx)
		if err := fwd.Publish(Topic, msg); err != nil {
			return fmt.Errorf("publish: %w", err)
		}
		return nil
	})
}

// run times the round: the producers loop for cfg.Duration.
func (p *peer) run(ctx context.Context) (*roundResult, error) {
	n := p.cfg.Producers
	hists := make([]*hdrhistogram.Histogram, n)
	errs := make([]error, n)
	var commits atomic.Int64
	cpu0, err := cpuNs()
	if err != nil {
		return nil, err
	}
	start := time.Now()
	stop := start.Add(p.cfg.Duration)
	var wg sync.WaitGroup
	for i := range n {
		hists[i] = hdrhistogram.New(1, 60_000_000, 3)
		wg.Go(func() {
			for time.Now().Before(stop) && ctx.Err() == nil {
				t := time.Now()
				if err := p.tx1(ctx); err != nil {
					errs[i] = err
					return
				}
				_ = hists[i].RecordValue(time.Since(t).Microseconds())
				commits.Add(1)
			}
		})
	}
	wg.Wait()
	el := time.Since(start)
	cpu1, err := cpuNs()
	if err != nil {
		return nil, err
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	h := hdrhistogram.New(1, 60_000_000, 3)
	for _, x := range hists {
		h.Merge(x)
	}
	return &roundResult{Commits: commits.Load(), Seconds: el.Seconds(), CPUNs: cpu1 - cpu0, LastID: p.next.Load(), Latency: h.Export()}, nil
}

// cpuNs is this process's user + system CPU time so far, in ns.
func cpuNs() (float64, error) {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0, fmt.Errorf("getrusage: %w", err)
	}
	return float64(ru.Utime.Nano() + ru.Stime.Nano()), nil
}
