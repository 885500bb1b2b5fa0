package admin

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// BlockedLane is one aggregate whose lane a quarantined event stops: the
// relay publishes none of the aggregate's later events until an operator
// retries or skips the head.
type BlockedLane struct {
	// Head is the quarantined event (without payload and headers).
	Head Event
	// Waiting counts the aggregate's unpublished events after Head.
	Waiting int64
	// OldestWaiting is when the first of them occurred (nil when none waits).
	OldestWaiting *time.Time
}

// maxBlockedLanes bounds one BlockedLanes call.
const maxBlockedLanes = 10000

// BlockedLanes returns the lanes stopped by a quarantined event, those with the
// most events waiting first (then oldest quarantine first), at most limit of
// them (1..10000). It reads only unpublished rows, through their partial index.
func (a *Admin) BlockedLanes(ctx context.Context, limit int) ([]BlockedLane, error) {
	if limit < 1 || limit > maxBlockedLanes {
		return nil, fmt.Errorf("admin: blocked lanes: limit %d must be in 1..%d", limit, maxBlockedLanes)
	}
	// The later events of a lane are counted through the same index the relay's
	// claim uses: (aggregate_type, aggregate_id, aggregate_sequence) over
	// unpublished rows.
	q := `SELECT ` + eventColumns + `, w.waiting, w.oldest
  FROM ` + a.events + ` e LEFT JOIN ` + a.skipped + ` s ON s.event_id = e.event_id
 CROSS JOIN LATERAL (
       SELECT count(*) AS waiting, min(l.occurred_at) AS oldest
         FROM ` + a.events + ` l
        WHERE l.published_at IS NULL AND l.aggregate_type = e.aggregate_type
          AND l.aggregate_id = e.aggregate_id AND l.aggregate_sequence > e.aggregate_sequence) w
 WHERE e.published_at IS NULL AND e.quarantined_at IS NOT NULL
 ORDER BY w.waiting DESC, e.quarantined_at, e.aggregate_type, e.aggregate_id, e.aggregate_sequence
 LIMIT $1`
	rows, err := a.db.Query(ctx, q, limit)
	if err != nil {
		return nil, fmt.Errorf("admin: blocked lanes: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (BlockedLane, error) {
		var l BlockedLane
		var err error
		l.Head, err = scanEvent(row, &l.Waiting, &l.OldestWaiting)
		return l, err
	})
	if err != nil {
		return nil, fmt.Errorf("admin: blocked lanes: %w", err)
	}
	return out, nil
}

// Lane returns the unpublished events of one aggregate in sequence order,
// at most limit (1..10000) of them, without payloads and headers: what a
// blocked lane holds back.
func (a *Admin) Lane(ctx context.Context, aggregateType, aggregateID string, limit int) ([]Event, error) {
	if limit < 1 || limit > maxBlockedLanes {
		return nil, fmt.Errorf("admin: lane: limit %d must be in 1..%d", limit, maxBlockedLanes)
	}
	rows, err := a.db.Query(ctx, `SELECT `+eventColumns+`
  FROM `+a.events+` e LEFT JOIN `+a.skipped+` s ON s.event_id = e.event_id
 WHERE e.published_at IS NULL AND e.aggregate_type = $1 AND e.aggregate_id = $2
 ORDER BY e.aggregate_sequence LIMIT $3`, aggregateType, aggregateID, limit)
	if err != nil {
		return nil, fmt.Errorf("admin: lane: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (Event, error) { return scanEvent(row) })
	if err != nil {
		return nil, fmt.Errorf("admin: lane: %w", err)
	}
	return out, nil
}
