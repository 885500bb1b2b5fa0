package relayprom

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/pgoutbox/pgoutbox/internal/config"
	"github.com/pgoutbox/pgoutbox/internal/pgbound"
	"github.com/pgoutbox/pgoutbox/internal/promreg"
	"github.com/pgoutbox/pgoutbox/migrate"
	"github.com/pgoutbox/pgoutbox/relay"
)

// Defaults of OutboxConfig, used for its zero fields.
const (
	DefaultMaxAge       = 5 * time.Second
	DefaultQueryTimeout = 2 * time.Second
)

// OutboxConfig configures an Outbox collector. A nil *OutboxConfig and the zero
// value are ready to use; each field names its default.
type OutboxConfig struct {
	// Schema is the PostgreSQL schema holding outbox_events. Empty means
	// migrate.DefaultSchema ("public").
	Schema string

	// MaxAge is how long figures read from the database are served before the
	// next scrape reads them again, so that frequent or concurrent scrapes cost one
	// query. The oldest pending age keeps growing between reads as long as events
	// are pending. It must not be negative. Zero means DefaultMaxAge (5s).
	MaxAge time.Duration

	// QueryTimeout bounds the query. The server ends it at half of that, and
	// a wait for a lock at a quarter, so that a lock held on the outbox costs
	// no connection of the pool. It must not be negative. Zero means
	// DefaultQueryTimeout (2s).
	QueryTimeout time.Duration

	// Health is the relay's health report (relay.Relay.Healthy). When set,
	// pgoutbox_relay_up{dependency="broker"} is exported, and
	// pgoutbox_relay_up{dependency="database"} also turns 0 when the relay lost
	// the database. Nil means none: up{database} reflects the query alone.
	Health func() error

	// Logger receives query failures (once per change between failing and
	// working). Nil means slog.Default().
	Logger *slog.Logger
}

// Validate reports what NewOutbox would reject in c, zero fields meaning their
// defaults: an error naming each bad field, joined. A nil c is valid.
func (c *OutboxConfig) Validate() error {
	_, err := c.withDefaults()
	return err
}

// withDefaults returns a copy of c with its defaults filled in, and validates it.
func (c *OutboxConfig) withDefaults() (OutboxConfig, error) {
	return config.Resolve("relayprom", c, func(c *OutboxConfig) {
		config.Default(&c.Schema, migrate.DefaultSchema)
		config.Default(&c.MaxAge, DefaultMaxAge)
		config.Default(&c.QueryTimeout, DefaultQueryTimeout)
		if c.Logger == nil {
			c.Logger = slog.Default()
		}
	}, func(c *OutboxConfig, p *config.Problems) {
		p.Field("OutboxConfig.Schema", migrate.ValidateSchema(c.Schema))
		p.Check(c.MaxAge > 0, "OutboxConfig.MaxAge (%s) must not be negative", c.MaxAge)
		p.Check(c.QueryTimeout > 0, "OutboxConfig.QueryTimeout (%s) must not be negative", c.QueryTimeout)
	})
}

// OutboxStats are the backlog figures of one read.
type OutboxStats struct {
	// Pending is the number of unpublished events that are not quarantined,
	// whether they are claimable, leased or backing off.
	Pending int64
	// OldestPendingAge is how long ago the oldest pending event occurred
	// (occurred_at: the enqueuing transaction's start unless the producer set
	// it); 0 when nothing is pending. Events blocked behind a quarantined event
	// count, so the age rises while a lane is stuck.
	OldestPendingAge time.Duration
	// Quarantined is the number of quarantined events.
	Quarantined int64
	// TableBytes is the size of outbox_events with its indexes and TOAST (all
	// partitions of a partitioned outbox).
	TableBytes int64
	// ReadAt is when the figures were read.
	ReadAt time.Time
}

// Outbox is a prometheus.Collector of the outbox's backlog, read from the
// database when scraped (at most once per MaxAge). Create it with NewOutbox and
// register it on a registry.
type Outbox struct {
	pool         *pgxpool.Pool
	cfg          OutboxConfig
	query, table string

	pending, oldest, quarantined, tableBytes, up *prometheus.Desc

	mu      sync.Mutex
	last    OutboxStats
	lastErr error
	readAt  time.Time // monotonic; zero before the first read
	queries int       // reads made, for tests
	failing bool
}

// NewOutbox returns a collector reading the outbox through pool. cfg may be nil
// for all defaults; invalid settings are reported here.
func NewOutbox(pool *pgxpool.Pool, cfg *OutboxConfig) (*Outbox, error) {
	if pool == nil {
		return nil, errors.New("relayprom: NewOutbox needs a pool")
	}
	c, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	desc := func(name, help string, labels ...string) *prometheus.Desc {
		return prometheus.NewDesc(prometheus.BuildFQName(promreg.Namespace, "relay", name), help, labels, nil)
	}
	table := pgx.Identifier{c.Schema, "outbox_events"}.Sanitize()
	return &Outbox{
		pool:  pool,
		cfg:   c,
		query: fmt.Sprintf(outboxStatsSQL, table),
		table: table,
		pending: desc("pending_events",
			"Unpublished events that are not quarantined (claimable, leased or backing off)."),
		oldest: desc("oldest_pending_age_seconds",
			"Age of the oldest pending event (since its occurred_at); 0 when none is pending. The headline health figure."),
		quarantined: desc("quarantined_events", "Quarantined events waiting for an operator (pgoutbox dlq)."),
		tableBytes:  desc("outbox_table_bytes", "Size of outbox_events including indexes and TOAST, all partitions."),
		up:          desc("up", "1 when the dependency answered the last time it was used, else 0.", "dependency"),
	}, nil
}

// outboxStatsSQL reads every backlog figure in one statement. The WHERE clause is
// the predicate of the partial index outbox_events_unpublished_idx, so only
// unpublished rows are visited, never the published history: the cost follows
// the backlog, not the table. pg_partition_tree sums the partitions of a
// partitioned outbox; it is empty for a plain table, sized directly.
const outboxStatsSQL = `
SELECT count(*) FILTER (WHERE quarantined_at IS NULL),
       coalesce(greatest(extract(epoch FROM now() - min(occurred_at) FILTER (WHERE quarantined_at IS NULL)), 0), 0)::float8,
       count(*) FILTER (WHERE quarantined_at IS NOT NULL),
       (SELECT coalesce(sum(pg_total_relation_size(relid)), pg_total_relation_size($1::regclass))::bigint
          FROM pg_partition_tree($1::regclass))
  FROM %[1]s
 WHERE published_at IS NULL`

// Stats returns the backlog figures, read from the database unless the last read
// is younger than MaxAge. ctx bounds the query (together with QueryTimeout).
func (o *Outbox) Stats(ctx context.Context) (OutboxStats, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.readAt.IsZero() || time.Since(o.readAt) >= o.cfg.MaxAge {
		o.read(ctx)
	}
	if o.lastErr != nil {
		return OutboxStats{}, o.lastErr
	}
	s := o.last
	if s.Pending > 0 {
		// The oldest event is still that old plus the time since the read, unless
		// it was published meanwhile: the next read tells.
		s.OldestPendingAge += time.Since(o.readAt)
	}
	return s, nil
}

// read runs the query; o.mu is held.
func (o *Outbox) read(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, o.cfg.QueryTimeout)
	defer cancel()
	o.queries++
	var s OutboxStats
	var age float64
	// Bounded on the server too: a lock held on the outbox (a tenant's own,
	// in a Group) ends the query with an answer, not by closing a connection
	// of the pool that the relays share.
	b := &pgx.Batch{}
	b.Queue(o.query, o.table)
	statement := o.cfg.QueryTimeout / 2
	err := pgbound.Send(ctx, o.pool, pgbound.New(statement, statement/2), b, func(br pgx.BatchResults) error {
		return br.QueryRow().Scan(&s.Pending, &age, &s.Quarantined, &s.TableBytes)
	})
	o.readAt = time.Now()
	if err != nil {
		o.lastErr = fmt.Errorf("relayprom: read outbox stats: %w", err)
		if !o.failing {
			o.cfg.Logger.Warn("could not read the outbox backlog for metrics", slog.Any("error", err))
			o.failing = true
		}
		return
	}
	if o.failing {
		o.cfg.Logger.Info("reading the outbox backlog for metrics again")
		o.failing = false
	}
	s.OldestPendingAge = time.Duration(age * float64(time.Second))
	s.ReadAt = o.readAt
	o.last, o.lastErr = s, nil
}

// Describe implements prometheus.Collector.
func (o *Outbox) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{o.pending, o.oldest, o.quarantined, o.tableBytes, o.up} {
		ch <- d
	}
}

// Collect implements prometheus.Collector. When the database cannot be read, the
// backlog gauges are left out (a stale figure would mislead) and
// pgoutbox_relay_up{dependency="database"} is 0.
func (o *Outbox) Collect(ch chan<- prometheus.Metric) {
	s, err := o.Stats(context.Background())
	dbUp := err == nil
	if dbUp {
		ch <- prometheus.MustNewConstMetric(o.pending, prometheus.GaugeValue, float64(s.Pending))
		ch <- prometheus.MustNewConstMetric(o.oldest, prometheus.GaugeValue, s.OldestPendingAge.Seconds())
		ch <- prometheus.MustNewConstMetric(o.quarantined, prometheus.GaugeValue, float64(s.Quarantined))
		ch <- prometheus.MustNewConstMetric(o.tableBytes, prometheus.GaugeValue, float64(s.TableBytes))
	}
	if o.cfg.Health != nil {
		h := o.cfg.Health()
		dbUp = dbUp && !errors.Is(h, relay.ErrDatabaseUnreachable)
		ch <- prometheus.MustNewConstMetric(o.up, prometheus.GaugeValue, boolValue(!errors.Is(h, relay.ErrBrokerUnreachable) && !errors.Is(h, relay.ErrBrokerMisconfigured)), "broker")
	}
	ch <- prometheus.MustNewConstMetric(o.up, prometheus.GaugeValue, boolValue(dbUp), "database")
}

func boolValue(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

var _ prometheus.Collector = (*Outbox)(nil)
