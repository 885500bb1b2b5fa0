package relay

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/pgoutbox/internal/retry"
)

// Producers notify only while a relay waits for work (outbox migration 4): an idle
// relay holds the schema's idle lock, an exclusive session-level advisory lock, and
// a committing producer notifies only when it cannot take that lock in shared mode.
//
// The relay counts as idle when every worker waits for a wake-up. The guard
// goroutine then takes the lock on a connection of its own, once the listener has
// proven that it hears its channel (probeListener). Taking it waits for the
// producers that are committing without notifying (they hold it in shared mode), so
// once the lock is held, one more claim finds their events, and every later commit
// notifies. When the relay gets busy it keeps the lock for idleRelease more, so that
// a relay whose batches come one at a time does not lock and unlock for each, and
// then releases it: a busy relay claims again after each batch anyway, and its
// producers stop paying for NOTIFY.
//
// Several idle relays queue for the one lock; while any holds it, every commit
// notifies, and every listening relay hears it.

const (
	idleLockClass = "pgoutbox.idle"
	idleRelease   = 100 * time.Millisecond
)

// Timeouts of the guard's own connection.
const (
	// guardConnectTimeout bounds connecting the guard's session.
	guardConnectTimeout = 10 * time.Second
	// idleUnlockTimeout bounds releasing the idle lock when the relay gets
	// busy; past it the session is closed, which releases the lock too.
	idleUnlockTimeout = 5 * time.Second
	// guardCloseTimeout bounds closing the guard's session (which ends the
	// lock); a session not closed in time is dropped by the server.
	guardCloseTimeout = 2 * time.Second
)

// setIdle records a worker's transition between waiting for work (idle) and having
// work, and tells the guard when the whole relay changes state.
func (r *Relay) setIdle(worker *bool, idle bool) {
	if *worker == idle {
		return
	}
	*worker = idle
	delta := int32(-1)
	if idle {
		delta = 1
	}
	n := r.idleWorkers.Add(delta)
	if n == int32(r.cfg.Workers) || (!idle && n == int32(r.cfg.Workers)-1) {
		r.idleChanged.Poke()
	}
}

func (r *Relay) allIdle() bool { return r.idleWorkers.Load() == int32(r.cfg.Workers) }

// guard holds the idle lock while the relay is idle.
func (r *Relay) guard() {
	ctx, cancel := r.helperContext()
	defer cancel()
	var (
		conn    *pgx.Conn
		held    bool
		wait    retry.Backoff
		release = time.NewTimer(time.Hour)
	)
	release.Stop()
	defer func() {
		release.Stop()
		if conn != nil {
			ctx, cancel := context.WithTimeout(context.Background(), guardCloseTimeout)
			defer cancel()
			_ = conn.Close(ctx) // ends the session: the lock goes with it
		}
	}()
	drop := func() {
		if conn != nil {
			ctx, cancel := context.WithTimeout(context.Background(), guardCloseTimeout)
			_ = conn.Close(ctx)
			cancel()
		}
		conn, held = nil, false
	}
	for {
		// The lock is taken only while the listener is proven to hear
		// (probeListener): a deaf relay gains nothing from producers'
		// notifications, and through a pooler in transaction mode the lock
		// would stay with a pooled server session.
		switch idle := r.allIdle(); {
		case idle && !held && r.listening.Load():
			release.Stop()
			if conn == nil {
				var err error
				if conn, err = r.guardConnect(ctx); err != nil {
					r.log.Debug("idle lock: connect failed; relying on polling", slog.Any("error", err))
					if !retry.Sleep(ctx, wait.Next()) {
						return
					}
					continue
				}
			}
			ok, err := r.lockIdle(ctx, conn)
			switch {
			case err == nil && !ok:
				// Got busy or stopping while waiting: the cancelled request may
				// have raced a grant, so end the session to be sure of holding nothing.
				drop()
			case err != nil:
				r.log.Debug("idle lock: lock failed; relying on polling", slog.Any("error", err))
				drop()
				if !retry.Sleep(ctx, wait.Next()) {
					return
				}
				continue
			case ok:
				held = true
				wait.Reset()
				// Commits that did not notify have ended: look once more.
				r.poke()
			}
		case !idle && held:
			release.Reset(idleRelease)
		}
		select {
		case <-ctx.Done():
			return
		case <-r.idleChanged:
		case <-release.C:
			if held && !r.allIdle() {
				ctx, cancel := context.WithTimeout(ctx, idleUnlockTimeout)
				_, err := conn.Exec(ctx, "SELECT pg_advisory_unlock(hashtext($1), hashtext($2))", idleLockClass, r.cfg.Schema)
				cancel()
				held = false
				if err != nil {
					drop()
				}
			}
		}
	}
}

func (r *Relay) guardConnect(ctx context.Context) (*pgx.Conn, error) {
	ctx, cancel := context.WithTimeout(ctx, guardConnectTimeout)
	defer cancel()
	conn, err := pgx.ConnectConfig(ctx, r.pool.Config().ConnConfig.Copy())
	if err != nil {
		return nil, fmt.Errorf("connect: %w", err)
	}
	return conn, nil
}

// lockIdle waits for the idle lock. It gives up, returning false, when the relay
// gets busy or stops meanwhile (another relay may hold the lock for a long time).
func (r *Relay) lockIdle(ctx context.Context, conn *pgx.Conn) (bool, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan struct{})
	defer close(done)
	go func() {
		for {
			select {
			case <-done:
				return
			case <-ctx.Done():
				return
			case <-r.idleChanged:
				if !r.allIdle() {
					cancel()
					return
				}
			}
		}
	}()
	_, err := conn.Exec(ctx, "SELECT pg_advisory_lock(hashtext($1), hashtext($2))", idleLockClass, r.cfg.Schema)
	if err != nil {
		if ctx.Err() != nil {
			return false, nil
		}
		return false, fmt.Errorf("idle lock: %w", err)
	}
	return true, nil
}
