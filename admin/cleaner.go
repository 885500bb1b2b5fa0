package admin

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgoutbox/pgoutbox/internal/config"
	"github.com/pgoutbox/pgoutbox/internal/lifecycle"
)

// DefaultCleanerInterval is the time between a Cleaner's runs when
// CleanerConfig.Interval is zero.
const DefaultCleanerInterval = time.Hour

// unlockTimeout bounds giving the cleanup lock back after a run; past it the
// connection is closed, which frees the lock too.
const unlockTimeout = 5 * time.Second

// CleanerConfig configures a Cleaner. A nil *CleanerConfig and the zero value
// are ready to use; each field names its default.
type CleanerConfig struct {
	// Cleanup is what each run does (schema, retention, batch size, inbox);
	// its fields default as CleanupConfig says, and its Logger to the Cleaner's.
	Cleanup CleanupConfig

	// Interval is the time between runs; the first run starts at once. It must
	// not be negative. Zero means DefaultCleanerInterval (1h).
	Interval time.Duration

	// Logger receives a line per run that deleted something, and errors.
	// Nil means slog.Default().
	Logger *slog.Logger

	// Done, when set, is called after each run this Cleaner made (not the rounds
	// it skipped because another Cleaner held the lock), with what the run did,
	// also when it failed part way: e.g. to feed a metric of deleted rows.
	Done func(CleanupResult, error)
}

// Validate reports what NewCleaner would reject in c, zero fields meaning
// their defaults: an error naming each bad field, joined. A nil c is valid.
func (c *CleanerConfig) Validate() error {
	_, err := c.withDefaults()
	return err
}

// withDefaults returns a copy of c with its defaults filled in, and validates it.
func (c *CleanerConfig) withDefaults() (CleanerConfig, error) {
	return config.Resolve("admin", c, func(c *CleanerConfig) {
		config.Default(&c.Interval, DefaultCleanerInterval)
		if c.Logger == nil {
			c.Logger = slog.Default()
		}
		if c.Cleanup.Logger == nil {
			c.Cleanup.Logger = c.Logger
		}
		cleanupDefaults(&c.Cleanup)
	}, func(c *CleanerConfig, p *config.Problems) {
		p.Check(c.Interval > 0, "CleanerConfig.Interval (%s) must not be negative", c.Interval)
		checkCleanup(&c.Cleanup, p)
	})
}

// Cleaner runs Cleanup periodically, as the relay's cleanup job does. Any number
// of Cleaners (one per relay) may run against one outbox: a session advisory lock
// per schema lets one of them run at a time, and the others skip that round.
type Cleaner struct {
	pool *pgxpool.Pool
	cfg  CleanerConfig
	key  int64
	lc   lifecycle.Lifecycle // runs the loop; a run in flight uses its Hard context
}

// NewCleaner returns a Cleaner working through pool; each run holds one of its
// connections. cfg may be nil for all defaults; invalid settings are reported
// here.
func NewCleaner(pool *pgxpool.Pool, cfg *CleanerConfig) (*Cleaner, error) {
	if pool == nil {
		return nil, errors.New("admin: NewCleaner needs a pool")
	}
	c, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	cl := &Cleaner{pool: pool, cfg: c, key: cleanupLockKey(c.Cleanup.Schema)}
	cl.lc.Name = "admin: cleaner"
	return cl, nil
}

// cleanupLockKey is the advisory lock that lets one cleaner of a schema run at a time.
func cleanupLockKey(schema string) int64 {
	h := fnv.New64a()
	h.Write([]byte("pgoutbox/cleanup/" + schema))
	return int64(h.Sum64())
}

// Start runs the first cleanup now and then one every Interval, in the
// background, until Stop or until ctx ends.
//
// Start and Stop follow the one rule of pgoutbox's services (package
// internal/lifecycle): a Cleaner starts once (a second Start is an error, and
// so is a Start after Stop: make a new Cleaner); Stop is graceful until its ctx
// ends, then hard, and may be called any number of times, also before Start.
// Cancelling ctx is a hard stop.
func (c *Cleaner) Start(ctx context.Context) error {
	return c.lc.Start(ctx, func(context.Context) error {
		c.lc.Go(c.loop)
		return nil
	})
}

// Stop ends the periodic runs. A run in progress finishes the batch in flight
// (one short statement) and stops before the next; what completed batches
// deleted stays deleted. If ctx ends first, the statement in flight is
// cancelled, and Stop returns ctx's error wrapped once the run has ended. See
// Start for the rule of Start and Stop.
func (c *Cleaner) Stop(ctx context.Context) error { return c.lc.Stop(ctx) }

func (c *Cleaner) loop() {
	t := time.NewTicker(c.cfg.Interval)
	defer t.Stop()
	stopping := c.lc.Stopping()
	for {
		res, ran, err := c.runOnce(c.lc.Hard(), stopping)
		if ran && c.cfg.Done != nil {
			c.cfg.Done(res, err)
		}
		did := ran && (res.Deleted > 0 || len(res.DroppedPartitions) > 0 || len(res.CreatedPartitions) > 0 || res.InboxDeleted > 0)
		stopped := c.lc.IsStopping()
		switch {
		case err != nil && !stopped:
			c.cfg.Logger.Error("cleanup failed; next try after the interval", slog.Any("error", err),
				slog.Duration("interval", c.cfg.Interval))
		case did:
			// Stopped mid-run, the batches it committed stay done: say so too.
			msg := "cleanup done"
			if stopped {
				msg = "cleanup stopped"
			}
			c.cfg.Logger.Info(msg, slog.Int64("deleted", res.Deleted), slog.Int("batches", res.Batches),
				slog.Any("dropped_partitions", res.DroppedPartitions), slog.Any("created_partitions", res.CreatedPartitions),
				slog.Int64("inbox_deleted", res.InboxDeleted), slog.Duration("took", res.Duration))
		}
		if stopped {
			return
		}
		select {
		case <-stopping:
			return
		case <-t.C:
		}
	}
}

// RunOnce runs one cleanup now if no other Cleaner of the schema is running one,
// and reports whether it ran.
func (c *Cleaner) RunOnce(ctx context.Context) (CleanupResult, bool, error) {
	return c.runOnce(ctx, nil)
}

// runOnce is RunOnce that also ends between two batches once stop is closed.
func (c *Cleaner) runOnce(ctx context.Context, stop <-chan struct{}) (CleanupResult, bool, error) {
	conn, err := c.pool.Acquire(ctx)
	if err != nil {
		return CleanupResult{}, false, fmt.Errorf("admin: cleaner: %w", err)
	}
	defer conn.Release()
	var locked bool
	if err := conn.QueryRow(ctx, "SELECT pg_try_advisory_lock($1)", c.key).Scan(&locked); err != nil {
		return CleanupResult{}, false, fmt.Errorf("admin: cleaner: take the lock: %w", err)
	}
	if !locked {
		return CleanupResult{}, false, nil
	}
	defer func() {
		uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), unlockTimeout)
		defer cancel()
		if _, err := conn.Exec(uctx, "SELECT pg_advisory_unlock($1)", c.key); err != nil {
			// The session still holds the lock: drop the connection, which frees it.
			_ = conn.Conn().Close(uctx)
		}
	}()
	res, err := cleanup(ctx, conn, c.cfg.Cleanup, stop)
	return res, true, err
}
