package cdc

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgoutbox/pgoutbox/broker"
)

// ErrSlotHealthy is returned by Recover when the slot exists, is idle and has
// its WAL, and Force was not given: there is nothing to recover.
var ErrSlotHealthy = errors.New("cdc: replication slot exists and is healthy")

// RecoverOptions tunes Recover.
type RecoverOptions struct {
	// Force recreates a healthy slot too. Nothing is lost either way: every
	// unpublished event is published from the table.
	Force bool
}

// RecoverResult is what Recover did.
type RecoverResult struct {
	Slot            string // the slot's name
	ConsistentPoint string // the new slot's start position
	Lanes           int    // aggregates that had unpublished events
	Published       int64  // events published from the table
	Remaining       int64  // events still unpublished: Quarantined + Failing + the rest, committed meanwhile
	// Quarantined are unpublished events quarantined (by this run or before).
	Quarantined int64
	// Failing are unpublished events with a failed attempt, not quarantined:
	// backing off, for the CDC source to retry when it starts.
	Failing int64
}

// Flowing is the number of remaining events that have never been tried:
// committed while Recover ran, they come through the new slot's stream. They
// are no sign of trouble.
func (r RecoverResult) Flowing() int64 { return r.Remaining - r.Quarantined - r.Failing }

// Recover recreates the replication slot after it was lost (dropped, or
// invalidated by max_slot_wal_keep_size) and publishes from the table every event
// the new slot will not send: each lane in sequence order, with the relay's retry
// and quarantine rules. It creates the slot first, then reads the unpublished
// events in the snapshot the slot exports, so that every event is either in that
// snapshot or in the new slot's stream. It returns once no lane has an event that
// may go now; events left (quarantined, backing off) stay in the table, and the
// CDC source publishes them when it starts. The slot must not be in use.
func Recover(ctx context.Context, pool *pgxpool.Pool, pub broker.Publisher, cfg *Config, opts RecoverOptions) (RecoverResult, error) {
	s, err := New(pool, pub, cfg)
	if err != nil {
		return RecoverResult{}, err
	}
	c := &s.cfg
	res := RecoverResult{Slot: c.Slot}
	st, err := slotState(ctx, pool, c)
	switch {
	case err != nil && !errors.Is(err, ErrSlotLost):
		return res, err
	case err == nil && st.exists && !opts.Force:
		return res, fmt.Errorf("%w: slot %q has the WAL it needs; nothing to recover (force recreates it anyway)", ErrSlotHealthy, c.Slot)
	}
	lanes, lsn, _, err := prepare(ctx, pool, c, &s.q, true)
	if err != nil {
		return res, err
	}
	res.ConsistentPoint, res.Lanes = lsn.String(), len(lanes)
	// Recover runs rounds of the table path itself, not the Source's goroutines:
	// its ctx is the context of the work in flight.
	hard, cancel := context.WithCancel(ctx)
	defer cancel()
	s.hardCtx = hard
	now := time.Now()
	for _, l := range lanes {
		s.blocked[l.key] = &laneState{seen: l.seen, due: now}
	}
	for ctx.Err() == nil {
		progressed, next := s.round()
		if !progressed && next.After(time.Now()) {
			break
		}
	}
	if err := ctx.Err(); err != nil {
		return res, fmt.Errorf("cdc: recover: %w", err)
	}
	res.Published = s.Stats().Published
	if err := pool.QueryRow(ctx, s.q.remaining).Scan(&res.Remaining, &res.Quarantined, &res.Failing); err != nil {
		return res, fmt.Errorf("cdc: count unpublished events: %w", err)
	}
	return res, nil
}
