package pgoutboxtest

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/pgoutbox/pgoutbox"
)

// QuarantinedEvent is an event the relay gave up on (see docs/design.md,
// quarantine), as WaitDrained reports it.
type QuarantinedEvent struct {
	ID                pgoutbox.UUID
	AggregateType     string
	AggregateID       string
	AggregateSequence int64
	EventType         string
	// LastError is the publisher's last error for the event (outbox_events.last_error).
	LastError string
}

// QuarantinedError is WaitDrained's error when events it waited for were
// quarantined instead of published. Get it with errors.As.
type QuarantinedError struct {
	// Events are the quarantined events, by aggregate and sequence.
	Events []QuarantinedEvent
	// Blocked counts the events waited for that stay unpublished behind a
	// quarantined event of their aggregate.
	Blocked int
}

// Error names every quarantined event and its last error.
func (e *QuarantinedError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "pgoutboxtest: %d event(s) quarantined", len(e.Events))
	if e.Blocked > 0 {
		fmt.Fprintf(&b, ", %d more blocked behind them", e.Blocked)
	}
	for _, q := range e.Events {
		fmt.Fprintf(&b, "; %s %s/%s #%d (%s): %s", q.EventType, q.AggregateType, q.AggregateID, q.AggregateSequence, q.ID, q.LastError)
	}
	return b.String()
}

// WaitDrained returns once every event committed before the call has been
// published, which Published then shows. If some of them were quarantined
// instead (their publisher refused them, or failed Relay.MaxAttempts times),
// it returns a *QuarantinedError naming them, once nothing else of them is left
// to publish; events quarantined before the call count too. ctx bounds the wait
// (give it a deadline): when it ends, the error says how many events were still
// unpublished and wraps ctx's error.
func (r *Relay) WaitDrained(ctx context.Context) error {
	ids, err := r.unpublished(ctx)
	if err != nil {
		if ctx.Err() != nil {
			return fmt.Errorf("pgoutboxtest: wait for drain: before the outbox was read: %w", ctx.Err())
		}
		return err
	}
	tick := time.NewTicker(r.cfg.DrainPoll)
	defer tick.Stop()
	for {
		var qe QuarantinedError
		left, err := r.pending(ctx, ids, &qe)
		if err != nil {
			if ctx.Err() != nil { // the deadline came during the query
				return drainTimedOut(ctx, len(ids))
			}
			return err
		}
		ids = left
		switch {
		case len(ids) == 0 && len(qe.Events) == 0:
			return nil
		case len(ids) == 0:
			return &qe
		}
		select {
		case <-ctx.Done():
			return drainTimedOut(ctx, len(ids))
		case <-tick.C:
		}
	}
}

// drainTimedOut is WaitDrained's error when ctx ended with n events (at most)
// still unpublished.
func drainTimedOut(ctx context.Context, n int) error {
	return fmt.Errorf("pgoutboxtest: wait for drain: %d event(s) still unpublished: %w", n, ctx.Err())
}

// unpublished returns the ids of every committed event not yet published.
func (r *Relay) unpublished(ctx context.Context) ([][16]byte, error) {
	rows, err := r.pool.Query(ctx, r.sql.unpublished)
	if err != nil {
		return nil, fmt.Errorf("pgoutboxtest: list unpublished events: %w", err)
	}
	defer rows.Close()
	var ids [][16]byte
	for rows.Next() {
		var id [16]byte
		if err := rows.Scan(&id); err != nil {
			return nil, fmt.Errorf("pgoutboxtest: list unpublished events: %w", err)
		}
		ids = append(ids, id)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("pgoutboxtest: list unpublished events: %w", err)
	}
	return ids, nil
}

// pending returns those of ids the relay may still publish, and adds the
// quarantined ones and the count of those blocked behind them to qe.
func (r *Relay) pending(ctx context.Context, ids [][16]byte, qe *QuarantinedError) ([][16]byte, error) {
	if len(ids) == 0 {
		return nil, nil
	}
	rows, err := r.pool.Query(ctx, r.sql.pending, ids)
	if err != nil {
		return nil, fmt.Errorf("pgoutboxtest: read unpublished events: %w", err)
	}
	defer rows.Close()
	var left [][16]byte
	for rows.Next() {
		var (
			id                  [16]byte
			q                   QuarantinedEvent
			quarantined, behind bool
		)
		if err := rows.Scan(&id, &q.AggregateType, &q.AggregateID, &q.AggregateSequence, &q.EventType,
			&quarantined, &q.LastError, &behind); err != nil {
			return nil, fmt.Errorf("pgoutboxtest: read unpublished events: %w", err)
		}
		switch {
		case quarantined:
			q.ID = pgoutbox.UUID(id)
			qe.Events = append(qe.Events, q)
		case behind:
			qe.Blocked++
		default:
			left = append(left, id)
		}
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("pgoutboxtest: read unpublished events: %w", err)
	}
	return left, nil
}
