// Package relay publishes committed outbox events to a broker.
//
// A Relay claims small batches of events in short transactions (FOR UPDATE SKIP
// LOCKED, then a lease in claimed_by/claim_until), publishes them outside any
// database lock, and sets published_at only after the broker acknowledged them.
// Events of one aggregate go out in aggregate_sequence order across any number of
// relays: a relay only claims a prefix of an aggregate's pending events, so
// sequence k+1 never leaves while k is in flight elsewhere, backing off or
// quarantined. Failed events are retried with exponential backoff and quarantined
// after Config.MaxAttempts. LISTEN/NOTIFY wakes the relay within milliseconds of a
// commit; polling is the safety net.
//
// A Group serves many outboxes (schemas of several databases, chosen by a
// selector and found again every GroupConfig.DiscoverInterval) with a Relay
// each. The wake-up of a database's relays is its hub's (hub.go): one LISTEN
// session, one session holding the idle locks (migrate.IdleLockClass, idle.go)
// and one probe statement per poll for all of them, the probe asking the
// claim's own rule (claimableSQL in sql.go). A lone Relay has a hub of its own.
//
// docs/design.md states who owns a row when, and what each crash leaves behind;
// its "Relay: the lane rule" is the one full explanation of the claim.
//
// Outside the standard library it pulls in pgx (with puddle) and the root
// package's OpenTelemetry trace API: no broker client and no metrics library.
package relay

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgoutbox/pgoutbox"
	"github.com/pgoutbox/pgoutbox/broker"
	"github.com/pgoutbox/pgoutbox/internal/failpoint"
	"github.com/pgoutbox/pgoutbox/internal/lifecycle"
	"github.com/pgoutbox/pgoutbox/internal/pgbound"
	"github.com/pgoutbox/pgoutbox/internal/retry"
	"github.com/pgoutbox/pgoutbox/migrate"
)

// Relay moves events from the outbox to a broker. Create it with New, then Start
// it; Stop it to shut down gracefully. A Relay is not restartable.
type Relay struct {
	cfg  Config
	pool *pgxpool.Pool
	pub  broker.Publisher
	// hub listens, holds the idle lock and polls for the relay: the Group's
	// hub of its database, or one of the relay's own (ownHub).
	hub    *hub
	ownHub bool
	q      queries
	log    *slog.Logger
	policy retry.Policy   // what becomes of a failed publish
	bounds pgbound.Bounds // every statement's lock_timeout and statement_timeout

	// lc runs the workers and the helpers (poll, listen, guard). Its Stopping
	// means "claim no more"; its Hard context is cancelled when Stop's deadline
	// passes or Start's ctx ends: in-flight publishes are abandoned and their
	// leases released. Its Stopped hook releases what is still leased.
	lc    lifecycle.Lifecycle
	wake  lifecycle.Wake // a token per pending reason to claim, up to one per worker
	retry chan time.Time // when a backoff comes due

	mu     sync.Mutex
	leased map[pgoutbox.UUID]struct{} // leases taken and not yet settled

	dbDown atomic.Bool
	// lastReset is when dbFailed last dropped the pool's connections (unix ns).
	lastReset atomic.Int64
	broker    retry.BrokerHealth // reachable or not, refusing our configuration or not
	// denied holds, per statement kind (claim, settle), the last database
	// error that was a missing privilege, nil once that kind succeeds again
	// (dbFailed, dbOK): a role may be allowed to claim and not to settle.
	denied [2]atomic.Pointer[error]
	// unusable holds the last error of a statement that the database refused
	// because the outbox's objects are not as the relay needs them (a table
	// or schema gone: SQLSTATE classes 42 and 3F), nil once one succeeds.
	unusable atomic.Pointer[error]
	// stuck holds, per statement kind, the last statement that the server
	// ended at the relay's bounds (a lock held by another session, a
	// statement past StatementTimeout), nil once that kind succeeds again.
	stuck [2]atomic.Pointer[error]

	idleWorkers atomic.Int32 // workers waiting for a wake-up (idle.go)
	lastFound   atomic.Int64 // when a claim last found events (unix ns)
	prevFound   atomic.Int64 // when the claim before that one found events (unix ns)
	// claimMu serialises the workers' claims, which share one cursor: each claim
	// starts after the lanes of the one before, instead of every worker walking
	// past the lanes its peers hold (claim).
	claimMu sync.Mutex
	// cur is the lane after which the next claim's lane scan starts, so that
	// successive claims sweep all lanes fairly instead of favouring the first
	// ones in index order; the zero Lane starts from the first lanes.
	cur         pgoutbox.Lane
	hotPoller   atomic.Bool    // a worker polls quickly instead of waiting (work)
	idleChanged lifecycle.Wake // the relay became idle or busy: the hub's, shared by its relays
	stats       counters
}

// Stats are a relay's counters since Start.
type Stats struct {
	Claims      int64 // claim statements that leased at least one event
	Claimed     int64 // events leased
	TakenOver   int64 // expired leases of another relay taken over (a lease covers a run of one aggregate)
	Published   int64 // events acknowledged by the broker and marked published
	Failed      int64 // failed publish attempts recorded
	Quarantined int64 // events quarantined
	Released    int64 // leases given back unattempted
}

type counters struct {
	claims, claimed, takenOver, published, failed, quarantined, released atomic.Int64
}

// New returns a relay reading the outbox through pool and publishing with pub.
// cfg may be nil for all defaults; invalid settings are reported here.
//
// Size pool for Workers + 2 connections. An idle relay claims once per
// PollInterval; pgxpool by default pings a connection idle for over a second
// before handing it out, which doubles those round trips. "pgoutbox relay" sets
// the pool's ShouldPing to ping only connections idle for over a minute; a claim
// on a dead connection fails and is retried on another.
func New(pool *pgxpool.Pool, pub broker.Publisher, cfg *Config) (*Relay, error) {
	return newRelay(pool, pub, cfg, nil)
}

// newRelay is New, for a Group when h is not nil: the Group's hub then
// listens, guards the idle lock and polls for the relay, beside the other
// relays of its database. Without one the relay has a hub of its own.
func newRelay(pool *pgxpool.Pool, pub broker.Publisher, cfg *Config, h *hub) (*Relay, error) {
	if pool == nil || pub == nil {
		return nil, errors.New("relay: New needs a pool and a publisher")
	}
	c, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	r := &Relay{
		hub:    h,
		cfg:    c,
		pool:   pool,
		pub:    pub,
		q:      newQueries(c.Schema),
		log:    c.Logger.With(slog.String("relay", c.ID)),
		policy: retry.Policy{MaxAttempts: c.MaxAttempts, BackoffBase: c.BackoffBase, BackoffMax: c.BackoffMax},
		bounds: pgbound.New(c.StatementTimeout, c.LockTimeout),
		wake:   make(lifecycle.Wake, c.Workers),
		retry:  make(chan time.Time, 16),
		leased: map[pgoutbox.UUID]struct{}{},

		idleChanged: lifecycle.NewWake(),
	}
	if h != nil {
		r.log = r.log.With(slog.String("tenant", c.Tenant))
	} else {
		h, r.ownHub = newHub(pool, r.log, &c), true
	}
	r.hub, r.idleChanged = h, h.idleChanged
	r.lc.Name = "relay"
	r.lc.Stopped = r.stopped
	return r, nil
}

// ID returns the relay's id, as written in claimed_by.
func (r *Relay) ID() string { return r.cfg.ID }

// Stats returns the relay's counters.
func (r *Relay) Stats() Stats {
	s := &r.stats
	return Stats{
		Claims: s.claims.Load(), Claimed: s.claimed.Load(), TakenOver: s.takenOver.Load(),
		Published: s.published.Load(), Failed: s.failed.Load(), Quarantined: s.quarantined.Load(),
		Released: s.released.Load(),
	}
}

// Errors of Healthy, matched with errors.Is.
var (
	ErrDatabaseUnreachable = errors.New("relay: database unreachable")
	ErrBrokerUnreachable   = errors.New("relay: broker unreachable")
	ErrBrokerMisconfigured = errors.New("relay: the broker refuses the relay's configuration (credentials, signing secret, permissions)")
	// ErrPermissionDenied: the database answers but refuses the relay's
	// statements for want of a privilege (SQLSTATE 42501). It also matches
	// migrate.ErrPermissionDenied.
	ErrPermissionDenied = fmt.Errorf("relay: %w", migrate.ErrPermissionDenied)
	// ErrOutboxUnusable: the database answers but the outbox's tables are not
	// there or not as migrated (a schema dropped or altered under the relay).
	ErrOutboxUnusable = errors.New("relay: the outbox's tables are missing or altered")
	// ErrOutboxStuck: the database answers but ended the relay's statements
	// at their bounds (Config.LockTimeout, Config.StatementTimeout): another
	// session holds a lock on the outbox's tables (a LOCK TABLE, a migration,
	// rows locked FOR UPDATE), or its statements run too long. The relay
	// retries with backoff; the other outboxes of a Group are not held up.
	ErrOutboxStuck = errors.New("relay: the outbox's statements time out (a lock held by another session, or too slow)")
)

// Healthy reports nil when the last contact with the database and with the broker
// succeeded, else what is wrong: ErrDatabaseUnreachable, ErrPermissionDenied
// (with the database's message: which privilege on which table),
// ErrOutboxUnusable, ErrOutboxStuck, ErrBrokerUnreachable,
// ErrBrokerMisconfigured (with the broker's answer) or several (errors.Is
// tells them apart).
func (r *Relay) Healthy() error {
	var errs []error
	if r.dbDown.Load() {
		errs = append(errs, ErrDatabaseUnreachable)
	}
	for i := range r.denied {
		if err := r.denied[i].Load(); err != nil {
			errs = append(errs, fmt.Errorf("%w: %w", ErrPermissionDenied, *err))
		}
	}
	if err := r.unusable.Load(); err != nil {
		errs = append(errs, fmt.Errorf("%w: %w", ErrOutboxUnusable, *err))
	}
	for i := range r.stuck {
		if err := r.stuck[i].Load(); err != nil {
			errs = append(errs, fmt.Errorf("%w: %w", ErrOutboxStuck, *err))
		}
	}
	errs = append(errs, r.broker.Errors(ErrBrokerUnreachable, ErrBrokerMisconfigured)...)
	return errors.Join(errs...)
}

// Timeouts of the relay's statements outside a claim (bounded by Lease/2) and
// a publish (Config.PublishTimeout).
const (
	// settleTimeout bounds one attempt to record a batch's outcome (mark, fail
	// and release in one transaction), on the client: the server ends the
	// statements first, at Config.StatementTimeout (Bounds.Deadline is used
	// when longer). A failed attempt is retried with backoff while the relay
	// runs.
	settleTimeout = 10 * time.Second
	// stopSettleGrace bounds an attempt to record a batch's outcome once the
	// relay is stopping, from the moment the stop began; a failed attempt is
	// then not retried. A database that hangs cannot hold a graceful stop up:
	// the unrecorded events' leases expire and they are published again (a
	// duplicate, never a loss).
	stopSettleGrace = 2 * time.Second
	// stopReleaseTimeout bounds the last try, once the relay has stopped, to
	// release leases whose settling failed; past it they expire on their own
	// after Config.Lease.
	stopReleaseTimeout = 2 * time.Second
	// announceTimeout bounds the notification that announces a backlog to the
	// other relays (announceBacklog).
	announceTimeout = 5 * time.Second
)

// Start launches the workers, the poller and the notification listener, and
// returns at once.
//
// Start and Stop follow the one rule of pgoutbox's services (package
// internal/lifecycle): a Relay starts once (a second Start is an error, and so
// is a Start after Stop: make a new Relay); Stop is graceful until its ctx ends,
// then hard, and may be called any number of times, also before Start.
// Cancelling ctx is a hard stop: in-flight publishes are abandoned and their
// leases released (best effort); prefer Stop.
func (r *Relay) Start(ctx context.Context) error {
	return r.lc.Start(ctx, func(context.Context) error {
		r.log.Info("relay starting", slog.String("schema", r.cfg.Schema), slog.Int("workers", r.cfg.Workers),
			slog.Int("batch_size", r.cfg.BatchSize), slog.Duration("lease", r.cfg.Lease))
		for i := range r.cfg.Workers {
			r.lc.Go(func() { r.work(i) })
		}
		r.lc.Go(r.poll)
		if r.ownHub {
			if err := r.hub.start(context.WithoutCancel(ctx)); err != nil {
				return err
			}
			r.hub.add(r)
		}
		return nil
	})
}

// Stop shuts the relay down gracefully: it stops claiming, waits for in-flight
// publishes to be acknowledged and marked, and releases the leases of events it
// did not publish. If ctx ends first, the stop turns hard: in-flight publishes
// are abandoned (their leases released, best effort), Stop still waits for the
// workers, and returns ctx's error wrapped. See Start for the rule of Start and
// Stop.
func (r *Relay) Stop(ctx context.Context) error { return r.lc.Stop(ctx) }

// stopped runs once every goroutine of the relay has returned (the lifecycle's
// Stopped hook). Workers settle every batch; this only finds leases whose
// settling failed (database down), and tries once more to release them. It
// stops the relay's own hub, which ends its LISTEN and idle-lock sessions.
func (r *Relay) stopped(bool) {
	if r.ownHub {
		r.hub.remove(r)
		ctx, cancel := context.WithTimeout(context.Background(), stopReleaseTimeout)
		_ = r.hub.stop(ctx)
		cancel()
	}
	if ids := r.outstanding(); len(ids) > 0 {
		ctx, cancel := context.WithTimeout(context.Background(), stopReleaseTimeout)
		defer cancel()
		b := &pgx.Batch{}
		b.Queue(r.q.release, uuids(ids), r.cfg.ID)
		if err := pgbound.Send(ctx, r.pool, r.bounds, b, nil); err != nil {
			r.log.Warn("could not release leases; they expire on their own", slog.Int("events", len(ids)), slog.Any("error", err))
		} else {
			r.forget(ids)
		}
	}
	s := r.Stats()
	r.log.Info("relay stopped", slog.Int64("published", s.Published), slog.Int64("failed", s.Failed),
		slog.Int64("quarantined", s.Quarantined))
}

// poke asks one idle worker to claim.
func (r *Relay) poke() { r.wake.Poke() }

// poll wakes a worker when the earliest backoff that a worker reported comes
// due. Polling for new events is the hub's (hub.probe), for all the relays of
// a database at once.
func (r *Relay) poll() {
	due := time.NewTimer(time.Hour)
	due.Stop()
	defer due.Stop()
	var dueAt time.Time
	stopping := r.lc.Stopping()
	for {
		select {
		case <-stopping:
			return
		case at := <-r.retry:
			if dueAt.IsZero() || at.Before(dueAt) {
				dueAt = at
				due.Reset(time.Until(at))
			}
		case <-due.C:
			dueAt = time.Time{}
			r.poke()
		}
	}
}

// errListenerDeaf is a LISTEN session that does not hear a notification sent
// to its channel.
var errListenerDeaf = errors.New("the LISTEN session did not hear the relay's own notification within " +
	listenProbeTimeout.String() + ": the database URL may lead through a connection pooler in transaction " +
	"mode (PgBouncer pool_mode=transaction), where LISTEN and session advisory locks do not work; " +
	"run the relay with --no-notify (Config.DisableNotify) or give it a URL with session pooling or none " +
	"(docs/operations.md, \"Connection poolers\")")

// The LISTEN session's liveness check (hub.listenOnce).
const (
	// listenProbeTimeout bounds the wait for the probe notification that
	// proves a new LISTEN session hears its channel (probeListener).
	listenProbeTimeout = 10 * time.Second
	// listenCheck is how long the session waits for a notification before it
	// checks that the server still answers.
	listenCheck = 10 * time.Second
	// listenPingTimeout bounds that check; past it the session is dropped and
	// a new one is made (on whichever host answers).
	listenPingTimeout = 5 * time.Second
)

// work is one claim → publish → settle loop.
func (r *Relay) work(id int) {
	var wait retry.Backoff
	again := true // claim at once on start: there may be a backlog
	idle := false
	hot := time.NewTimer(time.Hour)
	hot.Stop()
	defer hot.Stop()
	stopping := r.lc.Stopping()
	for {
		if !again {
			if !r.waitForWork(&idle, hot) {
				return
			}
		}
		if r.lc.IsStopping() {
			return
		}
		batch, err := r.claim()
		if errors.Is(err, errStopping) {
			return
		}
		if err != nil {
			r.dbFailed(stmtClaim, err)
			again = true
			if !sleepStop(stopping, wait.Next()) {
				return
			}
			continue
		}
		r.dbOK(stmtClaim)
		wait.Reset()
		if len(batch) == r.cfg.BatchSize {
			r.announceBacklog()
		}
		// Claim again until a claim comes back empty: publishing this batch frees
		// its lanes, whose next events are likely waiting.
		again = len(batch) > 0
		if !again {
			continue
		}
		r.prevFound.Store(r.lastFound.Swap(time.Now().UnixNano()))
		r.setIdle(&idle, false)
		if pause := r.process(batch); pause > 0 {
			// The broker is unreachable: hold off claiming instead of cycling every
			// lane's head through failed attempts.
			again = true
			if !sleepStop(stopping, pause) {
				return
			}
		}
	}
}

// Under a steady flow of events (the last two claims that found events came
// within hotLinger of each other), one worker keeps polling every hotPoll instead
// of waiting for a notification, until no claim has found anything for hotLinger.
// The relay then never counts as idle, so producers do not notify (idle.go): at a
// thousand commits a second, a NOTIFY per commit would serialise the commits on
// PostgreSQL's notification queue lock, and a wake-up per commit would cost a
// claim per event. Events wait at most hotPoll for the next claim. A lone event
// does not start the hot poll: fifty empty claims per event would make a trickle
// (or a hundred outboxes each receiving one, in a Group) cost more than NOTIFY.
const (
	hotPoll   = 2 * time.Millisecond
	hotLinger = 100 * time.Millisecond
)

// waitForWork waits for a reason to claim again: a wake-up, or the hot poll timer
// while events keep coming. It returns false when the relay stops.
func (r *Relay) waitForWork(idle *bool, hot *time.Timer) bool {
	if r.steadyFlow() && r.hotPoller.CompareAndSwap(false, true) {
		defer r.hotPoller.Store(false)
		r.setIdle(idle, false)
		hot.Reset(hotPoll)
		defer hot.Stop()
		select {
		case <-r.lc.Stopping():
			return false
		case <-r.wake:
		case <-hot.C:
		}
		return true
	}
	r.setIdle(idle, true)
	select {
	case <-r.lc.Stopping():
		return false
	case <-r.wake:
	}
	return true
}

// steadyFlow reports whether events keep coming: the last two claims that
// found events did so within hotLinger of each other, the last one within
// hotLinger of now.
func (r *Relay) steadyFlow() bool {
	last, prev := r.lastFound.Load(), r.prevFound.Load()
	return time.Since(time.Unix(0, last)) < hotLinger && last-prev < int64(hotLinger)
}

// announceBacklog wakes a peer worker, and the other relays through a notification:
// a full batch means a backlog, and relays that found nothing earlier (their claim
// raced ours for the same lanes) would otherwise sleep until their next poll.
func (r *Relay) announceBacklog() {
	r.poke()
	if r.cfg.DisableNotify {
		return
	}
	ctx, cancel := context.WithTimeout(r.lc.Hard(), announceTimeout)
	defer cancel()
	if _, err := r.pool.Exec(ctx, "SELECT pg_notify($1, '')", r.q.channel); err != nil {
		r.log.Debug("could not announce the backlog", slog.Any("error", err))
	}
}

// dbFailed records a failed statement: a missing privilege (the database
// answered, and will refuse again until someone grants it) or an unreachable
// database. Either is retried with backoff; only the change is logged.
func (r *Relay) dbFailed(kind int, err error) {
	if outboxUnusable(err) {
		retry.MarkUp(&r.dbDown, r.log, "database")
		if r.unusable.Swap(&err) == nil {
			r.log.Error("the outbox's tables are missing or altered; retrying with backoff", slog.Any("error", err))
		}
		return
	}
	if pgbound.Stuck(err) {
		// The database answered: not down, and its connections are fine.
		retry.MarkUp(&r.dbDown, r.log, "database")
		if r.stuck[kind].Swap(&err) == nil {
			r.log.Warn("the outbox's statements time out: another session holds a lock on its tables, or they run too long; retrying with backoff, the other outboxes go on",
				slog.Duration("lock_timeout", r.cfg.LockTimeout), slog.Duration("statement_timeout", r.cfg.StatementTimeout), slog.Any("error", err))
		}
		return
	}
	if !migrate.IsPermissionDenied(err) {
		retry.MarkDown(&r.dbDown, r.log, "database", err)
		r.dropHungConnections(err)
		return
	}
	retry.MarkUp(&r.dbDown, r.log, "database")
	if r.denied[kind].Swap(&err) == nil {
		r.log.Error("permission denied: the relay's role lacks a privilege; grant what 'pgoutbox migrate print --grants' lists for the relay role (docs/security.md); retrying with backoff",
			slog.Any("error", err))
	}
}

// probeFailed records that the hub's probe for the relay's events found the
// database unreachable, as a failed claim would; reset drops hung connections
// (the hub asks one of its relays to, for the pool they share).
func (r *Relay) probeFailed(err error, reset bool) {
	retry.MarkDown(&r.dbDown, r.log, "database", err)
	if reset {
		r.dropHungConnections(err)
	}
}

// refused reports whether the relay's last claim was refused by the database
// for a reason it gave (the outbox's tables, a privilege, a lock held past
// LockTimeout); a claim that succeeds clears it.
func (r *Relay) refused() bool {
	return r.unusable.Load() != nil || r.denied[stmtClaim].Load() != nil || r.stuck[stmtClaim].Load() != nil
}

// probeOK records that the hub's probe reached the database.
func (r *Relay) probeOK() { retry.MarkUp(&r.dbDown, r.log, "database") }

// dropHungConnections empties the pool after a statement timed out. A timeout,
// unlike a refused or reset connection, is what a hung server or a network
// black hole looks like (a frozen primary, before or after its standby is
// promoted): every connection to it would hang in turn until its own timeout,
// while new connections find the host that answers (a multi-host URL with
// target_session_attrs=read-write reaches the new primary). Idle connections
// close at once and those in use when they come back; at most once per
// resetInterval, so that a slow database does not lose its connections at
// every slow claim.
func (r *Relay) dropHungConnections(err error) {
	if !pgconn.Timeout(err) || r.lc.Hard().Err() != nil {
		return
	}
	now := time.Now().UnixNano()
	last := r.lastReset.Load()
	if now-last < int64(resetInterval) || !r.lastReset.CompareAndSwap(last, now) {
		return
	}
	r.log.Warn("a statement timed out: dropping the pool's connections, in case the database host hangs", slog.Any("error", err))
	r.pool.Reset()
}

// resetInterval is the least time between two dropHungConnections.
const resetInterval = 5 * time.Second

// Statement kinds of dbFailed and dbOK.
const (
	stmtClaim = iota
	stmtSettle
)

// outboxUnusable reports whether err is the database refusing a statement
// for the outbox's objects: undefined or wrong tables, columns, functions
// (SQLSTATE class 42 but a missing privilege) or schema (class 3F).
func outboxUnusable(err error) bool {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code == "42501" {
		return false
	}
	return strings.HasPrefix(pgErr.Code, "42") || strings.HasPrefix(pgErr.Code, "3F")
}

// dbOK records a statement of the kind that succeeded.
func (r *Relay) dbOK(kind int) {
	if r.unusable.Swap(nil) != nil {
		r.log.Info("the outbox's tables are usable again")
	}
	if r.denied[kind].Swap(nil) != nil {
		r.log.Info("the relay's statements are permitted again")
	}
	if r.stuck[kind].Swap(nil) != nil {
		r.log.Info("the outbox's statements complete again")
	}
	retry.MarkUp(&r.dbDown, r.log, "database")
}

// errStopping is claim's answer once the relay is stopping.
var errStopping = errors.New("relay: stopping")

// claimed is one leased event.
type claimed struct {
	msg            broker.Message
	attempts       int           // attempt_count before this attempt
	previousHolder *string       // who held the run's lease before this claim
	head           pgoutbox.UUID // the first event of its run, which holds the lease
	// undecodable is why the row cannot become a message (headers that are not a
	// JSON object of strings, written by a raw INSERT): it is quarantined.
	undecodable error
}

func (c *claimed) lane() pgoutbox.Lane {
	return pgoutbox.LaneOf(c.msg.AggregateType, c.msg.AggregateID)
}

// claim leases the next batch, continuing the lane scan from the relay's cursor,
// or from the first lanes when there is nothing after it.
//
// Claims run one at a time, each continuing where the previous one ended. A claim
// is short next to publishing and settling its batch, so the workers still
// overlap; but none scans lanes a peer has just leased. With a cursor per worker,
// the workers started together and trailed each other round the lanes, each claim
// walking past the lanes leased by the workers ahead of it (at 8 workers, 8× the
// buffer reads per claimed event).
func (r *Relay) claim() ([]claimed, error) {
	r.claimMu.Lock()
	defer r.claimMu.Unlock()
	if r.lc.IsStopping() {
		// Stopped while a peer's claim ran (a slow one, if the database hangs):
		// do not start another.
		return nil, errStopping
	}
	cur := &r.cur
	ctx, cancel := context.WithTimeout(r.lc.Hard(), r.cfg.Lease/2)
	defer cancel()
	start := time.Now()
	batch, err := r.claimFrom(ctx, *cur, r.cfg.BatchSize)
	if err != nil {
		return nil, err
	}
	if len(batch) == 0 && *cur != (pgoutbox.Lane{}) {
		// Nothing after the cursor: start over from the first lanes.
		if batch, err = r.claimFrom(ctx, pgoutbox.Lane{}, r.cfg.BatchSize); err != nil {
			return nil, err
		}
	}
	if obs := r.cfg.Observer; obs != nil && len(batch) > 0 {
		takenOver := 0
		for _, c := range batch {
			if c.previousHolder != nil && *c.previousHolder != r.cfg.ID {
				takenOver++
			}
		}
		obs.BatchClaimed(ClaimedBatch{Tenant: r.cfg.Tenant, Events: len(batch), TakenOver: takenOver, Duration: time.Since(start)})
	}
	// A full batch: the next claim goes on after its last lane, so that successive
	// claims sweep all lanes. A short one scanned to the end of the pending lanes:
	// the next claim starts from the first ones, in one statement.
	*cur = pgoutbox.Lane{}
	if len(batch) < r.cfg.BatchSize {
		return batch, nil
	}
	for i := range batch {
		if l := batch[i].lane(); l.Compare(*cur) > 0 {
			*cur = l
		}
	}
	return batch, nil
}

func (r *Relay) claimFrom(ctx context.Context, from pgoutbox.Lane, limit int) ([]claimed, error) {
	var batch []claimed
	b := &pgx.Batch{}
	b.Queue(r.q.claim, r.cfg.ID, r.cfg.Lease.Milliseconds(), from.AggregateType, from.AggregateID, limit, r.cfg.RunLength)
	err := pgbound.Send(ctx, r.pool, r.bounds, b, func(br pgx.BatchResults) error {
		rows, err := br.Query()
		if err != nil {
			return err
		}
		if err := failpoint.Inject(failpoint.RelayClaim); err != nil {
			rows.Close()
			return err
		}
		batch, err = pgx.AppendRows(make([]claimed, 0, limit), rows, func(row pgx.CollectableRow) (claimed, error) {
			var c claimed
			var headers []byte
			err := row.Scan(&c.msg.EventID, &c.msg.AggregateType, &c.msg.AggregateID, &c.msg.AggregateSequence,
				&c.msg.EventType, &c.msg.SchemaVersion, &c.msg.Payload, &headers, &c.msg.OccurredAt,
				&c.attempts, &c.previousHolder, &c.head)
			c.msg.Tenant, c.msg.Schema = r.cfg.Tenant, r.cfg.Schema
			if err == nil {
				var derr error
				if c.msg.Headers, derr = decodeHeaders(headers); derr != nil {
					c.undecodable = fmt.Errorf("relay: event %s refused before publishing: headers are not a JSON object of strings: %w", c.msg.EventID, derr)
				}
			}
			if c.head != c.msg.EventID {
				c.previousHolder = nil // only a run's head holds its lease
			}
			return c, err
		})
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("claim batch: %w", err)
	}
	if len(batch) > 0 {
		r.stats.claims.Add(1)
		r.stats.claimed.Add(int64(len(batch)))
		r.mu.Lock()
		for _, c := range batch {
			r.leased[c.msg.EventID] = struct{}{}
		}
		r.mu.Unlock()
		for _, c := range batch {
			if c.previousHolder != nil && *c.previousHolder != r.cfg.ID {
				r.stats.takenOver.Add(1)
			}
		}
	}
	return batch, nil
}

// process publishes a claimed batch and settles every event. It returns how long
// the worker should pause before claiming again (non-zero when the broker looked
// unreachable).
func (r *Relay) process(batch []claimed) time.Duration {
	// Per aggregate, ascending sequence: what Publisher.Publish requires.
	slices.SortFunc(batch, func(a, b claimed) int {
		return pgoutbox.CompareInLane(a.lane(), a.msg.AggregateSequence, b.lane(), b.msg.AggregateSequence)
	})
	start := time.Now()
	results := r.publish(batch)
	return r.settle(batch, results, time.Since(start))
}

// publish sends the batch and returns one result per event.
func (r *Relay) publish(batch []claimed) []error {
	msgs := make([]broker.Message, len(batch))
	var refused []error
	for i := range batch {
		msgs[i] = batch[i].msg
		if batch[i].undecodable != nil {
			if refused == nil {
				refused = make([]error, len(batch))
			}
			refused[i] = batch[i].undecodable
		}
	}
	if err := failpoint.Inject(failpoint.RelayBeforePublish); err != nil {
		results := make([]error, len(msgs))
		for i := range results {
			results[i] = broker.Unavailable(err)
		}
		return results
	}
	ctx, cancel := context.WithTimeout(r.lc.Hard(), r.cfg.PublishTimeout)
	// Rows written around the producer's checks (a raw INSERT) with reserved
	// headers or sizes beyond the limits are quarantined here, never sent.
	results := broker.PublishValid(ctx, r.pub, msgs, refused)
	cancel()
	_ = failpoint.Inject(failpoint.RelayAfterPublish) // crash or delay only: the broker has spoken
	checked, ok := retry.CheckResults(results, len(msgs))
	if !ok {
		r.log.Error("publisher returned the wrong number of results; retrying the batch with backoff",
			slog.Int("messages", len(msgs)), slog.Int("results", len(results)))
	}
	return checked
}

// failure is one failed publish to record: the event, the head of its run
// (which holds the lease), and the failure policy's verdict.
type failure struct {
	id, head pgoutbox.UUID
	verdict  retry.Verdict
}

// outcome is what a publish did to a batch, sorted for the settle statements.
type outcome struct {
	acked    []pgoutbox.UUID // acknowledged: marked published
	released []pgoutbox.UUID // not attempted: leases given back
	failed   []failure       // retried after a backoff, or quarantined
	// quarantined counts the failures quarantined; retryIn is the shortest
	// backoff of the others (0 when none is retried).
	quarantined int
	retryIn     time.Duration
	broker      retry.BatchOutcome // what the batch said about the broker
	events      []EventOutcome     // one per event, for the Observer only
}

// note records event i's outcome for the Observer.
func (o *outcome) note(c *claimed, i int, res Result, attempt int, err error) {
	if o.events == nil {
		return
	}
	e := &o.events[i]
	e.EventID, e.AggregateType, e.EventType = c.msg.EventID, c.msg.AggregateType, c.msg.EventType
	e.Result, e.Attempt, e.Err = res, attempt, err
	if err != nil {
		e.Reason = ClassifyFailure(err)
	}
}

// failColumns returns the failures as the fail statement's column arrays.
func (o *outcome) failColumns() (ids []pgtype.UUID, errs []string, delaysMs []int64, quarantine []bool, heads []pgtype.UUID) {
	for _, f := range o.failed {
		ids = append(ids, pgtype.UUID{Bytes: f.id, Valid: true})
		errs = append(errs, f.verdict.Text)
		delaysMs = append(delaysMs, f.verdict.Delay.Milliseconds())
		quarantine = append(quarantine, f.verdict.Quarantine)
		heads = append(heads, pgtype.UUID{Bytes: f.head, Valid: true})
	}
	return ids, errs, delaysMs, quarantine, heads
}

// settle records the outcome of a publish: acked events published, failed ones
// retried later or quarantined, unattempted ones released. The three statements go
// in one transaction under the relay's bounds (pgbound.Send). If the database is unreachable,
// settling is retried while the relay runs; once it is stopping, an attempt gets
// stopSettleGrace and no retry. The leases of what was not recorded simply expire
// and the events are published again (a duplicate, never a loss). It returns how
// long the worker should pause before claiming again.
func (r *Relay) settle(batch []claimed, results []error, publishDuration time.Duration) time.Duration {
	o := r.decide(batch, results)
	start := time.Now()
	if !r.record(&o) {
		return 0 // leases stay with us; the stop tries once more, then they expire
	}
	settleDuration := time.Since(start)
	r.forgetBatch(batch)
	r.stats.published.Add(int64(len(o.acked)))
	r.stats.failed.Add(int64(len(o.failed)))
	r.stats.quarantined.Add(int64(o.quarantined))
	r.stats.released.Add(int64(len(o.released)))
	if o.events != nil {
		r.cfg.Observer.BatchSettled(SettledBatch{Tenant: r.cfg.Tenant, Events: o.events, PublishDuration: publishDuration, SettleDuration: settleDuration})
	}
	if o.retryIn > 0 {
		// Wake up when the first backoff ends rather than at the next poll.
		select {
		case r.retry <- time.Now().Add(o.retryIn):
		default:
		}
	}
	r.broker.Settled(r.log, o.broker)
	if !o.broker.Acked && o.broker.AllUnavailable {
		// The broker is unreachable or refuses us: hold off claiming.
		return min(o.retryIn, r.cfg.PollInterval)
	}
	return 0
}

// decide sorts each event's result: acked, released (not attempted, or
// abandoned by a hard stop: not the event's fault), or failed, with the failure
// policy's verdict (retry.Policy.Decide) on retry or quarantine.
func (r *Relay) decide(batch []claimed, results []error) outcome {
	var o outcome
	if r.cfg.Observer != nil {
		o.events = make([]EventOutcome, len(batch))
	}
	hardStopped := r.lc.Hard().Err() != nil
	allUnavailable := true
	for i, err := range results {
		c := &batch[i]
		switch {
		case err == nil:
			o.acked = append(o.acked, c.msg.EventID)
			o.note(c, i, ResultPublished, c.attempts+1, nil)
		case errors.Is(err, broker.ErrPredecessorFailed),
			hardStopped && (errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)):
			o.released = append(o.released, c.msg.EventID)
			o.note(c, i, ResultReleased, 0, nil)
		default:
			v := r.policy.Decide(err, c.attempts+1)
			o.failed = append(o.failed, failure{id: c.msg.EventID, head: c.head, verdict: v})
			allUnavailable = allUnavailable && v.Unavailable
			if v.Misconfigured && o.broker.Refused == "" {
				o.broker.Refused = v.Text
			}
			if v.Quarantine {
				o.quarantined++
				r.log.Warn("event quarantined", slog.String("event_id", c.msg.EventID.String()),
					slog.String("aggregate", c.lane().String()),
					slog.Int64("sequence", c.msg.AggregateSequence), slog.Int("attempts", v.Attempt), slog.String("error", v.Text))
				o.note(c, i, ResultQuarantined, v.Attempt, err)
				continue
			}
			if o.retryIn == 0 || v.Delay < o.retryIn {
				o.retryIn = v.Delay
			}
			o.note(c, i, ResultFailed, v.Attempt, err)
		}
	}
	o.broker.Acked = len(o.acked) > 0
	o.broker.AllUnavailable = len(o.failed) > 0 && allUnavailable
	if len(o.failed) > 0 {
		o.broker.FirstError = o.failed[0].verdict.Text
	}
	return o
}

// record writes the outcome in one transaction, retrying with backoff while the
// database fails and the relay runs. It reports false if the relay began to
// stop and the attempt failed (see stopSettleGrace), or was hard-stopped.
func (r *Relay) record(o *outcome) bool {
	var wait retry.Backoff
	for {
		ctx, cancel := context.WithTimeout(context.Background(), max(settleTimeout, r.bounds.Deadline()))
		ctx, cancelGrace := r.lc.Grace(ctx, stopSettleGrace)
		err := pgbound.Send(ctx, r.pool, r.bounds, r.settleStatements(o), func(pgx.BatchResults) error {
			return failpoint.Inject(failpoint.RelayMark)
		})
		cancelGrace()
		cancel()
		if err == nil {
			r.dbOK(stmtSettle)
			return true
		}
		r.dbFailed(stmtSettle, fmt.Errorf("settle batch: %w", err))
		if r.lc.IsStopping() {
			r.log.Warn("stopping: could not record a batch's outcome; its leases expire and its events are published again",
				slog.Int("events", len(o.acked)+len(o.released)+len(o.failed)), slog.Any("error", err))
			return false
		}
		if hard := r.lc.Hard(); hard.Err() != nil || !retry.Sleep(hard, wait.Next()) {
			return false
		}
	}
}

// settleStatements returns the mark, fail and release statements of o. A
// pgx.Batch cannot be sent twice: record builds a fresh one for every attempt.
func (r *Relay) settleStatements(o *outcome) *pgx.Batch {
	b := &pgx.Batch{}
	if len(o.acked) > 0 {
		b.Queue(r.q.mark, uuids(o.acked), r.cfg.ID)
	}
	if len(o.failed) > 0 {
		ids, errs, delays, quarantine, heads := o.failColumns()
		b.Queue(r.q.fail, ids, errs, delays, quarantine, r.cfg.ID, heads)
	}
	if len(o.released) > 0 {
		b.Queue(r.q.release, uuids(o.released), r.cfg.ID)
	}
	return b
}

// uuids converts ids for a uuid[] parameter. pgtype.UUID is a type pgx knows
// by itself: it encodes it natively, where pgoutbox.UUID would go through its
// driver.Valuer text form element by element, and it names the parameter's type
// uuid[] in the query modes that do not ask the server for the parameters'
// types (exec, simple_protocol: the modes to use through PgBouncer's
// transaction pooling, docs/operations.md), where [][16]byte cannot be encoded.
func uuids(ids []pgoutbox.UUID) []pgtype.UUID {
	out := make([]pgtype.UUID, len(ids))
	for i, id := range ids {
		out[i] = pgtype.UUID{Bytes: id, Valid: true}
	}
	return out
}

// decodeHeaders reads the headers column (a JSON object of strings). Most events
// carry none: "{}" is not worth encoding/json's reflection.
func decodeHeaders(raw []byte) (map[string]string, error) {
	h := map[string]string{}
	if string(raw) == "{}" {
		return h, nil
	}
	if err := json.Unmarshal(raw, &h); err != nil {
		return nil, fmt.Errorf("headers: %w", err)
	}
	return h, nil
}

func (r *Relay) outstanding() []pgoutbox.UUID {
	r.mu.Lock()
	defer r.mu.Unlock()
	ids := make([]pgoutbox.UUID, 0, len(r.leased))
	for id := range r.leased {
		ids = append(ids, id)
	}
	return ids
}

// forgetBatch drops a settled batch's leases from those still held.
func (r *Relay) forgetBatch(batch []claimed) {
	r.mu.Lock()
	for i := range batch {
		delete(r.leased, batch[i].msg.EventID)
	}
	r.mu.Unlock()
}

func (r *Relay) forget(ids []pgoutbox.UUID) {
	r.mu.Lock()
	for _, id := range ids {
		delete(r.leased, id)
	}
	r.mu.Unlock()
}

func sleepStop(stop <-chan struct{}, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-stop:
		return false
	case <-t.C:
		return true
	}
}
