package cdc

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Failover slots (PostgreSQL 17 and later).
//
// On a server of version 17 or later the slot is a failover slot: created
// with FAILOVER true (an existing slot is altered to it at start). A physical
// standby with sync_replication_slots on then keeps a copy of it (synced),
// and the primary's walsender sends a decoded transaction only once every
// physical slot synchronized_standby_slots names has confirmed it: the source
// never publishes what a standby synchronising the slot lacks. After that
// standby is promoted, the source (on a multi-host URL) reaches it and
// resumes from the synced slot: its confirmed position may be behind the old
// primary's (the standby syncs it every few seconds), so what follows it is
// sent again and looked up in the table before publishing (Source.checkUntil):
// events marked published are not sent twice; events acknowledged and not yet
// marked when the primary failed are (the inbox absorbs them), as after any
// crash.
//
// A synced slot is usable after a promotion only when it is sync-ready on the
// standby: synced, not temporary (the standby has caught up with the
// primary's slot), not invalidated. The source checks at start, and every
// Config.FailoverCheckInterval, that synchronized_standby_slots names an
// active physical slot (a WARN when not) and, with Config.StandbyURL, that the
// standby's copy is sync-ready; the Observer (cdcprom's
// pgoutbox_cdc_failover_slot_ready gauge) and Source.FailoverReadiness report
// it. On an older server nothing of this runs, and after a failover the slot
// is missing (ErrSlotMissing): Recover.

// failoverVersion is the first server_version_num with failover slots.
const failoverVersion = 170000

// Errors of FailoverReadiness, matched with errors.Is.
var (
	// ErrFailoverNotSynchronized: synchronized_standby_slots is empty or names
	// no active physical slot: no standby is known to synchronise the slot,
	// and after a failover it would be missing (run Recover then).
	ErrFailoverNotSynchronized = errors.New("cdc: no standby synchronises the failover slot (synchronized_standby_slots names no active physical slot)")
	// ErrFailoverNotReady: the standby at Config.StandbyURL has no sync-ready
	// copy of the slot (absent, temporary, invalidated), or is not in
	// recovery: a promotion now would not find the slot usable.
	ErrFailoverNotReady = errors.New("cdc: the standby's copy of the failover slot is not sync-ready")
	// ErrFailoverStandbyUnreachable: the standby at Config.StandbyURL did not
	// answer.
	ErrFailoverStandbyUnreachable = errors.New("cdc: the failover standby (Config.StandbyURL) is unreachable")
)

// FailoverReadiness is what the source knows of its failover slot
// (Source.FailoverReadiness, Observer.FailoverChecked).
type FailoverReadiness struct {
	// Slot is the slot's name.
	Slot string
	// Checked: the server has failover slots (PostgreSQL 17 or later) and a
	// check ran. On older servers nothing is checked and the rest is zero.
	Checked bool
	// StandbySlots are the active physical slots synchronized_standby_slots
	// names on the primary: the standbys the walsender waits for.
	StandbySlots []string
	// StandbyChecked: Config.StandbyURL is set, and the standby answered.
	StandbyChecked bool
	// Ready: StandbySlots is not empty and, with Config.StandbyURL, the
	// standby's copy of the slot is sync-ready. Without StandbyURL only the
	// primary's side is known: a standby streams through a slot the walsender
	// waits for.
	Ready bool
	// Err is why not Ready: ErrFailoverNotSynchronized, ErrFailoverNotReady,
	// ErrFailoverStandbyUnreachable or a database error; nil when Ready.
	Err error
}

// serverVersion reads server_version_num.
func serverVersion(ctx context.Context, pool *pgxpool.Pool) (int, error) {
	var v int
	if err := pool.QueryRow(ctx, "SELECT current_setting('server_version_num')::int").Scan(&v); err != nil {
		return 0, fmt.Errorf("cdc: read server_version_num: %w", err)
	}
	return v, nil
}

// createSlotCommand is the replication command creating the slot with an
// exported snapshot, a failover slot when failover.
func createSlotCommand(slot string, failover bool) string {
	if failover {
		return fmt.Sprintf("CREATE_REPLICATION_SLOT %s LOGICAL pgoutput (SNAPSHOT 'export', FAILOVER true)", slot)
	}
	return fmt.Sprintf("CREATE_REPLICATION_SLOT %s LOGICAL pgoutput EXPORT_SNAPSHOT", slot)
}

// ensureFailover makes the existing idle slot a failover slot (PostgreSQL 17
// and later; a slot created before, by an older pgoutbox or by hand).
func ensureFailover(ctx context.Context, pool *pgxpool.Pool, c *Config) error {
	var failover bool
	if err := pool.QueryRow(ctx, "SELECT failover FROM pg_replication_slots WHERE slot_name = $1", c.Slot).Scan(&failover); err != nil {
		return fmt.Errorf("cdc: read slot %s: %w", c.Slot, err)
	}
	if failover {
		return nil
	}
	conn, err := replConn(ctx, pool)
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(ctx, "ALTER_REPLICATION_SLOT "+c.Slot+" (FAILOVER true)").ReadAll(); err != nil {
		return fmt.Errorf("cdc: make slot %s a failover slot: %w", c.Slot, err)
	}
	c.Logger.Info("made the replication slot a failover slot (PostgreSQL 17): a standby with sync_replication_slots keeps a copy",
		slog.String("slot", c.Slot))
	return nil
}

// failoverChecker checks the failover slot's readiness (PostgreSQL 17 and
// later).
type failoverChecker struct {
	primary, standby *pgxpool.Pool // standby nil without Config.StandbyURL
	slot             string
}

// openStandby opens a small pool on url (Config.StandbyURL). The URL's text
// is never in the error: it may hold a password.
func openStandby(url string) (*pgxpool.Pool, error) {
	pc, err := pgxpool.ParseConfig(url)
	if err != nil { // Config.validate has refused it already
		return nil, errors.New("cdc: Config.StandbyURL is not a valid connection string (the value is not shown: it may hold a password)")
	}
	pc.MaxConns = 1
	pc.MinConns = 0
	pool, err := pgxpool.NewWithConfig(context.Background(), pc)
	if err != nil {
		return nil, fmt.Errorf("cdc: Config.StandbyURL: %w", err)
	}
	return pool, nil
}

// check looks once.
func (f *failoverChecker) check(ctx context.Context) FailoverReadiness {
	r := FailoverReadiness{Slot: f.slot, Checked: true}
	err := f.primary.QueryRow(ctx, `SELECT coalesce(array_agg(slot_name::text ORDER BY slot_name), '{}')
  FROM pg_replication_slots WHERE slot_type = 'physical' AND active
  AND slot_name = ANY (string_to_array(replace(replace(current_setting('synchronized_standby_slots'), ' ', ''), '"', ''), ','))`).Scan(&r.StandbySlots)
	if err != nil {
		r.Err = fmt.Errorf("cdc: read synchronized_standby_slots: %w", err)
		return r
	}
	if len(r.StandbySlots) == 0 {
		r.Err = ErrFailoverNotSynchronized
		return r
	}
	if f.standby == nil {
		r.Ready = true
		return r
	}
	var inRecovery, ready bool
	err = f.standby.QueryRow(ctx, `SELECT pg_is_in_recovery(), coalesce((SELECT synced AND NOT temporary AND invalidation_reason IS NULL
  FROM pg_replication_slots WHERE slot_name = $1), false)`, f.slot).Scan(&inRecovery, &ready)
	if err != nil {
		r.Err = fmt.Errorf("%w: %w", ErrFailoverStandbyUnreachable, err)
		return r
	}
	r.StandbyChecked = true
	switch {
	case !inRecovery:
		r.Err = fmt.Errorf("%w: the server at Config.StandbyURL is not a standby (promoted?)", ErrFailoverNotReady)
	case !ready:
		r.Err = fmt.Errorf("%w: slot %q is missing, temporary or invalidated there (sync_replication_slots on? the standby caught up?)", ErrFailoverNotReady, f.slot)
	default:
		r.Ready = true
	}
	return r
}

// FailoverReadiness returns the last look at the failover slot's readiness
// (zero before the first one, and on servers older than PostgreSQL 17).
func (s *Source) FailoverReadiness() FailoverReadiness {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.failover
}

// startFailover checks the failover slot once at start, warning when no
// standby is known to synchronise it, and returns the checker for
// watchFailover (nil on servers older than PostgreSQL 17).
func (s *Source) startFailover(ctx context.Context, version int) (*failoverChecker, error) {
	if version < failoverVersion {
		return nil, nil
	}
	f := &failoverChecker{primary: s.pool, slot: s.cfg.Slot}
	if s.cfg.StandbyURL != "" {
		pool, err := openStandby(s.cfg.StandbyURL)
		if err != nil {
			return nil, err
		}
		f.standby = pool
	}
	cctx, cancel := context.WithTimeout(ctx, StatementTimeout) // an unreachable standby does not hold the start
	defer cancel()
	s.noteFailover(f.check(cctx))
	return f, nil
}

// noteFailover records a look and logs its changes.
func (s *Source) noteFailover(r FailoverReadiness) {
	s.mu.Lock()
	was := s.failover
	s.failover = r
	s.mu.Unlock()
	if s.cfg.Observer != nil {
		s.cfg.Observer.FailoverChecked(r)
	}
	switch {
	case r.Err != nil && (!was.Checked || was.Err == nil || was.Err.Error() != r.Err.Error()):
		s.log.Warn("the failover slot is not ready: after a failover the slot would be missing ('pgoutbox cdc recover' then)",
			slog.Any("error", r.Err), slog.String("standby_slots", strings.Join(r.StandbySlots, ",")))
	case r.Ready && !was.Ready:
		s.log.Info("the failover slot is ready: a standby synchronises it", slog.String("standby_slots", strings.Join(r.StandbySlots, ",")),
			slog.Bool("standby_checked", r.StandbyChecked))
	}
}

// watchFailover looks again every Config.FailoverCheckInterval until the stop.
func (s *Source) watchFailover(f *failoverChecker) {
	if f.standby != nil {
		defer f.standby.Close()
	}
	t := time.NewTicker(s.cfg.FailoverCheckInterval)
	defer t.Stop()
	for {
		select {
		case <-s.stopping:
			return
		case <-t.C:
		}
		ctx, cancel := context.WithTimeout(s.hardCtx, StatementTimeout)
		r := f.check(ctx)
		cancel()
		if s.hardCtx.Err() != nil {
			return
		}
		s.noteFailover(r)
	}
}

// createSlotOnce runs CREATE_REPLICATION_SLOT (createSlotCommand) and parses its answer.
func createSlotOnce(ctx context.Context, conn *pgconn.PgConn, slot string, failover bool) (pglogrepl.CreateReplicationSlotResult, error) {
	return pglogrepl.ParseCreateReplicationSlot(conn.Exec(ctx, createSlotCommand(slot, failover)))
}
