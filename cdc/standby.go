package cdc

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pglogrepl"

	"github.com/pgoutbox/pgoutbox/internal/retry"
)

// readStandbys is the statement name of checkStandbys, for dbFailed.
const readStandbys = "read the synchronous standbys' positions"

// The wait for synchronous standbys.
//
// Logical decoding (PostgreSQL 15) sends a transaction as soon as it is
// committed locally, before the synchronous standbys confirmed it; the
// producer's COMMIT is still waiting for them. If the primary failed then and
// a standby were promoted, the database would forget a transaction whose
// events the consumers already have (and reuse its aggregate sequences). So,
// when the server has synchronous standbys, a decoded transaction is held
// until enough of them report its end position in pg_stat_replication:
//
//   - which standbys: those with sync_state 'sync' or 'quorum'; how many: n
//     of synchronous_standby_names ("FIRST n (…)", "n (…)", "ANY n (…)"; 1 for
//     a plain list). A transaction is published once n of them are past its
//     end: for FIRST n that is every chosen standby, for ANY n a quorum, the
//     rule the server's own commit wait follows. Fewer than n connected: held.
//   - which position: flush_lsn (on disk on the standby, survives a crash of
//     its host), or replay_lsn when the server's synchronous_commit is
//     remote_apply. Never write_lsn: under remote_write the source still waits
//     for the flush, the safer of the two. The level a producer's session sets
//     for itself is not visible here; the server's setting is read, and a
//     session asking less (local, off) is still held for the flush.
//   - which end: the Commit message's transaction end (the end of the commit
//     record), what the server's commit waits for.
//   - the role needs pg_read_all_stats (pg_monitor includes it) to see other
//     roles' walsenders in pg_stat_replication; without it the standbys look
//     absent, and every transaction is held and the grant named (Healthy,
//     the log), never published unconfirmed.
//
// One query serves every held transaction: it runs when a transaction arrives
// past the known position, every Config.StandbyPollInterval while any is
// held, and every standbyRecheck otherwise (synchronous_standby_names may be
// changed by a reload) and after each reconnect of the stream.
//
// The hold is bound to the server the transactions were decoded on. The
// positions come through the pool, which may reach another server than the
// replication connection (a multi-host URL after a failover, a load
// balancer): the query also reads who answers (system identifier, timeline,
// the process holding the slot), and its answer counts only when that is the
// replication connection's own walsender (IDENTIFY_SYSTEM and its process id),
// the connection still up. A promoted standby shares the system identifier but
// not the timeline, and has no synchronous standbys of its own: its settings
// would release everything. When the stream ends, the held transactions are
// dropped and what was known of the standbys forgotten: the next connection
// reads them again from the slot's confirmed position on whatever server it
// reaches, and holds them for that server's standbys. PostgreSQL 17's
// failover slots with synchronized_standby_slots make the walsender itself
// wait for the listed standbys, which replaces this hold.

// Errors of Healthy about the synchronous standbys, matched with errors.Is.
var (
	// ErrSyncStandbyMissing: synchronous_standby_names is set and fewer
	// synchronous standbys than it requires are connected. The producers'
	// commits wait for them; the source holds every transaction too.
	ErrSyncStandbyMissing = errors.New("cdc: fewer synchronous standbys connected than synchronous_standby_names requires: holding transactions until they confirm")
	// ErrSyncStandbyBehind: a transaction has been held for the synchronous
	// standbys longer than StandbyHoldReport (a standby lags, hangs or is
	// partitioned away while still connected).
	ErrSyncStandbyBehind = errors.New("cdc: transactions held for the synchronous standbys")
	// ErrSyncStandbyOtherServer: the standbys' positions were read from
	// another server than the one the replication stream decodes from (the
	// pool reaches another host than the replication connection): they
	// release nothing, and every transaction is held.
	ErrSyncStandbyOtherServer = errors.New("cdc: the synchronous standbys' positions were read from another server than the replication stream's: holding transactions")
	// ErrSyncStandbyUnreadable: the source's role cannot read the standbys'
	// positions in pg_stat_replication. It also matches ErrPermissionDenied.
	ErrSyncStandbyUnreadable = fmt.Errorf("%w: the CDC role cannot read the synchronous standbys' positions (pg_stat_replication): "+
		"GRANT pg_monitor (or pg_read_all_stats) TO the CDC role; holding transactions until then", ErrPermissionDenied)
)

// StandbyWait is what the source knows of the synchronous standbys it waits for
// (Source.StandbyWait, Observer.StandbyChecked).
type StandbyWait struct {
	// Required is how many synchronous standbys must have a transaction before
	// its events are published (n of synchronous_standby_names); 0 when nothing
	// is held (no synchronous standbys, or Config.PublishUnreplicated).
	Required int
	// Connected is how many standbys pg_stat_replication shows as synchronous
	// (sync_state sync or quorum).
	Connected int
	// Position is the WAL position Required synchronous standbys have flushed
	// (replayed under synchronous_commit remote_apply): transactions that end
	// there or before may be published.
	Position pglogrepl.LSN
	// HeldTransactions and HeldEvents count the transactions received with
	// outbox events and held because they end past Position.
	HeldTransactions, HeldEvents int
	// Oldest is how long the oldest held transaction has been held.
	Oldest time.Duration
	// Err is why the last look failed or the standbys are missing
	// (ErrSyncStandbyMissing, ErrSyncStandbyUnreadable,
	// ErrSyncStandbyOtherServer, a database error), or nil.
	Err error
}

// serverID names the server a replication connection decodes from: its
// system identifier (a primary and its physical standbys share it), its
// timeline (a promoted standby starts a new one) and the walsender's process
// id (the one holding the slot there). The zero serverID: no stream.
type serverID struct {
	system   string
	timeline int64
	pid      uint32
}

// sameHistory reports whether a and b follow the same WAL history, in which
// positions compare: the same system and timeline.
func (a serverID) sameHistory(b serverID) bool {
	return a.system == b.system && a.timeline == b.timeline
}

// standbyState is the hold's state, under Source.mu.
type standbyState struct {
	known     bool          // a look succeeded since Start: until then everything is held
	off       bool          // nothing is held (Config.PublishUnreplicated, or no synchronous standbys)
	pos       pglogrepl.LSN // what enough synchronous standbys have
	required  int
	connected int
	err       error // ErrSyncStandbyMissing, ErrSyncStandbyUnreadable, ErrSyncStandbyOtherServer or nil
	behind    bool  // ErrSyncStandbyBehind was logged
}

// syncStandbysRequired returns how many synchronous standbys
// synchronous_standby_names (as the server accepted it) asks for: 0 when
// empty, n of "FIRST n (…)", "ANY n (…)" or "n (…)", 1 for a plain list.
func syncStandbysRequired(names string) (int, error) {
	s := strings.TrimSpace(names)
	if s == "" {
		return 0, nil
	}
	count := func(rest string) (int, bool, error) {
		rest = strings.TrimSpace(rest)
		i := 0
		for i < len(rest) && rest[i] >= '0' && rest[i] <= '9' {
			i++
		}
		if i == 0 || !strings.HasPrefix(strings.TrimSpace(rest[i:]), "(") {
			return 0, false, nil
		}
		n, err := strconv.Atoi(rest[:i])
		if err != nil || n < 1 {
			return 0, true, fmt.Errorf("cdc: synchronous_standby_names %q: bad number of standbys", names)
		}
		return n, true, nil
	}
	i := 0
	for i < len(s) && (s[i] >= 'a' && s[i] <= 'z' || s[i] >= 'A' && s[i] <= 'Z') {
		i++
	}
	if w := strings.ToUpper(s[:i]); w == "FIRST" || w == "ANY" {
		if n, ok, err := count(s[i:]); ok {
			return n, err
		}
	}
	if n, ok, err := count(s); ok {
		return n, err
	}
	return 1, nil // a plain list: the first connected one is synchronous
}

// standbyPosition returns the highest position that required of the
// synchronous standbys' positions (-1 for a NULL one) have reached, and false
// when fewer than required standbys are there to have it.
func standbyPosition(required int, positions []int64) (pglogrepl.LSN, bool) {
	if required < 1 || len(positions) < required {
		return 0, false
	}
	p := slices.Clone(positions)
	slices.Sort(p)
	slices.Reverse(p)
	if p[required-1] < 0 {
		return 0, false
	}
	return pglogrepl.LSN(p[required-1]), true
}

// releasableLocked reports whether t's events may be published (s.mu held).
func (s *Source) releasableLocked(t *txn) bool {
	sb := &s.sb
	return t.released || sb.off || (sb.known && t.end <= sb.pos)
}

// The transactions that may be published are a prefix of the queue (released
// is set in commit order, and so is end <= pos): the held ones are its tail,
// and the counts below walk back from the end.

// holdingLocked reports whether a transaction is held (s.mu held).
func (s *Source) holdingLocked() bool {
	for i := len(s.queue) - 1; i >= 0; i-- {
		if t := s.queue[i]; len(t.events) > 0 {
			return !s.releasableLocked(t)
		}
	}
	return false
}

// heldLocked counts the transactions held for the standbys, their events, and
// how long the oldest has been held (s.mu held).
func (s *Source) heldLocked(now time.Time) (txns, events int, oldest time.Duration) {
	for i := len(s.queue) - 1; i >= 0; i-- {
		t := s.queue[i]
		if len(t.events) == 0 {
			continue
		}
		if s.releasableLocked(t) {
			break
		}
		txns++
		events += len(t.events) - t.next
		oldest = now.Sub(t.received)
	}
	return txns, events, oldest
}

// StandbyWait returns what the source knows of the synchronous standbys and
// what it holds for them now.
func (s *Source) StandbyWait() StandbyWait {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.standbyWaitLocked(time.Now())
}

func (s *Source) standbyWaitLocked(now time.Time) StandbyWait {
	w := StandbyWait{Required: s.sb.required, Connected: s.sb.connected, Position: s.sb.pos, Err: s.sb.err}
	if s.sb.off {
		w.Required = 0
	}
	w.HeldTransactions, w.HeldEvents, w.Oldest = s.heldLocked(now)
	return w
}

// standbyErrors is Healthy's part about the standbys.
func (s *Source) standbyErrors() []error {
	s.mu.Lock()
	defer s.mu.Unlock()
	var errs []error
	if s.sb.err != nil {
		errs = append(errs, s.sb.err)
	}
	if n, _, oldest := s.heldLocked(time.Now()); oldest > StandbyHoldReport {
		errs = append(errs, fmt.Errorf("%w: %d transactions, the oldest for %s; the standbys have %s (%d of %d required connected)",
			ErrSyncStandbyBehind, n, oldest.Round(time.Millisecond), s.sb.pos, s.sb.connected, s.sb.required))
	}
	return errs
}

// watchStandbys reads the synchronous standbys' positions while transactions
// are held for them (one query for all, every StandbyPollInterval), and the
// setting every standbyRecheck otherwise, releasing what they have.
func (s *Source) watchStandbys() {
	var fail retry.Backoff
	for {
		d := standbyRecheck
		if err := s.checkStandbys(); err != nil {
			d = fail.Next()
		} else {
			fail.Reset()
			s.mu.Lock()
			held, _, _ := s.heldLocked(time.Now())
			s.mu.Unlock()
			if held > 0 {
				d = s.cfg.StandbyPollInterval
			}
		}
		t := time.NewTimer(d)
		select {
		case <-s.stopping:
			t.Stop()
			return
		case <-s.standbyWake:
		case <-t.C:
		}
		t.Stop()
	}
}

// checkStandbys reads synchronous_standby_names and the synchronous standbys'
// positions once, and releases the held transactions they have.
func (s *Source) checkStandbys() error {
	s.mu.Lock()
	on := s.streamOn
	s.mu.Unlock()
	if on == (serverID{}) {
		return nil // no stream, nothing held: the next connection pokes the watcher
	}
	var (
		names     string
		canRead   bool
		positions []int64
		system    string
		timeline  int64
		pid       int64
	)
	ctx, cancel := context.WithTimeout(s.hardCtx, StatementTimeout)
	err := s.pool.QueryRow(ctx, syncStandbysSQL, s.cfg.Slot).Scan(&names, &canRead, &positions, &system, &timeline, &pid)
	cancel()
	if err != nil {
		if s.hardCtx.Err() == nil {
			s.dbFailed(readStandbys, fmt.Errorf("%s: %w", readStandbys, err))
		}
		s.observeStandbys(err)
		return err
	}
	s.dbOK(readStandbys)
	required, perr := syncStandbysRequired(names)
	pos, enough := standbyPosition(required, positions)
	answered := serverID{system: system, timeline: timeline}
	if pid > 0 && pid <= math.MaxUint32 {
		answered.pid = uint32(pid)
	}
	var why error
	switch {
	case answered != on:
		why = fmt.Errorf("%w (the stream's: system %s, timeline %d, walsender %d; the positions': system %s, timeline %d, slot held by %d)",
			ErrSyncStandbyOtherServer, on.system, on.timeline, on.pid, answered.system, answered.timeline, answered.pid)
	case perr != nil:
		why = perr
	case required > 0 && !canRead:
		why = ErrSyncStandbyUnreadable
	case required > 0 && len(positions) < required:
		why = fmt.Errorf("%w (synchronous_standby_names %q: %d required, %d connected)", ErrSyncStandbyMissing, names, required, len(positions))
	}
	now := time.Now()
	s.mu.Lock()
	if s.streamOn != on {
		// The stream reconnected meanwhile: the held transactions were
		// dropped, and the positions may be another server's.
		s.mu.Unlock()
		s.standbyWake.Poke()
		return nil
	}
	sb := &s.sb
	was, before := sb.err, *sb
	if errors.Is(why, ErrSyncStandbyOtherServer) {
		// Nothing learnt of the stream's server: keep holding.
		sb.err = why
		s.mu.Unlock()
		if was == nil || was.Error() != why.Error() {
			s.log.Error("not publishing: the synchronous standbys' positions come from another server than the replication stream's", slog.Any("error", why))
		}
		s.observeStandbys(nil)
		return nil
	}
	sb.known, sb.off = true, required == 0 && perr == nil
	sb.required, sb.connected, sb.err = required, len(positions), why
	if enough && why == nil {
		sb.pos = max(sb.pos, pos) // a new synchronous standby behind the last one does not take back a release
	}
	at, release := sb.pos, !before.known || (sb.off && !before.off) || sb.pos > before.pos
	held, events, oldest := s.heldLocked(now)
	wasBehind, behind := sb.behind, held > 0 && oldest > StandbyHoldReport
	sb.behind = behind
	s.mu.Unlock()
	if release {
		s.work.Poke()
	}
	switch {
	case behind && !wasBehind:
		s.log.Warn("transactions held for the synchronous standbys", slog.Int("transactions", held), slog.Int("events", events),
			slog.Duration("oldest", oldest), slog.String("standby_position", at.String()))
	case !behind && wasBehind:
		s.log.Info("the synchronous standbys caught up; publishing again")
	}
	switch {
	case why != nil && (was == nil || was.Error() != why.Error()):
		lvl := slog.LevelWarn
		if errors.Is(why, ErrSyncStandbyUnreadable) || perr != nil {
			lvl = slog.LevelError
		}
		s.log.Log(s.hardCtx, lvl, "not publishing: the synchronous standbys cannot confirm transactions", slog.Any("error", why),
			slog.Int("held_transactions", held))
	case why == nil && was != nil:
		s.log.Info("the synchronous standbys confirm transactions again", slog.Int("required", required), slog.Int("connected", len(positions)))
	}
	s.observeStandbys(nil)
	return nil
}

// observeStandbys tells the Observer what the last look found.
func (s *Source) observeStandbys(err error) {
	if s.cfg.Observer == nil {
		return
	}
	s.mu.Lock()
	w := s.standbyWaitLocked(time.Now())
	s.mu.Unlock()
	if err != nil {
		w.Err = err
	}
	s.cfg.Observer.StandbyChecked(w)
}

// streamUp records the server the replication stream now decodes from (s.mu
// not held). What was known of the standbys belongs to the last connection
// and is forgotten (streamEnded did it). Positions of another WAL history (a
// promoted standby: a new timeline; another system) do not compare with those
// of the transactions still queued: the queued ones (released before the
// stream ended, on their own server's standbys' word) keep no position, so
// that settling them confirms nothing to the new slot and their events are
// looked up in the table before publishing, and the new slot's stream is
// taken from its start.
func (s *Source) streamUp(id serverID, walPos pglogrepl.LSN) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.history != (serverID{}) && !s.history.sameHistory(id) {
		for _, t := range s.queue {
			t.end = 0
		}
		s.confirmed, s.lastPushed, s.walEnd = 0, 0, 0
		// Events of the new history up to here may have been published from
		// the table (Recover): look them up first.
		s.checkUntil = max(s.checkUntil, walPos)
		s.log.Warn("the replication stream reached another server (a failover?): positions start again from its slot",
			slog.String("system", id.system), slog.Int64("timeline", id.timeline), slog.Int64("was_timeline", s.history.timeline))
	}
	s.history, s.streamOn = id, id
}

// streamEnded drops what was held for the standbys of the server the stream
// left (s.mu not held): those transactions are neither published nor
// confirmed, the next connection reads them again from the slot's confirmed
// position and holds them for its own server's standbys. What was known of
// the standbys is forgotten with them.
func (s *Source) streamEnded() {
	s.mu.Lock()
	txns, events := s.dropHeldLocked()
	s.streamOn = serverID{}
	s.sb = standbyState{off: s.cfg.PublishUnreplicated}
	s.mu.Unlock()
	if events > 0 {
		s.log.Info("replication stream ended: dropped the transactions held for the synchronous standbys; they are read again from the slot",
			slog.Int("transactions", txns), slog.Int("events", events))
	}
}

// dropHeldLocked removes from the queue the transactions not released to the
// dispatcher (a suffix of the queue: released is set in commit order, before
// any event of the transaction is handed out), so that the next connection's
// stream, which starts at the slot's confirmed position, brings them again
// (s.mu held). It returns how many transactions and events it dropped.
func (s *Source) dropHeldLocked() (txns, events int) {
	i := len(s.queue)
	for i > 0 && !s.queue[i-1].released {
		i--
	}
	for _, t := range s.queue[i:] {
		s.buffered -= t.unsettled
		events += len(t.events)
		txns++
	}
	clear(s.queue[i:])
	s.queue = s.queue[:i]
	s.lastPushed = s.confirmed
	if i > 0 {
		s.lastPushed = max(s.confirmed, s.queue[i-1].end)
	}
	return txns, events
}
