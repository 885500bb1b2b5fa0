package cdc

import (
	"crypto/md5"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"regexp"
	"strings"
	"time"

	"github.com/pgoutbox/pgoutbox/migrate"
)

// Config configures a Source. The zero value is ready to use; each field documents
// its default.
type Config struct {
	// Schema is the PostgreSQL schema holding the outbox tables. Defaults to "public".
	Schema string

	// Slot is the logical replication slot's name: lower-case letters, digits and
	// underscores, at most 63 bytes. One slot per schema. Defaults to
	// "pgoutbox_<schema>" (folded to the allowed characters; an md5 of the schema
	// when too long).
	Slot string

	// Publication is the publication's name; it publishes the inserts into
	// <Schema>.outbox_events and nothing else. Defaults to the slot's default name.
	Publication string

	// BatchSize is the most events handed to the broker in one Publish call.
	// Defaults to 500.
	BatchSize int

	// RunLength is the most events of one aggregate the table path reads per round
	// for a lane it owns (a failed, quarantined or backfilled lane). Defaults to 10.
	RunLength int

	// MaxBuffered is the most events received from the slot and not yet settled.
	// When it is reached the source stops reading the stream (it keeps the
	// connection alive) until the broker catches up. Defaults to 20 × BatchSize.
	MaxBuffered int

	// PublishTimeout bounds one Publish call; events without an ack by then are
	// retried. Defaults to 15s.
	PublishTimeout time.Duration

	// PollInterval is how often the table path looks at the lanes it owns when no
	// backoff comes due sooner: it notices events an operator retried. Defaults to 1s.
	PollInterval time.Duration

	// StatusInterval is how often the source reports its confirmed position to the
	// server when nothing else prompts it. It must stay well below the server's
	// wal_sender_timeout (60s by default). Defaults to 5s.
	StatusInterval time.Duration

	// MaxAttempts is how many failed publishes quarantine an event; broker.Unavailable
	// failures never count. Defaults to 10.
	MaxAttempts int

	// BackoffBase and BackoffMax bound the delay before retrying a failed event:
	// BackoffBase × 2^(attempts-1), capped at BackoffMax (at 10s while the broker is
	// unreachable), with jitter. Default to 1s and 5m.
	BackoffBase time.Duration
	BackoffMax  time.Duration

	// Logger receives the source's logs (state changes, not every event). Defaults
	// to slog.Default().
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
	if out.Schema == "" {
		out.Schema = migrate.DefaultSchema
	}
	if out.Slot == "" {
		out.Slot = DefaultSlot(out.Schema)
	}
	if out.Publication == "" {
		out.Publication = DefaultSlot(out.Schema)
	}
	setDefault(&out.BatchSize, 500)
	setDefault(&out.RunLength, 10)
	setDefault(&out.MaxBuffered, 20*out.BatchSize)
	setDefault(&out.PublishTimeout, 15*time.Second)
	setDefault(&out.PollInterval, time.Second)
	setDefault(&out.StatusInterval, 5*time.Second)
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
			errs = append(errs, fmt.Errorf("cdc: "+format, args...))
		}
	}
	check(migrate.ValidateSchema(c.Schema) == nil, "Config.Schema %q is not a valid schema name", c.Schema)
	check(slotName.MatchString(c.Slot), "Config.Slot %q: want 1-63 lower-case letters, digits or underscores", c.Slot)
	check(slotName.MatchString(c.Publication), "Config.Publication %q: want 1-63 lower-case letters, digits or underscores", c.Publication)
	check(c.BatchSize > 0 && c.BatchSize <= 10000, "Config.BatchSize must be in 1..10000, got %d", c.BatchSize)
	check(c.RunLength > 0, "Config.RunLength must be positive, got %d", c.RunLength)
	check(c.MaxBuffered >= c.BatchSize, "Config.MaxBuffered (%d) must be at least Config.BatchSize (%d)", c.MaxBuffered, c.BatchSize)
	check(c.PublishTimeout > 0, "Config.PublishTimeout must be positive, got %s", c.PublishTimeout)
	check(c.PollInterval > 0, "Config.PollInterval must be positive, got %s", c.PollInterval)
	check(c.StatusInterval > 0 && c.StatusInterval <= 30*time.Second, "Config.StatusInterval must be in (0, 30s], got %s", c.StatusInterval)
	check(c.MaxAttempts > 0, "Config.MaxAttempts must be positive, got %d", c.MaxAttempts)
	check(c.BackoffBase > 0 && c.BackoffMax >= c.BackoffBase,
		"Config.BackoffBase (%s) must be positive and at most Config.BackoffMax (%s)", c.BackoffBase, c.BackoffMax)
	return errors.Join(errs...)
}
