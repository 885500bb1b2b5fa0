package migrate

import (
	"context"
	_ "embed"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// DefaultPartitionsAhead is how many days of partitions after today
// CreatePartitions makes sure exist, unless told otherwise.
const DefaultPartitionsAhead = 7

//go:embed sql/partitioned/outbox_events.sql
var partitionedSQL string

// migrationSQL returns m's statements for c: for a partitioned outbox, the first
// outbox migration is preceded by the partitioned table, which its CREATE TABLE IF
// NOT EXISTS then leaves alone.
func migrationSQL(c Config, m Migration) (string, error) {
	out, err := expand(m.sql, c.Schema)
	if err != nil {
		return "", fmt.Errorf("migrate: %s: %w", m.fileName(), err)
	}
	if c.Partitioned && m.Line == LineOutbox && m.Version == 1 {
		p, err := expand(partitionedSQL, c.Schema)
		if err != nil {
			return "", fmt.Errorf("migrate: sql/partitioned/outbox_events.sql: %w", err)
		}
		out = p + "\n" + out
	}
	return out, nil
}

// Queryer runs one query: *pgxpool.Pool, *pgx.Conn and pgx.Tx have it.
type Queryer interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// IsPartitioned reports whether schema's outbox_events is a partitioned table
// (created by Up with Config.Partitioned). A missing table is not partitioned.
func IsPartitioned(ctx context.Context, db Queryer, schema string) (bool, error) {
	var partitioned bool
	err := db.QueryRow(ctx, `SELECT EXISTS (
    SELECT 1 FROM pg_partitioned_table p JOIN pg_class c ON c.oid = p.partrelid
     WHERE c.oid = to_regclass($1))`, pgx.Identifier{schema, "outbox_events"}.Sanitize()).Scan(&partitioned)
	if err != nil {
		return false, fmt.Errorf("migrate: is outbox_events partitioned: %w", err)
	}
	return partitioned, nil
}

// checkPartitionable refuses to make a plain outbox_events partitioned.
func checkPartitionable(ctx context.Context, tx pgx.Tx, schema string) error {
	var exists bool
	if err := tx.QueryRow(ctx, "SELECT to_regclass($1) IS NOT NULL",
		pgx.Identifier{schema, "outbox_events"}.Sanitize()).Scan(&exists); err != nil {
		return fmt.Errorf("migrate: look up outbox_events: %w", err)
	}
	if !exists {
		return nil
	}
	partitioned, err := IsPartitioned(ctx, tx, schema)
	if err != nil {
		return err
	}
	if !partitioned {
		return fmt.Errorf("migrate: Config.Partitioned: %s.outbox_events exists and is not partitioned; "+
			"turning it into a partitioned table takes a data migration (create a new schema with --partitioned and move the rows)", pgx.Identifier{schema}.Sanitize())
	}
	return nil
}

// CreatePartitions makes sure the daily partitions of schema's outbox_events exist
// from today (UTC) to daysAhead days later, and returns the names of those it
// created. For an outbox that is not partitioned it does nothing. Up calls it;
// so do admin.Cleanup and the relay's cleanup job. A day with no partition is not
// an error: its rows go to the default partition.
//
// Creating a partition takes a brief exclusive lock on outbox_events; the
// statement runs with a lock timeout of 5s so it never queues for long in front
// of producers and relays behind a long transaction.
func CreatePartitions(ctx context.Context, db DB, schema string, daysAhead int) ([]string, error) {
	if err := ValidateSchema(schema); err != nil {
		return nil, err
	}
	if daysAhead < 0 {
		return nil, fmt.Errorf("migrate: CreatePartitions: daysAhead %d must not be negative", daysAhead)
	}
	tx, err := db.Begin(ctx)
	if err != nil {
		return nil, fmt.Errorf("migrate: create partitions: begin: %w", err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) // no-op after Commit
	partitioned, err := IsPartitioned(ctx, tx, schema)
	if err != nil || !partitioned {
		return nil, err
	}
	if _, err := tx.Exec(ctx, "SET LOCAL lock_timeout = '5s'"); err != nil {
		return nil, fmt.Errorf("migrate: create partitions: %w", err)
	}
	rows, err := tx.Query(ctx, "SELECT * FROM "+pgx.Identifier{schema, "outbox_create_partitions"}.Sanitize()+"($1)", daysAhead)
	if err != nil {
		return nil, fmt.Errorf("migrate: create partitions: %w", err)
	}
	created, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("migrate: create partitions: %w", err)
	}
	if err := tx.Commit(ctx); err != nil {
		return nil, fmt.Errorf("migrate: create partitions: commit: %w", err)
	}
	return created, nil
}
