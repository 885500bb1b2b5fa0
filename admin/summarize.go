package admin

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// DefaultSummarizeRanges is CleanupConfig.SummarizeRanges when zero: 1024 ranges
// of 16 pages, at most 128 MiB of the table read per run.
const DefaultSummarizeRanges = 1024

// summarizeChunk is how many ranges one summarization statement looks at, each
// statement in its own short transaction.
const summarizeChunk = 64

// brinIndexesSQL finds the BRIN index on published_at that the migrations made
// ($1, its schema-qualified name), or, for a partitioned outbox, the partitions'
// own indexes under it: the ones summarization works on. Each comes with its
// table's size in blocks and its pages_per_range. Only a plain BRIN index
// qualifies (no expression, no predicate), so that summarizing it evaluates no
// function anyone else wrote; summarizing runs as the table's owner anyway.
// Catalog functions are qualified: the schema is not trusted to shadow nothing.
const brinIndexesSQL = `WITH RECURSIVE idx(oid) AS (
    SELECT pg_catalog.to_regclass($1)::oid
    UNION ALL
    SELECT i.inhrelid FROM pg_catalog.pg_inherits i JOIN idx ON i.inhparent = idx.oid
)
SELECT c.oid::bigint,
       pg_catalog.pg_relation_size(x.indrelid) / pg_catalog.current_setting('block_size')::bigint,
       coalesce((SELECT o.option_value::bigint FROM pg_catalog.pg_options_to_table(c.reloptions) o
                  WHERE o.option_name = 'pages_per_range'), 128)
FROM idx
JOIN pg_catalog.pg_class c ON c.oid = idx.oid AND c.relkind = 'i'
JOIN pg_catalog.pg_am am ON am.oid = c.relam AND am.amname = 'brin'
JOIN pg_catalog.pg_index x ON x.indexrelid = c.oid
WHERE x.indexprs IS NULL AND x.indpred IS NULL
ORDER BY c.oid`

// summarizeRangesSQL summarizes the ranges starting at blocks $2, $2-$4, … down to
// $3 of index $1, those not summarized yet, and returns how many it summarized.
const summarizeRangesSQL = `SELECT coalesce(sum(pg_catalog.brin_summarize_range($1::bigint::oid::regclass, b)), 0)::bigint
FROM pg_catalog.generate_series($2::bigint, $3::bigint, -$4::bigint) AS b`

// summarizeLockTimeout bounds the wait for the table's SHARE UPDATE EXCLUSIVE
// lock, which a VACUUM (autovacuum's too) holds: the VACUUM summarizes anyway.
const summarizeLockTimeout = "2s"

// summarize summarizes the unsummarized ranges among the newest of the outbox's
// BRIN index (or of its partitions' indexes), at most limit ranges looked at in
// all, walking back from the end of each table: rows are appended, so the ranges
// not yet summarized are the newest. A range summarized already costs a lookup;
// one that is not, a read of its pages: a run reads at most limit ranges. It
// returns how many ranges it summarized.
//
// Migration 10 turned autosummarize off, which asked autovacuum for a work item
// per new range and flooded the server log once its queue was full; this keeps
// summarization explicit and bounded, and VACUUM summarizes whatever is left.
// Without the table's ownership (PostgreSQL requires it) or with the table
// locked by a VACUUM, it summarizes nothing and says so; cleanup goes on.
func summarize(ctx context.Context, db CleanupDB, schema string, limit int, log *slog.Logger) (int64, error) {
	name := pgx.Identifier{schema, "outbox_events_published_at_brin"}.Sanitize()
	type index struct{ oid, blocks, perRange int64 }
	rows, err := db.Query(ctx, brinIndexesSQL, name)
	if err != nil {
		return 0, fmt.Errorf("admin: cleanup: find the BRIN index %s: %w", name, err)
	}
	indexes, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (index, error) {
		var i index
		err := r.Scan(&i.oid, &i.blocks, &i.perRange)
		return i, err
	})
	if err != nil {
		return 0, fmt.Errorf("admin: cleanup: find the BRIN index %s: %w", name, err)
	}
	var done int64
	left := int64(limit)
	for _, ix := range indexes {
		if ix.blocks == 0 || ix.perRange < 1 {
			continue
		}
		hi := (ix.blocks - 1) / ix.perRange * ix.perRange // the last range's first block
		for left > 0 && hi >= 0 {
			n := min(left, summarizeChunk)
			lo := max(0, hi-(n-1)*ix.perRange)
			got, err := summarizeChunkTx(ctx, db, ix.oid, hi, lo, ix.perRange)
			if err != nil {
				var pgErr *pgconn.PgError
				if errors.As(err, &pgErr) && (pgErr.Code == "42501" || pgErr.Code == "55P03") {
					// insufficient_privilege, lock_not_available
					log.Info("cleanup: BRIN summarization skipped; VACUUM summarizes the ranges instead",
						slog.String("index", name), slog.String("reason", pgErr.Message))
					return done, nil
				}
				return done, fmt.Errorf("admin: cleanup: summarize %s: %w", name, err)
			}
			done += got
			left -= (hi-lo)/ix.perRange + 1
			hi = lo - ix.perRange
		}
	}
	return done, nil
}

// summarizeChunkTx runs one summarization statement in a transaction of its own,
// waiting at most summarizeLockTimeout for the table.
func summarizeChunkTx(ctx context.Context, db CleanupDB, oid, hi, lo, perRange int64) (int64, error) {
	var n int64
	err := pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "SET LOCAL lock_timeout = '"+summarizeLockTimeout+"'"); err != nil {
			return err
		}
		return tx.QueryRow(ctx, summarizeRangesSQL, oid, hi, lo, perRange).Scan(&n)
	})
	return n, err
}
