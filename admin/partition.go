package admin

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgoutbox/pgoutbox/internal/failpoint"
)

// dropPartitions drops the daily partitions entirely older than the cutoff that
// hold only rows published before it.
func dropPartitions(ctx context.Context, db CleanupDB, c *CleanupConfig, res *CleanupResult, progress func()) error {
	events := pgx.Identifier{c.Schema, "outbox_events"}.Sanitize()
	attempts := pgx.Identifier{c.Schema, "outbox_attempts"}.Sanitize()
	// Daily partitions are named outbox_events_pYYYYMMDD (UTC) by
	// outbox_create_partitions; their upper bound is the next midnight.
	rows, err := db.Query(ctx, `SELECT c.relname::text, to_date(substr(c.relname, 16), 'YYYYMMDD')
  FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
 WHERE i.inhparent = to_regclass($1) AND c.relname ~ '^outbox_events_p[0-9]{8}$'
 ORDER BY 1`, events)
	if err != nil {
		return fmt.Errorf("admin: cleanup: list partitions: %w", err)
	}
	type part struct {
		name string
		day  time.Time
	}
	parts, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (part, error) {
		var p part
		err := r.Scan(&p.name, &p.day)
		return p, err
	})
	if err != nil {
		return fmt.Errorf("admin: cleanup: list partitions: %w", err)
	}
	for _, p := range parts {
		end := time.Date(p.day.Year(), p.day.Month(), p.day.Day()+1, 0, 0, 0, 0, time.UTC)
		if end.After(res.Cutoff) {
			continue
		}
		table := pgx.Identifier{c.Schema, p.name}.Sanitize()
		// Without locks: a full look at the partition. Its rows can only go from
		// unpublished to published, so a partition found clean stays clean except
		// for rows inserted since, which the check under the lock catches.
		var total, keep int64
		if err := db.QueryRow(ctx, "SELECT count(*), count(*) FILTER (WHERE published_at IS NULL OR published_at >= $1 OR quarantined_at IS NOT NULL) FROM "+table,
			res.Cutoff).Scan(&total, &keep); err != nil {
			return fmt.Errorf("admin: cleanup: inspect partition %s: %w", p.name, err)
		}
		if keep > 0 {
			c.Logger.Info("cleanup: partition kept: it holds unpublished, quarantined or recently published events; deleting its old rows in batches",
				slog.String("partition", p.name), slog.Int64("rows", total), slog.Int64("kept", keep))
			continue
		}
		if c.DryRun {
			res.DroppedPartitions = append(res.DroppedPartitions, p.name)
			res.DroppedRows += total
			continue
		}
		dropped, err := dropPartition(ctx, db, events, attempts, table)
		if err != nil {
			return fmt.Errorf("admin: cleanup: drop partition %s: %w", p.name, err)
		}
		if !dropped {
			c.Logger.Warn("cleanup: partition not dropped: the table stayed locked or got an unpublished row; deleting its rows in batches",
				slog.String("partition", p.name))
			continue
		}
		c.Logger.Info("cleanup: partition dropped", slog.String("partition", p.name), slog.Int64("rows", total))
		res.DroppedPartitions = append(res.DroppedPartitions, p.name)
		res.DroppedRows += total
		progress()
		if err := failpoint.Inject(failpoint.CleanupMidBatch); err != nil {
			return fmt.Errorf("admin: cleanup: after dropping %s: %w", p.name, err)
		}
	}
	return nil
}

// dropLockTimeout bounds the wait for the exclusive lock that dropping a
// partition takes on the outbox (a PostgreSQL interval).
const dropLockTimeout = "2s"

// dropPartition drops table, a partition of events, unless it got an unpublished
// row. It reports false, without error, when the lock was not granted within
// the lock timeout.
func dropPartition(ctx context.Context, db CleanupDB, events, attempts, table string) (bool, error) {
	tx, err := db.Begin(ctx)
	if err != nil {
		return false, err
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) // no-op after Commit
	// A waiting ACCESS EXCLUSIVE request queues every later query on the table
	// behind it, so never wait long: try again next run instead.
	if _, err := tx.Exec(ctx, "SET LOCAL lock_timeout = '"+dropLockTimeout+"'"); err != nil {
		return false, err
	}
	// The parent first, as DROP TABLE of a partition would: it keeps every query
	// of the outbox out until the partition is gone.
	if _, err := tx.Exec(ctx, "LOCK TABLE ONLY "+events+" IN ACCESS EXCLUSIVE MODE"); err != nil {
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == "55P03" { // lock_not_available
			return false, nil
		}
		return false, err
	}
	// Under the lock, the partial index of unpublished rows answers at once.
	var pending bool
	if err := tx.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM "+table+" WHERE published_at IS NULL)").Scan(&pending); err != nil {
		return false, err
	}
	if pending {
		return false, nil
	}
	// The attempt history goes with its events, in the same transaction. The
	// history is small (failed events only, 20 rows at most each): it is the
	// side walked, each row probing the partition's primary key.
	if _, err := tx.Exec(ctx, "DELETE FROM "+attempts+" a WHERE EXISTS (SELECT 1 FROM "+table+" p WHERE p.event_id = a.event_id)"); err != nil {
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == "55P03" {
			return false, nil
		}
		return false, err
	}
	if _, err := tx.Exec(ctx, "DROP TABLE "+table); err != nil {
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == "55P03" {
			return false, nil
		}
		return false, err
	}
	return true, tx.Commit(ctx)
}
