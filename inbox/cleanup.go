package inbox

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/pgoutbox/pgoutbox/migrate"
)

// ErrRetentionTooShort is matched (errors.Is) by Cleanup's error when the retention
// is shorter than the replay horizon: rows would be deleted while their events can
// still be delivered again, and those deliveries would be applied a second time.
var ErrRetentionTooShort = errors.New("inbox: dedup retention shorter than the replay horizon")

// CleanupConfig says which processed_events rows Cleanup deletes.
type CleanupConfig struct {
	// Schema is the PostgreSQL schema holding the inbox tables. Defaults to "public".
	Schema string

	// Consumer restricts the cleanup to one consumer name. Defaults to every
	// consumer.
	Consumer string

	// Retention is how long a processed_events row is kept after the event was
	// applied; older rows are deleted. Required, and at least ReplayHorizon.
	Retention time.Duration

	// ReplayHorizon is the longest time after which an event that a consumer
	// applied may be delivered to it again: how long published rows stay in the
	// outbox (what "pgoutbox replay" can re-publish), plus how long the broker
	// keeps a message it may redeliver (the stream's max age), plus the longest
	// consumer lag you plan for. A dedup row deleted sooner than that lets a
	// redelivery apply the event twice. Required.
	ReplayHorizon time.Duration

	// BatchSize is the most rows one DELETE statement removes; each batch commits
	// on its own, so locks and WAL bursts stay small. Defaults to 1000.
	BatchSize int
}

// Validate reports the first problem of the configuration as given, zero
// fields meaning their defaults: Retention and ReplayHorizon are required, and
// a Retention shorter than ReplayHorizon is an error wrapping
// ErrRetentionTooShort. Cleanup calls it.
func (c CleanupConfig) Validate() error {
	_, err := c.withDefaults()
	return err
}

func (c CleanupConfig) withDefaults() (CleanupConfig, error) {
	if c.Schema == "" {
		c.Schema = migrate.DefaultSchema
	}
	if c.BatchSize == 0 {
		c.BatchSize = 1000
	}
	switch {
	case migrate.ValidateSchema(c.Schema) != nil:
		return c, fmt.Errorf("inbox: CleanupConfig.Schema: %w", migrate.ValidateSchema(c.Schema))
	case c.ReplayHorizon <= 0:
		return c, errors.New("inbox: CleanupConfig.ReplayHorizon is required: the longest time after which an applied event can be delivered again")
	case c.Retention <= 0:
		return c, errors.New("inbox: CleanupConfig.Retention is required")
	case c.Retention < c.ReplayHorizon:
		return c, fmt.Errorf("%w: CleanupConfig.Retention %s is shorter than CleanupConfig.ReplayHorizon %s; "+
			"events applied between %s and %s ago could be delivered again and applied twice",
			ErrRetentionTooShort, c.Retention, c.ReplayHorizon, c.Retention, c.ReplayHorizon)
	case c.BatchSize < 1:
		return c, fmt.Errorf("inbox: CleanupConfig.BatchSize %d: must be positive", c.BatchSize)
	}
	return c, nil
}

// CleanupResult reports what Cleanup did.
type CleanupResult struct {
	// Deleted is the number of processed_events rows deleted.
	Deleted int64
	// Batches is the number of DELETE statements run.
	Batches int
	// Cutoff is the instant (database clock) before which rows were deleted.
	Cutoff time.Time
}

// Cleanup deletes processed_events rows older than cfg.Retention, oldest first, in
// batches of cfg.BatchSize, each its own statement, until none is left. It refuses
// (ErrRetentionTooShort) a retention shorter than cfg.ReplayHorizon.
//
// Positions (consumer_positions) are never deleted: under GapReject they keep
// protecting an aggregate's old sequences after their dedup rows are gone (a
// redelivered sequence at or below the position is a duplicate), and a consumer that
// lost its position would take the aggregate's next event for a gap.
//
// ctx bounds the whole run; the rows deleted by batches that completed stay deleted
// when it ends early, and the result counts them.
func Cleanup[TX any](ctx context.Context, db Driver[TX], cfg CleanupConfig) (CleanupResult, error) {
	var res CleanupResult
	cfg, err := cfg.withDefaults()
	if err != nil {
		return res, err
	}
	q := newQueries(cfg.Schema)
	if err := db.queryRow(ctx, q.cutoff, []any{cfg.Retention.Microseconds()}, &res.Cutoff); err != nil {
		return res, fmt.Errorf("inbox: cleanup: read the clock: %w", err)
	}
	for {
		var n int64
		var err error
		if cfg.Consumer == "" {
			n, err = db.exec(ctx, q.cleanupAll, res.Cutoff, cfg.BatchSize)
		} else {
			n, err = db.exec(ctx, q.cleanupOne, res.Cutoff, cfg.BatchSize, cfg.Consumer)
		}
		if err != nil {
			return res, fmt.Errorf("inbox: cleanup: delete batch %d: %w", res.Batches+1, err)
		}
		res.Batches++
		res.Deleted += n
		if n < int64(cfg.BatchSize) {
			return res, nil
		}
	}
}
