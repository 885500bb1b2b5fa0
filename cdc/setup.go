package cdc

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgconn/ctxwatch"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgoutbox/pgoutbox"
	"github.com/pgoutbox/pgoutbox/migrate"
)

// Errors of the start-up checks; each comes wrapped with what to do about it.
var (
	// ErrWALLevel: the server's wal_level is not logical.
	ErrWALLevel = errors.New("cdc: wal_level is not logical")
	// ErrReplicationPrivilege: the role may not use replication.
	ErrReplicationPrivilege = errors.New("cdc: role lacks the REPLICATION attribute")
	// ErrSlotActive: another process streams from the slot.
	ErrSlotActive = errors.New("cdc: replication slot in use by another process")
	// ErrSlotLost: the server invalidated the slot (it fell behind
	// max_slot_wal_keep_size); run Recover.
	ErrSlotLost = errors.New("cdc: replication slot invalidated")
	// ErrSlotMismatch: a slot of that name exists for another database or plugin.
	ErrSlotMismatch = errors.New("cdc: replication slot belongs to another database or plugin")
	// ErrOtherOwner: live leases of polling relays on unpublished events.
	ErrOtherOwner = errors.New("cdc: events are leased by polling relays")
	// ErrNotMigrated: the schema has no outbox table.
	ErrNotMigrated = errors.New("cdc: no outbox table")
)

// Check runs the start-up checks against the server without changing anything:
// wal_level, the REPLICATION attribute, the outbox table, and the slot (if it
// exists) being for this database and pgoutput, not invalidated and not in use.
func Check(ctx context.Context, pool *pgxpool.Pool, cfg *Config) error {
	c, err := cfg.withDefaults()
	if err != nil {
		return err
	}
	_, err = checkServer(ctx, pool, &c)
	return err
}

// slotInfo is a row of pg_replication_slots.
type slotInfo struct {
	exists    bool
	active    bool
	pid       *int32
	walStatus *string
}

func checkServer(ctx context.Context, pool *pgxpool.Pool, c *Config) (slotInfo, error) {
	var level string
	if err := pool.QueryRow(ctx, "SHOW wal_level").Scan(&level); err != nil {
		return slotInfo{}, fmt.Errorf("cdc: read wal_level: %w", err)
	}
	if level != "logical" {
		return slotInfo{}, fmt.Errorf("%w (it is %q): run ALTER SYSTEM SET wal_level = logical and restart PostgreSQL", ErrWALLevel, level)
	}
	var role string
	var ok bool
	if err := pool.QueryRow(ctx, "SELECT current_user, rolreplication OR rolsuper FROM pg_roles WHERE rolname = current_user").Scan(&role, &ok); err != nil {
		return slotInfo{}, fmt.Errorf("cdc: read role attributes: %w", err)
	}
	if !ok {
		return slotInfo{}, fmt.Errorf("%w: ALTER ROLE %s REPLICATION (role %q)", ErrReplicationPrivilege, pgx.Identifier{role}.Sanitize(), role)
	}
	var exists bool
	if err := pool.QueryRow(ctx, "SELECT to_regclass($1) IS NOT NULL", newQueries(c.Schema).table).Scan(&exists); err != nil {
		return slotInfo{}, fmt.Errorf("cdc: look up the outbox table: %w", err)
	}
	if !exists {
		return slotInfo{}, fmt.Errorf("%w in schema %s: run 'pgoutbox migrate --schema %s' first", ErrNotMigrated, c.Schema, c.Schema)
	}
	// A database migrated by a newer pgoutbox is refused (errors.Is migrate.ErrDatabaseNewer).
	if err := migrate.CheckCompatible(ctx, pool, c.Schema, migrate.LineOutbox); err != nil {
		return slotInfo{}, fmt.Errorf("cdc: %w", err)
	}
	return slotState(ctx, pool, c)
}

func slotState(ctx context.Context, pool *pgxpool.Pool, c *Config) (slotInfo, error) {
	var s slotInfo
	var plugin, db *string
	var thisDB string
	err := pool.QueryRow(ctx, `SELECT plugin, database, active, active_pid, wal_status, current_database()
  FROM pg_replication_slots WHERE slot_name = $1`, c.Slot).Scan(&plugin, &db, &s.active, &s.pid, &s.walStatus, &thisDB)
	if errors.Is(err, pgx.ErrNoRows) {
		return s, nil
	}
	if err != nil {
		return s, fmt.Errorf("cdc: read slot %s: %w", c.Slot, err)
	}
	s.exists = true
	if plugin == nil || *plugin != "pgoutput" || db == nil || *db != thisDB {
		return s, fmt.Errorf("%w: slot %q (plugin %v, database %v); choose another --slot", ErrSlotMismatch, c.Slot, deref(plugin), deref(db))
	}
	if s.active {
		return s, fmt.Errorf("%w: slot %q is streaming to backend pid %v: is another CDC relay running for schema %s?", ErrSlotActive, c.Slot, deref(s.pid), c.Schema)
	}
	if s.walStatus != nil && *s.walStatus == "lost" {
		return s, fmt.Errorf("%w: slot %q lost the WAL it needed: run 'pgoutbox cdc recover --schema %s'", ErrSlotLost, c.Slot, c.Schema)
	}
	return s, nil
}

func deref[T any](p *T) any {
	if p == nil {
		return "none"
	}
	return *p
}

// ensurePublication creates the schema's publication (inserts into its outbox
// table only) or checks that the existing one covers the table. It must exist
// before the slot: pgoutput looks publications up as of each decoded change.
// publish_via_partition_root makes a partitioned outbox's inserts arrive as
// inserts into outbox_events, not into its daily partitions.
func ensurePublication(ctx context.Context, pool *pgxpool.Pool, c *Config) error {
	var inserts bool
	err := pool.QueryRow(ctx, "SELECT pubinsert AND pubviaroot FROM pg_publication WHERE pubname = $1", c.Publication).Scan(&inserts)
	if errors.Is(err, pgx.ErrNoRows) {
		q := fmt.Sprintf("CREATE PUBLICATION %s FOR TABLE %s WITH (publish = 'insert', publish_via_partition_root = true)",
			pgx.Identifier{c.Publication}.Sanitize(), newQueries(c.Schema).table)
		if _, err := pool.Exec(ctx, q); err != nil {
			var pe *pgconn.PgError
			if errors.As(err, &pe) && pe.Code == "42710" { // created concurrently
				return ensurePublication(ctx, pool, c)
			}
			return fmt.Errorf("cdc: create publication %s: %w", c.Publication, err)
		}
		return nil
	}
	if err != nil {
		return fmt.Errorf("cdc: read publication %s: %w", c.Publication, err)
	}
	var covers bool
	if err := pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_publication_tables
  WHERE pubname = $1 AND schemaname = $2 AND tablename = 'outbox_events')`, c.Publication, c.Schema).Scan(&covers); err != nil {
		return fmt.Errorf("cdc: read publication %s: %w", c.Publication, err)
	}
	if !covers || !inserts {
		return fmt.Errorf("cdc: publication %q exists but does not publish inserts into %s via the partition root: drop it or choose another --publication",
			c.Publication, newQueries(c.Schema).table)
	}
	return nil
}

// ensureOwnership makes new outbox rows born leased to the CDC source (column
// defaults), then takes over every unpublished event no live lease holds. It
// fails with ErrOtherOwner when polling relays hold live leases.
func ensureOwnership(ctx context.Context, pool *pgxpool.Pool, c *Config, q *queries) error {
	var byDefault, untilDefault *string
	err := pool.QueryRow(ctx, `SELECT
  (SELECT pg_get_expr(d.adbin, d.adrelid) FROM pg_attrdef d JOIN pg_attribute a ON a.attrelid = d.adrelid AND a.attnum = d.adnum
    WHERE d.adrelid = $1::regclass AND a.attname = 'claimed_by'),
  (SELECT pg_get_expr(d.adbin, d.adrelid) FROM pg_attrdef d JOIN pg_attribute a ON a.attrelid = d.adrelid AND a.attnum = d.adnum
    WHERE d.adrelid = $1::regclass AND a.attname = 'claim_until')`, q.table).Scan(&byDefault, &untilDefault)
	if err != nil {
		return fmt.Errorf("cdc: read column defaults: %w", err)
	}
	owner := c.Owner()
	wantBy := "'" + owner + "'::text"
	if byDefault == nil || *byDefault != wantBy || untilDefault == nil || !strings.Contains(*untilDefault, "infinity") {
		// ALTER TABLE waits for in-flight producer transactions, so every row
		// inserted after it returns carries the new defaults.
		alter := fmt.Sprintf("ALTER TABLE %s ALTER COLUMN claimed_by SET DEFAULT %s, ALTER COLUMN claim_until SET DEFAULT 'infinity'",
			q.table, quoteLiteral(owner))
		if _, err := pool.Exec(ctx, alter); err != nil {
			return fmt.Errorf("cdc: make new events owned by %s (column defaults): %w", owner, err)
		}
	}
	rows, err := pool.Query(ctx, q.foreignLeases, owner)
	if err != nil {
		return fmt.Errorf("cdc: look for polling relays' leases: %w", err)
	}
	type lease struct {
		holder *string
		n      int64
		until  string
	}
	leases, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (lease, error) {
		var l lease
		return l, r.Scan(&l.holder, &l.n, &l.until)
	})
	if err != nil {
		return fmt.Errorf("cdc: look for polling relays' leases: %w", err)
	}
	if len(leases) > 0 {
		var parts []string
		for _, l := range leases {
			parts = append(parts, fmt.Sprintf("%v holds %d until %s", deref(l.holder), l.n, l.until))
		}
		return fmt.Errorf("%w (%s): a schema runs one relay source at a time; stop the polling relays (SIGTERM releases their leases) or wait for the leases to expire",
			ErrOtherOwner, strings.Join(parts, "; "))
	}
	if _, err := pool.Exec(ctx, q.takeover, owner); err != nil {
		return fmt.Errorf("cdc: take over unpublished events: %w", err)
	}
	return nil
}

// quoteLiteral quotes s as a plain string literal, for the replication
// protocol's commands, which take no parameters and whose scanner knows no escape
// strings. The values quoted here are plain by construction: the owner and the
// publication come from names Config.validate restricts to [a-z0-9_] (and
// "cdc:"), the snapshot name from the server.
func quoteLiteral(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }

// replConn opens a logical replication connection with the pool's settings.
func replConn(ctx context.Context, pool *pgxpool.Pool) (*pgconn.PgConn, error) {
	cc := pool.Config().ConnConfig.Copy()
	pc := cc.Config // pgconn.Config
	rp := map[string]string{}
	for k, v := range pc.RuntimeParams {
		rp[k] = v
	}
	rp["replication"] = "database"
	rp["application_name"] = "pgoutbox-cdc"
	// pgoutput renders values with the walsender's settings: fix them so that
	// timestamps parse the same everywhere.
	rp["DateStyle"] = "ISO, MDY"
	rp["TimeZone"] = "UTC"
	pc.RuntimeParams = rp
	// Deadlines (pgx's default): a receive that times out leaves the connection usable.
	pc.BuildContextWatcherHandler = func(c *pgconn.PgConn) ctxwatch.Handler {
		return &pgconn.DeadlineContextWatcherHandler{Conn: c.Conn()}
	}
	conn, err := pgconn.ConnectConfig(ctx, &pc)
	if err != nil {
		return nil, fmt.Errorf("cdc: open replication connection: %w", err)
	}
	return conn, nil
}

// createSlot creates the slot (a failover slot with failover: PostgreSQL 17
// and later, failover.go) and, in the snapshot it exports (exactly the
// commits before the slot's consistent point), reads the lanes with unpublished
// events: those the stream will never send.
// slotCreateAttempts bounds createSlot's tries after serialization failures.
const slotCreateAttempts = 5

func createSlot(ctx context.Context, pool *pgxpool.Pool, c *Config, q *queries, failover bool) (pglogrepl.LSN, []laneSeen, error) {
	conn, err := replConn(ctx, pool)
	if err != nil {
		return 0, nil, err
	}
	defer conn.Close(context.Background())
	// The server refuses with a serialization failure when the snapshot it would
	// export lists too many transactions ("initial slot snapshot too large", seen
	// while other sessions ran many short transactions). The slot is not kept
	// then, and trying again once those transactions ended succeeds.
	var res pglogrepl.CreateReplicationSlotResult
	for attempt := 1; ; attempt++ {
		res, err = createSlotOnce(ctx, conn, c.Slot, failover)
		var pe *pgconn.PgError
		if err == nil || !errors.As(err, &pe) || pe.Code != "40001" || attempt == slotCreateAttempts {
			break
		}
		select {
		case <-time.After(time.Duration(attempt) * slotCreateBackoff):
		case <-ctx.Done():
			return 0, nil, fmt.Errorf("cdc: create replication slot %s: %w", c.Slot, ctx.Err())
		}
	}
	if err != nil {
		return 0, nil, fmt.Errorf("cdc: create replication slot %s: %w", c.Slot, err)
	}
	lsn, err := pglogrepl.ParseLSN(res.ConsistentPoint)
	if err != nil {
		return 0, nil, fmt.Errorf("cdc: slot %s: consistent point %q: %w", c.Slot, res.ConsistentPoint, err)
	}
	var lanes []laneSeen
	err = pgx.BeginTxFunc(ctx, pool, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly}, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "SET TRANSACTION SNAPSHOT "+quoteLiteral(res.SnapshotName)); err != nil {
			return err
		}
		lanes, err = readPendingLanes(ctx, tx, q)
		return err
	})
	if err != nil {
		return 0, nil, fmt.Errorf("cdc: read unpublished events as of the new slot: %w", err)
	}
	return lsn, lanes, nil
}

type laneSeen struct {
	key  pgoutbox.Lane
	seen int64
}

func readPendingLanes(ctx context.Context, db interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}, q *queries) ([]laneSeen, error) {
	rows, err := db.Query(ctx, q.pendingLanes)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (laneSeen, error) {
		var l laneSeen
		return l, r.Scan(&l.key.AggregateType, &l.key.AggregateID, &l.seen)
	})
}

// dropSlot drops the slot if it exists and no process streams from it.
func dropSlot(ctx context.Context, pool *pgxpool.Pool, slot string) error {
	_, err := pool.Exec(ctx, "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = $1", slot)
	if err != nil {
		return fmt.Errorf("cdc: drop replication slot %s: %w", slot, err)
	}
	return nil
}

// Disable turns the CDC source off for a schema and hands its events back to
// polling relays: it drops the slot (which must not be in use) and the
// publication, removes the column defaults that make new events CDC-owned, and
// releases the source's leases on unpublished events.
func Disable(ctx context.Context, pool *pgxpool.Pool, cfg *Config) error {
	c, err := cfg.withDefaults()
	if err != nil {
		return err
	}
	q := newQueries(c.Schema)
	if s, err := slotState(ctx, pool, &c); err != nil && !errors.Is(err, ErrSlotLost) {
		return err
	} else if s.exists {
		if err := dropSlot(ctx, pool, c.Slot); err != nil {
			return err
		}
	}
	if _, err := pool.Exec(ctx, "DROP PUBLICATION IF EXISTS "+pgx.Identifier{c.Publication}.Sanitize()); err != nil {
		return fmt.Errorf("cdc: drop publication %s: %w", c.Publication, err)
	}
	alter := fmt.Sprintf("ALTER TABLE %s ALTER COLUMN claimed_by DROP DEFAULT, ALTER COLUMN claim_until DROP DEFAULT", q.table)
	if _, err := pool.Exec(ctx, alter); err != nil {
		return fmt.Errorf("cdc: drop the CDC column defaults: %w", err)
	}
	if _, err := pool.Exec(ctx, q.releaseAll, c.Owner()); err != nil {
		return fmt.Errorf("cdc: release events to polling relays: %w", err)
	}
	return nil
}
