package relay

import (
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/pgoutbox/internal/pipeline"
	"github.com/pgoutbox/pgoutbox/migrate"
)

// queries holds the relay's statements for one schema. They are written once here;
// docs/design.md explains the rules they enforce.
type queries struct {
	claim, mark, fail, release string
	channel                    string
	table                      string // the quoted outbox_events of the schema
	relays                     string // the quoted outbox_relays of the schema (heartbeat.go)
}

func newQueries(schema string) queries {
	t := pgx.Identifier{schema, "outbox_events"}.Sanitize()
	return queries{
		claim:   fmt.Sprintf(claimSQL, t, claimableSQL),
		mark:    fmt.Sprintf(markSQL, t),
		fail:    fmt.Sprintf(failSQL, t, pgx.Identifier{schema, "outbox_attempts"}.Sanitize()),
		release: fmt.Sprintf(releaseSQL, t),
		channel: migrate.NotifyChannel(schema),
		table:   t,
		relays:  pgx.Identifier{schema, "outbox_relays"}.Sanitize(),
	}
}

// claimableSQL is the one rule of an event a claim may take now (on the outbox
// row aliased e): not published, not quarantined, its backoff over, not leased
// (or its lease expired). The claim statement applies it to a lane's head and
// to the rest of its run; the hub's probe (probeSQL) to any event, so that an
// idle relay is woken whenever its claim would find something
// (TestProbeSeesWhatTheClaimTakes). Change the rule here, never in one of them.
const claimableSQL = `e.published_at IS NULL AND e.quarantined_at IS NULL AND e.available_at <= now()
           AND (e.claim_until IS NULL OR e.claim_until < now())`

// claimSQL leases up to $5 events in one statement, in a short transaction of
// its own under the relay's bounds (pgbound.Send).
// docs/design.md ("Relay: the lane rule") is the one full explanation of the
// algorithm and why it keeps every lane in order; this comment maps its steps to
// the clauses.
//
// Parameters: $1 relay id, $2 lease in milliseconds, $3/$4 the lane cursor (aggregate
// type and id; lanes strictly after it are scanned), $5 batch size, $6 run length.
//
//   - lanes is step 1, the scan of lanes: a loose index scan of the partial index of
//     unpublished events from the cursor, noting each lane's head.
//   - runs is steps 2 and 3: each head FOR UPDATE SKIP LOCKED if claimable
//     (claimableSQL, as %[2]s), then the gapless, claimable rest of its run (the
//     gapless column).
//   - lease is step 4: only the heads are written. runs is MATERIALIZED so that it is
//     computed once; lease finds the heads by (tableoid, ctid), their current version
//     since this statement locked them, without searching an index again. The
//     ctid = ANY(ARRAY(...)) form makes that a TID scan whatever the statistics say
//     (a join on ctid may be planned as a hash join over a sequential scan of the
//     whole table). A data-modifying WITH always runs to completion, whatever the
//     outer SELECT reads.
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
    SELECT r.*, h.tableoid AS head_tableoid, h.ctid AS head_ctid, h.event_id AS head_id, h.claimed_by AS head_claimed_by
      FROM lanes l
      CROSS JOIN LATERAL (
        SELECT e.tableoid, e.ctid, e.event_id, e.aggregate_type, e.aggregate_id, e.aggregate_sequence, e.event_type,
               e.schema_version, e.payload, e.headers, e.occurred_at, e.attempt_count, e.claimed_by
          FROM %[1]s e
         WHERE e.aggregate_type = l.aggregate_type AND e.aggregate_id = l.aggregate_id
           AND e.aggregate_sequence = l.head
           AND %[2]s
           FOR UPDATE OF e SKIP LOCKED) h
      CROSS JOIN LATERAL (
        SELECT h.event_id, h.aggregate_type, h.aggregate_id, h.aggregate_sequence, h.event_type,
               h.schema_version, h.payload, h.headers, h.occurred_at, h.attempt_count
        UNION ALL
        SELECT s.event_id, s.aggregate_type, s.aggregate_id, s.aggregate_sequence, s.event_type,
               s.schema_version, s.payload, s.headers, s.occurred_at, s.attempt_count
          FROM (SELECT e.*, e.aggregate_sequence - l.head = row_number() OVER (ORDER BY e.aggregate_sequence) AS gapless
                  FROM %[1]s e
                 WHERE e.aggregate_type = l.aggregate_type AND e.aggregate_id = l.aggregate_id
                   AND e.aggregate_sequence > l.head AND e.aggregate_sequence < l.head + $6
                   AND %[2]s
                 ORDER BY e.aggregate_sequence) s
         WHERE s.gapless
      ) r
     LIMIT $5
),
lease AS (
    UPDATE %[1]s e
       SET claimed_by = $1, claim_until = now() + $2 * interval '1 millisecond'
     WHERE e.ctid = ANY (ARRAY(SELECT head_ctid FROM runs))
       AND (e.tableoid, e.ctid) IN (SELECT head_tableoid, head_ctid FROM runs)
)
SELECT event_id, aggregate_type, aggregate_id, aggregate_sequence, event_type,
       schema_version, payload, headers, occurred_at, attempt_count, head_claimed_by, head_id
  FROM runs`

// markSQL records the broker's acks. It does not check the lease: an event the
// broker acknowledged is published, whoever holds it now (a relay that took over an
// expired lease merely publishes a duplicate). The events of a run that held no
// lease of their own are stamped with the publishing relay ($2), for the record;
// a run's head keeps the lease holder's id, which failSQL checks.
const markSQL = `
UPDATE %[1]s
   SET published_at = now(), attempt_count = attempt_count + 1, claim_until = NULL,
       claimed_by = coalesce(claimed_by, $2)
 WHERE event_id = ANY($1::uuid[]) AND published_at IS NULL`

// failSQL records failed attempts: the error, the backoff through available_at, and
// quarantine when the relay decided so. Only events of runs still leased by this
// relay are touched, so a relay that lost its lease cannot overwrite its successor's
// state: the run's head ($6, aligned with $1) must still name this relay. It does
// even when the head was marked published earlier in the same transaction, since
// markSQL keeps a head's claimed_by.
//
// The same statement writes each failure's row in the attempt history
// (outbox_attempts, %[2]s) and trims it (pipeline.RecordAttempts), only for the
// events this UPDATE touched: the lease check holds for the history too.
const failSQL = `
WITH failed AS (
UPDATE %[1]s e
   SET ` + pipeline.FailAssignments + `,
       claimed_by = NULL, claim_until = NULL
  FROM unnest($1::uuid[], $2::text[], $3::bigint[], $4::bool[], $6::uuid[]) AS f (event_id, error, delay_ms, quarantine, head_id)
 WHERE e.event_id = f.event_id AND e.published_at IS NULL
   AND EXISTS (SELECT 1 FROM %[1]s h WHERE h.event_id = f.head_id AND h.claimed_by = $5)
` + pipeline.FailReturning + `
)` + pipeline.RecordAttempts

// releaseSQL gives leases back without counting an attempt (events not sent because
// an earlier event of their aggregate failed, or because the relay is stopping).
// Only a run's head holds a lease; for its other events this is a no-op.
const releaseSQL = `
UPDATE %[1]s
   SET claimed_by = NULL, claim_until = NULL
 WHERE event_id = ANY($1::uuid[]) AND claimed_by = $2 AND published_at IS NULL`
