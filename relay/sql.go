package relay

import (
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/pgoutbox/migrate"
)

// queries holds the relay's statements for one schema. They are written once here;
// docs/design.md explains the rules they enforce.
type queries struct {
	claim, mark, fail, release string
	channel                    string
}

func newQueries(schema string) queries {
	t := pgx.Identifier{schema, "outbox_events"}.Sanitize()
	return queries{
		claim:   fmt.Sprintf(claimSQL, t),
		mark:    fmt.Sprintf(markSQL, t),
		fail:    fmt.Sprintf(failSQL, t),
		release: fmt.Sprintf(releaseSQL, t),
		channel: migrate.NotifyChannel(schema),
	}
}

// claimSQL leases up to $5 events in one statement (its own short transaction).
//
// Parameters: $1 relay id, $2 lease in milliseconds, $3/$4 the lane cursor (aggregate
// type and id; lanes strictly after it are scanned), $5 batch size, $6 run length.
//
//   - lanes walks the distinct aggregates that have unpublished events, in index
//     order from the cursor, one index probe each (a loose index scan of the partial
//     index), and notes each lane's head: its lowest unpublished sequence. It never
//     reads the published history, and stops as soon as the LIMIT of runs is met.
//   - runs takes, per lane, the first $6 claimable events (not quarantined, backoff
//     over, no live lease) and locks them FOR UPDATE SKIP LOCKED as it reads them; a
//     row leased or published by another relay since our snapshot is re-checked on
//     its new version and skipped, as is a row another claim holds locked right now.
//     It keeps the rows whose sequences run head, head+1, head+2, ... without a gap:
//     a lane whose head is not claimable (in flight elsewhere, backing off,
//     quarantined, just published) contributes nothing, and a run stops at the first
//     event it could not take. So sequence k+1 is never claimed while k waits, even
//     when two relays race for the same lane.
//   - The head is right because no snapshot can miss a lower unpublished sequence:
//     sequence k+1 is allocated only after k's transaction committed (the counter
//     row lock), so a snapshot that sees k+1 sees k. A stale head (published since)
//     only makes the statement stricter: that row is skipped, so the lane yields
//     nothing this time.
//   - runs is MATERIALIZED so that it is computed once, and the UPDATE finds its rows
//     by (tableoid, ctid): they are locked by this statement, so that is their
//     current version, and no index is searched again.
//
// No ordering here depends on timestamps: lanes are ordered by sequence alone.
const claimSQL = `
WITH RECURSIVE lanes (aggregate_type, aggregate_id, head) AS (
    (SELECT aggregate_type, aggregate_id, aggregate_sequence FROM %[1]s
      WHERE published_at IS NULL AND (aggregate_type, aggregate_id) > ($3::text, $4::text)
      ORDER BY aggregate_type, aggregate_id, aggregate_sequence
      LIMIT 1)
    UNION ALL
    SELECT nxt.aggregate_type, nxt.aggregate_id, nxt.aggregate_sequence
      FROM lanes l
      CROSS JOIN LATERAL (
        SELECT aggregate_type, aggregate_id, aggregate_sequence FROM %[1]s
         WHERE published_at IS NULL AND (aggregate_type, aggregate_id) > (l.aggregate_type, l.aggregate_id)
         ORDER BY aggregate_type, aggregate_id, aggregate_sequence
         LIMIT 1) nxt
),
runs AS MATERIALIZED (
    SELECT r.tableoid, r.ctid, r.claimed_by
      FROM lanes l
      CROSS JOIN LATERAL (
        SELECT h.tableoid, h.ctid, h.claimed_by,
               h.aggregate_sequence - l.head + 1 = row_number() OVER (ORDER BY h.aggregate_sequence) AS gapless
          FROM (SELECT e.tableoid, e.ctid, e.aggregate_sequence, e.claimed_by
                  FROM %[1]s e
                 WHERE e.published_at IS NULL
                   AND e.aggregate_type = l.aggregate_type AND e.aggregate_id = l.aggregate_id
                   AND e.quarantined_at IS NULL AND e.available_at <= now()
                   AND (e.claim_until IS NULL OR e.claim_until < now())
                 ORDER BY e.aggregate_sequence
                 LIMIT $6
                 FOR UPDATE OF e SKIP LOCKED) h
      ) r
     WHERE r.gapless
     LIMIT $5
)
UPDATE %[1]s e
   SET claimed_by = $1, claim_until = now() + $2 * interval '1 millisecond'
  FROM runs r
 WHERE e.tableoid = r.tableoid AND e.ctid = r.ctid
RETURNING e.event_id, e.aggregate_type, e.aggregate_id, e.aggregate_sequence, e.event_type,
          e.schema_version, e.payload, e.headers, e.occurred_at, e.attempt_count, r.claimed_by`

// markSQL records the broker's acks. It does not check the lease: an event the
// broker acknowledged is published, whoever holds it now (a relay that took over an
// expired lease merely publishes a duplicate).
const markSQL = `
UPDATE %[1]s
   SET published_at = now(), attempt_count = attempt_count + 1, claim_until = NULL
 WHERE event_id = ANY($1::uuid[]) AND published_at IS NULL`

// failSQL records failed attempts: the error, the backoff through available_at, and
// quarantine when the relay decided so. Only rows still leased by this relay are
// touched, so a relay that lost its lease cannot overwrite its successor's state.
const failSQL = `
UPDATE %[1]s e
   SET attempt_count = e.attempt_count + 1,
       last_error = f.error,
       available_at = now() + f.delay_ms * interval '1 millisecond',
       quarantined_at = CASE WHEN f.quarantine THEN now() END,
       claimed_by = NULL, claim_until = NULL
  FROM unnest($1::uuid[], $2::text[], $3::bigint[], $4::bool[]) AS f (event_id, error, delay_ms, quarantine)
 WHERE e.event_id = f.event_id AND e.claimed_by = $5 AND e.published_at IS NULL`

// releaseSQL gives leases back without counting an attempt (events not sent because
// an earlier event of their aggregate failed, or because the relay is stopping).
const releaseSQL = `
UPDATE %[1]s
   SET claimed_by = NULL, claim_until = NULL
 WHERE event_id = ANY($1::uuid[]) AND claimed_by = $2 AND published_at IS NULL`
