package inbox

import (
	"log/slog"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/pgoutbox/pgoutbox/internal/config"
	"github.com/pgoutbox/pgoutbox/migrate"
)

// GapPolicy says what a consumer does with an event whose aggregate sequence is more
// than one past the last sequence it applied for that aggregate: some earlier event
// has not been applied (yet).
type GapPolicy string

const (
	// GapReject refuses the event: nothing is applied, no processed_events row is
	// written, and the outcome asks the subscriber to nack it so the broker
	// redelivers it later, by which time the missing events have usually been
	// applied. Each aggregate's events are applied strictly in sequence order. An
	// event that will never come (skipped upstream, lost by the broker) holds its
	// aggregate until an operator moves the position past it
	// ([Consumer.SetPosition]). The default.
	GapReject GapPolicy = "reject"

	// GapAccept applies the event anyway and reports the gap (Outcome.Gap, the gaps
	// counter, a warning in the log). A missing event that arrives later is applied
	// too (Outcome.Late): every event is applied exactly once, in whatever order it
	// arrives. For consumers whose effects commute (counters, sets, independent
	// rows).
	GapAccept GapPolicy = "accept"
)

// The defaults of Config's fields.
const (
	DefaultSchema           = migrate.DefaultSchema
	DefaultGapPolicy        = GapReject
	DefaultRetryDelay       = time.Second
	DefaultMaxRetryDelay    = time.Minute
	DefaultGapRetryDelay    = 100 * time.Millisecond
	DefaultMaxGapRetryDelay = 5 * time.Second
	DefaultTxRetries        = 3
)

// Config configures a Consumer. Name is required; every other field documents its
// default.
type Config struct {
	// Name identifies the consumer: its rows in processed_events and
	// consumer_positions carry it. Every instance of one logical consumer uses the
	// same name; different consumers of the same events use different names, and
	// each applies every event once. Required; changing it later makes the consumer
	// apply everything again.
	Name string

	// Schema is the PostgreSQL schema holding the inbox tables (package migrate,
	// line "inbox"). Zero means DefaultSchema ("public").
	Schema string

	// GapPolicy is what to do when an earlier event of the aggregate is missing.
	// Zero means DefaultGapPolicy (GapReject).
	GapPolicy GapPolicy

	// Upcaster brings payloads of older schema versions to the shape the handler
	// expects; see [Upcaster] and [Upcasters]. Defaults to none: the handler sees
	// the payload as published.
	Upcaster Upcaster

	// RetryDelay is the broker's redelivery delay after a failed delivery (handler,
	// upcaster or database error), doubled with each delivery attempt up to
	// MaxRetryDelay, with jitter between half and all of it (retry.Exponential). Zero means
	// DefaultRetryDelay (1s).
	RetryDelay time.Duration

	// MaxRetryDelay caps RetryDelay's doubling. Zero means DefaultMaxRetryDelay
	// (1m).
	MaxRetryDelay time.Duration

	// GapRetryDelay is the redelivery delay of an event rejected for a gap, per
	// missing sequence: an event 3 past the next expected one comes back after
	// 3 × GapRetryDelay, so the events waiting behind a missing one return in
	// sequence order. The missing event is usually in flight at another instance,
	// so the delay is short. Zero means DefaultGapRetryDelay (100ms).
	GapRetryDelay time.Duration

	// MaxGapRetryDelay caps the gap delay: how often, at least, an event waiting
	// behind an event that never comes is retried. Zero means
	// DefaultMaxGapRetryDelay (5s).
	MaxGapRetryDelay time.Duration

	// TxRetries is how many times a transaction that PostgreSQL aborted for a
	// serialization failure or a deadlock is run again at once (handler included)
	// before the delivery counts as failed. Zero means DefaultTxRetries (3);
	// negative disables it.
	TxRetries int

	// Observer is told the outcome of every delivery, for metrics (package
	// inbox/inboxprom has Prometheus collectors). Defaults to none.
	Observer Observer

	// Tracing, when set, gives every delivery an OpenTelemetry span tied to the
	// producer's trace (see [Tracing]). Defaults to nil: no tracing.
	Tracing *Tracing

	// Logger receives failures, undecodable deliveries and accepted gaps. Defaults to
	// slog.Default().
	Logger *slog.Logger
}

// Validate reports what New would reject in c: the config as given, its zero
// fields meaning their defaults. It is safe on a nil receiver (all defaults,
// which lack the required Name). Several problems are joined with errors.Join.
func (c *Config) Validate() error {
	_, err := c.withDefaults()
	return err
}

func (c *Config) withDefaults() (Config, error) {
	return config.Resolve("inbox", c, configDefaults, checkConfig)
}

func configDefaults(c *Config) {
	config.Default(&c.Schema, DefaultSchema)
	config.Default(&c.GapPolicy, DefaultGapPolicy)
	config.Default(&c.RetryDelay, DefaultRetryDelay)
	config.Default(&c.MaxRetryDelay, DefaultMaxRetryDelay)
	config.Default(&c.GapRetryDelay, DefaultGapRetryDelay)
	config.Default(&c.MaxGapRetryDelay, DefaultMaxGapRetryDelay)
	switch {
	case c.TxRetries == 0:
		c.TxRetries = DefaultTxRetries
	case c.TxRetries < 0:
		c.TxRetries = 0
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
}

// checkConfig validates a config whose defaults are filled in.
func checkConfig(c *Config, p *config.Problems) {
	p.Check(c.Name != "", "Config.Name is required: it identifies the consumer in processed_events")
	p.Check(utf8.ValidString(c.Name) && !strings.ContainsRune(c.Name, 0), "Config.Name %q must be valid UTF-8 without NUL bytes", c.Name)
	p.Check(len(c.Name) <= 200, "Config.Name is longer than 200 bytes")
	p.Field("Config.Schema", migrate.ValidateSchema(c.Schema))
	p.Check(c.GapPolicy == GapReject || c.GapPolicy == GapAccept,
		"Config.GapPolicy %q: want %q or %q", c.GapPolicy, GapReject, GapAccept)
	p.Check(c.RetryDelay > 0 && c.MaxRetryDelay >= c.RetryDelay,
		"Config.RetryDelay (%s) must be positive and at most Config.MaxRetryDelay (%s)", c.RetryDelay, c.MaxRetryDelay)
	p.Check(c.GapRetryDelay > 0 && c.MaxGapRetryDelay >= c.GapRetryDelay,
		"Config.GapRetryDelay (%s) must be positive and at most Config.MaxGapRetryDelay (%s)", c.GapRetryDelay, c.MaxGapRetryDelay)
}
