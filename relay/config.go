package relay

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/pgoutbox/pgoutbox/migrate"
)

// Config configures a Relay. The zero value is ready to use; each field documents
// its default.
type Config struct {
	// ID names this relay in claimed_by and in logs. It must be unique among the
	// relays running at once. Defaults to "<hostname>-<pid>".
	ID string

	// Schema is the PostgreSQL schema holding the outbox tables. Defaults to "public".
	Schema string

	// BatchSize is the most events one claim leases. Defaults to 500.
	BatchSize int

	// RunLength is the most events of one aggregate one claim leases (a run of its
	// lane, head first). Longer runs mean fewer claims per event; shorter ones spread
	// a batch over more aggregates. Defaults to 10.
	RunLength int

	// Workers is the number of claim → publish → mark loops. Their claims take
	// turns, each continuing the lane scan where the previous one ended, while their
	// publishes and settles overlap. Defaults to 4: more workers keep more publishes
	// in flight, at the price of more leases held at once (Workers × BatchSize);
	// docs/performance.md has the measurements behind the default.
	Workers int

	// Lease is how long a claim is held before any relay may take the events over.
	// It must comfortably exceed PublishTimeout. Defaults to 30s.
	Lease time.Duration

	// PublishTimeout bounds one Publish call to the broker; events without an ack by
	// then are retried. Defaults to Lease / 2.
	PublishTimeout time.Duration

	// PollInterval is how often an idle relay looks for events when no notification
	// arrived: the safety net for lost notifications and for backoffs coming due.
	// Defaults to 2s.
	PollInterval time.Duration

	// DisableNotify turns off LISTEN/NOTIFY wake-ups, leaving polling alone.
	DisableNotify bool

	// MaxAttempts is how many failed publishes quarantine an event. Failures that
	// mean the broker is unreachable (broker.Unavailable) never count towards it:
	// an outage must not turn healthy events into poison. Defaults to 10.
	MaxAttempts int

	// BackoffBase and BackoffMax bound the delay before retrying a failed event:
	// BackoffBase × 2^(attempts-1), capped at BackoffMax, with jitter between half
	// and all of it. Default to 1s and 5m.
	BackoffBase time.Duration
	BackoffMax  time.Duration

	// Logger receives the relay's logs. It logs state changes (database or broker
	// down, back up), not every event. Defaults to slog.Default().
	Logger *slog.Logger

	// Observer is told about every claim and every settled batch, for metrics
	// (package relay/relayprom). It is called on the hot path and must not block.
	// Defaults to none.
	Observer Observer
}

// Validate reports what New would reject in c, with its defaults applied.
func (c *Config) Validate() error {
	_, err := c.withDefaults()
	return err
}

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
	setDefault(&out.BatchSize, 500)
	setDefault(&out.RunLength, 10)
	setDefault(&out.Workers, 4)
	setDefault(&out.Lease, 30*time.Second)
	setDefault(&out.PublishTimeout, out.Lease/2)
	setDefault(&out.PollInterval, 2*time.Second)
	setDefault(&out.MaxAttempts, 10)
	setDefault(&out.BackoffBase, time.Second)
	setDefault(&out.BackoffMax, 5*time.Minute)
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

func (c *Config) validate() error {
	var errs []error
	check := func(ok bool, format string, args ...any) {
		if !ok {
			errs = append(errs, fmt.Errorf("relay: "+format, args...))
		}
	}
	check(len(c.ID) <= 200, "Config.ID is longer than 200 bytes")
	check(migrate.ValidateSchema(c.Schema) == nil, "Config.Schema %q is not a valid schema name", c.Schema)
	check(c.BatchSize > 0 && c.BatchSize <= 10000, "Config.BatchSize must be in 1..10000, got %d", c.BatchSize)
	check(c.RunLength > 0, "Config.RunLength must be positive, got %d", c.RunLength)
	check(c.Workers > 0 && c.Workers <= 64, "Config.Workers must be in 1..64, got %d", c.Workers)
	check(c.Lease >= 100*time.Millisecond, "Config.Lease must be at least 100ms, got %s", c.Lease)
	check(c.PublishTimeout > 0 && c.PublishTimeout < c.Lease,
		"Config.PublishTimeout (%s) must be positive and shorter than Config.Lease (%s)", c.PublishTimeout, c.Lease)
	check(c.PollInterval > 0, "Config.PollInterval must be positive, got %s", c.PollInterval)
	check(c.MaxAttempts > 0, "Config.MaxAttempts must be positive, got %d", c.MaxAttempts)
	check(c.BackoffBase > 0 && c.BackoffMax >= c.BackoffBase,
		"Config.BackoffBase (%s) must be positive and at most Config.BackoffMax (%s)", c.BackoffBase, c.BackoffMax)
	return errors.Join(errs...)
}
