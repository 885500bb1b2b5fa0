package relay

import (
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/pgoutbox/internal/pipeline"
)

// routedQueries holds the statements of a relay with destinations
// (routed.go) for one schema. docs/design.md ("Destinations") explains the
// rules they enforce.
type routedQueries struct {
	register, seedNow, reopen, rules, audit string
	// lockLanes makes a registration wait for the settles under way;
	// unserved lists the registered destinations the relay does not serve.
	lockLanes, unserved, registered string
	// claim starts the lane scan before a cursor, claimTop at the last lane.
	claim, claimTop             string
	settle, deadLetter, release string
}

func newRoutedQueries(schema string) routedQueries {
	ev := pgx.Identifier{schema, "outbox_events"}.Sanitize()
	dl := pgx.Identifier{schema, "outbox_destination_lanes"}.Sanitize()
	ds := pgx.Identifier{schema, "outbox_destinations"}.Sanitize()
	seq := pgx.Identifier{schema, "outbox_aggregate_sequences"}.Sanitize()
	audit := pgx.Identifier{schema, "outbox_operator_audit"}.Sanitize()
	attempts := pgx.Identifier{schema, "outbox_attempts"}.Sanitize()
	return routedQueries{
		register:   fmt.Sprintf(registerSQL, ds),
		seedNow:    fmt.Sprintf(seedNowSQL, dl, seq),
		reopen:     fmt.Sprintf(reopenSQL, ev),
		rules:      fmt.Sprintf(rulesSQL, ds),
		audit:      fmt.Sprintf(auditRulesSQL, audit),
		lockLanes:  fmt.Sprintf(lockLanesSQL, dl),
		unserved:   fmt.Sprintf(unservedSQL, ds),
		registered: fmt.Sprintf(registeredSQL, ds),
		claim:      fmt.Sprintf(routedClaimSQL, ev, dl, routedClaimFrom, ds, "$9"),
		claimTop:   fmt.Sprintf(routedClaimSQL, ev, dl, "", ds, "$7"),
		settle:     fmt.Sprintf(routedSettleSQL, ev, dl, attempts, pipeline.AttemptsKept-1, ds),
		deadLetter: fmt.Sprintf(deadLetterSQL, ev, ds),
		release:    fmt.Sprintf(routedReleaseSQL, dl),
	}
}

// registerSQL registers a destination ($1 name, $2 rules, $3 start) if it is
// new: a row comes back only then. It existed otherwise, and its start is
// ignored (Destination.Start).
const registerSQL = `
INSERT INTO %[1]s (name, rules, start) VALUES ($1, $2::jsonb, $3)
ON CONFLICT (name) DO NOTHING
RETURNING name`

// lockLanesSQL, in the transaction that registers a new destination, waits
// for the claims and settles under way (each one statement that writes lane
// rows) and holds off new ones until it commits. A settle's done mark and a
// dead letter are judged against the registered destinations as its
// statement's snapshot saw them: without the lock, one that started before
// the registration committed could mark done, after the backfill's reopen, an
// event the new destination has not passed. The mode conflicts with itself, so two
// relays registering destinations at once take turns instead of deadlocking
// on each other's seeding.
const lockLanesSQL = `LOCK TABLE %[1]s IN SHARE ROW EXCLUSIVE MODE`

// unservedSQL lists the registered destinations the relay does not know
// ($1: routed.known, those registered when it started, served or not), in
// name order: destinations another relay registered since, as when a rolling
// change adds one. While there is one, the relay's claims lease nothing, and
// its settles neither mark events done nor quarantine events as routed to no
// destination: both need every destination's view (an event is done when
// every one has passed it, a dead letter when none takes it), and a relay
// with an older destinations file would judge them wrongly, marking done
// what the new destination still owes (its claim, which walks the lanes with
// an unpublished event, would never find them), or quarantining what only it
// takes. A destination registered before the relay started and not in its
// configuration counts as removed by the operator (its progress kept until
// destinations drop), as before.
const unservedSQL = `SELECT name FROM %[1]s WHERE name <> ALL($1::text[]) ORDER BY name LIMIT 10`

// registeredSQL lists every registered destination.
const registeredSQL = `SELECT name FROM %[1]s ORDER BY name`

// seedNowSQL starts a new StartNow destination ($1) after every event
// committed so far: its cursor on each lane is the lane's counter. An event
// in flight (its producer holds the counter's row, not yet committed) gets a
// higher sequence than the one read here, so it is the destination's.
const seedNowSQL = `
INSERT INTO %[1]s (destination, aggregate_type, aggregate_id, delivered_sequence)
SELECT $1, aggregate_type, aggregate_id, last_sequence FROM %[2]s
ON CONFLICT (destination, aggregate_type, aggregate_id) DO NOTHING`

// reopenSQL makes the retained events that are done (published, by the
// single-broker relay or for the destinations registered so far) pending
// again when a StartBackfill destination is registered: an event is done only
// when every destination passed it, and the new one has not. The cursors of
// the other destinations are past them, so only the new one receives them.
const reopenSQL = `
UPDATE %[1]s SET published_at = NULL
 WHERE published_at IS NOT NULL AND quarantined_at IS NULL`

// rulesSQL records a registered destination's rules ($1 name, $2 rules) and
// returns its rules as they were, and whether they changed.
const rulesSQL = `
WITH old AS (SELECT name, rules FROM %[1]s WHERE name = $1 FOR UPDATE)
UPDATE %[1]s d SET rules = $2::jsonb, updated_at = now()
  FROM old
 WHERE d.name = old.name
RETURNING old.rules, old.rules IS DISTINCT FROM $2::jsonb`

// auditRulesSQL audits a change of rules at registration: $1 the relay's id,
// $2 the reason, $3 the selection (destination, old and new rules).
const auditRulesSQL = `
INSERT INTO %[1]s (action, actor, reason, selection, event_count)
VALUES ('destination_rules', $1, $2, $3::jsonb, 0)`

// deadLetterPrefix begins the last_error of every event the routed engine
// quarantines in outbox_events (routed to no destination, refused by every
// one, or retried by an operator after every destination passed it): the
// settle statement tells them apart from delivered events by it.
const deadLetterPrefix = "routed to no destination: "

// routedClaimSQL leases up to $3 lanes of destination $5, in one statement,
// in a short transaction of its own under the relay's bounds. %[3]s is the
// lane scan's start: routedClaimFrom (lanes strictly before the cursor $7/$8)
// or nothing (from the last lane: routedClaimFromTop, which has no $7/$8).
//
// Parameters: $1 relay id, $2 lease in milliseconds, $3 the most lanes, $4 run
// length, $5 the destination, $6 every destination of the relay (text[]),
// $7/$8 the lane cursor, then (%[5]s: $9, or $7 without the cursor) the
// destinations the relay knows (routed.known, text[]).
//
//   - lanes: the loose index scan of the lanes with an unpublished event
//     (outbox_events_unpublished_idx), as the single-broker claim's, but
//     walking the lanes downwards from the cursor and reaching each lane at
//     its newest event. A lane's unpublished events are its newest (the done
//     mark publishes a prefix), so the first entry the scan meets in a lane
//     with work is a live one, whichever index the planner takes. Walking
//     upwards met each lane at its oldest entry, and had to step over every
//     event already done but not yet vacuumed (dead entries of the partial
//     index, or published rows of the unique one), one heap fetch each: with
//     several destinations a lane stays pending until the slowest has passed
//     it, so that prefix, and the cost of every claim, grew with the backlog
//     (docs/performance.md, "destinations").
//   - cand: those whose row for $5 (none: the cursor is 0) is not leased, not
//     backing off, not quarantined, with an unpublished event past the
//     cursor, or with an unpublished, unquarantined event that every
//     destination has passed (the run is then empty, and the settle
//     statement's done mark publishes it, or quarantines it again if it is a
//     dead letter an operator retried). The done marks of two destinations
//     settling one lane at once each read the other's cursor as it was
//     before: both may leave events unmarked, which this finds again. The
//     row is looked up lane by lane (LATERAL; its LIMIT 1, harmless under
//     the primary key, keeps the planner from turning it into a join that
//     hashes every row the destination has): a claim reads the rows of the
//     lanes it scans, however many lanes the destination has ever had.
//     None while a destination registered after the relay's start is not
//     among those it knows (unservedSQL).
//   - lease: the upsert of the lane rows. ON CONFLICT DO UPDATE locks the row
//     and checks its latest version: of two relays claiming one lane, the
//     second waits for the first's short transaction and then finds the
//     lease taken. RETURNING gives the cursor of that latest version. The
//     rows are locked in ascending lane order whatever the scan's direction,
//     as relays before the downward scan locked them: two relays of one
//     destination (a rolling upgrade's old and new) never wait on each other
//     in a cycle.
//   - the run: the lane's events past the cursor, ascending, at most $4; the
//     caller keeps those contiguous from the first one (sequences are gapless
//     in commit order, so a visible higher one means every lower one is
//     committed).
const routedClaimSQL = `
WITH RECURSIVE lanes (aggregate_type, aggregate_id) AS (
    (SELECT aggregate_type, aggregate_id FROM %[1]s
      WHERE published_at IS NULL%[3]s
      ORDER BY aggregate_type DESC, aggregate_id DESC, aggregate_sequence DESC
      LIMIT 1)
    UNION ALL
    SELECT nxt.aggregate_type, nxt.aggregate_id
      FROM lanes l
      CROSS JOIN LATERAL (
        SELECT aggregate_type, aggregate_id FROM %[1]s
         WHERE published_at IS NULL AND (aggregate_type, aggregate_id) < (l.aggregate_type, l.aggregate_id)
         ORDER BY aggregate_type DESC, aggregate_id DESC, aggregate_sequence DESC
         LIMIT 1) nxt
),
cand AS MATERIALIZED (
    SELECT l.aggregate_type, l.aggregate_id, d.claimed_by AS prev
      FROM lanes l
      LEFT JOIN LATERAL (
        SELECT * FROM %[2]s x
         WHERE x.destination = $5 AND x.aggregate_type = l.aggregate_type AND x.aggregate_id = l.aggregate_id
         LIMIT 1) d ON true
     WHERE (d.destination IS NULL
            OR (d.quarantined_at IS NULL AND d.available_at <= now()
                AND (d.claim_until IS NULL OR d.claim_until < now())))
       AND CASE WHEN EXISTS (
                  SELECT 1 FROM %[1]s e
                   WHERE e.aggregate_type = l.aggregate_type AND e.aggregate_id = l.aggregate_id
                     AND e.published_at IS NULL AND e.aggregate_sequence > coalesce(d.delivered_sequence, 0))
                THEN true
                ELSE EXISTS (
                  SELECT 1 FROM %[1]s e
                   WHERE e.aggregate_type = l.aggregate_type AND e.aggregate_id = l.aggregate_id
                     AND e.published_at IS NULL AND e.quarantined_at IS NULL
                     AND e.aggregate_sequence <= (
                       SELECT min(coalesce(x.delivered_sequence, 0))
                         FROM unnest($6::text[]) AS n (name)
                         LEFT JOIN %[2]s x
                           ON x.destination = n.name AND x.aggregate_type = l.aggregate_type
                          AND x.aggregate_id = l.aggregate_id))
           END
       AND NOT EXISTS (SELECT 1 FROM %[4]s o WHERE o.name <> ALL(%[5]s::text[]))
     LIMIT $3
),
lease AS (
    INSERT INTO %[2]s AS d (destination, aggregate_type, aggregate_id, claimed_by, claim_until)
    SELECT $5, aggregate_type, aggregate_id, $1, now() + $2 * interval '1 millisecond' FROM cand
     ORDER BY aggregate_type, aggregate_id
    ON CONFLICT (destination, aggregate_type, aggregate_id) DO UPDATE
       SET claimed_by = excluded.claimed_by, claim_until = excluded.claim_until
     WHERE d.quarantined_at IS NULL AND d.available_at <= now()
       AND (d.claim_until IS NULL OR d.claim_until < now())
    RETURNING d.aggregate_type, d.aggregate_id, d.delivered_sequence, d.attempt_count
)
SELECT l.aggregate_type, l.aggregate_id, l.delivered_sequence, l.attempt_count, c.prev,
       r.event_id, r.aggregate_sequence, r.event_type, r.schema_version, r.payload, r.headers, r.occurred_at
  FROM lease l
  JOIN cand c ON c.aggregate_type = l.aggregate_type AND c.aggregate_id = l.aggregate_id
  LEFT JOIN LATERAL (
    SELECT e.event_id, e.aggregate_sequence, e.event_type, e.schema_version, e.payload, e.headers, e.occurred_at
      FROM %[1]s e
     WHERE e.aggregate_type = l.aggregate_type AND e.aggregate_id = l.aggregate_id
       AND e.aggregate_sequence > l.delivered_sequence
     ORDER BY e.aggregate_sequence
     LIMIT $4) r ON true
 ORDER BY l.aggregate_type, l.aggregate_id, r.aggregate_sequence`

// routedClaimFrom is routedClaimSQL's start at the cursor ($7/$8): the lanes
// strictly before it.
const routedClaimFrom = ` AND (aggregate_type, aggregate_id) < ($7::text, $8::text)`

// deadLetterSQL quarantines in outbox_events the events no destination
// takes ($1 ids, $2 errors): routed to none, or refused by every one. The
// cursors pass them; dlq list shows them. None while a destination
// registered after the relay's start is not among those it knows ($3;
// unservedSQL): only a relay that serves them all can tell that none takes
// an event.
const deadLetterSQL = `
UPDATE %[1]s e
   SET quarantined_at = now(), last_error = f.error
  FROM unnest($1::uuid[], $2::text[]) AS f (event_id, error)
 WHERE e.event_id = f.event_id AND e.published_at IS NULL AND e.quarantined_at IS NULL
   AND NOT EXISTS (SELECT 1 FROM %[2]s o WHERE o.name <> ALL($3::text[]))`

// routedSettleSQL records a destination's outcome on the lanes of a batch,
// only on lanes still leased by this relay ($2), and marks done what every
// destination of the relay has passed.
//
// Parameters: $1 the destination, $2 relay id, $3 every destination of the
// relay (text[]), then per lane: $4/$5 the lane, $6 the sequence its cursor
// advances to (0: none), $7 the error (NULL: no failure), $8 the backoff in
// milliseconds, $9 quarantine, $10 the failed event's sequence, $11 its
// attempt number, $12 the text of a dead letter retried after every
// destination passed it. $13 the destinations the relay knows (routed.known).
//
//   - upd: the lane rows, none while a destination registered after the
//     relay's start is not among those it knows, $13 (unservedSQL: its view
//     of the destinations is out of date, so it must not judge what is done;
//     its leases run out and a relay that serves them all delivers the lanes
//     again). The cursor only moves forward. A failure counts an
//     attempt (the run's first undelivered event's, as Judge numbered it),
//     backs off, records the error and maybe the quarantine; an advance
//     without failure clears them. The lease is released.
//   - recorded and trimmed: each failure's row in the attempt history
//     (outbox_attempts, %[3]s) with the destination's name, only for lanes
//     this relay still held (those upd touched), and the trim of the event's
//     rows to the pipeline.AttemptsKept newest, as the single-broker relay's
//     fail statement does (pipeline.RecordAttempts).
//   - the done mark: the lane's events up to the least cursor over the
//     relay's destinations (this one's as just set, the others' as stored; a
//     missing row is 0) are published, unless quarantined. A dead letter an
//     operator retried (its last_error begins with deadLetterPrefix) is
//     quarantined again instead: no destination owes it, and marking it
//     published would drop it silently.
const routedSettleSQL = `
WITH s AS (
    SELECT * FROM unnest($4::text[], $5::text[], $6::bigint[], $7::text[], $8::bigint[], $9::bool[], $10::bigint[], $11::int[])
        AS s (aggregate_type, aggregate_id, advance, error, delay_ms, quarantine, failed_sequence, attempt)
),
upd AS (
    UPDATE %[2]s d
       SET delivered_sequence = greatest(d.delivered_sequence, s.advance),
           attempt_count = CASE WHEN s.error IS NOT NULL THEN s.attempt
                                WHEN s.advance > d.delivered_sequence THEN 0
                                ELSE d.attempt_count END,
           last_error = CASE WHEN s.error IS NOT NULL THEN s.error
                             WHEN s.advance > d.delivered_sequence THEN NULL
                             ELSE d.last_error END,
           available_at = CASE WHEN s.error IS NOT NULL THEN now() + s.delay_ms * interval '1 millisecond'
                               ELSE d.available_at END,
           quarantined_at = CASE WHEN s.quarantine THEN now() ELSE d.quarantined_at END,
           quarantined_sequence = CASE WHEN s.quarantine THEN s.failed_sequence ELSE d.quarantined_sequence END,
           claimed_by = NULL, claim_until = NULL
      FROM s
     WHERE d.destination = $1 AND d.aggregate_type = s.aggregate_type AND d.aggregate_id = s.aggregate_id
       AND d.claimed_by = $2
       AND NOT EXISTS (SELECT 1 FROM %[5]s o WHERE o.name <> ALL($13::text[]))
    RETURNING d.aggregate_type, d.aggregate_id, d.delivered_sequence
),
recorded AS (
    INSERT INTO %[3]s (event_id, attempt, relay_id, destination, error)
    SELECT e.event_id, s.attempt, $2, $1, s.error
      FROM upd u
      JOIN s ON s.aggregate_type = u.aggregate_type AND s.aggregate_id = u.aggregate_id
      JOIN %[1]s e ON e.aggregate_type = s.aggregate_type AND e.aggregate_id = s.aggregate_id
                  AND e.aggregate_sequence = s.failed_sequence
     WHERE s.error IS NOT NULL
    RETURNING event_id
),
trimmed AS (
    DELETE FROM %[3]s a
     USING recorded f
     WHERE a.event_id = f.event_id
       AND a.attempt_id < (SELECT min(k.attempt_id) FROM (SELECT b.attempt_id FROM %[3]s b
                             WHERE b.event_id = f.event_id ORDER BY b.attempt_id DESC LIMIT %[4]d) k)
),
done AS (
    SELECT u.aggregate_type, u.aggregate_id,
           least(u.delivered_sequence, (
             SELECT min(coalesce(x.delivered_sequence, 0))
               FROM unnest($3::text[]) AS n (name)
               LEFT JOIN %[2]s x
                 ON x.destination = n.name AND x.aggregate_type = u.aggregate_type AND x.aggregate_id = u.aggregate_id
              WHERE n.name <> $1)) AS upto
      FROM upd u
)
UPDATE %[1]s e
   SET published_at = CASE WHEN e.last_error LIKE '` + deadLetterPrefix + `%%' THEN NULL ELSE now() END,
       quarantined_at = CASE WHEN e.last_error LIKE '` + deadLetterPrefix + `%%' THEN now() END,
       last_error = CASE WHEN e.last_error LIKE '` + deadLetterPrefix + `%%' THEN $12 ELSE e.last_error END
  FROM done
 WHERE e.aggregate_type = done.aggregate_type AND e.aggregate_id = done.aggregate_id
   AND e.aggregate_sequence <= done.upto
   AND e.published_at IS NULL AND e.quarantined_at IS NULL`

// routedReleaseSQL gives back a destination's leases ($1) on lanes ($3, $4)
// still held by this relay ($2), without counting an attempt.
const routedReleaseSQL = `
UPDATE %[1]s d
   SET claimed_by = NULL, claim_until = NULL
  FROM unnest($3::text[], $4::text[]) AS l (aggregate_type, aggregate_id)
 WHERE d.destination = $1 AND d.aggregate_type = l.aggregate_type AND d.aggregate_id = l.aggregate_id
   AND d.claimed_by = $2`
