package cdc

import (
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/pgoutbox/pgoutbox"
	"github.com/pgoutbox/pgoutbox/internal/pipeline"
)

// queries holds the CDC source's statements for one schema. docs/design.md ("CDC
// source") explains the rules they enforce.
type queries struct {
	table                                      string // schema-qualified, quoted
	relays                                     string // the quoted outbox_relays (heartbeat.go)
	takeover, foreignLeases, pendingLanes      string
	alreadyPublished, mark, fail               string
	laneRows, lease, unblockable, eventsBehind string
	releaseAll, remaining                      string
}

func newQueries(schema string) queries {
	t := pgx.Identifier{schema, "outbox_events"}.Sanitize()
	f := func(q string) string { return fmt.Sprintf(q, t) }
	return queries{
		table:            t,
		relays:           pgx.Identifier{schema, "outbox_relays"}.Sanitize(),
		takeover:         f(takeoverSQL),
		foreignLeases:    f(foreignLeasesSQL),
		pendingLanes:     f(pendingLanesSQL),
		alreadyPublished: f(alreadyPublishedSQL),
		mark:             f(markSQL),
		fail:             fmt.Sprintf(failSQL, t, pgx.Identifier{schema, "outbox_attempts"}.Sanitize()),
		laneRows:         f(laneRowsSQL),
		lease:            f(leaseSQL),
		unblockable:      f(unblockableSQL),
		eventsBehind:     f(eventsBehindSQL),
		releaseAll:       f(releaseAllSQL),
		remaining:        f(remainingSQL),
	}
}

// takeoverSQL makes the CDC source ($1) the owner of every unpublished event that
// no live lease holds: claim_until 'infinity' keeps polling relays away for good
// (their claim needs an expired or empty lease). Rows inserted later are born
// owned through the column defaults set at start-up.
const takeoverSQL = `
UPDATE %[1]s
   SET claimed_by = $1, claim_until = 'infinity'
 WHERE published_at IS NULL AND claimed_by IS DISTINCT FROM $1
   AND (claim_until IS NULL OR claim_until < now())`

// foreignLeasesSQL lists live leases of other relays on unpublished events: a
// polling relay is (or was until a moment ago) running on this schema.
const foreignLeasesSQL = `
SELECT claimed_by, count(*), max(claim_until)::text
  FROM %[1]s
 WHERE published_at IS NULL AND claimed_by IS DISTINCT FROM $1 AND claim_until >= now()
 GROUP BY claimed_by ORDER BY claimed_by`

// pendingLanesSQL returns every lane with unpublished events and its highest
// unpublished sequence: the lanes the table path owns at start-up.
const pendingLanesSQL = `
SELECT aggregate_type, aggregate_id, max(aggregate_sequence)
  FROM %[1]s
 WHERE published_at IS NULL
 GROUP BY aggregate_type, aggregate_id`

// alreadyPublishedSQL finds the events of a batch that are published already (the
// stream re-sends what followed the last confirmed position after a restart).
const alreadyPublishedSQL = `
SELECT event_id FROM %[1]s WHERE event_id = ANY($1::uuid[]) AND published_at IS NOT NULL`

// markSQL records the broker's acks, like the polling relay's mark. The lease is
// ended (claim_until NULL); claimed_by keeps saying who published the event.
// Only its row count is read: when it falls short, markAll looks for the
// events left out.
const markSQL = `
UPDATE %[1]s
   SET published_at = now(), attempt_count = attempt_count + 1, claim_until = NULL
 WHERE event_id = ANY($1::uuid[]) AND published_at IS NULL`

// failSQL records failed attempts, like the polling relay's fail, but the CDC
// source keeps the event (claimed_by = $5, claim_until 'infinity'): a failed event
// is the table path's to retry, never a polling relay's.
// The same statement writes each failure's row in the attempt history
// (outbox_attempts, %[2]s; relay id "cdc:<slot>"), as the polling relay's does.
const failSQL = `
WITH failed AS (
UPDATE %[1]s e
   SET ` + pipeline.FailAssignments + `,
       claimed_by = $5, claim_until = 'infinity'
  FROM unnest($1::uuid[], $2::text[], $3::bigint[], $4::bool[]) AS f (event_id, error, delay_ms, quarantine)
 WHERE e.event_id = f.event_id AND e.published_at IS NULL
   AND (e.claimed_by = $5 OR e.claim_until IS NULL OR e.claim_until < now())
` + pipeline.FailReturning + `
)` + pipeline.RecordAttempts

// laneRowsSQL reads, for each lane the table path owns ($1/$2), its first $4
// unpublished events in sequence order, and whether each may go now: not
// quarantined, backoff over, and either ours or not leased by anyone alive.
const laneRowsSQL = `
SELECT e.event_id, e.aggregate_type, e.aggregate_id, e.aggregate_sequence, e.event_type,
       e.schema_version, e.payload, e.headers, e.occurred_at, e.attempt_count,
       e.quarantined_at IS NOT NULL,
       greatest(e.available_at, CASE WHEN e.claimed_by IS DISTINCT FROM $3 AND e.claim_until >= now()
                                     THEN e.claim_until END) AS not_before,
       now()
  FROM unnest($1::text[], $2::text[]) AS l (aggregate_type, aggregate_id)
 CROSS JOIN LATERAL (
        SELECT * FROM %[1]s x
         WHERE x.published_at IS NULL
           AND x.aggregate_type = l.aggregate_type AND x.aggregate_id = l.aggregate_id
         ORDER BY x.aggregate_sequence
         LIMIT $4) e
 ORDER BY e.aggregate_type, e.aggregate_id, e.aggregate_sequence`

// leaseSQL (re)takes the events the table path is about to publish: events an
// operator retried have had their lease cleared.
const leaseSQL = `
UPDATE %[1]s
   SET claimed_by = $2, claim_until = 'infinity'
 WHERE event_id = ANY($1::uuid[]) AND published_at IS NULL AND quarantined_at IS NULL
   AND available_at <= now()
   AND (claimed_by = $2 OR claim_until IS NULL OR claim_until < now())
RETURNING event_id`

// unblockableSQL decides, in one snapshot, which lanes the table path may hand
// back to the stream: the highest sequence the stream skipped for the lane ($3) is
// visible and published, and nothing at or below it is unpublished. Visibility of
// that row implies visibility of every lower sequence (each was committed before
// the next could be allocated), so the NOT EXISTS cannot miss a late commit.
// With each lane comes the WAL insert position (walInsertPositionSQL), read
// after every event the table path published was visible to it: the stream
// looks up the events of transactions ending there or before (it may bring
// some the table path published, later sequences of the lane).
const unblockableSQL = `
SELECT l.aggregate_type, l.aggregate_id, (` + walInsertPositionSQL + `)
  FROM unnest($1::text[], $2::text[], $3::bigint[]) AS l (aggregate_type, aggregate_id, seen)
 WHERE EXISTS (SELECT 1 FROM %[1]s e
                WHERE e.aggregate_type = l.aggregate_type AND e.aggregate_id = l.aggregate_id
                  AND e.aggregate_sequence = l.seen AND e.published_at IS NOT NULL)
   AND NOT EXISTS (SELECT 1 FROM %[1]s e
                    WHERE e.published_at IS NULL
                      AND e.aggregate_type = l.aggregate_type AND e.aggregate_id = l.aggregate_id
                      AND e.aggregate_sequence <= l.seen)`

// walInsertPositionSQL reads the server's WAL insert position as text. Every
// transaction visible to a later snapshot has its commit record inserted, so
// it ends at or before the position. (A standby, where nothing is marked,
// answers its replay position.)
const walInsertPositionSQL = `SELECT CASE WHEN pg_is_in_recovery() THEN pg_last_wal_replay_lsn() ELSE pg_current_wal_insert_lsn() END::text`

// eventsBehindSQL counts the events not yet published (the partial index only).
const eventsBehindSQL = `SELECT count(*) FROM %[1]s WHERE published_at IS NULL`

// remainingSQL counts the unpublished events, and among them the quarantined
// and the failing ones (a failed attempt recorded); the others have never been
// tried. Over the partial index of unpublished events only.
const remainingSQL = `
SELECT count(*),
       count(*) FILTER (WHERE quarantined_at IS NOT NULL),
       count(*) FILTER (WHERE quarantined_at IS NULL AND (attempt_count > 0 OR last_error IS NOT NULL))
  FROM %[1]s WHERE published_at IS NULL`

// releaseAllSQL hands the CDC source's unpublished events back to polling relays.
const releaseAllSQL = `
UPDATE %[1]s SET claimed_by = NULL, claim_until = NULL
 WHERE published_at IS NULL AND claimed_by = $1`

// syncStandbysSQL reads, in one round trip for every held transaction,
// synchronous_standby_names, whether the role may see other roles' walsenders
// (pg_read_all_stats, which pg_monitor includes; without it their columns read
// NULL), and one position per synchronous standby (sync_state sync or quorum;
// -1 when NULL): flush_lsn, or replay_lsn when synchronous_commit (the
// server's, unless the source's role, database or URL sets its own) is
// remote_apply. Walsenders of logical slots (this source's own among them)
// are not standbys a failover can promote, and are left out. Then who
// answers: the system identifier, the timeline (0 on a standby) and the
// process holding the slot $1 (0: none), which the source compares with its replication
// connection's (a position read from another server releases nothing).
// standby.go explains the rule.
const syncStandbysSQL = `
SELECT current_setting('synchronous_standby_names'),
       pg_has_role(current_user, 'pg_read_all_stats', 'USAGE'),
       coalesce(array_agg(coalesce(pg_wal_lsn_diff(
                    CASE current_setting('synchronous_commit') WHEN 'remote_apply' THEN replay_lsn ELSE flush_lsn END,
                    '0/0')::bigint, -1))
                FILTER (WHERE sync_state IN ('sync', 'quorum')
                          AND pid NOT IN (SELECT active_pid FROM pg_replication_slots
                                           WHERE slot_type = 'logical' AND active_pid IS NOT NULL)),
                '{}'),
       (SELECT system_identifier::text FROM pg_control_system()),
       CASE WHEN pg_is_in_recovery() THEN 0
            ELSE ('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::bigint END,
       coalesce((SELECT active_pid FROM pg_replication_slots WHERE slot_name = $1), 0)
  FROM pg_stat_replication`

// pgUUIDs converts ids for a uuid[] parameter. pgtype.UUID is a type pgx
// encodes natively (pgoutbox.UUID would go through its driver.Valuer text form,
// element by element: a tenth of the source's CPU), and it names the
// parameter's type in the query modes that do not ask the server for it (exec,
// simple_protocol: the modes for PgBouncer's transaction pooling).
func pgUUIDs(ids []pgoutbox.UUID) []pgtype.UUID {
	out := make([]pgtype.UUID, len(ids))
	for i, id := range ids {
		out[i] = pgtype.UUID{Bytes: id, Valid: true}
	}
	return out
}

// collectIDs reads a result of one non-NULL uuid column.
func collectIDs(rows pgx.Rows) ([]pgoutbox.UUID, error) {
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (pgoutbox.UUID, error) {
		var id pgtype.UUID
		err := row.Scan(&id)
		return id.Bytes, err
	})
}
