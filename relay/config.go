package relay

import (
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/pgoutbox/pgoutbox/internal/config"
	"github.com/pgoutbox/pgoutbox/internal/heartbeat"
	"github.com/pgoutbox/pgoutbox/migrate"
)

// Defaults of Config, used for its zero fields.
const (
	DefaultBatchSize    = 500
	DefaultRunLength    = 10
	DefaultWorkers      = 4
	DefaultLease        = 30 * time.Second
	DefaultPollInterval = 2 * time.Second
	// DefaultHeartbeatInterval is how often a relay records that it is alive
	// (Config.HeartbeatInterval).
	DefaultHeartbeatInterval = heartbeat.DefaultInterval
	DefaultMaxAttempts       = 10
	DefaultBackoffBase       = time.Second
	DefaultBackoffMax        = 5 * time.Minute
	// DefaultStatementTimeout and DefaultLockTimeout bound each statement of
	// a relay on the server (Config.StatementTimeout, Config.LockTimeout).
	DefaultStatementTimeout = 5 * time.Second
	DefaultLockTimeout      = time.Second
)

// Limits of Config checked by Validate.
const (
	maxIDLength  = 200
	maxBatchSize = 10000
	maxWorkers   = 64
	minLease     = 100 * time.Millisecond
	// maxHeartbeatInterval keeps a live relay from looking gone for long.
	maxHeartbeatInterval = heartbeat.MaxInterval
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

	// Tenant names the outbox in each message's Tenant (the {tenant} of a
	// destination template), in logs and in the Observer's reports. Empty
	// means Schema.
	Tenant string

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

	// HeartbeatInterval is how often the relay records in the schema's
	// outbox_relays table that it is alive (its id, version, host, busy or idle;
	// the relays of one database share one statement). Zero means
	// DefaultHeartbeatInterval (15s); status and the console call a relay gone
	// after three intervals without a heartbeat.
	HeartbeatInterval time.Duration

	// DisableNotify turns off LISTEN/NOTIFY wake-ups, leaving polling alone. Set
	// it when the pool leads through a connection pooler in transaction mode
	// (PgBouncer pool_mode=transaction), where a LISTEN session and the idle
	// lock cannot work: the relay then uses no session state
	// (docs/operations.md, "Connection poolers").
	DisableNotify bool

	// StatementTimeout bounds each of the relay's statements on the server
	// (claim, settle, release, the hub's probe): PostgreSQL's statement_timeout,
	// set with SET LOCAL in the statement's own transaction, so that it works
	// through a pooler in transaction mode and never outlives the statement.
	// A statement that runs longer is cancelled by the server, the outbox is
	// reported stuck (Healthy returns ErrOutboxStuck) and retried with backoff;
	// the connection stays in the pool, and the other outboxes of a Group are
	// not held up. At most Lease/4, so that a claim ends well within its
	// lease. Zero means DefaultStatementTimeout (5s), or Lease/4 if shorter.
	StatementTimeout time.Duration

	// LockTimeout bounds each wait of the relay's statements for a lock held
	// by another session (PostgreSQL's lock_timeout, set like
	// StatementTimeout): a LOCK TABLE on the outbox, a migration altering it,
	// its rows locked FOR UPDATE. Such an outbox is reported stuck and skipped
	// until the lock is gone. At most StatementTimeout. Zero means
	// DefaultLockTimeout (1s), or StatementTimeout if shorter.
	LockTimeout time.Duration

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

	// Destinations, when set, make a routed relay: pass New a nil publisher,
	// and each event goes to the destinations whose rules match it, each
	// destination with its own progress per aggregate lane, its own leases,
	// backoff and quarantine, and Workers workers of its own (size the pool
	// for Workers × len(Destinations) + 2 connections). An event no
	// destination takes is quarantined, never dropped. At most
	// MaxDestinations, names unique (Destination.Validate). Every relay of
	// one outbox must serve the same destinations: an event counts as
	// published when every destination of the relay that settles it has
	// passed it. A Group does not support destinations (NewGroup refuses
	// them), nor does the CDC source (cdc.Config has none). Empty means the
	// relay publishes with the publisher given to New.
	// docs/design.md, "Destinations".
	Destinations []Destination
}

// Validate reports what New would reject in c, zero fields meaning their
// defaults: an error naming each bad field, joined. A nil c is valid.
func (c *Config) Validate() error {
	_, err := c.withDefaults()
	return err
}

// withDefaults returns a copy of c with its defaults filled in, and validates it.
func (c *Config) withDefaults() (Config, error) {
	return config.Resolve("relay", c, configDefaults, checkConfig)
}

func configDefaults(c *Config) {
	if c.ID == "" {
		host, _ := os.Hostname()
		if host == "" {
			host = "relay"
		}
		c.ID = fmt.Sprintf("%s-%d", host, os.Getpid())
	}
	config.Default(&c.Schema, migrate.DefaultSchema)
	config.Default(&c.Tenant, c.Schema)
	config.Default(&c.BatchSize, DefaultBatchSize)
	config.Default(&c.RunLength, DefaultRunLength)
	config.Default(&c.Workers, DefaultWorkers)
	config.Default(&c.Lease, DefaultLease)
	config.Default(&c.PublishTimeout, c.Lease/2)
	config.Default(&c.PollInterval, DefaultPollInterval)
	config.Default(&c.HeartbeatInterval, DefaultHeartbeatInterval)
	config.Default(&c.StatementTimeout, min(DefaultStatementTimeout, c.Lease/4))
	config.Default(&c.LockTimeout, min(DefaultLockTimeout, c.StatementTimeout))
	config.Default(&c.MaxAttempts, DefaultMaxAttempts)
	config.Default(&c.BackoffBase, DefaultBackoffBase)
	config.Default(&c.BackoffMax, DefaultBackoffMax)
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
}

// checkConfig validates a config whose defaults are filled in.
func checkConfig(c *Config, p *config.Problems) {
	p.Check(len(c.ID) <= maxIDLength, "Config.ID (%d bytes) must be at most %d bytes", len(c.ID), maxIDLength)
	p.Field("Config.Schema", migrate.ValidateSchema(c.Schema))
	p.Check(c.BatchSize > 0 && c.BatchSize <= maxBatchSize, "Config.BatchSize (%d) must be in 1..%d", c.BatchSize, maxBatchSize)
	p.Check(c.RunLength > 0, "Config.RunLength (%d) must be positive", c.RunLength)
	p.Check(c.Workers > 0 && c.Workers <= maxWorkers, "Config.Workers (%d) must be in 1..%d", c.Workers, maxWorkers)
	p.Check(c.Lease >= minLease, "Config.Lease (%s) must be at least %s", c.Lease, minLease)
	p.Check(c.PublishTimeout > 0 && c.PublishTimeout < c.Lease,
		"Config.PublishTimeout (%s) must be positive and shorter than Config.Lease (%s)", c.PublishTimeout, c.Lease)
	p.Check(c.PollInterval > 0, "Config.PollInterval (%s) must be positive", c.PollInterval)
	p.Check(c.HeartbeatInterval > 0 && c.HeartbeatInterval <= maxHeartbeatInterval,
		"Config.HeartbeatInterval (%s) must be positive and at most %s", c.HeartbeatInterval, maxHeartbeatInterval)
	p.Check(c.StatementTimeout >= time.Millisecond && c.StatementTimeout <= c.Lease/4,
		"Config.StatementTimeout (%s) must be at least 1ms and at most Config.Lease/4 (%s)", c.StatementTimeout, c.Lease/4)
	p.Check(c.LockTimeout >= time.Millisecond && c.LockTimeout <= c.StatementTimeout,
		"Config.LockTimeout (%s) must be at least 1ms and at most Config.StatementTimeout (%s)", c.LockTimeout, c.StatementTimeout)
	p.Check(c.MaxAttempts > 0, "Config.MaxAttempts (%d) must be positive", c.MaxAttempts)
	p.Check(c.BackoffBase > 0 && c.BackoffMax >= c.BackoffBase,
		"Config.BackoffBase (%s) must be positive and at most Config.BackoffMax (%s)", c.BackoffBase, c.BackoffMax)
	p.Field("Config.Destinations", validateDestinations(c.Destinations))
}
