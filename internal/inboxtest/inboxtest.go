// Package inboxtest is the shared fixture of the inbox subscribers' tests: a
// business "effects" table that records what a consumer applied, in order, and
// outbox-shaped messages to feed it.
package inboxtest

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgoutbox/pgoutbox"
	"github.com/pgoutbox/pgoutbox/broker"
	"github.com/pgoutbox/pgoutbox/inbox"
	"github.com/pgoutbox/pgoutbox/internal/pgtest"
)

var quiet = slog.New(slog.DiscardHandler)

// Effects is a migrated schema with an effects table: one row per applied event,
// numbered in the order of application.
type Effects struct {
	Pool   *pgxpool.Pool
	Schema string
}

// NewEffects creates the effects table in schema (already migrated).
func NewEffects(tb testing.TB, pool *pgxpool.Pool, schema string) *Effects {
	tb.Helper()
	e := &Effects{Pool: pool, Schema: schema}
	_, err := pool.Exec(context.Background(), `CREATE TABLE `+e.Table("effects")+` (
		n            bigserial PRIMARY KEY,
		event_id     uuid   NOT NULL,
		aggregate_id text   NOT NULL,
		sequence     bigint NOT NULL)`)
	pgtest.Must(tb, err, "create effects")
	return e
}

// Table returns the schema-qualified name of a table of the schema.
func (e *Effects) Table(name string) string { return pgx.Identifier{e.Schema, name}.Sanitize() }

// Count returns how many rows of table match where.
func (e *Effects) Count(tb testing.TB, table, where string, args ...any) int {
	tb.Helper()
	var n int
	err := e.Pool.QueryRow(context.Background(), "SELECT count(*) FROM "+e.Table(table)+" WHERE "+where, args...).Scan(&n)
	pgtest.Must(tb, err, "count %s", table)
	return n
}

// Sequences returns what was applied of aggregate id, in application order.
func (e *Effects) Sequences(tb testing.TB, id string) []int64 {
	tb.Helper()
	rows, err := e.Pool.Query(context.Background(), "SELECT sequence FROM "+e.Table("effects")+" WHERE aggregate_id = $1 ORDER BY n", id)
	pgtest.Must(tb, err, "read effects")
	seqs, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	pgtest.Must(tb, err, "read effects")
	return seqs
}

// CheckInOrder fails tb unless each of aggregates aggregates, named by
// fmt.Sprintf(idFormat, a), has exactly perAggregate effects, applied in
// sequence order 1..perAggregate.
func (e *Effects) CheckInOrder(tb testing.TB, idFormat string, aggregates, perAggregate int) {
	tb.Helper()
	for a := range aggregates {
		got := e.Sequences(tb, fmt.Sprintf(idFormat, a))
		if len(got) != perAggregate {
			tb.Fatalf("aggregate %d: %d effects, want %d", a, len(got), perAggregate)
		}
		for i, s := range got {
			if s != int64(i+1) {
				tb.Fatalf("aggregate %d applied out of order: %v", a, got)
			}
		}
	}
}

// SumStats returns the consumers' counters added up, and what each applied.
func SumStats(consumers []*inbox.Consumer[pgx.Tx]) (total inbox.Stats, applied []int64) {
	for _, c := range consumers {
		s := c.Stats()
		total.Applied += s.Applied
		total.Duplicates += s.Duplicates
		total.Gaps += s.Gaps
		total.Late += s.Late
		total.Failed += s.Failed
		total.Undecodable += s.Undecodable
		applied = append(applied, s.Applied)
	}
	return total, applied
}

// Record is the business effect of the tests' handlers.
func (e *Effects) Record(ctx context.Context, tx pgx.Tx, ev inbox.Event) error {
	_, err := tx.Exec(ctx, "INSERT INTO "+e.Table("effects")+" (event_id, aggregate_id, sequence) VALUES ($1, $2, $3)",
		ev.EventID.String(), ev.AggregateID, ev.AggregateSequence)
	return err
}

// Consumer returns an inbox consumer (named "billing" unless cfg names it) that
// records effects, or runs h when given.
func (e *Effects) Consumer(tb testing.TB, cfg inbox.Config, h inbox.Handler[pgx.Tx]) *inbox.Consumer[pgx.Tx] {
	tb.Helper()
	if h == nil {
		h = e.Record
	}
	if cfg.Name == "" {
		cfg.Name = "billing"
	}
	cfg.Schema = e.Schema
	if cfg.Logger == nil {
		cfg.Logger = quiet
	}
	c, err := inbox.New(inbox.Pgx(e.Pool), h, &cfg)
	pgtest.Must(tb, err, "inbox.New")
	return c
}

// Event returns event seq of order id.
func Event(id string, seq int64) broker.Message {
	return broker.Message{
		EventID:           pgoutbox.NewEventID(),
		AggregateType:     "order",
		AggregateID:       id,
		AggregateSequence: seq,
		EventType:         "updated",
		SchemaVersion:     1,
		OccurredAt:        time.Now(),
		Payload:           []byte(fmt.Sprintf(`{"order_id":%q,"step":%d}`, id, seq)),
	}
}

// Lane returns events 1..n of order id.
func Lane(id string, n int) []broker.Message {
	out := make([]broker.Message, n)
	for i := range out {
		out[i] = Event(id, int64(i+1))
	}
	return out
}

// StopAtEnd stops s when the test ends, within 30 s, and fails the test if the
// stop fails: the cleanup of every subscriber a test starts.
func StopAtEnd(tb testing.TB, s interface{ Stop(context.Context) error }) {
	tb.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := s.Stop(ctx); err != nil {
			tb.Errorf("stop subscriber: %v", err)
		}
	})
}

// Processor is an inbox.Processor made of a function, to wrap a consumer. A
// nil Fn is a processor that is only a name.
type Processor struct {
	Consumer string // what Name returns
	Fn       func(ctx context.Context, d inbox.Delivery) inbox.Outcome
}

// Name implements inbox.Processor.
func (p Processor) Name() string { return p.Consumer }

// Process implements inbox.Processor.
func (p Processor) Process(ctx context.Context, d inbox.Delivery) inbox.Outcome { return p.Fn(ctx, d) }

// KillAfterApply wraps c: once c has applied a delivery (its transaction
// committed), the process kills itself (SIGKILL: no deferred function runs),
// before the subscriber can settle the delivery. The crash a subscriber's
// TestHelperProcess child stages.
func KillAfterApply(c inbox.Processor) inbox.Processor {
	return Processor{Consumer: c.Name(), Fn: func(ctx context.Context, d inbox.Delivery) inbox.Outcome {
		o := c.Process(ctx, d)
		if o.Status == inbox.StatusApplied {
			p, _ := os.FindProcess(os.Getpid())
			_ = p.Kill()
			select {}
		}
		return o
	}}
}
