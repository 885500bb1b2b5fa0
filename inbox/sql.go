package inbox

import (
	"fmt"

	"github.com/jackc/pgx/v5"
)

// queries are the inbox's statements for one schema. Parameters carry explicit casts
// so that database/sql drivers, which send untyped text, plan them the same way.
type queries struct {
	claim, known, advance, position, setPosition string
	cutoff, cleanupAll, cleanupOne               string
}

func newQueries(schema string) queries {
	positions := pgx.Identifier{schema, "consumer_positions"}.Sanitize()
	processed := pgx.Identifier{schema, "processed_events"}.Sanitize()
	return queries{
		// claim is the first statement of every consumer transaction. $1 consumer,
		// $2 aggregate type, $3 aggregate id, $4 event id, $5 sequence, $6 true when
		// gaps are accepted. It returns the position before this delivery and whether
		// the processed_events row is new (the event is to be applied).
		//
		// pos locks the consumer's position row of the aggregate, creating it at 0
		// the first time. The no-op DO UPDATE is what takes the lock: a second
		// transaction for the same aggregate (another instance, a redelivery) waits
		// here until the first ends, then reads the position it committed. Applying
		// an aggregate's events is thus serialised per consumer, and the decision
		// below is always taken on the newest position.
		//
		// seen inserts the dedup row, unless the policy refuses the event: under
		// GapReject only the next sequence may be applied, so a gap or an old
		// sequence writes nothing (the transaction is then rolled back). ON CONFLICT
		// DO NOTHING RETURNING tells a first delivery (a row comes back) from a
		// duplicate (none). Should a transaction reach this INSERT while another
		// holds an uncommitted row for the same event, it waits for that one too,
		// and then conflicts (committed: a duplicate) or inserts (rolled back).
		//
		// The last column says whether the event already has its row, for a
		// sequence the policy refused: an event applied before an operator set the
		// position back is a duplicate, not a gap. (It reads the statement's
		// snapshot; a row committed while pos waited is not seen, but then the
		// position pos read already covers that event.)
		//
		// "The next sequence" is written $5 - 1, never last_sequence + 1: $5 is at
		// least 1, while a position at the largest bigint (set before inbox.MaxSequence
		// was enforced) would make last_sequence + 1 fail with "bigint out of range"
		// on every delivery of the aggregate, forever.
		claim: fmt.Sprintf(`WITH pos AS (
    INSERT INTO %[1]s AS p (consumer_name, aggregate_type, aggregate_id, last_sequence)
    VALUES ($1::text, $2::text, $3::text, 0)
    ON CONFLICT (consumer_name, aggregate_type, aggregate_id)
        DO UPDATE SET last_sequence = p.last_sequence
    RETURNING p.last_sequence
), seen AS (
    INSERT INTO %[2]s (consumer_name, event_id)
    SELECT $1::text, $4::uuid FROM pos
    WHERE $6::boolean OR pos.last_sequence = $5::bigint - 1
    ON CONFLICT (consumer_name, event_id) DO NOTHING
    RETURNING event_id
)
SELECT (SELECT last_sequence FROM pos), EXISTS (SELECT 1 FROM seen),
    EXISTS (SELECT 1 FROM %[2]s WHERE consumer_name = $1::text AND event_id = $4::uuid)`, positions, processed),

		// known tells, in a statement of its own (a new snapshot), whether the
		// event has its processed_events row: claim's last column reads the
		// snapshot from before claim waited for another transaction of the
		// aggregate, which may have applied this very event meanwhile.
		known: fmt.Sprintf(`SELECT EXISTS (SELECT 1 FROM %s WHERE consumer_name = $1::text AND event_id = $2::uuid)`, processed),

		// advance moves the position after the effect, in the same transaction.
		// GREATEST: a late event (GapAccept) never moves it back.
		advance: fmt.Sprintf(`UPDATE %s
SET last_sequence = GREATEST(last_sequence, $4::bigint), updated_at = now()
WHERE consumer_name = $1::text AND aggregate_type = $2::text AND aggregate_id = $3::text`, positions),

		position: fmt.Sprintf(`SELECT last_sequence FROM %s
WHERE consumer_name = $1::text AND aggregate_type = $2::text AND aggregate_id = $3::text`, positions),

		setPosition: fmt.Sprintf(`INSERT INTO %[1]s AS p (consumer_name, aggregate_type, aggregate_id, last_sequence)
VALUES ($1::text, $2::text, $3::text, $4::bigint)
ON CONFLICT (consumer_name, aggregate_type, aggregate_id)
    DO UPDATE SET last_sequence = EXCLUDED.last_sequence, updated_at = now()`, positions),

		// The cutoff comes from the database clock, once per cleanup, so every batch
		// deletes against the same instant and the loop ends.
		cutoff: `SELECT now() - $1::bigint * interval '1 microsecond'`,

		// A batch: the oldest rows first (the processed_at index), SKIP LOCKED so that
		// concurrent cleaners split the work instead of queueing.
		cleanupAll: fmt.Sprintf(`DELETE FROM %[1]s AS e
USING (
    SELECT consumer_name, event_id FROM %[1]s
    WHERE processed_at < $1::timestamptz
    ORDER BY processed_at
    LIMIT $2::integer
    FOR UPDATE SKIP LOCKED
) AS doomed
WHERE e.consumer_name = doomed.consumer_name AND e.event_id = doomed.event_id`, processed),

		cleanupOne: fmt.Sprintf(`DELETE FROM %[1]s AS e
USING (
    SELECT consumer_name, event_id FROM %[1]s
    WHERE processed_at < $1::timestamptz AND consumer_name = $3::text
    ORDER BY processed_at
    LIMIT $2::integer
    FOR UPDATE SKIP LOCKED
) AS doomed
WHERE e.consumer_name = doomed.consumer_name AND e.event_id = doomed.event_id`, processed),
	}
}
