// Package pgoutboxtest helps a service's own integration tests check what its
// outbox publishes: it runs an in-process relay (package relay) against the
// test's database and schema, records every message the relay's publisher
// acknowledged, waits until the outbox is drained, and applies the migrations to
// a throwaway schema.
//
//	func TestPlaceOrder(t *testing.T) {
//		pool := ... // the test's *pgxpool.Pool, closed with t.Cleanup
//		r := pgoutboxtest.New(t, pool, nil) // a fresh schema of this test's own
//		... // the code under test enqueues events with pgoutbox.Producer, Schema: r.Schema()
//		if err := r.WaitDrained(ctx); err != nil {
//			t.Fatal(err)
//		}
//		got := r.PublishedFor("order", "42")
//		...
//	}
//
// It imports the standard library's testing package and pgoutbox's own
// packages, nothing else of a testing framework. docs/producer.md, "Testing your
// service", has a longer example.
//
// Outside the standard library it pulls in pgx and the OpenTelemetry trace API, as
// the root package does.
package pgoutboxtest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgoutbox/pgoutbox"
	"github.com/pgoutbox/pgoutbox/broker"
	"github.com/pgoutbox/pgoutbox/broker/brokertest"
	"github.com/pgoutbox/pgoutbox/internal/config"
	"github.com/pgoutbox/pgoutbox/migrate"
	"github.com/pgoutbox/pgoutbox/relay"
)

// Defaults of Config, used for its zero fields. The relay's are chosen for
// tests, not production: a short poll and quick retries, so that a test waits
// milliseconds rather than relay's seconds.
const (
	// DefaultPollInterval is the relay's PollInterval in tests; NOTIFY wake-ups
	// stay on, so most events go out well before a poll.
	DefaultPollInterval = 50 * time.Millisecond
	// DefaultWorkers is the relay's Workers in tests: few, so that the relay
	// fits in pgxpool's default pool beside the test's own connections.
	DefaultWorkers = 2
	// DefaultMaxAttempts is the relay's MaxAttempts in tests: a publisher that
	// keeps failing gets its event quarantined quickly.
	DefaultMaxAttempts = 5
	// DefaultBackoffBase and DefaultBackoffMax are the relay's backoff in tests.
	DefaultBackoffBase = 10 * time.Millisecond
	DefaultBackoffMax  = 200 * time.Millisecond
	// DefaultDrainPoll is how often WaitDrained looks at the outbox.
	DefaultDrainPoll = 10 * time.Millisecond
	// DefaultStopTimeout bounds the graceful stop at the end of a test.
	DefaultStopTimeout = 10 * time.Second
)

// Config configures a test relay. A nil *Config means all defaults: a fresh
// schema of the test's own and an in-memory broker.
type Config struct {
	// Schema is the PostgreSQL schema holding the outbox tables that the relay
	// serves. Empty means a fresh one: Start creates a schema with a unique name
	// ("pgoutboxtest_" and 12 hex digits), applies the migrations, serves it
	// alone and drops it in Stop; Relay.Schema names it, for the code under
	// test. A relay thus never publishes (and marks published) events of the
	// database's real outbox, nor of another test running in parallel.
	//
	// Name a schema only to serve that one: one made by the package's Schema,
	// or an application's own ("public" included) when the test means to drain
	// it. Two relays serving one schema take each other's events.
	Schema string

	// Publisher is where the relay publishes, for a test against a real broker.
	// The caller keeps it and closes it. Nil means an in-memory broker that
	// acknowledges every message at once (a brokertest.Recorder).
	Publisher broker.Publisher

	// Relay configures the relay. Its zero fields take this package's defaults
	// where it has one (DefaultPollInterval, DefaultWorkers, DefaultMaxAttempts,
	// DefaultBackoffBase, DefaultBackoffMax), else relay's; its ID defaults to a
	// unique "pgoutboxtest-…" and its Schema to Schema (setting both to
	// different schemas is an error). A nil Logger means the test's output
	// (testing.TB.Output) with New, slog.Default() with Start. Nil means all of
	// those defaults.
	Relay *relay.Config

	// DrainPoll is how often WaitDrained looks at the outbox. Zero means
	// DefaultDrainPoll (10ms).
	DrainPoll time.Duration

	// StopTimeout bounds the graceful stop that New registers with t.Cleanup;
	// after it the stop turns hard. Zero means DefaultStopTimeout (10s).
	StopTimeout time.Duration
}

// Validate reports what Start would reject in c, zero fields meaning their
// defaults: an error naming each bad field, joined. A nil c is valid.
func (c *Config) Validate() error {
	_, _, err := c.withDefaults()
	return err
}

// withDefaults returns a copy of c and the relay's config with their defaults
// filled in, and validates both.
func (c *Config) withDefaults() (Config, relay.Config, error) {
	var rc relay.Config
	out, err := config.Resolve("pgoutboxtest", c, func(c *Config) {
		if c.Relay != nil {
			config.Default(&c.Schema, c.Relay.Schema) // named there only: explicit too
		}
		config.Default(&c.DrainPoll, DefaultDrainPoll)
		config.Default(&c.StopTimeout, DefaultStopTimeout)
		if c.Relay != nil {
			rc = *c.Relay
		}
		config.Default(&rc.ID, "pgoutboxtest-"+randomHex())
		config.Default(&rc.Schema, c.Schema)
		config.Default(&rc.PollInterval, DefaultPollInterval)
		config.Default(&rc.Workers, DefaultWorkers)
		config.Default(&rc.MaxAttempts, DefaultMaxAttempts)
		config.Default(&rc.BackoffBase, DefaultBackoffBase)
		config.Default(&rc.BackoffMax, DefaultBackoffMax)
	}, func(c *Config, p *config.Problems) {
		if c.Schema != "" { // empty: a fresh schema, made by Start
			p.Field("Config.Schema", migrate.ValidateSchema(c.Schema))
		}
		p.Check(rc.Schema == c.Schema, "Config.Relay.Schema (%q) must be empty or Config.Schema (%q)", rc.Schema, c.Schema)
		p.Check(c.DrainPoll > 0, "Config.DrainPoll (%s) must be positive", c.DrainPoll)
		p.Check(c.StopTimeout > 0, "Config.StopTimeout (%s) must be positive", c.StopTimeout)
		p.Field("Config.Relay", rc.Validate())
	})
	return out, rc, err
}

// randomHex returns 12 random hex digits: a name unique among concurrent tests.
func randomHex() string {
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// Relay is a running relay of a test and the record of what its publisher
// acknowledged. It is safe for concurrent use.
type Relay struct {
	cfg   Config
	pool  *pgxpool.Pool
	relay *relay.Relay
	rec   *recording
	sql   queries

	// owned is set when Start created the schema, which Stop then drops once.
	owned    bool
	dropOnce sync.Once
	dropErr  error
}

// Schema returns the schema the relay serves: Config.Schema, or the fresh one
// Start created. Give it to pgoutbox.Config.Schema (and inbox's config).
func (r *Relay) Schema() string { return r.cfg.Schema }

// New starts a relay for the test tb, as Start does, and stops it when the test
// ends (t.Cleanup, bounded by Config.StopTimeout). The relay logs to the test's
// output unless Config.Relay.Logger says otherwise. It fails the test if the
// relay cannot start.
func New(tb testing.TB, pool *pgxpool.Pool, cfg *Config) *Relay {
	tb.Helper()
	var c Config
	if cfg != nil {
		c = *cfg
	}
	var rc relay.Config
	if c.Relay != nil {
		rc = *c.Relay
	}
	if rc.Logger == nil {
		// Safe: the relay logs nothing once Stop returned, which is before the
		// test completes.
		rc.Logger = slog.New(slog.NewTextHandler(tb.Output(), nil))
	}
	c.Relay = &rc
	r, err := Start(context.Background(), pool, &c)
	if err != nil {
		tb.Fatalf("pgoutboxtest: %v", err)
	}
	tb.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), r.cfg.StopTimeout)
		defer cancel()
		if err := r.Stop(ctx); err != nil {
			tb.Errorf("pgoutboxtest: %v", err)
		}
	})
	return r
}

// Start starts a relay reading the outbox of cfg.Schema through pool, or of a
// fresh schema it creates when cfg.Schema is empty; the caller stops it with
// Stop, which drops such a schema. ctx governs only the start (the migrations
// included); cancelling it later stops the relay hard (prefer Stop). Size pool
// for the relay's Workers + 2 connections beside the test's own.
func Start(ctx context.Context, pool *pgxpool.Pool, cfg *Config) (r *Relay, err error) {
	c, rc, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	if pool == nil {
		return nil, errors.New("pgoutboxtest: Start needs a pool")
	}
	owned := c.Schema == ""
	if owned {
		c.Schema = "pgoutboxtest_" + randomHex()
		rc.Schema = c.Schema
		defer func() {
			if err != nil {
				// Nothing serves it: drop it now, whatever ctx says.
				dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), DropTimeout)
				defer cancel()
				err = errors.Join(err, dropSchema(dctx, pool, c.Schema))
			}
		}()
		if err := migrateSchema(ctx, pool, c.Schema); err != nil {
			return nil, err
		}
	}
	pub := c.Publisher
	if pub == nil {
		pub = &brokertest.Recorder{}
	}
	rec := &recording{pub: pub}
	rl, err := relay.New(pool, rec, &rc)
	if err != nil {
		return nil, fmt.Errorf("pgoutboxtest: new relay: %w", err)
	}
	if err := rl.Start(ctx); err != nil {
		return nil, fmt.Errorf("pgoutboxtest: start relay: %w", err)
	}
	return &Relay{cfg: c, pool: pool, relay: rl, rec: rec, sql: newQueries(c.Schema), owned: owned}, nil
}

// Stop stops the relay gracefully: in-flight publishes finish and are recorded.
// If ctx ends first the stop turns hard (see relay.Relay.Stop). Then it drops
// the schema Start created, if it did (bounded by DropTimeout, not ctx, so that
// a test's expired deadline leaves no schema behind). Stopping twice is
// harmless. It does not close a Config.Publisher.
func (r *Relay) Stop(ctx context.Context) error {
	if err := r.relay.Stop(ctx); err != nil {
		return fmt.Errorf("stop relay: %w", err)
	}
	if r.owned {
		r.dropOnce.Do(func() {
			dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), DropTimeout)
			defer cancel()
			r.dropErr = dropSchema(dctx, r.pool, r.cfg.Schema)
		})
		return r.dropErr
	}
	return nil
}

// Published returns a copy of every message the publisher acknowledged since
// the start or the last Reset, in acknowledgement order: within one aggregate,
// in AggregateSequence order. Delivery is at least once, so after a relay
// retried a batch whose outcome it could not record, an event may appear twice.
func (r *Relay) Published() []broker.Message { return r.rec.messages(nil) }

// PublishedFor is Published restricted to one aggregate: its events in
// AggregateSequence order.
func (r *Relay) PublishedFor(aggregateType, aggregateID string) []broker.Message {
	lane := pgoutbox.LaneOf(aggregateType, aggregateID)
	return r.rec.messages(func(m *broker.Message) bool { return m.Lane() == lane })
}

// Reset forgets what was published so far, so that a test's next step asserts
// only on its own messages. Call it after WaitDrained, or messages still in
// flight may be recorded after the reset.
func (r *Relay) Reset() { r.rec.reset() }

// recording is the publisher the relay sees: it forwards to the real one and
// records each message that one acknowledged.
type recording struct {
	pub broker.Publisher

	mu  sync.Mutex
	got []broker.Message
}

// Publish implements broker.Publisher.
func (r *recording) Publish(ctx context.Context, msgs []broker.Message) []error {
	errs := r.pub.Publish(ctx, msgs)
	r.mu.Lock()
	defer r.mu.Unlock()
	for i := range msgs {
		if i < len(errs) && errs[i] == nil {
			m := msgs[i]
			m.Payload = slices.Clone(m.Payload)
			r.got = append(r.got, m)
		}
	}
	return errs
}

// Close implements broker.Publisher. The relay never closes its publisher, and
// the wrapped one belongs to the caller.
func (r *recording) Close() error { return nil }

func (r *recording) messages(keep func(*broker.Message) bool) []broker.Message {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []broker.Message
	for i := range r.got {
		if keep == nil || keep(&r.got[i]) {
			out = append(out, r.got[i])
		}
	}
	return out
}

func (r *recording) reset() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.got = nil
}

// queries are WaitDrained's statements for one schema.
type queries struct {
	// unpublished lists what WaitDrained waits for: every committed event not
	// yet published, quarantined ones included (they are reported, not waited on).
	unpublished string
	// pending reads back those of the given events still unpublished, each with
	// whether it is quarantined or blocked: an event behind a quarantined one in
	// its aggregate is never published until an operator acts (docs/design.md),
	// so waiting for it would only run into the deadline.
	pending string
}

func newQueries(schema string) queries {
	t := pgx.Identifier{schema, "outbox_events"}.Sanitize()
	return queries{
		unpublished: `SELECT event_id FROM ` + t + ` WHERE published_at IS NULL`,
		pending: `SELECT e.event_id, e.aggregate_type, e.aggregate_id, e.aggregate_sequence, e.event_type,
       e.quarantined_at IS NOT NULL, coalesce(e.last_error, ''),
       EXISTS (SELECT 1 FROM ` + t + ` q
               WHERE q.aggregate_type = e.aggregate_type AND q.aggregate_id = e.aggregate_id
                 AND q.aggregate_sequence < e.aggregate_sequence
                 AND q.published_at IS NULL AND q.quarantined_at IS NOT NULL)
FROM ` + t + ` e
WHERE e.event_id = ANY($1) AND e.published_at IS NULL
ORDER BY e.aggregate_type, e.aggregate_id, e.aggregate_sequence`,
	}
}
