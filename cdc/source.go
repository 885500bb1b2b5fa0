// Package cdc is the relay's logical-replication source: instead of polling the
// outbox table, it follows the inserts into <schema>.outbox_events through a
// durable replication slot (pgoutput) and publishes them through the same
// broker.Publisher seam, with the same wire format, per-aggregate order, retry
// and quarantine rules and published_at bookkeeping as the polling relay.
//
// The slot's confirmed position advances only past events the broker
// acknowledged (and that were marked published), or whose failure was recorded
// in the table: a restart resumes there, so duplicates are possible and loss is
// not. A lane (one aggregate's events) whose event failed is handed to the
// table path, which publishes it from the table in sequence order, with backoff
// and quarantine, and hands it back to the stream once it caught up.
//
// A schema runs one source at a time: the CDC source owns every unpublished
// event (claimed_by "cdc:<slot>", claim_until infinity, new rows by column
// default), so a polling relay started by mistake finds nothing to claim.
// Disable hands the events back to polling relays. Recover recreates a lost
// slot and publishes from the table what the stream will never send.
// On PostgreSQL 17 and later the slot is a failover slot: a standby with
// sync_replication_slots keeps a copy, from which the source resumes after
// that standby's promotion (FailoverReadiness says whether one is ready).
//
// docs/design.md ("CDC source") states the rules and what each crash leaves.
//
// Outside the standard library it pulls in pgx, pglogrepl, the OpenTelemetry trace
// API (the root package's) and the Prometheus client for Source.Collector; no
// broker client.
package cdc

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgoutbox/pgoutbox"
	"github.com/pgoutbox/pgoutbox/broker"
	"github.com/pgoutbox/pgoutbox/internal/failpoint"
	"github.com/pgoutbox/pgoutbox/internal/lifecycle"
	"github.com/pgoutbox/pgoutbox/internal/pipeline"
	"github.com/pgoutbox/pgoutbox/internal/retry"
	"github.com/pgoutbox/pgoutbox/migrate"
)

// laneOf returns the lane of a message.
func laneOf(m *broker.Message) pgoutbox.Lane { return pgoutbox.LaneOf(m.AggregateType, m.AggregateID) }

// laneState is a lane the table path owns.
type laneState struct {
	seen int64     // highest sequence the stream skipped (or the table held) for the lane
	due  time.Time // when the table path looks at the lane next
}

// txn is one committed transaction received from the slot.
type txn struct {
	end    pglogrepl.LSN // confirming it means: everything up to its commit is settled
	commit time.Time
	events []broker.Message // sorted by lane, then sequence
	// refused holds why an event cannot become a message (headers that are not
	// a JSON object of strings, written by a raw INSERT): it is quarantined.
	refused   map[pgoutbox.UUID]error
	mem       arena // the events' payloads
	next      int   // events[:next] were handed out or skipped
	unsettled int
	received  time.Time // when push queued it
	// released: the synchronous standbys have it (or none is waited for); its
	// events may be published (standby.go).
	released bool
}

// item is one event of a batch: the pipeline's Event (its message, attempts
// before this one, and why it cannot be sent: see txn.refused), and where it
// came from.
type item struct {
	pipeline.Event
	tx *txn // nil for the table path
	// check: the event may have been published already (Source.checkUntil);
	// the stream looks it up before publishing.
	check bool
}

// Source streams outbox inserts from a replication slot to a broker. Create it
// with New, Start it, Stop it; it is not restartable.
type Source struct {
	cfg  Config
	pool *pgxpool.Pool
	pub  broker.Publisher
	q    queries
	log  *slog.Logger
	pipe pipeline.Config // publishing and judging a batch (the polling relay's pipeline too)
	// afterMark, set by a test only, runs between markAll's update and its
	// look for events published meanwhile.
	afterMark func()

	mu      sync.Mutex
	blocked map[pgoutbox.Lane]*laneState
	// lanesOut holds the lanes of the stream's batches being published: a
	// lane is in one batch at a time, so its next event goes out only once
	// the previous one's ack is in (and a failure blocked the lane).
	lanesOut   map[pgoutbox.Lane]struct{}
	queue      []*txn // received, not wholly settled, in commit order
	buffered   int    // events of queue not settled
	confirmed  pglogrepl.LSN
	lastPushed pglogrepl.LSN
	walEnd     pglogrepl.LSN // a keepalive's position, safe to confirm once queue is empty
	// checkUntil: the events of transactions that end at or before it may
	// have been published by someone else (a previous run, or the table path
	// before it handed their lane back); they are looked up in the table
	// before publishing. Later ones cannot have been: their commit was not
	// made yet when the position was read.
	checkUntil pglogrepl.LSN
	sb         standbyState // the wait for synchronous standbys (standby.go)
	// streamOn is the server the replication stream decodes from now (zero
	// while it is down); history the last one it reached (standby.go).
	streamOn, history serverID
	// failover is the last look at the failover slot's readiness (failover.go).
	failover FailoverReadiness
	// started is when Start ran, for the heartbeat (heartbeat.go).
	started time.Time

	// lc is the start/stop protocol (package lifecycle): the one rule for Start
	// twice, Stop twice, Start after Stop, Stop before Start and Start's context
	// ending.
	lc lifecycle.Lifecycle
	// stopping is lc.Stopping(); hardCtx is lc.Hard() once started (Recover's
	// own context in Recover): the context of work in flight.
	stopping <-chan struct{}
	hardCtx  context.Context
	// streamed is set once Start succeeded: the stream held the slot, and the
	// stop waits for the server to release it.
	streamed atomic.Bool

	work, space, tableWake, brokerBack, standbyWake lifecycle.Wake

	// inFlight counts the stream's batches assembled and not yet settled
	// (published, or being marked).
	inFlight atomic.Int32
	// pausedUntil (unix nanoseconds): the broker looked unreachable; the
	// dispatcher assembles nothing before then unless the table path gets an
	// ack through (brokerBack).
	pausedUntil atomic.Int64
	// marks tracks the marks of wholly acknowledged batches in progress, so
	// that a batch with a failure can wait for the marks begun before it.
	marks markTickets
	// health is the database's and the broker's state for Healthy, per
	// statement (retryDB's what) for a missing privilege: a role may be
	// allowed to read and not to mark.
	health     pipeline.Health
	streamDown atomic.Pointer[error] // why the replication stream is down (a redactedError), or nil
	stats      counters
}

type counters struct {
	pipeline.Counters                           // published, failed, quarantined
	fromTable, duplicates, skipped atomic.Int64 // see Stats
}

// Stats are a source's counters since Start.
type Stats struct {
	Published   int64 // events acknowledged by the broker and marked published
	FromTable   int64 // of Published, those the table path published
	Failed      int64 // failed publish attempts recorded
	Quarantined int64 // events quarantined
	Duplicates  int64 // streamed events not sent again because they were published already
	Skipped     int64 // streamed events left to the table path (their lane was blocked)
}

// New returns a source reading the slot through pool's server and publishing
// with pub. cfg may be nil for all defaults; invalid settings are reported here.
// The pool's role needs the REPLICATION attribute.
func New(pool *pgxpool.Pool, pub broker.Publisher, cfg *Config) (*Source, error) {
	if pool == nil || pub == nil {
		return nil, errors.New("cdc: New needs a pool and a publisher")
	}
	c, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	s := &Source{
		cfg: c, pool: pool, pub: pub, q: newQueries(c.Schema),
		log:        c.Logger.With(slog.String("source", "cdc"), slog.String("slot", c.Slot)),
		blocked:    map[pgoutbox.Lane]*laneState{},
		lanesOut:   map[pgoutbox.Lane]struct{}{},
		work:       lifecycle.NewWake(),
		space:      lifecycle.NewWake(),
		tableWake:  lifecycle.NewWake(),
		brokerBack: lifecycle.NewWake(),

		standbyWake: lifecycle.NewWake(),
	}
	s.pipe = pipeline.Config{
		Broker: pub, Timeout: c.PublishTimeout, NotAttempted: pipeline.ResultHeld,
		Policy: retry.Policy{MaxAttempts: c.MaxAttempts, BackoffBase: c.BackoffBase, BackoffMax: c.BackoffMax},
		// A quarantined lane is looked at again for an operator's retry.
		QuarantineDelay: c.PollInterval,
		Observed:        c.Observer != nil, Log: s.log,
	}
	s.health = pipeline.Health{
		Errs: pipeline.Sentinels{
			DatabaseUnreachable: ErrDatabaseUnreachable, PermissionDenied: ErrPermissionDenied,
			BrokerUnreachable: ErrBrokerUnreachable, BrokerMisconfigured: ErrBrokerMisconfigured,
		},
		Log: s.log, Name: "the CDC source", Role: "cdc",
	}
	s.sb.off = c.PublishUnreplicated
	s.marks.cond.L = &s.marks.mu
	s.lc.Name = "cdc"
	s.lc.Stopped = s.stopped
	s.stopping = s.lc.Stopping()
	return s, nil
}

// Config returns the source's configuration with its defaults applied.
func (s *Source) Config() Config { return s.cfg }

// Stats returns the source's counters.
func (s *Source) Stats() Stats {
	c := &s.stats
	return Stats{Published: c.Published.Load(), FromTable: c.fromTable.Load(), Failed: c.Failed.Load(),
		Quarantined: c.Quarantined.Load(), Duplicates: c.duplicates.Load(), Skipped: c.skipped.Load()}
}

// Errors of Healthy, matched with errors.Is.
var (
	// ErrDatabaseUnreachable: the last round trip to the database failed.
	ErrDatabaseUnreachable = errors.New("cdc: database unreachable")
	// ErrPermissionDenied: the database answers but refuses the source's
	// statements for want of a privilege (SQLSTATE 42501). It also matches
	// migrate.ErrPermissionDenied.
	ErrPermissionDenied = fmt.Errorf("cdc: %w", migrate.ErrPermissionDenied)
	// ErrBrokerUnreachable: the last batch failed with the broker unreachable.
	ErrBrokerUnreachable = errors.New("cdc: broker unreachable")
	// ErrBrokerMisconfigured: the broker answers but refuses the source's
	// configuration (credentials, signing secret, permissions;
	// broker.Misconfigured). Healthy adds the broker's answer.
	ErrBrokerMisconfigured = errors.New("cdc: the broker refuses the relay's configuration (credentials, signing secret, permissions)")
	// ErrStreamDown: the replication stream is down and reconnecting with
	// backoff. Healthy adds why (which may match ErrSlotMissing or
	// ErrSlotActive).
	ErrStreamDown = errors.New("cdc: replication stream down")
)

// Healthy reports nil when the last contact with the database, the broker and
// the replication stream succeeded, else what is wrong, each matchable with
// errors.Is: ErrDatabaseUnreachable, ErrPermissionDenied (with the database's
// message: which privilege on which table, for each statement refused),
// ErrBrokerUnreachable, ErrBrokerMisconfigured (with the broker's answer),
// ErrStreamDown (with why), ErrSyncStandbyMissing, ErrSyncStandbyBehind,
// ErrSyncStandbyUnreadable and ErrSyncStandbyOtherServer (transactions held
// for the synchronous standbys, standby.go), or several (errors.Join).
func (s *Source) Healthy() error {
	errs := s.health.Errors()
	if why := s.streamDown.Load(); why != nil {
		errs = append(errs, fmt.Errorf("%w: %w", ErrStreamDown, *why))
	}
	errs = append(errs, s.standbyErrors()...)
	return errors.Join(errs...)
}

// Start runs the start-up checks and set-up (publication, slot, ownership of
// unpublished events), waits for the replication stream to be up (so that a
// slot in use elsewhere is reported here rather than in the logs), and returns
// their error, if any; then the source streams in the background until Stop.
// The set-up is bounded by StartTimeout.
//
// Start follows package lifecycle's one rule: it runs once (a second Start
// returns an error matching lifecycle.ErrAlreadyStarted); a source whose Start
// failed, or that was stopped, cannot start again (lifecycle.ErrStopped): make a
// new one. The end of ctx is a hard stop, as Stop with an expired context.
func (s *Source) Start(ctx context.Context) error {
	return s.lc.Start(ctx, s.start)
}

// start is the set-up run inside Lifecycle.Start: if it fails, the goroutines
// it launched are hard-stopped and waited for, and the source is stopped for
// good.
func (s *Source) start(ctx context.Context) error {
	sctx, cancel := context.WithTimeout(ctx, StartTimeout)
	defer cancel()
	lanes, lsn, version, err := prepare(sctx, s.pool, &s.cfg, &s.q, false)
	if err != nil {
		return err
	}
	s.confirmed, s.lastPushed = lsn, lsn
	if s.checkUntil, err = walInsertPosition(sctx, s.pool); err != nil {
		return err
	}
	// Last of what may fail: the checker's pool is closed by watchFailover.
	failover, err := s.startFailover(sctx, version)
	if err != nil {
		return err
	}
	now := time.Now()
	for _, l := range lanes {
		s.blocked[l.key] = &laneState{seen: l.seen, due: now}
	}
	s.hardCtx = s.lc.Hard()
	s.log.Info("cdc source starting", slog.String("schema", s.cfg.Schema), slog.String("publication", s.cfg.Publication),
		slog.String("confirmed_lsn", lsn.String()), slog.Int("backfill_lanes", len(lanes)))
	ready := make(chan error, 1)
	s.lc.Go(func() { s.stream(ready) })
	s.lc.Go(s.dispatch)
	s.lc.Go(s.tablePath)
	if !s.cfg.PublishUnreplicated {
		s.lc.Go(s.watchStandbys)
	}
	if failover != nil {
		s.lc.Go(func() { s.watchFailover(failover) })
	}
	s.started = now
	s.lc.Go(s.beats)
	select {
	case err := <-ready:
		if err != nil {
			return err
		}
	case <-sctx.Done():
		return fmt.Errorf("cdc: start replication: %w", sctx.Err())
	}
	s.streamed.Store(true)
	return nil
}

// prepare runs the checks, creates what is missing and takes ownership. It
// returns the lanes the table path must publish first (unpublished events the
// stream will not send), the slot's confirmed position and the server's
// version (server_version_num). With recreate, an existing idle slot is
// dropped first. On PostgreSQL 17 and later the slot is a failover slot
// (failover.go).
func prepare(ctx context.Context, pool *pgxpool.Pool, c *Config, q *queries, recreate bool) ([]laneSeen, pglogrepl.LSN, int, error) {
	slot, err := checkServer(ctx, pool, c)
	if err != nil && !(recreate && errors.Is(err, ErrSlotLost)) {
		return nil, 0, 0, err
	}
	version, err := serverVersion(ctx, pool)
	if err != nil {
		return nil, 0, 0, err
	}
	failover := version >= failoverVersion
	if err := ensurePublication(ctx, pool, c); err != nil {
		return nil, 0, 0, err
	}
	if err := ensureOwnership(ctx, pool, c, q); err != nil {
		return nil, 0, 0, err
	}
	if slot.exists && recreate {
		if err := dropSlot(ctx, pool, c.Slot); err != nil {
			return nil, 0, 0, err
		}
		slot.exists = false
	}
	if !slot.exists {
		lsn, lanes, err := createSlot(ctx, pool, c, q, failover)
		return lanes, lsn, version, err
	}
	if failover {
		if err := ensureFailover(ctx, pool, c); err != nil {
			return nil, 0, 0, err
		}
	}
	var lsn pglogrepl.LSN
	var text *string
	if err := pool.QueryRow(ctx, "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = $1", c.Slot).Scan(&text); err != nil {
		return nil, 0, 0, fmt.Errorf("cdc: read slot %s: %w", c.Slot, err)
	}
	if text != nil {
		if lsn, err = pglogrepl.ParseLSN(*text); err != nil {
			return nil, 0, 0, fmt.Errorf("cdc: slot %s: %w", c.Slot, err)
		}
	}
	// Every unpublished event committed before the confirmed position is one the
	// stream will not send again: failed, held back behind a failure, or acked
	// and not marked when the last run died. The previous run saw all of them
	// committed, so this snapshot sees them; the table path owns their lanes.
	lanes, err := readPendingLanes(ctx, pool, q)
	if err != nil {
		return nil, 0, 0, fmt.Errorf("cdc: read unpublished events: %w", err)
	}
	return lanes, lsn, version, nil
}

// walInsertPosition reads the server's WAL insert position: every transaction
// visible now ends at or before it (a commit record is inserted before the
// transaction becomes visible).
func walInsertPosition(ctx context.Context, pool *pgxpool.Pool) (pglogrepl.LSN, error) {
	var text string
	if err := pool.QueryRow(ctx, walInsertPositionSQL).Scan(&text); err != nil {
		return 0, fmt.Errorf("cdc: read the WAL position: %w", err)
	}
	lsn, err := pglogrepl.ParseLSN(text)
	if err != nil {
		return 0, fmt.Errorf("cdc: read the WAL position: %w", err)
	}
	return lsn, nil
}

// Stop shuts the source down: no new batches, the batch in flight is published
// and settled, and the confirmed position is reported to the server. If ctx ends
// first, in-flight publishes are abandoned (the restart publishes them again)
// and ctx's error is returned. Stop may be called any number of times, and
// before Start (the source then never starts); every call waits for the same
// shutdown (package lifecycle's rule).
func (s *Source) Stop(ctx context.Context) error {
	return s.lc.Stop(ctx)
}

// stopped is the Lifecycle's Stopped hook: it runs once every goroutine has
// returned. The server releases the slot a moment after the connection closes;
// it waits for that (at most SlotReleaseWait) so that a restart right away does
// not find the slot in use, and logs the totals. It writes the heartbeat's
// state stopped first.
func (s *Source) stopped(bool) {
	if !s.started.IsZero() {
		s.beatStopped()
	}
	if !s.streamed.Load() {
		return // the start failed: the slot was not ours
	}
	wctx, wcancel := context.WithTimeout(context.Background(), SlotReleaseWait)
	defer wcancel()
	for {
		var active bool
		err := s.pool.QueryRow(wctx, "SELECT coalesce(bool_or(active), false) FROM pg_replication_slots WHERE slot_name = $1", s.cfg.Slot).Scan(&active)
		if err != nil || !active || !retry.Sleep(wctx, slotReleasePoll) {
			break
		}
	}
	st := s.Stats()
	s.log.Info("cdc source stopped", slog.Int64("published", st.Published), slog.Int64("failed", st.Failed),
		slog.Int64("quarantined", st.Quarantined))
}

// push queues a transaction received from the slot. After a reconnect the server
// sends again what followed the confirmed position; transactions queued already
// are dropped by their end position.
func (s *Source) push(t *txn) {
	slices.SortFunc(t.events, func(a, b broker.Message) int {
		return pgoutbox.CompareInLane(laneOf(&a), a.AggregateSequence, laneOf(&b), b.AggregateSequence)
	})
	s.mu.Lock()
	if t.end <= s.lastPushed {
		s.mu.Unlock()
		return
	}
	t.unsettled, t.received = len(t.events), time.Now()
	// The watcher looks at the standbys at once when this is the first
	// transaction to hold; while others are held, its next poll covers this one.
	look := len(t.events) > 0 && !s.releasableLocked(t) && !s.holdingLocked()
	s.queue = append(s.queue, t)
	s.buffered += len(t.events)
	s.lastPushed = t.end
	s.advanceLocked()
	s.mu.Unlock()
	if look {
		s.standbyWake.Poke()
	}
	s.work.Poke()
}

func (s *Source) full() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.buffered >= s.cfg.MaxBuffered
}

// advanceLocked drops settled transactions from the head of the queue and moves
// the confirmed position to the end of the last one.
func (s *Source) advanceLocked() {
	n := 0
	for n < len(s.queue) && s.queue[n].unsettled == 0 && s.queue[n].next == len(s.queue[n].events) {
		s.confirmed = max(s.confirmed, s.queue[n].end)
		n++
	}
	if n > 0 {
		clear(s.queue[:n])
		s.queue = s.queue[n:]
	}
}

// reportable is the position to confirm to the server: the end of the last
// settled transaction or, when nothing received is unsettled, the server's last
// keepalive position (WAL of other tables, and of our own marks, must not be
// retained for us).
func (s *Source) reportable() pglogrepl.LSN {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.queue) == 0 {
		return max(s.confirmed, s.walEnd)
	}
	return s.confirmed
}

// oldestUnconfirmed is the commit time of the oldest transaction received and not
// yet settled (zero when none).
func (s *Source) oldestUnconfirmed() time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.queue) == 0 {
		return time.Time{}
	}
	return s.queue[0].commit
}

// dispatch turns queued transactions into batches and publishes up to
// Config.Workers of them at once, each on a goroutine of its own. The batches
// out share no lane: an event whose lane is in a batch being published waits
// for that batch's acks, so a lane whose event fails is blocked before its
// next event is looked at, as with one batch at a time. A batch the broker
// acknowledged whole gives its lanes back at once and is marked while the
// next ones go out; a batch with a failure first waits for the marks begun
// before it, then records the failure and blocks the lane.
func (s *Source) dispatch() {
	slots := make(chan struct{}, s.cfg.Workers)
	var workers sync.WaitGroup
	defer workers.Wait() // a stop lets the batches out finish and settle
	for {
		select {
		case <-s.stopping:
			return
		case <-s.work:
		}
		for {
			if !s.waitPause() {
				return
			}
			select {
			case <-s.stopping:
				return
			case slots <- struct{}{}:
			}
			s.inFlight.Add(1)
			batch := s.assemble()
			if len(batch) == 0 {
				s.inFlight.Add(-1)
				<-slots
				break // until a push, a hand-back of lanes or a settled batch pokes work
			}
			workers.Add(1)
			go func() {
				defer workers.Done()
				if pause := s.process(batch); pause > 0 {
					s.pausedUntil.Store(time.Now().Add(pause).UnixNano())
				}
				s.inFlight.Add(-1)
				<-slots
				s.work.Poke()
			}()
		}
	}
}

// waitPause waits while the broker looks unreachable: for the table path to
// get an ack through, or for the pause to end. It returns false on stop.
func (s *Source) waitPause() bool {
	until := s.pausedUntil.Load()
	if until == 0 {
		return true
	}
	if d := time.Until(time.Unix(0, until)); d > 0 {
		t := time.NewTimer(d)
		defer t.Stop()
		select {
		case <-s.stopping:
			return false
		case <-s.brokerBack:
		case <-t.C:
		}
	}
	s.pausedUntil.CompareAndSwap(until, 0)
	return true
}

// markTickets numbers the marks of wholly acknowledged batches, so that a
// batch with a failure can wait for every mark begun before it: those may hold
// earlier events of its failed lane, which the table path must find published.
// Its cond's L is its mu (set by New).
type markTickets struct {
	mu      sync.Mutex
	cond    sync.Cond
	next    uint64
	pending map[uint64]struct{}
}

// begin registers a mark about to start.
func (m *markTickets) begin() uint64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.pending == nil {
		m.pending = map[uint64]struct{}{}
	}
	t := m.next
	m.next++
	m.pending[t] = struct{}{}
	return t
}

// end records that mark t is over (done, or abandoned by a hard stop).
func (m *markTickets) end(t uint64) {
	m.mu.Lock()
	delete(m.pending, t)
	m.mu.Unlock()
	m.cond.Broadcast()
}

// waitBegun waits until every mark begun so far is over.
func (m *markTickets) waitBegun() {
	m.mu.Lock()
	until := m.next
	m.mu.Unlock()
	m.waitBefore(until)
}

// waitBefore waits until every mark numbered below until is over.
func (m *markTickets) waitBefore(until uint64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for {
		waiting := false
		for t := range m.pending {
			if t < until {
				waiting = true
				break
			}
		}
		if !waiting {
			return
		}
		m.cond.Wait()
	}
}

// assemble takes the next batch from the queue. Events of lanes the table path
// owns are skipped (settled at once: the table has them); the lane remembers the
// highest sequence skipped.
//
// Events are taken in commit order, up to the first whose lane is in a batch
// being published (lanesOut). Stopped there with less than a quarter of a
// batch while at least that many events wait, it takes nothing: under load,
// small batches cost a publish and a mark each, and the lanes come back with
// the next acks. With few events waiting it takes what may go (latency).
func (s *Source) assemble() []item {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.lanesOut) > 0 {
		quarter := max(1, s.cfg.BatchSize/4)
		if n, waiting := s.takeableLocked(); n < quarter && waiting >= quarter {
			return nil
		}
	}
	var out []item
	skipped := 0
	mine := map[pgoutbox.Lane]struct{}{}
	conflict := false
	for _, t := range s.queue {
		if t.next < len(t.events) && !s.releasableLocked(t) {
			break // this and every later transaction wait for the synchronous standbys
		}
		t.released = true
		for t.next < len(t.events) && len(out) < s.cfg.BatchSize {
			m := &t.events[t.next]
			l := laneOf(m)
			if st := s.blocked[l]; st != nil {
				t.next++
				st.seen = max(st.seen, m.AggregateSequence)
				t.unsettled--
				s.buffered--
				skipped++
				continue
			}
			if _, out := s.lanesOut[l]; out {
				if _, ours := mine[l]; !ours {
					conflict = true // its previous event's ack is not in yet
					break
				}
			}
			t.next++
			mine[l] = struct{}{}
			out = append(out, item{Event: pipeline.Event{Msg: *m, Refused: t.refused[m.EventID]}, tx: t, check: t.end <= s.checkUntil})
		}
		if conflict || len(out) >= s.cfg.BatchSize {
			break
		}
	}
	for l := range mine {
		s.lanesOut[l] = struct{}{}
	}
	if skipped > 0 {
		s.stats.skipped.Add(int64(skipped))
		s.advanceLocked()
		s.space.Poke()
	}
	return out
}

// takeableLocked counts the events assemble would take now, up to a batch:
// in commit order, up to the first whose lane is out in another batch; and
// the events waiting to be handed out, up to a batch (s.mu held).
func (s *Source) takeableLocked() (n, waiting int) {
	seen := map[pgoutbox.Lane]struct{}{}
	stopped := false
	for _, t := range s.queue {
		if t.next < len(t.events) && !s.releasableLocked(t) {
			break
		}
		for i := t.next; i < len(t.events) && waiting < s.cfg.BatchSize; i++ {
			l := laneOf(&t.events[i])
			if s.blocked[l] != nil {
				continue
			}
			waiting++
			if stopped {
				continue
			}
			if _, out := s.lanesOut[l]; out {
				if _, ours := seen[l]; !ours {
					stopped = true
					continue
				}
			}
			seen[l] = struct{}{}
			n++
		}
		if waiting >= s.cfg.BatchSize {
			break
		}
	}
	return n, waiting
}

// releaseLanesLocked gives a batch's lanes back for the next batches (s.mu
// held).
func (s *Source) releaseLanesLocked(batch []item) {
	for i := range batch {
		delete(s.lanesOut, batch[i].Lane())
	}
}

// process publishes one batch from the stream and settles it. It returns how long
// to pause when the broker looked unreachable.
func (s *Source) process(batch []item) time.Duration {
	var ids []pgoutbox.UUID
	for i := range batch {
		if batch[i].check {
			ids = append(ids, batch[i].Msg.EventID)
		}
	}
	// After a restart the stream sends again what followed the confirmed
	// position, and after the table path handed a lane back the stream may
	// bring events it published: what was marked published then is not sent
	// twice. Events committed after both cannot be published yet, and are not
	// looked up: in a steady stream, no batch is.
	var done []pgoutbox.UUID
	if len(ids) > 0 {
		// A batch acknowledged whole gives its lanes back before its mark: after
		// a reconnect (a failover to a synced slot) the stream may bring its
		// events again while that mark waits for the database. Let the marks
		// begun so far land first, so that the look finds them published.
		s.marks.waitBegun()
	}
	if len(ids) > 0 && !s.retryDB("look up published events", func(ctx context.Context) error {
		rows, err := s.pool.Query(ctx, s.q.alreadyPublished, pgUUIDs(ids))
		if err != nil {
			return err
		}
		done, err = collectIDs(rows)
		return err
	}) {
		return 0 // hard stop: nothing settled, nothing confirmed
	}
	send := batch
	if len(done) > 0 {
		skip := map[pgoutbox.UUID]bool{}
		for _, id := range done {
			skip[id] = true
		}
		send = nil
		for _, it := range batch {
			if !skip[it.Msg.EventID] {
				send = append(send, it)
			}
		}
		s.stats.duplicates.Add(int64(len(batch) - len(send)))
	}
	res := settled{failedLanes: map[pgoutbox.Lane]time.Duration{}}
	if len(send) > 0 {
		results, took := pipeline.Publish(s.hardCtx, &s.pipe, send)
		_ = failpoint.Inject(failpoint.CDCAfterPublish) // crash or delay only: the broker has spoken
		if s.hardCtx.Err() != nil {
			s.mu.Lock()
			s.releaseLanesLocked(batch)
			s.mu.Unlock()
			return 0 // abandoned: leave everything for the restart
		}
		j := s.judge(send, results, &res)
		if len(j.Acked) == len(send) {
			// Acknowledged whole: the lanes may go on in the next batches while
			// this one is marked.
			ticket := s.marks.begin()
			s.mu.Lock()
			s.releaseLanesLocked(batch)
			s.mu.Unlock()
			s.work.Poke()
			ok := s.record(PathStream, &j, took, &res)
			s.marks.end(ticket)
			if ok {
				s.settleBatch(batch, send, res, false)
			} // else hard-stopped: nothing settled, nothing confirmed
			return 0
		}
		// A failure blocks its lane: the marks begun before land first, so that
		// the table path, reading the lane from the table, does not find their
		// events unpublished and send them again.
		s.marks.waitBegun()
		if !s.record(PathStream, &j, took, &res) {
			s.mu.Lock()
			s.releaseLanesLocked(batch)
			s.mu.Unlock()
			return 0
		}
	}
	s.settleBatch(batch, send, res, true)
	if res.allUnavailable {
		// Hold the stream (the slot's lag grows, the server keeps the WAL) rather
		// than hand every lane to the table path one failure at a time; the table
		// path's retries of the failed lanes tell when the broker is back.
		return brokerOutagePause
	}
	return 0
}

// settleBatch counts a stream batch settled (sent is what was published of
// it, res what settling found): lanes with a failed event go to the table
// path, the batch's lanes are given back when release (a batch acknowledged
// whole gave them back before its mark: they may be out in a later batch
// now), and the confirmed position moves past transactions now wholly
// settled.
func (s *Source) settleBatch(batch, sent []item, res settled, release bool) {
	now := time.Now()
	s.mu.Lock()
	if release {
		s.releaseLanesLocked(batch)
	}
	for l, delay := range res.failedLanes {
		st := &laneState{due: now.Add(delay)}
		for _, it := range sent {
			if it.Lane() == l {
				st.seen = max(st.seen, it.Msg.AggregateSequence)
			}
		}
		s.blocked[l] = st
	}
	for _, it := range batch {
		it.tx.unsettled--
		s.buffered--
	}
	s.advanceLocked()
	s.mu.Unlock()
	s.space.Poke()
	if len(res.failedLanes) > 0 {
		s.tableWake.Poke()
	}
}

// settled is what settle found.
type settled struct {
	acked          int
	failedLanes    map[pgoutbox.Lane]time.Duration // lanes with a failed event → its backoff
	allUnavailable bool                            // failures only, all of them broker outages
}

// settle records the outcome of a publish from path in the table: acked events
// published, failed ones retried later (attempt_count, last_error,
// available_at) or quarantined, as the pipeline judged them against the
// policy, exactly as the polling relay does. Events not sent because an
// earlier event of their lane failed are left as they are. It returns false if
// the source was hard-stopped before the outcome was recorded.
func (s *Source) settle(path Path, items []item, results []error, took time.Duration) (settled, bool) {
	res := settled{failedLanes: map[pgoutbox.Lane]time.Duration{}}
	if s.hardCtx.Err() != nil {
		return res, false // abandoned: leave everything for the restart
	}
	j := s.judge(items, results, &res)
	return res, s.record(path, &j, took, &res)
}

// judge sorts a publish's results (pipeline.Judge); a failed event's lane
// goes into res.failedLanes with its backoff (PollInterval when quarantined).
func (s *Source) judge(items []item, results []error, res *settled) pipeline.Judged {
	j := pipeline.Judge(&s.pipe, items, results, false)
	for _, f := range j.Failed {
		res.failedLanes[items[f.Index].Lane()] = f.Verdict.Delay
	}
	return j
}

// record writes what judge found in the table (acked events published,
// failures recorded), counts it and tells the Observer and the broker's
// health; res gets the counts. It returns false if the source was
// hard-stopped before the outcome was recorded.
func (s *Source) record(path Path, j *pipeline.Judged, took time.Duration, res *settled) bool {
	start := time.Now()
	if len(j.Acked) > 0 && !s.markAll(j.Acked) {
		return false
	}
	if len(j.Failed) > 0 && !s.recordFailures(j.Failed) {
		return false
	}
	res.acked, res.allUnavailable = len(j.Acked), j.BrokerDown()
	s.stats.Add(j)
	if j.Events != nil {
		s.cfg.Observer.BatchSettled(SettledBatch{Path: path, Events: j.Events, PublishDuration: took, SettleDuration: time.Since(start)})
	}
	s.health.Settled(j.Broker)
	return true
}

// recordFailures records failed attempts (attempt_count, last_error,
// available_at) and quarantines. It returns false if the source was
// hard-stopped first.
func (s *Source) recordFailures(failed []pipeline.Failure) bool {
	f := pipeline.FailColumnsOf(failed)
	return s.retryDB("record failed attempts", func(ctx context.Context) error {
		_, err := s.pool.Exec(ctx, s.q.fail, pgUUIDs(f.IDs), f.Errors, f.DelaysMs, f.Quarantine, s.cfg.Owner())
		return err
	})
}

// markAll marks events published. A commit reaches logical decoding a moment
// before other sessions see it, so an event the mark did not update is looked
// for again (briefly), unless it is found published meanwhile (by the table
// path). "Not updated but present" is not enough: the producer's transaction
// may become visible between the mark and the look, and an event taken for
// published then would stay unmarked for ever.
func (s *Source) markAll(ids []pgoutbox.UUID) bool {
	left := ids
	for try := 0; ; try++ {
		var done []pgoutbox.UUID
		all := false
		if !s.retryDB("mark events published", func(ctx context.Context) error {
			arg := pgUUIDs(left)
			tag, err := s.pool.Exec(ctx, s.q.mark, arg)
			if err != nil {
				return err
			}
			if all = tag.RowsAffected() == int64(len(left)); all {
				return nil
			}
			if s.afterMark != nil {
				s.afterMark()
			}
			// Those published now: marked by this statement, or before it.
			rows, err := s.pool.Query(ctx, s.q.alreadyPublished, arg)
			if err != nil {
				return err
			}
			done, err = collectIDs(rows)
			return err
		}) {
			return false
		}
		if all {
			return true
		}
		left = minus(left, done)
		if len(left) == 0 {
			return true
		}
		if try >= markRetries {
			s.log.Warn("events acknowledged by the broker are not in the outbox table (deleted?)", slog.Int("events", len(left)),
				slog.String("first", left[0].String()))
			return true
		}
		if !retry.Sleep(s.hardCtx, markRetryInterval) {
			return false
		}
	}
}

func minus(a, b []pgoutbox.UUID) []pgoutbox.UUID {
	if len(b) == 0 {
		return a
	}
	drop := make(map[pgoutbox.UUID]bool, len(b))
	for _, id := range b {
		drop[id] = true
	}
	var out []pgoutbox.UUID
	for _, id := range a {
		if !drop[id] {
			out = append(out, id)
		}
	}
	return out
}

// retryDB runs f with a fresh StatementTimeout until it succeeds, backing off while
// the database is unreachable or refuses f's statement for want of a privilege
// (dbFailed). It returns false if the source was hard-stopped.
func (s *Source) retryDB(what string, f func(ctx context.Context) error) bool {
	var wait retry.Backoff
	for {
		ctx, cancel := context.WithTimeout(s.hardCtx, StatementTimeout)
		err := f(ctx)
		cancel()
		if err == nil {
			s.dbOK(what)
			return true
		}
		if s.hardCtx.Err() != nil {
			return false
		}
		s.dbFailed(what, fmt.Errorf("%s: %w", what, err))
		if !retry.Sleep(s.hardCtx, wait.Next()) {
			return false
		}
	}
}

// dbFailed records a failed statement: a missing privilege (the database
// answered, and will refuse again until someone grants it; the same rule as the
// polling relay, pipeline.Health) or an unreachable database. Only the change
// is logged.
func (s *Source) dbFailed(what string, err error) { s.health.Failed(what, err) }

// dbOK records that the statement what succeeded.
func (s *Source) dbOK(what string) { s.health.OK(what) }
