package admin

import (
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

// waitingRead fills st's split of the pending events: waiting for a relay, or
// blocked behind a dead letter (one of Status' reads).
func (a *Admin) waitingRead(st *Status) read {
	var lagging, blocked float64
	return read{what: "split pending events", sql: fmt.Sprintf(waitingSQL, a.events),
		dest: []any{&st.WaitingForRelay, &lagging, &st.BlockedBehindDeadLetter, &blocked},
		row: func() error {
			st.OldestWaitingForRelayAge = Duration(lagging * float64(time.Second))
			st.OldestBlockedAge = Duration(blocked * float64(time.Second))
			return nil
		}}
}
