package admin

import (
	"context"
	"fmt"
	"time"
)

// waitingSQL splits the pending events (unpublished, not quarantined) into those
// that wait for a relay and those that wait behind a dead letter of their own
// lane (a quarantined event of the same aggregate with a lower sequence): the
// first lag, the second are blocked, whatever the relays do. It reads only
// unpublished rows, through their partial index.
const waitingSQL = `
WITH heads AS (
    SELECT q.aggregate_type, q.aggregate_id, min(q.aggregate_sequence) AS seq
      FROM %[1]s q
     WHERE q.published_at IS NULL AND q.quarantined_at IS NOT NULL
     GROUP BY q.aggregate_type, q.aggregate_id
)
SELECT count(*) FILTER (WHERE h.seq IS NULL),
       coalesce(extract(epoch FROM now() - min(e.occurred_at) FILTER (WHERE h.seq IS NULL)), 0)::float8,
       count(*) FILTER (WHERE h.seq IS NOT NULL),
       coalesce(extract(epoch FROM now() - min(e.occurred_at) FILTER (WHERE h.seq IS NOT NULL)), 0)::float8
  FROM %[1]s e
  LEFT JOIN heads h ON h.aggregate_type = e.aggregate_type AND h.aggregate_id = e.aggregate_id
                   AND e.aggregate_sequence > h.seq
 WHERE e.published_at IS NULL AND e.quarantined_at IS NULL`

// readWaiting fills st's split of the pending events: waiting for a relay, or
// blocked behind a dead letter.
func (a *Admin) readWaiting(ctx context.Context, st *Status) error {
	var lagging, blocked float64
	err := queryRow(ctx, a.db, fmt.Sprintf(waitingSQL, a.events), nil,
		&st.WaitingForRelay, &lagging, &st.BlockedBehindDeadLetter, &blocked)
	if err != nil {
		return fmt.Errorf("admin: status: split pending events: %w", err)
	}
	st.OldestWaitingForRelayAge = Duration(lagging * float64(time.Second))
	st.OldestBlockedAge = Duration(blocked * float64(time.Second))
	return nil
}
