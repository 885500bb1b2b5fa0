package relay

import "time"

// Producers notify only while a relay waits for work (outbox migration 4): an
// idle relay holds the schema's idle lock (migrate.IdleLockClass), an exclusive
// session-level advisory lock, and a committing producer notifies only when it
// cannot take that lock in shared mode.
//
// The relay counts as idle when every worker waits for a wake-up. Its hub's
// guard (hub.go) then takes the lock on a connection of its own, once the
// listener has proven that it hears (hub.probeListener). Taking it waits for the
// producers that are committing without notifying (they hold it in shared mode;
// past guardLockTimeout the guard tries again later), so once the lock is held,
// one more claim finds their events, and every later commit notifies. When the relay gets busy it keeps the lock for idleRelease more, so that
// a relay whose batches come one at a time does not lock and unlock for each, and
// then releases it: a busy relay claims again after each batch anyway, and its
// producers stop paying for NOTIFY.
//
// Several idle relays queue for the one lock; while any holds it, every commit
// notifies, and every listening relay hears it.

// idleRelease is how long a relay that got busy keeps its idle lock
// (migrate.IdleLockClass).
const idleRelease = 100 * time.Millisecond

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
	if n == int32(r.workers) || (!idle && n == int32(r.workers)-1) {
		r.idleChanged.Poke()
	}
}

func (r *Relay) allIdle() bool { return r.idleWorkers.Load() == int32(r.workers) }
