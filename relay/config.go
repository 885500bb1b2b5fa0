package relay

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/pgoutbox/pgoutbox/migrate"
)

// Defaults of Config, used for its zero fields.
const (
	DefaultBatchSize    = 500
	DefaultRunLength    = 10
	DefaultWorkers      = 4
	DefaultLease        = 30 * time.Second
	DefaultPollInterval = 2 * time.Second
	DefaultMaxAttempts  = 10
	DefaultBackoffBase  = time.Second
	DefaultBackoffMax   = 5 * time.Minute
)

// Limits of Config checked by Validate.
const (
	maxIDLength  = 200
	maxBatchSize = 10000
	maxWorkers   = 64
	minLease     = 100 * time.Millisecond
)

// Config configures a Relay. A nil *Config and the zero value are ready to use;
// each field names its default.
type Config struct {
	// ID names this relay in claimed_by and in logs. It must be unique among the
	// relays running at once, and at most 200 bytes. Empty means
	// "<hostname>-<pid>".
	ID string

	// Schema is the PostgreSQL schema holding the outbox tables. Empty means
	// migrate.DefaultSchema ("public").
	Schema string

	// BatchSize is the most events one claim leases, at most 10000. Zero means
	// DefaultBatchSize (500).
	BatchSize int

	// RunLength is the most events of one aggregate one claim leases (a run of its
	// lane, head first). Longer runs mean fewer claims per event; shorter ones spread
	// a batch over more aggregates. Zero means DefaultRunLength (10).
	RunLength int

	// Workers is the number of claim → publish → mark loops, at most 64. Their
	// claims take turns, each continuing the lane scan where the previous one
	// ended, while their publishes and settles overlap. More workers keep more
	// publishes in flight, at the price of more leases held at once (Workers ×
	// BatchSize); docs/performance.md has the measurements behind the default.
	// Zero means DefaultWorkers (4).
	Workers int

	// Lease is how long a claim is held before any relay may take the events over,
	// at least 100ms. It must comfortably exceed PublishTimeout. Zero means
	// DefaultLease (30s).
	Lease time.Duration

	// PublishTimeout bounds one Publish call to the broker; events without an ack by
	// then are retried. It must be shorter than Lease. Zero means Lease / 2.
	PublishTimeout time.Duration

	// PollInterval is how often an idle relay looks for events when no notification
	// arrived: the safety net for lost notifications and for backoffs coming due.
	// Zero means DefaultPollInterval (2s).
	PollInterval time.Duration

	// DisableNotify turns off LISTEN/NOTIFY wake-ups, leaving polling alone.
	DisableNotify bool

	// MaxAttempts is how many failed publishes quarantine an event. Failures that
	// mean the broker is unreachable (broker.Unavailable) never count towards it:
	// an outage must not turn healthy events into poison. Zero means
	// DefaultMaxAttempts (10).
	MaxAttempts int

	// BackoffBase and BackoffMax bound the delay before retrying a failed event:
	// BackoffBase × 2^(attempts-1), capped at BackoffMax, with jitter between half
	// and all of it. BackoffBase must not exceed BackoffMax. Zero means
	// DefaultBackoffBase (1s) and DefaultBackoffMax (5m).
	BackoffBase time.Duration
	BackoffMax  time.Duration

	// Logger receives the relay's logs. It logs state changes (database or broker
	// down, back up), not every event. Nil means slog.Default().
	Logger *slog.Logger

	// Observer is told about every claim and every settled batch, for metrics
	// (package relay/relayprom). It is called on the hot path and must not block.
	// Nil means none.
	Observer Observer
}

// Validate reports what New would reject in c, zero fields meaning their
// defaults: an error naming each bad field, joined. A nil c is valid.
func (c *Config) Validate() error {
	_, err := c.withDefaults()
	return err
}

// withDefaults returns a copy of c with its defaults filled in, and validates it.
func (c *Config) withDefaults() (Config, error) {
	var out Config
	if c != nil {
		out = *c
	}
	if out.ID == "" {
		host, _ := os.Hostname()
		if host == "" {
			host = "relay"
		}
		out.ID = fmt.Sprintf("%s-%d", host, os.Getpid())
	}
	if out.Schema == "" {
		out.Schema = migrate.DefaultSchema
	}
	setDefault(&out.BatchSize, DefaultBatchSize)
	setDefault(&out.RunLength, DefaultRunLength)
	setDefault(&out.Workers, DefaultWorkers)
	setDefault(&out.Lease, DefaultLease)
	setDefault(&out.PublishTimeout, out.Lease/2)
	setDefault(&out.PollInterval, DefaultPollInterval)
	setDefault(&out.MaxAttempts, DefaultMaxAttempts)
	setDefault(&out.BackoffBase, DefaultBackoffBase)
	setDefault(&out.BackoffMax, DefaultBackoffMax)
	if out.Logger == nil {
		out.Logger = slog.Default()
	}
	return out, out.validate()
}

func setDefault[T int | time.Duration](v *T, def T) {
	if *v == 0 {
		*v = def
	}
}

// validate checks a config whose defaults are filled in.
func (c *Config) validate() error {
	var errs []error
	check := func(ok bool, format string, args ...any) {
		if !ok {
			errs = append(errs, fmt.Errorf("relay: "+format, args...))
		}
	}
	check(len(c.ID) <= maxIDLength, "Config.ID (%d bytes) must be at most %d bytes", len(c.ID), maxIDLength)
	if err := migrate.ValidateSchema(c.Schema); err != nil {
		errs = append(errs, fmt.Errorf("relay: Config.Schema: %w", err))
	}
	check(c.BatchSize > 0 && c.BatchSize <= maxBatchSize, "Config.BatchSize (%d) must be in 1..%d", c.BatchSize, maxBatchSize)
	check(c.RunLength > 0, "Config.RunLength (%d) must be positive", c.RunLength)
	check(c.Workers > 0 && c.Workers <= maxWorkers, "Config.Workers (%d) must be in 1..%d", c.Workers, maxWorkers)
	check(c.Lease >= minLease, "Config.Lease (%s) must be at least %s", c.Lease, minLease)
	check(c.PublishTimeout > 0 && c.PublishTimeout < c.Lease,
		"Config.PublishTimeout (%s) must be positive and shorter than Config.Lease (%s)", c.PublishTimeout, c.Lease)
	check(c.PollInterval > 0, "Config.PollInterval (%s) must be positive", c.PollInterval)
	check(c.MaxAttempts > 0, "Config.MaxAttempts (%d) must be positive", c.MaxAttempts)
	check(c.BackoffBase > 0 && c.BackoffMax >= c.BackoffBase,
		"Config.BackoffBase (%s) must be positive and at most Config.BackoffMax (%s)", c.BackoffBase, c.BackoffMax)
	return errors.Join(errs...)
}
