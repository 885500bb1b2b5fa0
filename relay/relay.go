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
// A Relay with destinations (Config.Destinations, New with a nil publisher)
// routes each event to every destination whose rules take it, each with its
// own broker, workers and progress per lane (outbox_destination_lanes): order,
// backoff, quarantine and dead letters hold per destination, and one that is
// down holds back only its own lanes; an event no destination takes is
// quarantined, never dropped (routed.go; docs/design.md, "Destinations").
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
	"errors"
	"fmt"
	"log/slog"
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
	"github.com/pgoutbox/pgoutbox/internal/pipeline"
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
	pipe   pipeline.Config // publishing and judging a batch (the CDC source's pipeline too)
	bounds pgbound.Bounds  // every statement's lock_timeout and statement_timeout
	// started is when Start ran, for the heartbeat (heartbeat.go).
	started time.Time

	// lc runs the workers and the helpers (poll, listen, guard). Its Stopping
	// means "claim no more"; its Hard context is cancelled when Stop's deadline
	// passes or Start's ctx ends: in-flight publishes are abandoned and their
	// leases released. Its Stopped hook releases what is still leased.
	lc    lifecycle.Lifecycle
	wake  lifecycle.Wake // a token per pending reason to claim, up to one per worker
	retry chan time.Time // when a backoff comes due

	// streams are what the workers claim from, Config.Workers workers each:
	// the single broker (one stream, claiming with claim), or one per
	// destination of a routed relay (routed.go).
	streams []*stream
	// workers is the number of workers over all streams.
	workers int
	// routed is the engine of a relay with destinations; nil with a publisher.
	routed *routed

	mu     sync.Mutex
	leased map[pgoutbox.UUID]struct{} // leases taken and not yet settled

	// health is the database's and the broker's state for Healthy, per
	// statement kind (claim, settle): a role may be allowed to claim and not
	// to settle, a lock may hold up one kind and not the other.
	health pipeline.Health
	// lastReset is when dbFailed last dropped the pool's connections (unix ns).
	lastReset atomic.Int64

	idleWorkers atomic.Int32 // workers waiting for a wake-up (idle.go)
	// claimMu serialises the workers' claims, which share one cursor: each claim
	// starts after the lanes of the one before, instead of every worker walking
	// past the lanes its peers hold (claim).
	claimMu sync.Mutex
	// cur is the lane after which the next claim's lane scan starts, so that
	// successive claims sweep all lanes fairly instead of favouring the first
	// ones in index order; the zero Lane starts from the first lanes.
	cur         pgoutbox.Lane
	idleChanged lifecycle.Wake // the relay became idle or busy: the hub's, shared by its relays
	stats       counters
}

// Stats are a relay's counters since Start. In a relay with destinations
// they are summed over the destinations: Claimed and Published count an
// event once per destination that leased or delivered it.
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
	claims, claimed, takenOver atomic.Int64
	pipeline.Counters          // published, failed, quarantined, released (not attempted)
}

// New returns a relay reading the outbox through pool and publishing with pub.
// cfg may be nil for all defaults; invalid settings are reported here.
//
// A relay with destinations (Config.Destinations) takes a nil pub: each
// destination has its publisher, and the relay routes every event to the
// destinations whose rules match it, with progress of its own per destination
// (routed.go, docs/design.md "Destinations"). Passing both is an error.
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
	routedMode := cfg != nil && len(cfg.Destinations) > 0
	switch {
	case pool != nil && pub != nil && routedMode:
		return nil, errors.New("relay: New takes a publisher or Config.Destinations, not both: pass a nil publisher with destinations")
	case pool == nil || (pub == nil && !routedMode):
		return nil, errors.New("relay: New needs a pool and a publisher")
	}
	if routedMode && h != nil {
		return nil, errGroupDestinations
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
	r.pipe = pipeline.Config{
		Broker: pub, Timeout: c.PublishTimeout, NotAttempted: pipeline.ResultReleased,
		Policy:   retry.Policy{MaxAttempts: c.MaxAttempts, BackoffBase: c.BackoffBase, BackoffMax: c.BackoffMax},
		Observed: c.Observer != nil, Log: r.log,
	}
	r.health = pipeline.Health{
		Errs: pipeline.Sentinels{
			DatabaseUnreachable: ErrDatabaseUnreachable, PermissionDenied: ErrPermissionDenied,
			OutboxUnusable: ErrOutboxUnusable, OutboxStuck: ErrOutboxStuck,
			BrokerUnreachable: ErrBrokerUnreachable, BrokerMisconfigured: ErrBrokerMisconfigured,
		},
		Log: r.log, Name: "the relay", Role: "relay", LockTimeout: c.LockTimeout, StatementTimeout: c.StatementTimeout,
	}
	r.lc.Name = "relay"
	r.lc.Stopped = r.stopped
	if routedMode {
		r.routed = newRouted(r)
	} else {
		r.streams = []*stream{{wake: r.wake, next: r.next}}
	}
	r.workers = c.Workers * len(r.streams)
	return r, nil
}

// ID returns the relay's id, as written in claimed_by.
func (r *Relay) ID() string { return r.cfg.ID }

// Stats returns the relay's counters.
func (r *Relay) Stats() Stats {
	s := &r.stats
	return Stats{
		Claims: s.claims.Load(), Claimed: s.claimed.Load(), TakenOver: s.takenOver.Load(),
		Published: s.Published.Load(), Failed: s.Failed.Load(), Quarantined: s.Quarantined.Load(),
		Released: s.NotAttempted.Load(),
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
//
// In a relay with destinations, the broker errors name their destination.
func (r *Relay) Healthy() error {
	errs := r.health.Errors()
	if r.routed != nil {
		errs = append(errs, r.routed.brokerErrors()...)
	}
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
		r.started = time.Now()
		r.log.Info("relay starting", slog.String("schema", r.cfg.Schema), slog.Int("workers", r.cfg.Workers),
			slog.Int("batch_size", r.cfg.BatchSize), slog.Duration("lease", r.cfg.Lease))
		if r.routed != nil {
			if err := r.routed.register(ctx); err != nil {
				return err
			}
		}
		for _, s := range r.streams {
			for range r.cfg.Workers {
				r.lc.Go(func() { r.work(s) })
			}
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
	defer r.beatStopped()
	if r.routed != nil {
		r.routed.releaseOutstanding()
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

// poke asks one idle worker of each stream to claim.
func (r *Relay) poke() {
	for _, s := range r.streams {
		s.wake.Poke()
	}
}

// stream is one kind of work for a relay's workers: the single broker's
// claims, or one destination's (routed.go). Each stream has Config.Workers
// workers, its own wake-ups and its own hot poll, so that a destination whose
// lanes back off does not keep another's workers waiting.
type stream struct {
	wake      lifecycle.Wake // a token per pending reason to claim, up to one per worker
	hotPoller atomic.Bool    // a worker polls quickly instead of waiting (work)
	lastFound atomic.Int64   // when a claim last found events (unix ns)
	prevFound atomic.Int64   // when the claim before that one found events (unix ns)
	// next claims a batch: how many events it leased, whether the batch was
	// full, and the function publishing and settling it (which returns how
	// long the worker should pause before claiming again).
	next func() (n int, full bool, process func() time.Duration, err error)
}

// next is the single broker's stream: claim, then process.
func (r *Relay) next() (int, bool, func() time.Duration, error) {
	batch, err := r.claim()
	if err != nil {
		return 0, false, nil, err
	}
	return len(batch), len(batch) == r.cfg.BatchSize, func() time.Duration { return r.process(batch) }, nil
}

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

// work is one claim → publish → settle loop of stream s.
func (r *Relay) work(s *stream) {
	var wait retry.Backoff
	again := true // claim at once on start: there may be a backlog
	idle := false
	hot := time.NewTimer(time.Hour)
	hot.Stop()
	defer hot.Stop()
	stopping := r.lc.Stopping()
	for {
		if !again {
			if !r.waitForWork(s, &idle, hot) {
				return
			}
		}
		if r.lc.IsStopping() {
			return
		}
		n, full, process, err := s.next()
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
		if full {
			r.announceBacklog()
		}
		// Claim again until a claim comes back empty: publishing this batch frees
		// its lanes, whose next events are likely waiting.
		again = n > 0
		if !again {
			continue
		}
		s.prevFound.Store(s.lastFound.Swap(time.Now().UnixNano()))
		r.setIdle(&idle, false)
		// Events found by one destination are for every other to pass too; while
		// this stream is busy the relay is not idle, so neither a notification
		// nor the hub's probe would wake the others (a relay with one stream
		// pokes none).
		for _, other := range r.streams {
			if other != s {
				other.wake.Poke()
			}
		}
		if pause := process(); pause > 0 {
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
func (r *Relay) waitForWork(s *stream, idle *bool, hot *time.Timer) bool {
	if s.steadyFlow() && s.hotPoller.CompareAndSwap(false, true) {
		defer s.hotPoller.Store(false)
		r.setIdle(idle, false)
		hot.Reset(hotPoll)
		defer hot.Stop()
		select {
		case <-r.lc.Stopping():
			return false
		case <-s.wake:
		case <-hot.C:
		}
		return true
	}
	r.setIdle(idle, true)
	select {
	case <-r.lc.Stopping():
		return false
	case <-s.wake:
	}
	return true
}

// steadyFlow reports whether events keep coming: the last two claims that
// found events did so within hotLinger of each other, the last one within
// hotLinger of now.
func (s *stream) steadyFlow() bool {
	last, prev := s.lastFound.Load(), s.prevFound.Load()
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

// dbFailed records a failed statement of kind (stmtClaim, stmtSettle): the
// outbox unusable, stuck at the bounds, a missing privilege, or an unreachable
// database (pipeline.Health.Failed), whose hung connections are dropped. Each
// is retried with backoff; only the change is logged.
func (r *Relay) dbFailed(kind string, err error) {
	if r.health.Failed(kind, err) {
		r.dropHungConnections(err)
	}
}

// probeFailed records that the hub's probe for the relay's events found the
// database unreachable, as a failed claim would; reset drops hung connections
// (the hub asks one of its relays to, for the pool they share).
func (r *Relay) probeFailed(err error, reset bool) {
	r.health.Unreachable(err)
	if reset {
		r.dropHungConnections(err)
	}
}

// refused reports whether the relay's last claim was refused by the database
// for a reason it gave (the outbox's tables, a privilege, a lock held past
// LockTimeout); a claim that succeeds clears it.
func (r *Relay) refused() bool { return r.health.Refused(stmtClaim) }

// probeOK records that the hub's probe reached the database.
func (r *Relay) probeOK() { r.health.Reachable() }

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
	stmtClaim  = "claim"
	stmtSettle = "settle"
)

// dbOK records a statement of the kind that succeeded.
func (r *Relay) dbOK(kind string) { r.health.OK(kind) }

// errStopping is claim's answer once the relay is stopping.
var errStopping = errors.New("relay: stopping")

// claimed is one leased event: the pipeline's Event (its message, attempts
// before this one, and why the row cannot become a message when it cannot:
// headers that are not a JSON object of strings, written by a raw INSERT),
// and its lease.
type claimed struct {
	pipeline.Event
	previousHolder *string       // who held the run's lease before this claim
	head           pgoutbox.UUID // the first event of its run, which holds the lease
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
		if l := batch[i].Lane(); l.Compare(*cur) > 0 {
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
			err := row.Scan(&c.Msg.EventID, &c.Msg.AggregateType, &c.Msg.AggregateID, &c.Msg.AggregateSequence,
				&c.Msg.EventType, &c.Msg.SchemaVersion, &c.Msg.Payload, &headers, &c.Msg.OccurredAt,
				&c.Attempts, &c.previousHolder, &c.head)
			c.Msg.Tenant, c.Msg.Schema = r.cfg.Tenant, r.cfg.Schema
			if err == nil {
				c.Msg.Headers, c.Refused = pipeline.DecodeHeaders("relay", c.Msg.EventID, headers)
			}
			if c.head != c.Msg.EventID {
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
			r.leased[c.Msg.EventID] = struct{}{}
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
	var results []error
	var took time.Duration
	if err := failpoint.Inject(failpoint.RelayBeforePublish); err != nil {
		results = pipeline.Unavailable(len(batch), err)
	} else {
		// Sorted per aggregate, ascending sequence: what Publisher.Publish
		// requires; results follow the sorted batch.
		results, took = pipeline.Publish(r.lc.Hard(), &r.pipe, batch)
	}
	_ = failpoint.Inject(failpoint.RelayAfterPublish) // crash or delay only: the broker has spoken
	return r.settle(batch, results, took)
}

// settle records the outcome of a publish: acked events published, failed ones
// retried later or quarantined, unattempted ones released, as the pipeline
// judged them (pipeline.Judge: a publish that a hard stop abandoned is not the
// events' fault, they are released). The three statements go in one
// transaction under the relay's bounds (pgbound.Send). If the database is
// unreachable, settling is retried while the relay runs; once it is stopping,
// an attempt gets stopSettleGrace and no retry. The leases of what was not
// recorded simply expire and the events are published again (a duplicate,
// never a loss). It returns how long the worker should pause before claiming
// again.
func (r *Relay) settle(batch []claimed, results []error, publishDuration time.Duration) time.Duration {
	j := pipeline.Judge(&r.pipe, batch, results, r.lc.Hard().Err() != nil)
	start := time.Now()
	if !r.record(batch, &j) {
		return 0 // leases stay with us; the stop tries once more, then they expire
	}
	settleDuration := time.Since(start)
	r.forgetBatch(batch)
	r.stats.Add(&j)
	if j.Events != nil {
		r.cfg.Observer.BatchSettled(SettledBatch{Tenant: r.cfg.Tenant, Events: j.Events, PublishDuration: publishDuration, SettleDuration: settleDuration})
	}
	if j.RetryIn > 0 {
		// Wake up when the first backoff ends rather than at the next poll.
		select {
		case r.retry <- time.Now().Add(j.RetryIn):
		default:
		}
	}
	r.health.Settled(j.Broker)
	if j.BrokerDown() {
		// The broker is unreachable or refuses us: hold off claiming.
		return min(j.RetryIn, r.cfg.PollInterval)
	}
	return 0
}

// record writes the outcome in one transaction, retrying with backoff while the
// database fails and the relay runs. It reports false if the relay began to
// stop and the attempt failed (see stopSettleGrace), or was hard-stopped.
func (r *Relay) record(batch []claimed, j *pipeline.Judged) bool {
	return r.recordWith(func() *pgx.Batch { return r.settleStatements(batch, j) }, "settle batch", r.log,
		slog.Int("events", len(j.Acked)+len(j.NotAttempted)+len(j.Failed)))
}

// recordWith is record for any settle: build makes the statements afresh for
// every attempt (a pgx.Batch cannot be sent twice); what names the settle in
// the error, size its extent in the warning a stopping relay logs. A routed
// relay's destinations (dest.record) settle through it too.
func (r *Relay) recordWith(build func() *pgx.Batch, what string, log *slog.Logger, size slog.Attr) bool {
	var wait retry.Backoff
	for {
		ctx, cancel := context.WithTimeout(context.Background(), max(settleTimeout, r.bounds.Deadline()))
		ctx, cancelGrace := r.lc.Grace(ctx, stopSettleGrace)
		err := pgbound.Send(ctx, r.pool, r.bounds, build(), func(pgx.BatchResults) error {
			return failpoint.Inject(failpoint.RelayMark)
		})
		cancelGrace()
		cancel()
		if err == nil {
			r.dbOK(stmtSettle)
			return true
		}
		r.dbFailed(stmtSettle, fmt.Errorf("%s: %w", what, err))
		if r.lc.IsStopping() {
			log.Warn("stopping: could not record a batch's outcome; its leases expire and its events are published again",
				size, slog.Any("error", err))
			return false
		}
		if hard := r.lc.Hard(); hard.Err() != nil || !retry.Sleep(hard, wait.Next()) {
			return false
		}
	}
}

// settleStatements returns the mark, fail and release statements of j. A
// pgx.Batch cannot be sent twice: record builds a fresh one for every attempt.
func (r *Relay) settleStatements(batch []claimed, j *pipeline.Judged) *pgx.Batch {
	b := &pgx.Batch{}
	if len(j.Acked) > 0 {
		b.Queue(r.q.mark, uuids(j.Acked), r.cfg.ID)
	}
	if len(j.Failed) > 0 {
		f := pipeline.FailColumnsOf(j.Failed)
		heads := make([]pgoutbox.UUID, len(j.Failed))
		for i, fl := range j.Failed {
			heads[i] = batch[fl.Index].head // the run's head holds the lease
		}
		b.Queue(r.q.fail, uuids(f.IDs), f.Errors, f.DelaysMs, f.Quarantine, r.cfg.ID, uuids(heads))
	}
	if len(j.NotAttempted) > 0 {
		b.Queue(r.q.release, uuids(j.NotAttempted), r.cfg.ID)
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
		delete(r.leased, batch[i].Msg.EventID)
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
