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
//     index): it never reads the published history, and stops as soon as the LIMIT
//     of the outer query is met.
//   - runs takes, per lane, the first $6 unpublished events and keeps the longest
//     claimable prefix: an event is claimable when it is not quarantined, its backoff
//     is over and nobody holds a live lease on it. A lane whose head is not claimable
//     (in flight elsewhere, backing off, quarantined) contributes nothing: sequence
//     k+1 is never claimed while k waits.
//   - runs is MATERIALIZED and handed to locked as an array, so that it is computed
//     once (a few hundred rows at most) and looked up by primary key, whatever the
//     table's statistics say: a join let the planner scan every pending row instead.
//   - locked re-reads those rows FOR UPDATE SKIP LOCKED. A row another relay leased
//     or published since our snapshot is re-checked on its new version and dropped.
//   - the UPDATE leases a locked row only if every unpublished event before it in its
//     lane is also in locked. The NOT EXISTS may see an older snapshot than the
//     locks, but that only makes it stricter: rows become published, never
//     unpublished, so a stale view can only add blockers. This keeps every claim a
//     prefix of its lane even when two relays race for the same lane.
//
// No ordering here depends on timestamps: lanes are ordered by sequence alone.
const claimSQL = `
WITH RECURSIVE lanes (aggregate_type, aggregate_id) AS (
    (SELECT aggregate_type, aggregate_id FROM %[1]s
      WHERE published_at IS NULL AND (aggregate_type, aggregate_id) > ($3::text, $4::text)
      ORDER BY aggregate_type, aggregate_id, aggregate_sequence
      LIMIT 1)
    UNION ALL
    SELECT nxt.aggregate_type, nxt.aggregate_id
      FROM lanes l
      CROSS JOIN LATERAL (
        SELECT aggregate_type, aggregate_id FROM %[1]s
         WHERE published_at IS NULL AND (aggregate_type, aggregate_id) > (l.aggregate_type, l.aggregate_id)
         ORDER BY aggregate_type, aggregate_id, aggregate_sequence
         LIMIT 1) nxt
),
runs AS MATERIALIZED (
    SELECT r.event_id
      FROM lanes l
      CROSS JOIN LATERAL (
        SELECT w.event_id FROM (
            SELECT h.event_id,
                   bool_and(h.quarantined_at IS NULL AND h.available_at <= now()
                            AND (h.claim_until IS NULL OR h.claim_until < now()))
                       OVER (ORDER BY h.aggregate_sequence) AS claimable_prefix
              FROM (SELECT event_id, aggregate_sequence, quarantined_at, available_at, claim_until
                      FROM %[1]s
                     WHERE published_at IS NULL
                       AND aggregate_type = l.aggregate_type AND aggregate_id = l.aggregate_id
                     ORDER BY aggregate_sequence
                     LIMIT $6) h
        ) w
        WHERE w.claimable_prefix) r
     LIMIT $5
),
locked AS (
    SELECT e.event_id, e.aggregate_type, e.aggregate_id, e.aggregate_sequence, e.claimed_by AS previous_holder
      FROM %[1]s e
     WHERE e.event_id = ANY (ARRAY(SELECT event_id FROM runs))
       AND e.published_at IS NULL AND e.quarantined_at IS NULL AND e.available_at <= now()
       AND (e.claim_until IS NULL OR e.claim_until < now())
       FOR UPDATE OF e SKIP LOCKED
)
UPDATE %[1]s e
   SET claimed_by = $1, claim_until = now() + $2 * interval '1 millisecond'
  FROM locked l
 WHERE e.event_id = l.event_id
   AND NOT EXISTS (
        SELECT 1 FROM %[1]s p
         WHERE p.published_at IS NULL
           AND p.aggregate_type = l.aggregate_type AND p.aggregate_id = l.aggregate_id
           AND p.aggregate_sequence < l.aggregate_sequence
           AND p.event_id NOT IN (SELECT event_id FROM locked))
RETURNING e.event_id, e.aggregate_type, e.aggregate_id, e.aggregate_sequence, e.event_type,
          e.schema_version, e.payload, e.headers, e.occurred_at, e.attempt_count, l.previous_holder`

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
