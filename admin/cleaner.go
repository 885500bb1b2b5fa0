package admin

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// CleanerConfig configures a Cleaner.
type CleanerConfig struct {
	// Cleanup is what each run does (schema, retention, batch size, inbox);
	// its Logger defaults to the Cleaner's.
	Cleanup CleanupConfig

	// Interval is the time between runs; the first run starts at once. Required.
	Interval time.Duration

	// Logger receives a line per run that deleted something, and errors.
	// Defaults to slog.Default().
	Logger *slog.Logger

	// Done, when set, is called after each run this Cleaner made (not the rounds
	// it skipped because another Cleaner held the lock), with what the run did,
	// also when it failed part way: e.g. to feed a metric of deleted rows.
	Done func(CleanupResult, error)
}

// Cleaner runs Cleanup periodically, as the relay's cleanup job does. Any number
// of Cleaners (one per relay) may run against one outbox: a session advisory lock
// per schema lets one of them run at a time, and the others skip that round.
type Cleaner struct {
	pool *pgxpool.Pool
	cfg  CleanerConfig
	key  int64

	mu     sync.Mutex
	cancel context.CancelFunc
	done   chan struct{}
}

// NewCleaner returns a Cleaner working through pool; each run holds one of its
// connections.
func NewCleaner(pool *pgxpool.Pool, cfg CleanerConfig) (*Cleaner, error) {
	if cfg.Interval <= 0 {
		return nil, fmt.Errorf("admin: CleanerConfig.Interval %s: must be positive", cfg.Interval)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Cleanup.Logger == nil {
		cfg.Cleanup.Logger = cfg.Logger
	}
	c, err := cfg.Cleanup.withDefaults()
	if err != nil {
		return nil, err
	}
	cfg.Cleanup = c
	return &Cleaner{pool: pool, cfg: cfg, key: cleanupLockKey(c.Schema)}, nil
}

// cleanupLockKey is the advisory lock that lets one cleaner of a schema run at a time.
func cleanupLockKey(schema string) int64 {
	h := fnv.New64a()
	h.Write([]byte("pgoutbox/cleanup/" + schema))
	return int64(h.Sum64())
}

// Start runs the first cleanup now and then one every Interval, in the
// background, until Stop or until ctx ends. Starting a started Cleaner is an
// error.
func (c *Cleaner) Start(ctx context.Context) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.done != nil {
		return errors.New("admin: cleaner already started")
	}
	ctx, c.cancel = context.WithCancel(ctx)
	c.done = make(chan struct{})
	go c.loop(ctx, c.done)
	return nil
}

// Stop ends the periodic runs, cancelling a run in progress (the batches it
// completed stay done), and waits for it to end or for ctx. It is safe to call
// more than once, and on a Cleaner never started.
func (c *Cleaner) Stop(ctx context.Context) error {
	c.mu.Lock()
	cancel, done := c.cancel, c.done
	c.mu.Unlock()
	if done == nil {
		return nil
	}
	cancel()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (c *Cleaner) loop(ctx context.Context, done chan struct{}) {
	defer close(done)
	t := time.NewTicker(c.cfg.Interval)
	defer t.Stop()
	for {
		res, ran, err := c.RunOnce(ctx)
		if ran && c.cfg.Done != nil {
			c.cfg.Done(res, err)
		}
		did := ran && (res.Deleted > 0 || len(res.DroppedPartitions) > 0 || len(res.CreatedPartitions) > 0 || res.InboxDeleted > 0)
		stopped := ctx.Err() != nil
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
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// RunOnce runs one cleanup now if no other Cleaner of the schema is running one,
// and reports whether it ran.
func (c *Cleaner) RunOnce(ctx context.Context) (CleanupResult, bool, error) {
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
		uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		if _, err := conn.Exec(uctx, "SELECT pg_advisory_unlock($1)", c.key); err != nil {
			// The session still holds the lock: drop the connection, which frees it.
			_ = conn.Conn().Close(uctx)
		}
	}()
	res, err := Cleanup(ctx, conn, c.cfg.Cleanup)
	return res, true, err
}
