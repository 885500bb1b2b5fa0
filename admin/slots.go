package admin

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// ReplicationSlot is a logical replication slot of the current database, as a
// CDC relay (package cdc) uses one.
type ReplicationSlot struct {
	Name   string
	Plugin string
	// Active reports whether a session streams from the slot now.
	Active bool
	// WALStatus is PostgreSQL's wal_status: reserved, extended, unreserved or
	// lost (a lost slot needs pgoutbox cdc recover).
	WALStatus string
	// LagBytes is how much WAL the slot's consumer has not confirmed yet
	// (the WAL insert position minus confirmed_flush_lsn); RetainedBytes how much
	// WAL the server keeps for it (minus restart_lsn). Nil on a standby or when
	// the slot has no position.
	LagBytes, RetainedBytes *int64
}

// ReplicationSlots lists the logical replication slots of the current
// database, by name. pg_replication_slots is readable by every role.
func (a *Admin) ReplicationSlots(ctx context.Context) ([]ReplicationSlot, error) {
	rows, err := a.db.Query(ctx, `
SELECT s.slot_name::text, coalesce(s.plugin::text, ''), s.active, coalesce(s.wal_status, ''),
       CASE WHEN NOT pg_is_in_recovery() THEN pg_wal_lsn_diff(pg_current_wal_insert_lsn(), s.confirmed_flush_lsn)::bigint END,
       CASE WHEN NOT pg_is_in_recovery() THEN pg_wal_lsn_diff(pg_current_wal_insert_lsn(), s.restart_lsn)::bigint END
  FROM pg_replication_slots s
 WHERE s.slot_type = 'logical' AND s.database = current_database()
 ORDER BY s.slot_name`)
	if err != nil {
		return nil, fmt.Errorf("admin: replication slots: %w", err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowToStructByPos[ReplicationSlot])
	if err != nil {
		return nil, fmt.Errorf("admin: replication slots: %w", err)
	}
	return out, nil
}
