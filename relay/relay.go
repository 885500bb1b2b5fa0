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
// docs/design.md states who owns a row when, and what each crash leaves behind;
// its "Relay: the lane rule" is the one full explanation of the claim.
package relay

import (
	"cmp"
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
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgoutbox/pgoutbox"
	"github.com/pgoutbox/pgoutbox/broker"
	"github.com/pgoutbox/pgoutbox/internal/failpoint"
	"github.com/pgoutbox/pgoutbox/internal/retry"
	"github.com/pgoutbox/pgoutbox/migrate"
)

// Relay moves events from the outbox to a broker. Create it with New, then Start
// it; Stop it to shut down gracefully. A Relay is not restartable.
type Relay struct {
	cfg  Config
	pool *pgxpool.Pool
	pub  broker.Publisher
	q    queries
	log  *slog.Logger

	wake     chan struct{}  // a token per pending reason to claim
	retry    chan time.Time // when a backoff comes due
	stopping chan struct{}  // closed by Stop: claim no more
	// hardCtx is cancelled when Stop's deadline passes or Start's ctx ends: in-flight
	// publishes are abandoned and their leases released.
	hardCtx    context.Context
	hardCancel context.CancelFunc
	workers    sync.WaitGroup
	helpers    sync.WaitGroup

	startOnce, stopOnce sync.Once
	started             atomic.Bool

	mu     sync.Mutex
	leased map[pgoutbox.UUID]struct{} // leases taken and not yet settled

	dbDown, brokerDown atomic.Bool
	brokerRefused      atomic.Pointer[string] // why the broker refuses our configuration (broker.Misconfigured), or nil
	// denied holds, per statement kind (claim, settle), the last database
	// error that was a missing privilege, nil once that kind succeeds again
	// (dbFailed, dbOK): a role may be allowed to claim and not to settle.
	denied [2]atomic.Pointer[error]

	idleWorkers atomic.Int32 // workers waiting for a wake-up (idle.go)
	lastFound   atomic.Int64 // when a claim last found events (unix ns)
	// claimMu serialises the workers' claims, which share one cursor: each claim
	// starts after the lanes of the one before, instead of every worker walking
	// past the lanes its peers hold (claim).
	claimMu     sync.Mutex
	cur         cursor
	hotPoller   atomic.Bool   // a worker polls quickly instead of waiting (work)
	idleChanged chan struct{} // the relay became idle or busy
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
	if pool == nil || pub == nil {
		return nil, errors.New("relay: New needs a pool and a publisher")
	}
	c, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	return &Relay{
		cfg:      c,
		pool:     pool,
		pub:      pub,
		q:        newQueries(c.Schema),
		log:      c.Logger.With(slog.String("relay", c.ID)),
		wake:     make(chan struct{}, c.Workers),
		retry:    make(chan time.Time, 16),
		stopping: make(chan struct{}),
		leased:   map[pgoutbox.UUID]struct{}{},

		idleChanged: make(chan struct{}, 1),
	}, nil
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
)

// Healthy reports nil when the last contact with the database and with the broker
// succeeded, else what is wrong: ErrDatabaseUnreachable, ErrPermissionDenied
// (with the database's message: which privilege on which table),
// ErrBrokerUnreachable, ErrBrokerMisconfigured (with the broker's answer) or
// several (errors.Is tells them apart).
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
	if r.brokerDown.Load() {
		errs = append(errs, ErrBrokerUnreachable)
	}
	if reason := r.brokerRefused.Load(); reason != nil {
		errs = append(errs, fmt.Errorf("%w: %s", ErrBrokerMisconfigured, *reason))
	}
	return errors.Join(errs...)
}

// brokerRefuses records that the broker refused the relay's configuration,
// logging the change as the configuration error it is.
func (r *Relay) brokerRefuses(reason string) {
	r.brokerDown.Store(false) // it answers: not an outage
	if r.brokerRefused.Swap(&reason) == nil {
		r.log.Error("the broker refuses the relay's configuration (credentials, signing secret, permissions): "+
			"fix the configuration; events are retried with backoff and none is quarantined", slog.String("error", reason))
	}
}

// brokerAccepts clears a configuration refusal; ok says the broker acknowledged.
func (r *Relay) brokerAccepts(ok bool) {
	if r.brokerRefused.Swap(nil) != nil && ok {
		r.log.Info("the broker accepts the relay's configuration again")
	}
}

// Start launches the workers and the notification listener and returns at once.
// Cancelling ctx stops the relay abruptly: in-flight publishes are abandoned and
// their leases released (best effort); prefer Stop. Start may be called once.
func (r *Relay) Start(ctx context.Context) error {
	err := errors.New("relay: already started")
	r.startOnce.Do(func() {
		err = nil
		r.started.Store(true)
		r.hardCtx, r.hardCancel = context.WithCancel(context.WithoutCancel(ctx))
		// Start's ctx ending is a hard stop.
		r.helpers.Add(1)
		go func() {
			defer r.helpers.Done()
			select {
			case <-ctx.Done():
				r.signalStop()
				r.hardCancel()
			case <-r.hardCtx.Done():
			}
		}()
		r.log.Info("relay starting", slog.String("schema", r.cfg.Schema), slog.Int("workers", r.cfg.Workers),
			slog.Int("batch_size", r.cfg.BatchSize), slog.Duration("lease", r.cfg.Lease))
		for i := range r.cfg.Workers {
			r.workers.Add(1)
			go r.work(i)
		}
		r.helpers.Add(1)
		go r.poll()
		if !r.cfg.DisableNotify {
			r.helpers.Add(2)
			go r.listen()
			go r.guard()
		}
	})
	return err
}

func (r *Relay) signalStop() { r.stopOnce.Do(func() { close(r.stopping) }) }

// Stop shuts the relay down gracefully: it stops claiming, waits for in-flight
// publishes to be acknowledged and marked, and releases the leases of events it
// did not publish. If ctx ends first, in-flight publishes are abandoned (their
// leases released, best effort) and ctx's error is returned. Stop is safe to call
// more than once, and before Start.
func (r *Relay) Stop(ctx context.Context) error {
	r.signalStop()
	if !r.started.Load() {
		return nil
	}
	done := make(chan struct{})
	go func() { r.workers.Wait(); close(done) }()
	var err error
	select {
	case <-done:
	case <-ctx.Done():
		err = fmt.Errorf("relay: stop: %w", ctx.Err())
		r.hardCancel()
		<-done
	}
	r.hardCancel()
	r.helpers.Wait()
	// Workers settle every batch; this only finds leases whose settling failed
	// (database down), and tries once more.
	if ids := r.outstanding(); len(ids) > 0 {
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if _, rerr := r.pool.Exec(sctx, r.q.release, uuids(ids), r.cfg.ID); rerr != nil {
			r.log.Warn("could not release leases; they expire on their own", slog.Int("events", len(ids)), slog.Any("error", rerr))
		} else {
			r.forget(ids)
		}
	}
	s := r.Stats()
	r.log.Info("relay stopped", slog.Int64("published", s.Published), slog.Int64("failed", s.Failed),
		slog.Int64("quarantined", s.Quarantined))
	return err
}

// poke asks one idle worker to claim.
func (r *Relay) poke() {
	select {
	case r.wake <- struct{}{}:
	default:
	}
}

// poll wakes a worker every PollInterval, and when the earliest backoff that a
// worker reported comes due.
func (r *Relay) poll() {
	defer r.helpers.Done()
	t := time.NewTicker(r.cfg.PollInterval)
	defer t.Stop()
	due := time.NewTimer(time.Hour)
	due.Stop()
	defer due.Stop()
	var dueAt time.Time
	for {
		select {
		case <-r.stopping:
			return
		case <-t.C:
			r.poke()
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

// listen keeps a dedicated connection LISTENing on the schema's channel and turns
// notifications into wake-ups. After any reconnect it wakes a worker, since commits
// may have gone unnoticed meanwhile.
func (r *Relay) listen() {
	defer r.helpers.Done()
	ctx, cancel := context.WithCancel(r.hardCtx)
	defer cancel()
	go func() {
		select {
		case <-r.stopping:
			cancel()
		case <-ctx.Done():
		}
	}()
	var wait retry.Backoff
	failing := false
	for ctx.Err() == nil {
		err := r.listenOnce(ctx, func() {
			if failing {
				r.log.Info("listening for notifications again")
				failing = false
			}
			wait.Reset()
		})
		if ctx.Err() != nil {
			return
		}
		if !failing {
			r.log.Warn("notification listener down; polling every "+r.cfg.PollInterval.String()+" until it is back", slog.Any("error", err))
			failing = true
		}
		if !retry.Sleep(ctx, wait.Next()) {
			return
		}
	}
}

func (r *Relay) listenOnce(ctx context.Context, up func()) error {
	conn, err := pgx.ConnectConfig(ctx, r.pool.Config().ConnConfig.Copy())
	if err != nil {
		return fmt.Errorf("connect: %w", err)
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(ctx, "LISTEN "+pgx.Identifier{r.q.channel}.Sanitize()); err != nil {
		return fmt.Errorf("listen: %w", err)
	}
	up()
	r.poke()
	for {
		if _, err := conn.WaitForNotification(ctx); err != nil {
			return fmt.Errorf("wait for notification: %w", err)
		}
		r.poke()
	}
}

// work is one claim → publish → settle loop.
func (r *Relay) work(id int) {
	defer r.workers.Done()
	var wait retry.Backoff
	again := true // claim at once on start: there may be a backlog
	idle := false
	hot := time.NewTimer(time.Hour)
	hot.Stop()
	defer hot.Stop()
	for {
		if !again {
			if !r.waitForWork(&idle, hot) {
				return
			}
		}
		select {
		case <-r.stopping:
			return
		default:
		}
		batch, err := r.claim()
		if errors.Is(err, errStopping) {
			return
		}
		if err != nil {
			r.dbFailed(stmtClaim, err)
			again = true
			if !sleepStop(r.stopping, wait.Next()) {
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
		r.lastFound.Store(time.Now().UnixNano())
		r.setIdle(&idle, false)
		if pause := r.process(batch); pause > 0 {
			// The broker is unreachable: hold off claiming instead of cycling every
			// lane's head through failed attempts.
			again = true
			if !sleepStop(r.stopping, pause) {
				return
			}
		}
	}
}

// Under a steady flow of events, one worker keeps polling every hotPoll instead of
// waiting for a notification, until no claim has found anything for hotLinger.
// The relay then never counts as idle, so producers do not notify (idle.go): at a
// thousand commits a second, a NOTIFY per commit would serialise the commits on
// PostgreSQL's notification queue lock, and a wake-up per commit would cost a
// claim per event. Events wait at most hotPoll for the next claim.
const (
	hotPoll   = 2 * time.Millisecond
	hotLinger = 100 * time.Millisecond
)

// waitForWork waits for a reason to claim again: a wake-up, or the hot poll timer
// while events keep coming. It returns false when the relay stops.
func (r *Relay) waitForWork(idle *bool, hot *time.Timer) bool {
	if time.Since(time.Unix(0, r.lastFound.Load())) < hotLinger && r.hotPoller.CompareAndSwap(false, true) {
		defer r.hotPoller.Store(false)
		r.setIdle(idle, false)
		hot.Reset(hotPoll)
		defer hot.Stop()
		select {
		case <-r.stopping:
			return false
		case <-r.wake:
		case <-hot.C:
		}
		return true
	}
	r.setIdle(idle, true)
	select {
	case <-r.stopping:
		return false
	case <-r.wake:
	}
	return true
}

// announceBacklog wakes a peer worker, and the other relays through a notification:
// a full batch means a backlog, and relays that found nothing earlier (their claim
// raced ours for the same lanes) would otherwise sleep until their next poll.
func (r *Relay) announceBacklog() {
	r.poke()
	if r.cfg.DisableNotify {
		return
	}
	ctx, cancel := context.WithTimeout(r.hardCtx, 5*time.Second)
	defer cancel()
	if _, err := r.pool.Exec(ctx, "SELECT pg_notify($1, '')", r.q.channel); err != nil {
		r.log.Debug("could not announce the backlog", slog.Any("error", err))
	}
}

// dbFailed records a failed statement: a missing privilege (the database
// answered, and will refuse again until someone grants it) or an unreachable
// database. Either is retried with backoff; only the change is logged.
func (r *Relay) dbFailed(kind int, err error) {
	if !migrate.IsPermissionDenied(err) {
		retry.MarkDown(&r.dbDown, r.log, "database", err)
		return
	}
	retry.MarkUp(&r.dbDown, r.log, "database")
	if r.denied[kind].Swap(&err) == nil {
		r.log.Error("permission denied: the relay's role lacks a privilege; grant what 'pgoutbox migrate print --grants' lists for the relay role (docs/security.md); retrying with backoff",
			slog.Any("error", err))
	}
}

// Statement kinds of dbFailed and dbOK.
const (
	stmtClaim = iota
	stmtSettle
)

// dbOK records a statement of the kind that succeeded.
func (r *Relay) dbOK(kind int) {
	if r.denied[kind].Swap(nil) != nil {
		r.log.Info("the relay's statements are permitted again")
	}
	retry.MarkUp(&r.dbDown, r.log, "database")
}

// errStopping is claim's answer once the relay is stopping.
var errStopping = errors.New("relay: stopping")

// cursor is where the relay's next lane scan starts, so successive claims sweep all
// lanes fairly instead of favouring the first ones in index order.
type cursor struct{ aggregateType, aggregateID string }

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
	select {
	case <-r.stopping:
		// Stopped while a peer's claim ran (a slow one, if the database hangs):
		// do not start another.
		return nil, errStopping
	default:
	}
	cur := &r.cur
	ctx, cancel := context.WithTimeout(r.hardCtx, r.cfg.Lease/2)
	defer cancel()
	start := time.Now()
	batch, err := r.claimFrom(ctx, *cur, r.cfg.BatchSize)
	if err != nil {
		return nil, err
	}
	if len(batch) == 0 && *cur != (cursor{}) {
		// Nothing after the cursor: start over from the first lanes.
		if batch, err = r.claimFrom(ctx, cursor{}, r.cfg.BatchSize); err != nil {
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
		obs.BatchClaimed(ClaimedBatch{Events: len(batch), TakenOver: takenOver, Duration: time.Since(start)})
	}
	// A full batch: the next claim goes on after its last lane, so that successive
	// claims sweep all lanes. A short one scanned to the end of the pending lanes:
	// the next claim starts from the first ones, in one statement.
	*cur = cursor{}
	if len(batch) < r.cfg.BatchSize {
		return batch, nil
	}
	for _, c := range batch {
		if k := (cursor{c.msg.AggregateType, c.msg.AggregateID}); cmpCursor(k, *cur) > 0 {
			*cur = k
		}
	}
	return batch, nil
}

func cmpCursor(a, b cursor) int {
	return cmp.Or(strings.Compare(a.aggregateType, b.aggregateType), strings.Compare(a.aggregateID, b.aggregateID))
}

func (r *Relay) claimFrom(ctx context.Context, from cursor, limit int) ([]claimed, error) {
	rows, err := r.pool.Query(ctx, r.q.claim, r.cfg.ID, r.cfg.Lease.Milliseconds(),
		from.aggregateType, from.aggregateID, limit, r.cfg.RunLength)
	if err != nil {
		return nil, fmt.Errorf("claim batch: %w", err)
	}
	if err := failpoint.Inject(failpoint.RelayClaim); err != nil {
		rows.Close()
		return nil, fmt.Errorf("claim batch: %w", err)
	}
	batch, err := pgx.AppendRows(make([]claimed, 0, limit), rows, func(row pgx.CollectableRow) (claimed, error) {
		var c claimed
		var headers []byte
		err := row.Scan(&c.msg.EventID, &c.msg.AggregateType, &c.msg.AggregateID, &c.msg.AggregateSequence,
			&c.msg.EventType, &c.msg.SchemaVersion, &c.msg.Payload, &headers, &c.msg.OccurredAt,
			&c.attempts, &c.previousHolder, &c.head)
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
		return cmp.Or(strings.Compare(a.msg.AggregateType, b.msg.AggregateType),
			strings.Compare(a.msg.AggregateID, b.msg.AggregateID),
			cmp.Compare(a.msg.AggregateSequence, b.msg.AggregateSequence))
	})
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
	var results []error
	start := time.Now()
	if err := failpoint.Inject(failpoint.RelayBeforePublish); err != nil {
		results = make([]error, len(msgs))
		for i := range results {
			results[i] = broker.Unavailable(err)
		}
	} else {
		pctx, cancel := context.WithTimeout(r.hardCtx, r.cfg.PublishTimeout)
		// Rows written around the producer's checks (a raw INSERT) with reserved
		// headers or sizes beyond the limits are quarantined here, never sent.
		results = broker.PublishValid(pctx, r.pub, msgs, refused)
		cancel()
		_ = failpoint.Inject(failpoint.RelayAfterPublish) // crash or delay only: the broker has spoken
	}
	published := time.Since(start)
	if len(results) != len(msgs) {
		r.log.Error("publisher returned the wrong number of results; releasing the batch",
			slog.Int("messages", len(msgs)), slog.Int("results", len(results)))
		results = make([]error, len(msgs))
		for i := range results {
			results[i] = broker.ErrPredecessorFailed
		}
	}
	return r.settle(batch, results, published)
}

// settle records the outcome of a publish: acked events published, failed ones
// retried later or quarantined, unattempted ones released. The three statements go
// in one round trip and one implicit transaction. If the database is unreachable,
// settling is retried until the relay is hard-stopped; the leases then simply expire
// and the events are published again (a duplicate, never a loss).
func (r *Relay) settle(batch []claimed, results []error, publishDuration time.Duration) time.Duration {
	var (
		acked, released           []pgoutbox.UUID
		failIDs                   []pgoutbox.UUID
		failErrs                  []string
		failDelays                []int64
		failQuarantine            []bool
		failHeads                 []pgoutbox.UUID
		anyAck, allUnavailable    = false, true
		refusedErr                string // the first broker.Misconfigured failure
		quarantined, firstRetryIn = 0, time.Duration(0)
	)
	hardStopped := r.hardCtx.Err() != nil
	var outcomes []EventOutcome // only for the Observer
	if r.cfg.Observer != nil {
		outcomes = make([]EventOutcome, len(batch))
	}
	note := func(i int, res Result, attempt int, err error) {
		if outcomes != nil {
			o := &outcomes[i]
			o.EventID, o.AggregateType, o.EventType = batch[i].msg.EventID, batch[i].msg.AggregateType, batch[i].msg.EventType
			o.Result, o.Attempt, o.Err = res, attempt, err
			if err != nil {
				o.Reason = ClassifyFailure(err)
			}
		}
	}
	for i, err := range results {
		c := &batch[i]
		switch {
		case err == nil:
			acked = append(acked, c.msg.EventID)
			anyAck = true
			note(i, ResultPublished, c.attempts+1, nil)
		case errors.Is(err, broker.ErrPredecessorFailed),
			hardStopped && (errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)):
			// Not attempted, or abandoned by a hard stop: not the event's fault.
			released = append(released, c.msg.EventID)
			note(i, ResultReleased, 0, nil)
		default:
			unavailable := broker.IsUnavailable(err)
			allUnavailable = allUnavailable && unavailable
			if refusedErr == "" && broker.IsMisconfigured(err) {
				refusedErr = retry.ErrorText(err)
			}
			attempt := c.attempts + 1
			quarantine := broker.IsPermanent(err) || (!unavailable && attempt >= r.cfg.MaxAttempts)
			delay := retry.AttemptDelay(attempt, r.cfg.BackoffBase, r.cfg.BackoffMax, unavailable)
			if quarantine {
				quarantined++
				r.log.Warn("event quarantined", slog.String("event_id", c.msg.EventID.String()),
					slog.String("aggregate", c.msg.AggregateType+"/"+c.msg.AggregateID),
					slog.Int64("sequence", c.msg.AggregateSequence), slog.Int("attempts", attempt), slog.String("error", retry.ErrorText(err)))
				note(i, ResultQuarantined, attempt, err)
			} else {
				if firstRetryIn == 0 || delay < firstRetryIn {
					firstRetryIn = delay
				}
				note(i, ResultFailed, attempt, err)
			}
			failIDs = append(failIDs, c.msg.EventID)
			failErrs = append(failErrs, retry.ErrorText(err))
			failDelays = append(failDelays, delay.Milliseconds())
			failQuarantine = append(failQuarantine, quarantine)
			failHeads = append(failHeads, c.head)
		}
	}

	// A pgx.Batch cannot be sent twice: build a fresh one for every attempt.
	newBatch := func() *pgx.Batch {
		b := &pgx.Batch{}
		if len(acked) > 0 {
			b.Queue(r.q.mark, uuids(acked), r.cfg.ID)
		}
		if len(failIDs) > 0 {
			b.Queue(r.q.fail, uuids(failIDs), failErrs, failDelays, failQuarantine, r.cfg.ID, uuids(failHeads))
		}
		if len(released) > 0 {
			b.Queue(r.q.release, uuids(released), r.cfg.ID)
		}
		return b
	}
	var wait retry.Backoff
	settleStart := time.Now()
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		br := r.pool.SendBatch(ctx, newBatch())
		err := failpoint.Inject(failpoint.RelayMark)
		err = errors.Join(err, br.Close())
		cancel()
		if err == nil {
			r.dbOK(stmtSettle)
			break
		}
		r.dbFailed(stmtSettle, fmt.Errorf("settle batch: %w", err))
		if r.hardCtx.Err() != nil || !retry.Sleep(r.hardCtx, wait.Next()) {
			return 0 // leases stay with us; Stop tries once more, then they expire
		}
	}
	all := make([]pgoutbox.UUID, len(batch))
	for i := range batch {
		all[i] = batch[i].msg.EventID
	}
	r.forget(all)
	r.stats.published.Add(int64(len(acked)))
	r.stats.failed.Add(int64(len(failIDs)))
	r.stats.quarantined.Add(int64(quarantined))
	r.stats.released.Add(int64(len(released)))
	if outcomes != nil {
		r.cfg.Observer.BatchSettled(SettledBatch{Events: outcomes, PublishDuration: publishDuration, SettleDuration: time.Since(settleStart)})
	}

	if firstRetryIn > 0 {
		// Wake up when the first backoff ends rather than at the next poll.
		select {
		case r.retry <- time.Now().Add(firstRetryIn):
		default:
		}
	}
	switch {
	case anyAck:
		retry.MarkUp(&r.brokerDown, r.log, "broker")
		r.brokerAccepts(true)
	case len(failIDs) > 0 && allUnavailable && refusedErr != "":
		r.brokerRefuses(refusedErr)
		return min(firstRetryIn, r.cfg.PollInterval)
	case len(failIDs) > 0 && allUnavailable:
		r.brokerAccepts(false)
		retry.MarkDown(&r.brokerDown, r.log, "broker", errors.New(failErrs[0]))
		return min(firstRetryIn, r.cfg.PollInterval)
	}
	return 0
}

// uuids converts ids for a uuid[] parameter: pgx encodes [16]byte natively, where
// UUID would go through its driver.Valuer text form, element by element.
func uuids(ids []pgoutbox.UUID) [][16]byte {
	out := make([][16]byte, len(ids))
	for i, id := range ids {
		out[i] = id
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
