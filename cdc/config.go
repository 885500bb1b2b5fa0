package cdc

import (
	"crypto/md5"
	"encoding/hex"
	"log/slog"
	"regexp"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgoutbox/pgoutbox/internal/config"
	"github.com/pgoutbox/pgoutbox/internal/heartbeat"
	"github.com/pgoutbox/pgoutbox/migrate"
)

// The defaults of Config's fields: a zero field means its default.
const (
	// DefaultBatchSize is Config.BatchSize's default.
	DefaultBatchSize = 500
	// DefaultWorkers is Config.Workers's default.
	DefaultWorkers = 4
	// MaxWorkers is the largest Config.Workers allowed.
	MaxWorkers = 64
	// DefaultRunLength is Config.RunLength's default.
	DefaultRunLength = 10
	// DefaultMaxBufferedBatches is how many batches Config.MaxBuffered holds by
	// default: DefaultMaxBufferedBatches × BatchSize.
	DefaultMaxBufferedBatches = 20
	// DefaultPublishTimeout is Config.PublishTimeout's default.
	DefaultPublishTimeout = 15 * time.Second
	// DefaultPollInterval is Config.PollInterval's default.
	DefaultPollInterval = time.Second
	// DefaultStatusInterval is Config.StatusInterval's default.
	DefaultStatusInterval = 5 * time.Second
	// MaxStatusInterval is the longest Config.StatusInterval allowed: well
	// below the server's wal_sender_timeout (60s by default).
	MaxStatusInterval = 30 * time.Second
	// DefaultMaxAttempts is Config.MaxAttempts's default.
	DefaultMaxAttempts = 10
	// DefaultBackoffBase is Config.BackoffBase's default.
	DefaultBackoffBase = time.Second
	// DefaultBackoffMax is Config.BackoffMax's default.
	DefaultBackoffMax = 5 * time.Minute
	// MaxBatchSize is the largest Config.BatchSize allowed.
	MaxBatchSize = 10000
	// DefaultFailoverCheckInterval is Config.FailoverCheckInterval's default.
	DefaultFailoverCheckInterval = 30 * time.Second
	// DefaultHeartbeatInterval is Config.HeartbeatInterval's default.
	DefaultHeartbeatInterval = heartbeat.DefaultInterval
	// DefaultStandbyPollInterval is Config.StandbyPollInterval's default.
	DefaultStandbyPollInterval = 10 * time.Millisecond
)

// Config configures a Source. The zero value (or a nil *Config) is ready to
// use: a zero field means its default, which its doc names. New copies the
// Config; Validate reports what New would reject.
type Config struct {
	// Schema is the PostgreSQL schema holding the outbox tables. Empty means
	// migrate.DefaultSchema ("public").
	Schema string

	// Slot is the logical replication slot's name: lower-case letters, digits and
	// underscores, at most 63 bytes. One slot per schema. Empty means
	// DefaultSlot(Schema): "pgoutbox_<schema>" (folded to the allowed
	// characters; an md5 of the schema when too long).
	Slot string

	// Publication is the publication's name; it publishes the inserts into
	// <Schema>.outbox_events and nothing else. Empty means DefaultSlot(Schema).
	Publication string

	// BatchSize is the most events handed to the broker in one Publish call, at
	// most MaxBatchSize. Zero means DefaultBatchSize (500).
	BatchSize int

	// Workers is how many batches the stream publishes at once, at most
	// MaxWorkers. The batches out share no aggregate: an event waits while an
	// earlier event of its aggregate is being published. More workers keep
	// more publishes in flight (and, after a crash, more acknowledged events
	// unmarked: published again, never lost). Zero means DefaultWorkers (4).
	Workers int

	// RunLength is the most events of one aggregate the table path reads per round
	// for a lane it owns (a failed, quarantined or backfilled lane). Zero means
	// DefaultRunLength (10).
	RunLength int

	// MaxBuffered is the most events received from the slot and not yet settled,
	// at least BatchSize. When it is reached the source stops reading the stream
	// (it keeps the connection alive) until the broker catches up. Zero means
	// DefaultMaxBufferedBatches × BatchSize (20 × BatchSize).
	MaxBuffered int

	// PublishTimeout bounds one Publish call; events without an ack by then are
	// retried. Zero means DefaultPublishTimeout (15s).
	PublishTimeout time.Duration

	// PollInterval is how often the table path looks at the lanes it owns when no
	// backoff comes due sooner: it notices events an operator retried. Zero
	// means DefaultPollInterval (1s).
	PollInterval time.Duration

	// StatusInterval is how often the source reports its confirmed position to the
	// server when nothing else prompts it, at most MaxStatusInterval. Zero means
	// DefaultStatusInterval (5s).
	StatusInterval time.Duration

	// MaxAttempts is how many failed publishes quarantine an event; broker.Unavailable
	// failures never count. Zero means DefaultMaxAttempts (10).
	MaxAttempts int

	// BackoffBase and BackoffMax bound the delay before retrying a failed event:
	// BackoffBase × 2^(attempts-1), capped at BackoffMax (at retry.UnavailableCap,
	// 10s, while the broker is unreachable), with jitter. Zero means
	// DefaultBackoffBase (1s) and DefaultBackoffMax (5m).
	BackoffBase time.Duration
	BackoffMax  time.Duration

	// PublishUnreplicated turns off the wait for synchronous standbys. By
	// default (false), when the server has synchronous standbys
	// (synchronous_standby_names is set), a transaction's events are published
	// only once enough of them have it (docs/operations.md, "PostgreSQL
	// failover"): logical decoding sends a transaction as soon as it is
	// committed locally, and a failover to a standby that lacks it would make
	// the database forget events the consumers already have. Set it only where
	// a failover that loses transactions is acceptable.
	PublishUnreplicated bool

	// StandbyPollInterval is how often, while transactions are held for the
	// synchronous standbys, their positions are read again (one query for every
	// held transaction); nothing is read per transaction. Zero means
	// DefaultStandbyPollInterval (10ms).
	StandbyPollInterval time.Duration

	// StandbyURL, if set, is the connection string of a physical standby
	// that synchronises the failover slot (PostgreSQL 17 and later,
	// sync_replication_slots on): the source checks every
	// FailoverCheckInterval that its copy of the slot is sync-ready, usable
	// after a promotion (FailoverReadiness, cdcprom's
	// pgoutbox_cdc_failover_slot_ready). Empty checks the primary's side
	// only (synchronized_standby_slots names an active physical slot). It may
	// hold a password: it is never logged nor put in an error. Ignored on
	// older servers.
	StandbyURL string

	// FailoverCheckInterval is how often the failover slot's readiness is
	// checked (PostgreSQL 17 and later). Zero means
	// DefaultFailoverCheckInterval (30s).
	FailoverCheckInterval time.Duration

	// HeartbeatInterval is how often the source records in the schema's
	// outbox_relays table that it is alive (relay id "cdc:<Slot>", source
	// cdc, its version, host, busy or idle), as the polling relay does; it
	// writes state stopped when it stops. Zero means
	// DefaultHeartbeatInterval (15s); status and the console call it gone
	// after three intervals without a heartbeat. At most an hour.
	HeartbeatInterval time.Duration

	// Observer, if set, is told of every settled batch, every position
	// reported to the server and every look at the synchronous standbys, for metrics (package cdc/cdcprom implements it).
	// Nil observes nothing.
	Observer Observer

	// Logger receives the source's logs (state changes, not every event). Nil
	// means slog.Default().
	Logger *slog.Logger
}

// Owner returns the claimed_by value of the events the CDC source owns:
// "cdc:<slot>".
func (c *Config) Owner() string { return "cdc:" + c.Slot }

var slotName = regexp.MustCompile(`^[a-z0-9_]{1,63}$`)

// DefaultSlot returns the default slot (and publication) name for schema.
func DefaultSlot(schema string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(schema) {
		if (r >= 'a' && r <= 'z') || (r >= '0' && r <= '9') || r == '_' {
			b.WriteRune(r)
		} else {
			b.WriteByte('_')
		}
	}
	name := "pgoutbox_" + b.String()
	if len(name) > 63 || b.String() != schema {
		// Folding may have merged distinct schemas ("A" and "a"): a digest keeps
		// their slots apart.
		sum := md5.Sum([]byte(schema))
		tail := "_" + hex.EncodeToString(sum[:])[:12]
		name = name[:min(len(name), 63-len(tail))] + tail
	}
	return name
}

// Validate reports what New would reject in c: zero fields stand for their
// defaults, and each error names its field (errors.Join of all of them). A nil
// *Config is valid: all defaults.
func (c *Config) Validate() error {
	_, err := c.withDefaults()
	return err
}

func (c *Config) withDefaults() (Config, error) {
	return config.Resolve("cdc", c, configDefaults, checkConfig)
}

func configDefaults(c *Config) {
	config.Default(&c.Schema, migrate.DefaultSchema)
	config.Default(&c.Slot, DefaultSlot(c.Schema))
	config.Default(&c.Publication, DefaultSlot(c.Schema))
	config.Default(&c.BatchSize, DefaultBatchSize)
	config.Default(&c.Workers, DefaultWorkers)
	config.Default(&c.RunLength, DefaultRunLength)
	config.Default(&c.MaxBuffered, DefaultMaxBufferedBatches*c.BatchSize)
	config.Default(&c.PublishTimeout, DefaultPublishTimeout)
	config.Default(&c.PollInterval, DefaultPollInterval)
	config.Default(&c.StatusInterval, DefaultStatusInterval)
	config.Default(&c.MaxAttempts, DefaultMaxAttempts)
	config.Default(&c.BackoffBase, DefaultBackoffBase)
	config.Default(&c.BackoffMax, DefaultBackoffMax)
	config.Default(&c.StandbyPollInterval, DefaultStandbyPollInterval)
	config.Default(&c.FailoverCheckInterval, DefaultFailoverCheckInterval)
	config.Default(&c.HeartbeatInterval, DefaultHeartbeatInterval)
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
}

// checkConfig validates a config whose defaults are filled in.
func checkConfig(c *Config, p *config.Problems) {
	p.Check(migrate.ValidateSchema(c.Schema) == nil, "Config.Schema %q is not a valid schema name", c.Schema)
	p.Check(slotName.MatchString(c.Slot), "Config.Slot %q: want 1-63 lower-case letters, digits or underscores", c.Slot)
	p.Check(slotName.MatchString(c.Publication), "Config.Publication %q: want 1-63 lower-case letters, digits or underscores", c.Publication)
	p.Check(c.BatchSize > 0 && c.BatchSize <= MaxBatchSize, "Config.BatchSize must be in 1..%d, got %d", MaxBatchSize, c.BatchSize)
	p.Check(c.Workers > 0 && c.Workers <= MaxWorkers, "Config.Workers must be in 1..%d, got %d", MaxWorkers, c.Workers)
	p.Check(c.RunLength > 0, "Config.RunLength must be positive, got %d", c.RunLength)
	p.Check(c.MaxBuffered >= c.BatchSize, "Config.MaxBuffered (%d) must be at least Config.BatchSize (%d)", c.MaxBuffered, c.BatchSize)
	p.Check(c.PublishTimeout > 0, "Config.PublishTimeout must be positive, got %s", c.PublishTimeout)
	p.Check(c.PollInterval > 0, "Config.PollInterval must be positive, got %s", c.PollInterval)
	p.Check(c.StatusInterval > 0 && c.StatusInterval <= MaxStatusInterval, "Config.StatusInterval must be in (0, %s], got %s", MaxStatusInterval, c.StatusInterval)
	if c.StandbyURL != "" {
		_, err := pgconn.ParseConfig(c.StandbyURL)
		p.Check(err == nil, "Config.StandbyURL is not a valid connection string (the value is not shown: it may hold a password)")
	}
	p.Check(c.FailoverCheckInterval > 0, "Config.FailoverCheckInterval must be positive, got %s", c.FailoverCheckInterval)
	p.Check(c.HeartbeatInterval > 0 && c.HeartbeatInterval <= heartbeat.MaxInterval,
		"Config.HeartbeatInterval (%s) must be positive and at most %s", c.HeartbeatInterval, heartbeat.MaxInterval)
	p.Check(c.StandbyPollInterval > 0, "Config.StandbyPollInterval must be positive, got %s", c.StandbyPollInterval)
	p.Check(c.MaxAttempts > 0, "Config.MaxAttempts must be positive, got %d", c.MaxAttempts)
	p.Check(c.BackoffBase > 0 && c.BackoffMax >= c.BackoffBase,
		"Config.BackoffBase (%s) must be positive and at most Config.BackoffMax (%s)", c.BackoffBase, c.BackoffMax)
}
