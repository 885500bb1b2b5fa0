package relay

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgoutbox/pgoutbox/internal/heartbeat"
	"github.com/pgoutbox/pgoutbox/internal/lifecycle"
	"github.com/pgoutbox/pgoutbox/internal/pgbound"
	"github.com/pgoutbox/pgoutbox/internal/retry"
	"github.com/pgoutbox/pgoutbox/migrate"
)

// hub listens, holds idle locks and polls for the relays of one database: a
// lone Relay's own, or those of a Group's database. Per relay, that would be
// two sessions and a claim per PollInterval each; at a hundred outboxes, two
// hundred sessions and fifty claims a second of an idle database. The hub
// keeps instead:
//
//   - one LISTEN session for the channels of all its relays (listen), routing
//     each notification to its relay;
//   - one session holding the idle locks of the relays that are idle (guard),
//     with the protocol of idle.go, one lock per outbox;
//   - one statement per PollInterval that finds which idle relays have events
//     to claim (probe), instead of a claim per relay.
//
// So an idle database costs the same few queries a second whatever the number
// of its outboxes. The relays' workers, claims and settles are their own, on
// the database's one pool.
// member is what the hub needs of each of its relays, and all it may use:
// *Relay implements it (below); the hub never reaches into a Relay.
type member interface {
	// schema is the outbox's schema: its idle lock's key, the hub's order.
	schema() string
	// outboxTable is the quoted outbox_events table the probe asks of.
	outboxTable() string
	// notifyChannel is the channel its producers notify (migrate.NotifyChannel).
	notifyChannel() string
	// allIdle reports that every worker waits for a wake-up.
	allIdle() bool
	// refused reports that its own claims fail for a reason the database
	// gave: it is left out of the probe and woken to claim on its own.
	refused() bool
	// poke wakes a worker to claim.
	poke()
	// probeFailed and probeOK report the probe's outcome for it, as from a
	// claim of its own (its health, its log); reset drops hung connections.
	probeFailed(err error, reset bool)
	probeOK()
	// heartbeat is the row the hub writes for it (heartbeat.go).
	heartbeat() heartbeat.Beat
}

func (r *Relay) schema() string        { return r.cfg.Schema }
func (r *Relay) outboxTable() string   { return r.q.table }
func (r *Relay) notifyChannel() string { return r.q.channel }

var _ member = (*Relay)(nil)

type hub struct {
	pool         *pgxpool.Pool
	log          *slog.Logger
	pollInterval time.Duration
	// heartbeatInterval is how often beats writes the relays' heartbeats.
	heartbeatInterval time.Duration
	disableNotify     bool
	bounds            pgbound.Bounds // of the probe: one outbox's lock must not hold it up
	lc                lifecycle.Lifecycle

	mu     sync.Mutex
	relays map[member]struct{}
	// relaysChanged is poked when relays come or go: the listener LISTENs to
	// their channels. (The guard hears of it through idleChanged.)
	relaysChanged lifecycle.Wake
	// idleChanged is every relay's idleChanged: some relay became idle or busy.
	idleChanged lifecycle.Wake
	// joined is poked when a relay joins: beats writes its heartbeat at once.
	joined    lifecycle.Wake
	listening atomic.Bool // the LISTEN session is up and proven to hear
	probes    atomic.Int64
}

func newHub(pool *pgxpool.Pool, log *slog.Logger, c *Config) *hub {
	h := &hub{
		pool: pool, log: log, pollInterval: c.PollInterval, heartbeatInterval: c.HeartbeatInterval, disableNotify: c.DisableNotify,
		bounds:        pgbound.New(c.StatementTimeout, min(c.LockTimeout, probeLockTimeout)),
		relays:        map[member]struct{}{},
		relaysChanged: lifecycle.NewWake(),
		idleChanged:   lifecycle.NewWake(),
		joined:        lifecycle.NewWake(),
	}
	h.lc.Name = "relay hub"
	return h
}

func (h *hub) start(ctx context.Context) error {
	return h.lc.Start(ctx, func(context.Context) error {
		h.lc.Go(h.probe)
		h.lc.Go(h.beats)
		if !h.disableNotify {
			h.lc.Go(h.listen)
			h.lc.Go(h.guard)
		}
		return nil
	})
}

func (h *hub) stop(ctx context.Context) error { return h.lc.Stop(ctx) }

// add makes r one of the hub's relays; New has given it the hub's idleChanged.
func (h *hub) add(r member) {
	h.mu.Lock()
	h.relays[r] = struct{}{}
	h.mu.Unlock()
	h.relaysChanged.Poke()
	h.idleChanged.Poke()
	h.joined.Poke()
}

// remove drops r, whose idle lock the guard then releases.
func (h *hub) remove(r member) {
	h.mu.Lock()
	delete(h.relays, r)
	h.mu.Unlock()
	h.relaysChanged.Poke()
	h.idleChanged.Poke()
}

// snapshot returns the hub's relays, in schema order.
func (h *hub) snapshot() []member {
	h.mu.Lock()
	rs := make([]member, 0, len(h.relays))
	for r := range h.relays {
		rs = append(rs, r)
	}
	h.mu.Unlock()
	slices.SortFunc(rs, func(a, b member) int { return strings.Compare(a.schema(), b.schema()) })
	return rs
}

// helperContext is Relay.helperContext for the hub's goroutines.
func (h *hub) helperContext() (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(h.lc.Hard())
	stopping := h.lc.Stopping()
	go func() {
		select {
		case <-stopping:
			cancel()
		case <-ctx.Done():
		}
	}()
	return ctx, cancel
}

// probe finds, every PollInterval, the idle relays with events to claim, in one
// statement, and wakes them. Busy relays claim anyway; a relay whose outbox
// cannot be read (a dropped schema, a missing privilege, a lock held on it
// past LockTimeout) is woken too, so that its own claim reports the error in
// its health and retries with its backoff. Such a relay is left out of the
// statement from then on (Relay.refused), until one of its claims succeeds.
// The probe waits for a lock at most probeLockTimeout: until the claim of a
// newly locked outbox has failed, that outbox costs each probe twice that.
func (h *hub) probe() {
	ctx, cancel := h.helperContext()
	defer cancel()
	t := time.NewTicker(h.pollInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		var idle, refused []member
		for _, r := range h.snapshot() {
			switch {
			case !r.allIdle():
			case r.refused():
				// Its own claims fail for a reason the database gave: left out
				// of the probe, which it would fail every time, and woken to
				// claim (and back off) on its own until a claim succeeds.
				refused = append(refused, r)
			default:
				idle = append(idle, r)
			}
		}
		for _, r := range refused {
			r.poke()
		}
		if len(idle) == 0 {
			continue
		}
		due, err := h.probeOnce(ctx, idle)
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) {
			// The database answered: some outbox is broken. Probe one by one,
			// so that the others are not held up by it.
			due, err = nil, nil
			for _, r := range idle {
				d, perr := h.probeOnce(ctx, []member{r})
				if errors.As(perr, &pgErr) {
					d = []member{r}
				} else if perr != nil {
					err = perr
					break
				}
				due = append(due, d...)
			}
		}
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			// The relays learn it as from a claim of theirs: their health,
			// their log, and hung connections dropped (once).
			for i, r := range idle {
				r.probeFailed(err, i == 0)
			}
			continue
		}
		for _, r := range idle {
			r.probeOK()
		}
		for _, r := range due {
			r.poke()
		}
	}
}

// probeOnce returns the relays of rs whose outbox holds a claimable event.
// The statement runs under the hub's bounds: a lock on one outbox makes the
// server end it with an error naming the outbox's relation, not hang.
func (h *hub) probeOnce(ctx context.Context, rs []member) ([]member, error) {
	ctx, cancel := context.WithTimeout(ctx, max(h.pollInterval, time.Second, h.bounds.Deadline()))
	defer cancel()
	h.probes.Add(1)
	var idx []int32
	b := &pgx.Batch{}
	b.Queue(probeSQL(rs))
	err := pgbound.Send(ctx, h.pool, h.bounds, b, func(br pgx.BatchResults) error {
		rows, err := br.Query()
		if err != nil {
			return err
		}
		idx, err = pgx.CollectRows(rows, pgx.RowTo[int32])
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("probe: %w", err)
	}
	due := make([]member, 0, len(idx))
	for _, i := range idx {
		if i >= 0 && int(i) < len(rs) {
			due = append(due, rs[i])
		}
	}
	return due, nil
}

// probeSQL is one EXISTS per outbox: is some event claimable now, by the
// claim's own rule (claimableSQL)? It asks of any event, not of a lane's head
// only, so it never misses what a claim would take; its answer may be yes for
// a lane whose head is quarantined, backing off or leased (its later events
// wait): the claim then finds nothing, once per PollInterval. Only schema
// names, quoted as identifiers, and row numbers go into the text.
func probeSQL(rs []member) string {
	var b strings.Builder
	for i, r := range rs {
		if i > 0 {
			b.WriteString("\nUNION ALL\n")
		}
		b.WriteString("SELECT ")
		b.WriteString(strconv.Itoa(i))
		b.WriteString("::int4 WHERE EXISTS (SELECT 1 FROM ")
		b.WriteString(r.outboxTable())
		b.WriteString(" e WHERE ")
		b.WriteString(claimableSQL)
		b.WriteString(")")
	}
	return b.String()
}

// probeLockTimeout bounds the probe's wait for a lock on an outbox. The probe
// is only a hint: an outbox whose lock it cannot get is woken, and its own
// claim waits for the lock as long as Config.LockTimeout allows. A brief lock
// (a partition dropped) thus costs nothing, and a lasting one holds the
// others' probe up little until that claim has failed and the outbox is left
// out.
const probeLockTimeout = 100 * time.Millisecond

// hubProbeChannel is the channel of the listener's own probe notification.
const hubProbeChannel = "pgoutbox.hub"

// listen keeps one session LISTENing on the channels of all the hub's relays.
func (h *hub) listen() {
	ctx, cancel := h.helperContext()
	defer cancel()
	var wait retry.Backoff
	failing := false
	for ctx.Err() == nil {
		err := h.listenOnce(ctx, func() {
			if failing {
				h.log.Info("listening for notifications again")
				failing = false
			}
			wait.Reset()
		})
		h.setListening(false)
		if ctx.Err() != nil {
			return
		}
		if !failing {
			h.log.Warn("notification listener down; polling every "+h.pollInterval.String()+" until it is back", slog.Any("error", err))
			failing = true
		}
		if !retry.Sleep(ctx, wait.Next()) {
			return
		}
	}
}

func (h *hub) setListening(on bool) {
	h.listening.Store(on)
	h.idleChanged.Poke() // the guard takes locks only while the listener hears
}

func (h *hub) listenOnce(ctx context.Context, up func()) error {
	conn, err := pgx.ConnectConfig(ctx, h.pool.Config().ConnConfig.Copy())
	if err != nil {
		return fmt.Errorf("connect: %w", err)
	}
	defer conn.Close(context.Background())
	heard := map[string]member{} // channel → relay
	if _, err := conn.Exec(ctx, "LISTEN "+pgx.Identifier{hubProbeChannel}.Sanitize()); err != nil {
		return fmt.Errorf("listen: %w", err)
	}
	if err := h.sync(ctx, conn, heard); err != nil {
		return err
	}
	if err := h.probeListener(ctx, conn, heard); err != nil {
		return err
	}
	up()
	h.setListening(true)
	for _, r := range heard {
		r.poke() // commits may have gone unnoticed while no session listened
	}
	for {
		// Wait for a notification, a change of the relays, or listenCheck.
		wctx, cancel := context.WithTimeout(ctx, listenCheck)
		var resync atomic.Bool
		watched := make(chan struct{})
		go func() {
			defer close(watched)
			select {
			case <-h.relaysChanged:
				resync.Store(true)
				cancel()
			case <-wctx.Done():
			}
		}()
		n, err := conn.WaitForNotification(wctx)
		cancel()
		<-watched
		if err == nil {
			h.route(heard, n.Channel)
		}
		switch {
		case resync.Load():
			if err := h.sync(ctx, conn, heard); err != nil {
				return err
			}
		case err == nil:
		case ctx.Err() == nil && pgconn.Timeout(err):
			pctx, cancel := context.WithTimeout(ctx, listenPingTimeout)
			err := conn.Ping(pctx)
			cancel()
			if err != nil {
				return fmt.Errorf("listening session does not answer: %w", err)
			}
		default:
			return fmt.Errorf("wait for notification: %w", err)
		}
	}
}

func (h *hub) route(heard map[string]member, channel string) {
	if r := heard[channel]; r != nil {
		r.poke()
	}
}

// sync LISTENs to the channels of relays added since the last sync, and
// UNLISTENs those of relays gone; heard is updated to match.
func (h *hub) sync(ctx context.Context, conn *pgx.Conn, heard map[string]member) error {
	want := map[string]member{}
	for _, r := range h.snapshot() {
		want[r.notifyChannel()] = r
	}
	for ch := range heard {
		if want[ch] == nil {
			if _, err := conn.Exec(ctx, "UNLISTEN "+pgx.Identifier{ch}.Sanitize()); err != nil {
				return fmt.Errorf("unlisten: %w", err)
			}
			delete(heard, ch)
		}
	}
	for ch, r := range want {
		if heard[ch] == nil {
			if _, err := conn.Exec(ctx, "LISTEN "+pgx.Identifier{ch}.Sanitize()); err != nil {
				return fmt.Errorf("listen: %w", err)
			}
			if h.listening.Load() {
				r.poke() // commits before the LISTEN went unnoticed
			}
		}
		heard[ch] = r
	}
	return nil
}

// probeListener is Relay.probeListener for the hub's session, on its own
// channel; notifications of the relays' channels meanwhile wake them.
func (h *hub) probeListener(ctx context.Context, conn *pgx.Conn, heard map[string]member) error {
	token := make([]byte, 8)
	_, _ = rand.Read(token)
	payload := "pgoutbox.probe." + hex.EncodeToString(token)
	pctx, cancel := context.WithTimeout(ctx, listenProbeTimeout)
	defer cancel()
	if _, err := h.pool.Exec(pctx, "SELECT pg_notify($1, $2)", hubProbeChannel, payload); err != nil {
		return fmt.Errorf("listen: send the probe notification: %w", err)
	}
	for {
		n, err := conn.WaitForNotification(pctx)
		switch {
		case err == nil && n.Channel == hubProbeChannel && n.Payload == payload:
			return nil
		case err == nil:
			h.route(heard, n.Channel)
		case ctx.Err() == nil && pctx.Err() != nil:
			return errListenerDeaf
		default:
			return fmt.Errorf("listen: wait for the probe notification: %w", err)
		}
	}
}

// guardLockTimeout bounds one request of the guard for an outbox's idle lock:
// a producer holding it (in shared mode, until its transaction ends) must not
// hold up the locks of the other outboxes. The guard asks again at once, after
// the other outboxes' turn: between two requests of one outbox (a round trip,
// and the others' requests) a committing producer of it neither notifies nor
// is waited for, but it holds the lock in shared mode until it commits, so the
// guard's next grant comes after that commit, and the claim that follows the
// grant finds its events.
const guardLockTimeout = 100 * time.Millisecond

// guard holds, on one session, the idle lock of every idle relay of the hub:
// idle.go's protocol, per outbox. A relay's lock is taken once all its workers
// wait and the listener hears; then the relay claims once more. It is released
// once the relay has been busy for idleRelease.
func (h *hub) guard() {
	ctx, cancel := h.helperContext()
	defer cancel()
	var (
		conn  *pgx.Conn
		held  = map[member]time.Time{} // held locks; the time the relay got busy, or zero
		wait  retry.Backoff
		timer = time.NewTimer(time.Hour)
	)
	timer.Stop()
	defer timer.Stop()
	drop := func() {
		if conn != nil {
			cctx, cancel := context.WithTimeout(context.Background(), guardCloseTimeout)
			_ = conn.Close(cctx) // ends the session: its locks go with it
			cancel()
		}
		conn = nil
		clear(held)
	}
	defer drop()
	for {
		next, again, err := h.guardOnce(ctx, &conn, held)
		switch {
		case ctx.Err() != nil:
			return
		case err != nil:
			h.log.Debug("idle locks: relying on polling", slog.Any("error", err))
			drop()
			next = wait.Next()
		default:
			wait.Reset()
			if again {
				continue // a lock still wanted: queue for it again at once
			}
		}
		if next > 0 {
			timer.Reset(next)
		}
		select {
		case <-ctx.Done():
			return
		case <-h.idleChanged:
		case <-timer.C:
		}
		timer.Stop()
	}
}

// guardOnce takes and releases locks as the relays' states ask, and returns
// when to look again (0: at the next change), or again when a lock it wants
// could not be had within guardLockTimeout.
func (h *hub) guardOnce(ctx context.Context, conn **pgx.Conn, held map[member]time.Time) (next time.Duration, again bool, err error) {
	relays := h.snapshot()
	present := make(map[member]bool, len(relays))
	later := func(d time.Duration) {
		if next == 0 || d < next {
			next = d
		}
	}
	if *conn == nil {
		if !h.listening.Load() {
			return 0, false, nil
		}
		c, err := h.guardConnect(ctx)
		if err != nil {
			return 0, false, err
		}
		*conn = c
	}
	for _, r := range relays {
		present[r] = true
		busySince, isHeld := held[r]
		switch idle := r.allIdle(); {
		case idle && !isHeld && h.listening.Load():
			ok, err := h.lockIdle(ctx, *conn, r.schema())
			if err != nil {
				return 0, false, err
			}
			if !ok {
				again = true
				continue
			}
			held[r] = time.Time{}
			r.poke() // commits that did not notify have ended: look once more
		case idle && isHeld:
			held[r] = time.Time{}
		case !idle && isHeld && busySince.IsZero():
			held[r] = time.Now()
			later(idleRelease)
		case !idle && isHeld:
			if d := idleRelease - time.Since(busySince); d > 0 {
				later(d)
				continue
			}
			if err := h.unlockIdle(ctx, *conn, r.schema()); err != nil {
				return 0, false, err
			}
			delete(held, r)
		}
	}
	for r := range held {
		if !present[r] {
			if err := h.unlockIdle(ctx, *conn, r.schema()); err != nil {
				return 0, false, err
			}
			delete(held, r)
		}
	}
	return next, again, nil
}

func (h *hub) guardConnect(ctx context.Context) (*pgx.Conn, error) {
	ctx, cancel := context.WithTimeout(ctx, guardConnectTimeout)
	defer cancel()
	conn, err := pgx.ConnectConfig(ctx, h.pool.Config().ConnConfig.Copy())
	if err != nil {
		return nil, fmt.Errorf("connect: %w", err)
	}
	// A SET, not a startup parameter, which PgBouncer refuses.
	if _, err := conn.Exec(ctx, "SET lock_timeout = "+strconv.FormatInt(guardLockTimeout.Milliseconds(), 10)); err != nil {
		_ = conn.Close(context.Background())
		return nil, fmt.Errorf("set lock_timeout: %w", err)
	}
	return conn, nil
}

// lockIdle takes schema's idle lock, waiting at most guardLockTimeout; false
// when a producer held it that long.
func (h *hub) lockIdle(ctx context.Context, conn *pgx.Conn, schema string) (bool, error) {
	_, err := conn.Exec(ctx, "SELECT pg_advisory_lock(hashtext($1), hashtext($2))", migrate.IdleLockClass, schema)
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "55P03" { // lock_not_available: lock_timeout
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("idle lock: %w", err)
	}
	return true, nil
}

func (h *hub) unlockIdle(ctx context.Context, conn *pgx.Conn, schema string) error {
	ctx, cancel := context.WithTimeout(ctx, idleUnlockTimeout)
	defer cancel()
	if _, err := conn.Exec(ctx, "SELECT pg_advisory_unlock(hashtext($1), hashtext($2))", migrate.IdleLockClass, schema); err != nil {
		return fmt.Errorf("idle unlock: %w", err)
	}
	return nil
}
