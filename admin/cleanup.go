package admin

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgoutbox/pgoutbox"
	"github.com/pgoutbox/pgoutbox/inbox"
	"github.com/pgoutbox/pgoutbox/internal/config"
	"github.com/pgoutbox/pgoutbox/internal/failpoint"
	"github.com/pgoutbox/pgoutbox/migrate"
)

// CleanupDB is what Cleanup needs of a database handle: *pgxpool.Pool,
// *pgxpool.Conn and *pgx.Conn have it. Each batch is its own transaction, so it
// must not be a pgx.Tx.
type CleanupDB interface {
	Begin(ctx context.Context) (pgx.Tx, error)
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Defaults of CleanupConfig, used for its zero fields.
const (
	DefaultRetention        = 7 * 24 * time.Hour
	DefaultCleanupBatchSize = 5000
)

// CleanupConfig says what Cleanup deletes. The zero value is ready to use; each
// field names its default.
type CleanupConfig struct {
	// Schema is the PostgreSQL schema holding the outbox tables. Empty means
	// migrate.DefaultSchema ("public").
	Schema string

	// Retention is how long a published event is kept after it was published
	// (published_at); older ones are deleted. It is also how far back
	// "pgoutbox replay" can reach. Zero means DefaultRetention (7 days).
	Retention time.Duration

	// BatchSize is how many rows one batch looks at and at most deletes; each
	// batch is one short statement that commits on its own. Zero means
	// DefaultCleanupBatchSize (5000).
	BatchSize int

	// PartitionsAhead is, for a partitioned outbox, how many days of partitions
	// after today Cleanup makes sure exist. Zero means
	// migrate.DefaultPartitionsAhead (7).
	PartitionsAhead int

	// InboxRetention, when positive, also deletes the consumer inbox's dedup rows
	// (processed_events) older than it, with inbox.Cleanup. It must be at least
	// InboxReplayHorizon. Zero leaves the inbox alone.
	InboxRetention time.Duration

	// InboxSchema is the schema of the inbox tables. Empty means Schema.
	InboxSchema string

	// InboxReplayHorizon is the longest time after which an event a consumer
	// applied may reach it again (see inbox.CleanupConfig.ReplayHorizon).
	// Zero means Retention, the least it can be: a replay can re-send any event
	// still in the outbox.
	InboxReplayHorizon time.Duration

	// SummarizeRanges bounds the BRIN summarization of a run: at most this many
	// of the newest page ranges of the published_at index are looked at (and
	// summarized when they are not yet), 16 pages each. The index does not ask
	// autovacuum to summarize (outbox migration 10); every VACUUM of the table
	// summarizes what a run leaves. Zero means DefaultSummarizeRanges (1024).
	SummarizeRanges int

	// DryRun deletes, drops and creates nothing: the result says what a run
	// would do now (Deleted the rows batches would delete, DroppedPartitions and
	// DroppedRows the partitions that would be dropped, InboxDeleted the dedup
	// rows), counted with one read of each table. Batches stays 0.
	DryRun bool

	// Progress, when set, is called after each batch and each dropped partition
	// with the running totals.
	Progress func(CleanupProgress)

	// Logger receives a line per dropped partition and per partition kept for
	// rows it still needs. Nil means slog.Default().
	Logger *slog.Logger
}

// Validate reports what Cleanup would reject in c, zero fields meaning their
// defaults: an error naming each bad field, joined. A nil c is valid.
func (c *CleanupConfig) Validate() error {
	if c == nil {
		return nil
	}
	_, err := c.withDefaults()
	return err
}

// CleanupProgress is reported while Cleanup runs.
type CleanupProgress struct {
	// Deleted is the number of outbox rows deleted by batches so far, Batches the
	// number of batches run.
	Deleted int64
	Batches int
	// DroppedPartitions is the number of partitions dropped so far.
	DroppedPartitions int
}

// CleanupResult reports what Cleanup did.
type CleanupResult struct {
	// Cutoff is the instant (database clock) before which published events were
	// deleted.
	Cutoff time.Time
	// Deleted is the number of outbox rows deleted by batches, in Batches
	// statements.
	Deleted int64
	Batches int
	// DroppedPartitions names the partitions dropped whole, which held
	// DroppedRows rows (partitioned outbox only).
	DroppedPartitions []string
	DroppedRows       int64
	// CreatedPartitions names the partitions created ahead of time.
	CreatedPartitions []string
	// InboxDeleted is the number of processed_events rows deleted.
	InboxDeleted int64
	// RelaysForgotten is the number of relay heartbeats deleted: relays last
	// seen before Cutoff.
	RelaysForgotten int64
	// Summarized is the number of BRIN page ranges summarized (see
	// CleanupConfig.SummarizeRanges).
	Summarized int64
	// Duration is how long the cleanup took.
	Duration time.Duration
}

func (c *CleanupConfig) withDefaults() (CleanupConfig, error) {
	return config.Resolve("admin", c, cleanupDefaults, checkCleanup)
}

func cleanupDefaults(c *CleanupConfig) {
	config.Default(&c.Schema, migrate.DefaultSchema)
	config.Default(&c.Retention, DefaultRetention)
	config.Default(&c.BatchSize, DefaultCleanupBatchSize)
	config.Default(&c.PartitionsAhead, migrate.DefaultPartitionsAhead)
	config.Default(&c.SummarizeRanges, DefaultSummarizeRanges)
	config.Default(&c.InboxSchema, c.Schema)
	config.Default(&c.InboxReplayHorizon, c.Retention)
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
}

// checkCleanup validates a cleanup config whose defaults are filled in.
func checkCleanup(c *CleanupConfig, p *config.Problems) {
	p.Field("CleanupConfig.Schema", migrate.ValidateSchema(c.Schema))
	p.Check(c.Retention > 0, "CleanupConfig.Retention (%s) must be positive", c.Retention)
	p.Check(c.BatchSize > 0, "CleanupConfig.BatchSize (%d) must be positive", c.BatchSize)
	p.Check(c.PartitionsAhead >= 0, "CleanupConfig.PartitionsAhead (%d) must not be negative", c.PartitionsAhead)
	p.Check(c.SummarizeRanges > 0, "CleanupConfig.SummarizeRanges (%d) must not be negative", c.SummarizeRanges)
	p.Check(c.InboxRetention >= 0, "CleanupConfig.InboxRetention (%s) must not be negative", c.InboxRetention)
	p.Field("CleanupConfig.InboxSchema", migrate.ValidateSchema(c.InboxSchema))
	// Checked before anything is deleted, not when the inbox's turn comes.
	p.Check(c.InboxRetention <= 0 || c.InboxRetention >= c.InboxReplayHorizon,
		"%w: CleanupConfig.InboxRetention %s is shorter than the replay horizon %s "+
			"(CleanupConfig.InboxReplayHorizon, by default the outbox's Retention): a replayed event could be applied twice",
		inbox.ErrRetentionTooShort, c.InboxRetention, c.InboxReplayHorizon)
}

// Cleanup deletes published events older than the retention and, when asked, the
// inbox's dedup rows older than theirs. It never deletes an unpublished or a
// quarantined event, nor a per-aggregate sequence counter (the aggregate's
// sequence would restart at 1), nor the audit rows of skipped events.
//
// Rows are deleted in batches of BatchSize, walking the primary key: each batch is
// one statement in its own short transaction, locks its rows with SKIP LOCKED and
// commits, so relays and producers never wait for it. On a partitioned outbox
// (migrate.Config.Partitioned) Cleanup first creates the partitions ahead of time,
// then drops each daily partition whose whole day is older than the cutoff and
// whose rows were all published before it; the exclusive lock a DROP needs on the
// table lasts milliseconds and is waited for at most 2s (the partition is then
// left for the batches). Rows of partitions that cannot be dropped are deleted by
// the batches.
//
// After the batches, Cleanup summarizes the BRIN index on published_at (see
// CleanupConfig.SummarizeRanges and docs/operations.md, "BRIN summarization").
//
// ctx bounds the whole run; what completed batches deleted stays deleted when it
// ends early, and the result counts it.
func Cleanup(ctx context.Context, db CleanupDB, cfg CleanupConfig) (CleanupResult, error) {
	return cleanup(ctx, db, cfg, nil)
}

// errStopping ends a Cleaner's run between two batches when the Cleaner stops.
var errStopping = errors.New("the cleaner is stopping")

// cleanup is Cleanup that also ends between two batches, with errStopping, once
// stop is closed (a Cleaner stopping gracefully). stop may be nil.
func cleanup(ctx context.Context, db CleanupDB, cfg CleanupConfig, stop <-chan struct{}) (CleanupResult, error) {
	start := time.Now()
	var res CleanupResult
	c, err := cfg.withDefaults()
	if err != nil {
		return res, err
	}
	// A database migrated by a newer pgoutbox is refused (errors.Is migrate.ErrDatabaseNewer).
	if err := migrate.CheckCompatible(ctx, db, c.Schema, migrate.LineOutbox); err != nil {
		return res, fmt.Errorf("admin: cleanup: %w", err)
	}
	events := pgx.Identifier{c.Schema, "outbox_events"}.Sanitize()
	if err := db.QueryRow(ctx, "SELECT now() - $1::bigint * interval '1 microsecond'", c.Retention.Microseconds()).Scan(&res.Cutoff); err != nil {
		return res, fmt.Errorf("admin: cleanup: read the clock: %w", err)
	}
	progress := func() {
		if c.Progress != nil {
			c.Progress(CleanupProgress{Deleted: res.Deleted, Batches: res.Batches, DroppedPartitions: len(res.DroppedPartitions)})
		}
	}

	partitioned, err := migrate.IsPartitioned(ctx, db, c.Schema)
	if err != nil {
		return res, fmt.Errorf("admin: cleanup: %w", err)
	}
	if c.DryRun {
		err := cleanupDryRun(ctx, db, &c, &res, partitioned)
		res.Duration = time.Since(start)
		return res, err
	}
	if partitioned {
		if res.CreatedPartitions, err = migrate.CreatePartitions(ctx, db, c.Schema, c.PartitionsAhead); err != nil {
			var pgErr *pgconn.PgError
			if !errors.As(err, &pgErr) || pgErr.Code != "55P03" { // lock_not_available
				return res, fmt.Errorf("admin: cleanup: %w", err)
			}
			// Rows of a day without its partition go to the default one meanwhile.
			c.Logger.Warn("cleanup: partitions ahead not created: the outbox stayed locked; next run tries again", slog.Any("error", err))
		}
		if err := dropPartitions(ctx, db, &c, &res, progress); err != nil {
			res.Duration = time.Since(start)
			return res, err
		}
	}

	attempts := pgx.Identifier{c.Schema, "outbox_attempts"}.Sanitize()
	first, next := fmt.Sprintf(deleteBatchSQL, events, ">=", attempts), fmt.Sprintf(deleteBatchSQL, events, ">", attempts)
	var cursor pgoutbox.UUID // the nil UUID: the first batch starts at the beginning
	for {
		if res.Batches > 0 {
			if err := failpoint.Inject(failpoint.CleanupMidBatch); err != nil {
				res.Duration = time.Since(start)
				return res, fmt.Errorf("admin: cleanup: after batch %d: %w", res.Batches, err)
			}
		}
		if isClosed(stop) {
			res.Duration = time.Since(start)
			return res, fmt.Errorf("admin: cleanup: after batch %d: %w", res.Batches, errStopping)
		}
		q := next
		if res.Batches == 0 {
			q = first
		}
		var last *pgoutbox.UUID
		var n int64
		if err := db.QueryRow(ctx, q, cursor, c.BatchSize, res.Cutoff).Scan(&last, &n); err != nil {
			res.Duration = time.Since(start)
			return res, fmt.Errorf("admin: cleanup: delete batch %d: %w", res.Batches+1, err)
		}
		res.Batches++
		res.Deleted += n
		progress()
		if last == nil {
			break
		}
		cursor = *last
	}

	// The heartbeats of relays last seen before the cutoff: stopped or gone
	// long ago (a live relay renews its row every heartbeat interval).
	tag, err := db.Exec(ctx, "DELETE FROM "+pgx.Identifier{c.Schema, "outbox_relays"}.Sanitize()+" WHERE last_seen < $1", res.Cutoff)
	if err != nil {
		res.Duration = time.Since(start)
		return res, fmt.Errorf("admin: cleanup: delete old relay heartbeats: %w", err)
	}
	res.RelaysForgotten = tag.RowsAffected()

	if !isClosed(stop) {
		if res.Summarized, err = summarize(ctx, db, c.Schema, c.SummarizeRanges, c.Logger); err != nil {
			res.Duration = time.Since(start)
			return res, err
		}
	}

	if c.InboxRetention > 0 {
		if isClosed(stop) {
			res.Duration = time.Since(start)
			return res, fmt.Errorf("admin: cleanup: before the inbox: %w", errStopping)
		}
		ir, err := inbox.Cleanup(ctx, inbox.Pgx(db), inbox.CleanupConfig{
			Schema: c.InboxSchema, Retention: c.InboxRetention, ReplayHorizon: c.InboxReplayHorizon, BatchSize: c.BatchSize,
		})
		res.InboxDeleted = ir.Deleted
		if err != nil {
			res.Duration = time.Since(start)
			return res, fmt.Errorf("admin: cleanup: %w", err)
		}
	}
	res.Duration = time.Since(start)
	return res, nil
}

// cleanupDryRun fills res with what Cleanup would delete now, changing nothing.
func cleanupDryRun(ctx context.Context, db CleanupDB, c *CleanupConfig, res *CleanupResult, partitioned bool) error {
	events := pgx.Identifier{c.Schema, "outbox_events"}.Sanitize()
	var dropped []string // sanitized names of the partitions that would be dropped
	if partitioned {
		if err := dropPartitions(ctx, db, c, res, func() {}); err != nil {
			return err
		}
		for _, p := range res.DroppedPartitions {
			dropped = append(dropped, pgx.Identifier{c.Schema, p}.Sanitize())
		}
	}
	if dropped == nil {
		dropped = []string{}
	}
	if err := db.QueryRow(ctx, `SELECT count(*) FROM `+events+` e
 WHERE e.published_at < $1::timestamptz AND e.quarantined_at IS NULL
   AND e.tableoid <> ALL (ARRAY(SELECT to_regclass(p)::oid FROM unnest($2::text[]) p))`,
		res.Cutoff, dropped).Scan(&res.Deleted); err != nil {
		return fmt.Errorf("admin: cleanup: dry run: count %s: %w", events, err)
	}
	if c.InboxRetention > 0 {
		inboxTable := pgx.Identifier{c.InboxSchema, "processed_events"}.Sanitize()
		var exists bool
		if err := db.QueryRow(ctx, "SELECT to_regclass($1) IS NOT NULL", inboxTable).Scan(&exists); err != nil {
			return fmt.Errorf("admin: cleanup: dry run: look up %s: %w", inboxTable, err)
		}
		if exists {
			if err := db.QueryRow(ctx, "SELECT count(*) FROM "+inboxTable+
				" WHERE processed_at < now() - $1::bigint * interval '1 microsecond'",
				c.InboxRetention.Microseconds()).Scan(&res.InboxDeleted); err != nil {
				return fmt.Errorf("admin: cleanup: dry run: count %s: %w", inboxTable, err)
			}
		}
	}
	return nil
}

// deleteBatchSQL deletes one batch: $1 the cursor (the last event id looked at),
// $2 the batch size, $3 the cutoff. %[2]s is >= for the first batch and > after.
//
//   - scanned walks the primary key from the cursor: BatchSize rows, published or
//     not, so a batch costs the same wherever the old rows are, and the walk ends
//     after one pass over the table. (There is no index on published_at: it would
//     cost every relay's mark a non-HOT update.)
//   - doomed keeps the published rows older than the cutoff and locks them with
//     SKIP LOCKED: a row someone else holds is left for the next run.
//   - the DELETE checks the conditions again on the row it deletes, so a
//     quarantined or unpublished row can never go, whatever the walk found.
//   - history deletes the attempt rows (outbox_attempts, %[3]s) of the events
//     deleted, in the same statement: they go with their event.
//
// Both lookups are handed arrays, so they are primary-key probes whatever the
// statistics say: a join let the planner hash the whole table for every batch.
//
// It returns the last id scanned (NULL at the end of the table) and the count
// deleted.
const deleteBatchSQL = `
WITH scanned AS (
    SELECT event_id FROM %[1]s WHERE event_id %[2]s $1::uuid ORDER BY event_id LIMIT $2::integer
), doomed AS (
    SELECT e.event_id FROM %[1]s e
     WHERE e.event_id = ANY (ARRAY(SELECT event_id FROM scanned))
       AND e.published_at < $3::timestamptz AND e.quarantined_at IS NULL
       FOR UPDATE OF e SKIP LOCKED
), deleted AS (
    DELETE FROM %[1]s e
     WHERE e.event_id = ANY (ARRAY(SELECT event_id FROM doomed))
       AND e.published_at < $3::timestamptz AND e.quarantined_at IS NULL
    RETURNING e.event_id
), history AS (
    DELETE FROM %[3]s a WHERE a.event_id = ANY (ARRAY(SELECT event_id FROM deleted))
)
SELECT (SELECT event_id FROM scanned ORDER BY event_id DESC LIMIT 1), (SELECT count(*) FROM deleted)`

// isClosed reports whether stop is closed; a nil stop never is.
func isClosed(stop <-chan struct{}) bool {
	select {
	case <-stop:
		return true
	default:
		return false
	}
}
