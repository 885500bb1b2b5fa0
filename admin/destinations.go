package admin

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/pgoutbox"
	"github.com/pgoutbox/pgoutbox/relay"
)

// Destinations are the named places a relay with destinations publishes to
// (relay.Config.Destinations, pgoutbox relay --destinations-file). Each keeps
// its progress per aggregate lane in outbox_destination_lanes; its dead letters
// are its quarantined lane rows, each stopped at one event (quarantined_sequence),
// and they hold back only that destination's lane.

// ActionDestinationDrop is the audit action of DropDestination.
const ActionDestinationDrop = "destination_drop"

// ErrDestinationNotFound is returned when no destination has the given name.
var ErrDestinationNotFound = errors.New("destination not found")

// ErrDestinationServed is returned by DropDestination when a relay holds live
// leases on the destination's lanes, so is serving it: stop that relay, or
// remove the destination from its configuration and restart it, first.
var ErrDestinationServed = errors.New("a relay is serving the destination")

// Destination is one registered destination with its backlog figures.
type Destination struct {
	Name string `json:"name"`
	// Rules are the routing rules as the relay last registered them (JSON of
	// relay.Rule).
	Rules json.RawMessage `json:"rules"`
	// Start is how it began: "now" or "backfill".
	Start        string    `json:"start"`
	RegisteredAt time.Time `json:"registered_at"`
	// UpdatedAt is when a relay last registered it (its rules may have changed
	// then).
	UpdatedAt time.Time `json:"updated_at"`
	// PendingLanes counts the lanes holding an unpublished event the
	// destination has not passed yet (its dead letters' lanes included);
	// PendingEvents counts those events.
	PendingLanes  int64 `json:"pending_lanes"`
	PendingEvents int64 `json:"pending_events"`
	// DeadLetters counts its quarantined lanes (dlq list --destination).
	DeadLetters int64 `json:"dead_letters"`
	// LiveLeases counts its lanes a relay holds a live lease on: nonzero, a
	// relay is serving it now.
	LiveLeases int64 `json:"live_leases"`
	// OldestPendingAge is how long ago the oldest of its pending events
	// occurred; zero when none is pending.
	OldestPendingAge Duration `json:"oldest_pending_age_seconds"`
	// OldestPendingAt is when the oldest of its pending events occurred; nil
	// when none is pending.
	OldestPendingAt *time.Time `json:"oldest_pending_at"`
}

// destinationsSQL reads each destination with its figures. Pending events are
// read through the outbox's partial index of unpublished rows: an event is done
// (published_at) once every destination passed it. Events quarantined in
// outbox_events (routed to no destination, or refused) are the outbox's dead
// letters, not a destination's, and are not counted here.
const destinationsSQL = `
SELECT d.name, d.rules, d.start, d.registered_at, d.updated_at,
       coalesce(p.lanes, 0), coalesce(p.events, 0),
       (SELECT count(*) FROM %[2]s l WHERE l.destination = d.name AND l.quarantined_at IS NOT NULL),
       (SELECT count(*) FROM %[2]s l WHERE l.destination = d.name AND l.claim_until > now()),
       coalesce(p.oldest, 0)::float8, p.oldest_at
  FROM %[1]s d
  LEFT JOIN LATERAL (
        SELECT count(DISTINCT (e.aggregate_type, e.aggregate_id)) AS lanes, count(*) AS events,
               extract(epoch FROM now() - min(e.occurred_at)) AS oldest, min(e.occurred_at) AS oldest_at
          FROM %[3]s e
          LEFT JOIN %[2]s l ON l.destination = d.name AND l.aggregate_type = e.aggregate_type AND l.aggregate_id = e.aggregate_id
         WHERE e.published_at IS NULL AND e.quarantined_at IS NULL
           AND e.aggregate_sequence > coalesce(l.delivered_sequence, 0)) p ON true
 WHERE $1::text IS NULL OR d.name = $1
 ORDER BY d.name`

// Destinations lists the registered destinations with their backlog, by
// name. It is empty for an outbox no relay with destinations ever served.
func (a *Admin) Destinations(ctx context.Context) ([]Destination, error) {
	out, err := a.destinations(ctx, a.db, nil)
	if err != nil {
		return nil, fmt.Errorf("admin: destinations: %w", err)
	}
	return out, nil
}

// destinations reads the destinations, one when name is not nil.
func (a *Admin) destinations(ctx context.Context, db DB, name *string) ([]Destination, error) {
	rows, err := db.Query(ctx, fmt.Sprintf(destinationsSQL, a.table("outbox_destinations"), a.lanes(), a.events), name)
	if err != nil {
		return nil, err
	}
	out := []Destination{}
	var d Destination
	var oldest float64
	_, err = pgx.ForEachRow(rows, []any{&d.Name, &d.Rules, &d.Start, &d.RegisteredAt, &d.UpdatedAt,
		&d.PendingLanes, &d.PendingEvents, &d.DeadLetters, &d.LiveLeases, &oldest, &d.OldestPendingAt}, func() error {
		d.OldestPendingAge = Duration(oldest * float64(time.Second))
		if d.OldestPendingAt != nil {
			at := *d.OldestPendingAt
			d.OldestPendingAt = &at
		}
		d.Rules = append(json.RawMessage(nil), d.Rules...)
		out = append(out, d)
		return nil
	})
	return out, err
}

// table is the quoted name of one of the outbox's tables.
func (a *Admin) table(name string) string { return pgx.Identifier{a.schema, name}.Sanitize() }

// lanes is the quoted name of outbox_destination_lanes.
func (a *Admin) lanes() string { return a.table("outbox_destination_lanes") }

// checkDestinationName refuses a name that relay.Destination would refuse,
// before any SQL.
func checkDestinationName(name string) error {
	if err := relay.ValidateDestinationName(name); err != nil {
		return fmt.Errorf("admin: %w", err)
	}
	return nil
}

// DropRequest says which destination DropDestination drops, why, and who
// decided it.
type DropRequest struct {
	// Name is the destination. Required.
	Name string
	// Reason is recorded in the operator audit. Required (not blank).
	Reason string
	// Actor names the operator in the audit; defaults to DefaultActor().
	Actor string
	// Force drops it even while a relay holds live leases on its lanes (that
	// relay would register it again, and start it over by its start mode).
	Force bool
}

// Dropped is what DropDestination deleted.
type Dropped struct {
	Destination Destination `json:"destination"`
	// Lanes is how many progress rows were deleted.
	Lanes   int64 `json:"lanes"`
	AuditID int64 `json:"audit_id"`
}

// DropDestination forgets a destination: its progress rows and its row are
// deleted, and the drop is recorded in the operator audit (action
// destination_drop, with its rules and start), in one transaction. A relay
// that registers the name again starts it over by its start mode: "now" skips
// what was committed before, "backfill" sends every retained event again.
// While a relay holds live leases on its lanes the drop is refused with
// ErrDestinationServed unless req.Force; an unknown name is
// ErrDestinationNotFound; a blank reason ErrNoReason.
func (a *Admin) DropDestination(ctx context.Context, req DropRequest) (*Dropped, error) {
	if err := checkDestinationName(req.Name); err != nil {
		return nil, err
	}
	if strings.TrimSpace(req.Reason) == "" {
		return nil, ErrNoReason
	}
	actor, reason, err := operator(req.Actor, req.Reason)
	if err != nil {
		return nil, err
	}
	out := &Dropped{}
	err = pgx.BeginFunc(ctx, a.db, func(tx pgx.Tx) error {
		// Read without a lock (FOR UPDATE would take the UPDATE privilege the
		// operator role does not have); the DELETE below locks the row.
		ds, err := a.destinations(ctx, tx, &req.Name)
		if err != nil {
			return err
		}
		if len(ds) == 0 {
			return fmt.Errorf("%w: %s", ErrDestinationNotFound, req.Name)
		}
		out.Destination = ds[0]
		if out.Destination.LiveLeases > 0 && !req.Force {
			return fmt.Errorf("%w %s: %d of its lanes are leased by a running relay; stop it or remove the destination from its configuration first",
				ErrDestinationServed, req.Name, out.Destination.LiveLeases)
		}
		if err := queryRow(ctx, tx, `WITH gone AS (DELETE FROM `+a.lanes()+` WHERE destination = $1 RETURNING 1)
SELECT count(*) FROM gone`, []any{req.Name}, &out.Lanes); err != nil {
			return err
		}
		var gone int64
		if err := queryRow(ctx, tx, `WITH gone AS (DELETE FROM `+a.table("outbox_destinations")+` WHERE name = $1 RETURNING 1)
SELECT count(*) FROM gone`, []any{req.Name}, &gone); err != nil {
			return err
		}
		if gone == 0 { // dropped meanwhile by another operator
			return fmt.Errorf("%w: %s", ErrDestinationNotFound, req.Name)
		}
		out.AuditID, err = writeAudit(ctx, tx, a.schema, auditRecord{action: ActionDestinationDrop, actor: actor, reason: reason,
			selection: map[string]any{"destination": req.Name, "rules": out.Destination.Rules, "start": out.Destination.Start,
				"lanes": out.Lanes, "dead_letters": out.Destination.DeadLetters, "pending_events": out.Destination.PendingEvents}})
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("admin: drop destination: %w", err)
	}
	return out, nil
}

// destQuarantinedSQL is a destination's dead letters as events (alias e): the
// event each quarantined lane stopped at, with the lane's attempts, error,
// quarantine and lease in place of the event's own. $1 is the destination.
const destQuarantinedSQL = `
SELECT e.event_id, e.aggregate_type, e.aggregate_id, e.aggregate_sequence, e.event_type, e.schema_version,
       e.occurred_at, e.available_at, coalesce(e.claimed_by, ''), e.claim_until, NULL::timestamptz, e.attempt_count,
       coalesce(e.last_error, ''), e.quarantined_at, 'quarantined'
  FROM (SELECT ev.event_id, ev.aggregate_type, ev.aggregate_id, ev.aggregate_sequence, ev.event_type, ev.schema_version,
               ev.occurred_at, l.available_at, l.claimed_by, l.claim_until, l.attempt_count, l.last_error, l.quarantined_at
          FROM %[1]s l
          JOIN %[2]s ev ON ev.aggregate_type = l.aggregate_type AND ev.aggregate_id = l.aggregate_id
                       AND ev.aggregate_sequence = l.quarantined_sequence
         WHERE l.destination = $1 AND l.quarantined_at IS NOT NULL) e
 WHERE true`

// ListDestinationQuarantined returns the dead letters of one destination
// matching f, oldest quarantine first: for each of its quarantined lanes, the
// event it stopped at, with the lane's attempt count, last error and
// quarantine time. Event.Destination names the destination.
func (a *Admin) ListDestinationQuarantined(ctx context.Context, destination string, f Filter) ([]Event, error) {
	cond, args := f.where([]any{destination})
	order := `
 ORDER BY e.quarantined_at, e.aggregate_type, e.aggregate_id, e.aggregate_sequence`
	if f.Limit > 0 {
		order += " LIMIT " + strconv.Itoa(f.Limit)
	}
	return a.destQuarantined(ctx, destination, cond+order, args)
}

// ListDestinationQuarantinedPage returns one page of the dead letters of one
// destination matching f (its Limit is ignored: p's counts, 1..MaxPage), as
// ListDestinationQuarantined, oldest quarantine first, then by event id;
// Cursor.At is the lane's quarantine time.
func (a *Admin) ListDestinationQuarantinedPage(ctx context.Context, destination string, f Filter, p Page) ([]Event, error) {
	if err := p.check("list quarantined"); err != nil {
		return nil, err
	}
	cond, args := f.where([]any{destination})
	after, args := p.where("e.quarantined_at", args)
	args = append(args, p.Limit)
	return a.destQuarantined(ctx, destination, cond+after+`
 ORDER BY e.quarantined_at, e.event_id LIMIT $`+strconv.Itoa(len(args)), args)
}

// CountDestinationQuarantined counts the dead letters of one destination that
// f selects (its Limit ignored), as CountBulk counts the outbox's: more than
// MaxBulk is ErrTooMany.
func (a *Admin) CountDestinationQuarantined(ctx context.Context, destination string, f Filter) (int, error) {
	if err := checkDestinationName(destination); err != nil {
		return 0, err
	}
	cond, args := f.where([]any{destination})
	var n int
	err := queryRow(ctx, a.db, `SELECT count(*) FROM (`+fmt.Sprintf(destQuarantinedSQL, a.lanes(), a.events)+cond+
		` LIMIT `+strconv.Itoa(MaxBulk+1)+`) c`, args, &n)
	switch {
	case err != nil:
		return 0, fmt.Errorf("admin: count quarantined of %s: %w", destination, err)
	case n > MaxBulk:
		return 0, fmt.Errorf("admin: count quarantined of %s: %w", destination, ErrTooMany)
	}
	return n, nil
}

// destQuarantined returns the dead letters of destination (args[0]) that
// clause, the conditions and order after destQuarantinedSQL, selects.
func (a *Admin) destQuarantined(ctx context.Context, destination, clause string, args []any) ([]Event, error) {
	if err := checkDestinationName(destination); err != nil {
		return nil, err
	}
	if err := a.knownDestination(ctx, a.db, destination); err != nil {
		return nil, fmt.Errorf("admin: list quarantined: %w", err)
	}
	rows, err := a.db.Query(ctx, fmt.Sprintf(destQuarantinedSQL, a.lanes(), a.events)+clause, args...)
	if err != nil {
		return nil, fmt.Errorf("admin: list quarantined of %s: %w", destination, err)
	}
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (Event, error) {
		e, err := scanEvent(row)
		e.Destination = destination
		return e, err
	})
	if err != nil {
		return nil, fmt.Errorf("admin: list quarantined of %s: %w", destination, err)
	}
	return out, nil
}

// knownDestination returns an error wrapping ErrDestinationNotFound unless the
// destination is registered.
func (a *Admin) knownDestination(ctx context.Context, db DB, name string) error {
	var found bool
	if err := queryRow(ctx, db, `SELECT EXISTS (SELECT 1 FROM `+a.table("outbox_destinations")+` WHERE name = $1)`,
		[]any{name}, &found); err != nil {
		return err
	}
	if !found {
		return fmt.Errorf("%w: %s", ErrDestinationNotFound, name)
	}
	return nil
}

// GetForDestination returns one event as Get does, with its state for one
// destination: published when the destination passed it (delivered, or not
// routed there), quarantined when the destination's lane stopped at it,
// else pending, backing_off or leased by the lane; the lane's attempt count,
// last error and quarantine replace the event's own while the destination has
// not passed it. The outbox-wide record of a skip is not shown.
func (a *Admin) GetForDestination(ctx context.Context, destination string, id pgoutbox.UUID) (*Event, error) {
	if err := checkDestinationName(destination); err != nil {
		return nil, err
	}
	if err := a.knownDestination(ctx, a.db, destination); err != nil {
		return nil, fmt.Errorf("admin: get: %w", err)
	}
	e, err := a.Get(ctx, id)
	if err != nil {
		return nil, err
	}
	e.Destination, e.Skip = destination, nil
	var delivered int64
	var attempts int
	var lastError, claimedBy string
	var available time.Time
	var claimUntil, quarantinedAt *time.Time
	var quarantinedSeq *int64
	var state string
	err = queryRow(ctx, a.db, `SELECT coalesce(l.delivered_sequence, 0), coalesce(l.attempt_count, 0), coalesce(l.last_error, ''),
       coalesce(l.claimed_by, ''), coalesce(l.available_at, now()), l.claim_until, l.quarantined_at, l.quarantined_sequence,
       CASE WHEN l.claim_until > now() THEN 'leased' WHEN l.available_at > now() THEN 'backing_off' ELSE 'pending' END
  FROM (SELECT 1) one LEFT JOIN `+a.lanes()+` l ON l.destination = $1 AND l.aggregate_type = $2 AND l.aggregate_id = $3`,
		[]any{destination, e.AggregateType, e.AggregateID},
		&delivered, &attempts, &lastError, &claimedBy, &available, &claimUntil, &quarantinedAt, &quarantinedSeq, &state)
	if err != nil {
		return nil, fmt.Errorf("admin: get event %s for %s: %w", id, destination, err)
	}
	if e.AggregateSequence <= delivered {
		e.State, e.AttemptCount, e.LastError, e.QuarantinedAt, e.ClaimedBy, e.ClaimUntil = StatePublished, 0, "", nil, "", nil
		return e, nil
	}
	e.PublishedAt = nil
	e.AttemptCount, e.LastError, e.ClaimedBy, e.ClaimUntil, e.AvailableAt = attempts, lastError, claimedBy, claimUntil, available
	e.QuarantinedAt, e.State = nil, state
	if quarantinedAt != nil && quarantinedSeq != nil {
		if *quarantinedSeq == e.AggregateSequence {
			e.State, e.QuarantinedAt = StateQuarantined, quarantinedAt
		} else {
			// Behind its lane's dead letter for this destination.
			e.State, e.AttemptCount, e.LastError = StatePending, 0, ""
		}
	}
	return e, nil
}

// DestinationRetryRequest says which dead letters of one destination
// RetryDestination retries.
type DestinationRetryRequest struct {
	// Destination is the destination's name. Required.
	Destination string
	// Exactly one of IDs, Filter (with a criterion) and All says which dead
	// letters, as in RetryRequest.
	IDs    []pgoutbox.UUID
	Filter Filter
	All    bool
	Reason string
	Actor  string
}

// RetryDestination lifts the quarantine of the destination's lanes whose dead
// letter req selects: quarantine, attempts, backoff and lease cleared (the last
// error kept), the relays woken; the lane resumes at that event, for this
// destination only. The action is audited as dlq_retry with the destination
// in its selection, in the same transaction. It returns the events retried;
// ids that are not a dead letter of the destination are left alone, ids no
// event has are ErrNotFound (nothing retried).
func (a *Admin) RetryDestination(ctx context.Context, req DestinationRetryRequest) ([]pgoutbox.UUID, error) {
	if err := checkDestinationName(req.Destination); err != nil {
		return nil, err
	}
	if err := oneSelection("DestinationRetryRequest", len(req.IDs) > 0, req.Filter, req.All); err != nil {
		return nil, err
	}
	actor, reason, err := operator(req.Actor, req.Reason)
	if err != nil {
		return nil, err
	}
	rec := auditRecord{action: ActionRetry, actor: actor, reason: reason}
	cond, args := "", []any{req.Destination, a.channel}
	limit := ""
	switch {
	case len(req.IDs) > 0:
		cond, args = " AND e.event_id = ANY($3::uuid[])", append(args, req.IDs)
		rec.selection = map[string]any{"destination": req.Destination, "event_ids": req.IDs}
	case req.All:
		rec.selection = map[string]any{"destination": req.Destination, "all": true}
	default:
		cond, args = req.Filter.where(args)
		if req.Filter.Limit > 0 {
			limit = " LIMIT " + strconv.Itoa(req.Filter.Limit)
		}
		rec.selection = map[string]any{"destination": req.Destination, "filter": req.Filter.audit()}
	}
	var out []pgoutbox.UUID
	err = pgx.BeginFunc(ctx, a.db, func(tx pgx.Tx) error {
		if err := a.knownDestination(ctx, tx, req.Destination); err != nil {
			return err
		}
		if len(req.IDs) > 0 {
			if err := a.checkExist(ctx, tx, req.IDs, "retried"); err != nil {
				return err
			}
		}
		rows, err := tx.Query(ctx, `WITH chosen AS (
`+fmt.Sprintf(destQuarantinedSQL, a.lanes(), a.events)+cond+`
 ORDER BY e.quarantined_at, e.aggregate_type, e.aggregate_id, e.aggregate_sequence`+limit+`
), retried AS (
    UPDATE `+a.lanes()+` l
       SET quarantined_at = NULL, quarantined_sequence = NULL, attempt_count = 0, available_at = now(),
           claimed_by = NULL, claim_until = NULL
      FROM chosen c
     WHERE l.destination = $1 AND l.aggregate_type = c.aggregate_type AND l.aggregate_id = c.aggregate_id
       AND l.quarantined_sequence = c.aggregate_sequence
    RETURNING c.event_id, c.aggregate_type, c.aggregate_id, c.aggregate_sequence
), wake AS (
    SELECT pg_notify($2, '') WHERE EXISTS (SELECT 1 FROM retried)
)
SELECT event_id FROM retried, (SELECT count(*) FROM wake) w
 ORDER BY aggregate_type, aggregate_id, aggregate_sequence`, args...)
		if err != nil {
			return err
		}
		if out, err = pgx.CollectRows(rows, pgx.RowTo[pgoutbox.UUID]); err != nil {
			return err
		}
		rec.ids, rec.count = out, int64(len(out))
		_, err = writeAudit(ctx, tx, a.schema, rec)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("admin: retry for %s: %w", req.Destination, err)
	}
	return out, nil
}

// DestinationSkipRequest says which dead letters of one destination
// SkipDestination skips.
type DestinationSkipRequest struct {
	// Destination is the destination's name. Required.
	Destination string
	// IDs are dead letters of the destination. Required.
	IDs []pgoutbox.UUID
	// Reason is recorded in the audit. Required (not blank).
	Reason string
	Actor  string
}

// SkipDestination gives up on dead letters of one destination: its lane moves
// past each (delivered_sequence = the event's sequence, quarantine, attempts
// and lease cleared) without sending it there; the other destinations are not
// touched. When every registered destination has then passed the event, it
// is marked published, as the relay does. The skip is audited as dlq_skip with
// the destination in its selection, in one transaction, then the relays are
// woken. All or nothing: an id no event has is ErrNotFound, one that is not a
// dead letter of the destination ErrNotQuarantined.
func (a *Admin) SkipDestination(ctx context.Context, req DestinationSkipRequest) ([]Event, error) {
	if err := checkDestinationName(req.Destination); err != nil {
		return nil, err
	}
	actor, reason, err := skipOperator(req.IDs, req.Actor, req.Reason)
	if err != nil {
		return nil, err
	}
	var out []Event
	err = pgx.BeginFunc(ctx, a.db, func(tx pgx.Tx) error {
		if err := a.knownDestination(ctx, tx, req.Destination); err != nil {
			return err
		}
		if err := a.checkExist(ctx, tx, req.IDs, "skipped"); err != nil {
			return err
		}
		// Lock the lanes of the events: the dead letters of the destination.
		rows, err := tx.Query(ctx, fmt.Sprintf(destQuarantinedSQL, a.lanes(), a.events)+` AND e.event_id = ANY($2::uuid[])
 ORDER BY e.aggregate_type, e.aggregate_id, e.aggregate_sequence`, req.Destination, req.IDs)
		if err != nil {
			return err
		}
		if out, err = pgx.CollectRows(rows, func(row pgx.CollectableRow) (Event, error) {
			e, err := scanEvent(row)
			e.Destination = req.Destination
			return e, err
		}); err != nil {
			return err
		}
		if len(out) != len(req.IDs) {
			var wrong []string
			for _, id := range req.IDs {
				found := false
				for _, e := range out {
					found = found || e.ID == id
				}
				if !found {
					wrong = append(wrong, id.String())
				}
			}
			return fmt.Errorf("%w for %s: %s (nothing skipped)", ErrNotQuarantined, req.Destination, strings.Join(wrong, ", "))
		}
		for _, e := range out {
			tag, err := tx.Exec(ctx, `UPDATE `+a.lanes()+`
   SET delivered_sequence = quarantined_sequence, quarantined_at = NULL, quarantined_sequence = NULL,
       attempt_count = 0, available_at = now(), claimed_by = NULL, claim_until = NULL
 WHERE destination = $1 AND aggregate_type = $2 AND aggregate_id = $3 AND quarantined_sequence = $4`,
				req.Destination, e.AggregateType, e.AggregateID, e.AggregateSequence)
			if err != nil {
				return err
			}
			if tag.RowsAffected() != 1 {
				return fmt.Errorf("%w for %s: %s changed meanwhile (nothing skipped)", ErrNotQuarantined, req.Destination, e.ID)
			}
			// The done mark, as the relay makes it: every registered
			// destination has passed the event (no lane row: nothing passed).
			if _, err := tx.Exec(ctx, `UPDATE `+a.events+` ev SET published_at = now()
 WHERE ev.aggregate_type = $1 AND ev.aggregate_id = $2 AND ev.published_at IS NULL AND ev.quarantined_at IS NULL
   AND ev.aggregate_sequence <= (
        SELECT min(coalesce(l.delivered_sequence, 0)) FROM `+a.table("outbox_destinations")+` d
          LEFT JOIN `+a.lanes()+` l ON l.destination = d.name AND l.aggregate_type = $1 AND l.aggregate_id = $2)`,
				e.AggregateType, e.AggregateID); err != nil {
				return err
			}
		}
		done := make([]pgoutbox.UUID, len(out))
		for i, e := range out {
			done[i] = e.ID
		}
		if _, err := writeAudit(ctx, tx, a.schema, auditRecord{action: ActionSkip, actor: actor, reason: reason,
			selection: map[string]any{"destination": req.Destination, "event_ids": req.IDs}, ids: done, count: int64(len(done))}); err != nil {
			return err
		}
		_, err = tx.Exec(ctx, "SELECT pg_notify($1, '')", a.channel)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("admin: skip for %s: %w", req.Destination, err)
	}
	return out, nil
}

// The states of an event at one destination (EventDestination.State).
const (
	// DestDelivered: the destination's lane passed the event and its rules
	// route it there.
	DestDelivered = "delivered"
	// DestNotRouted: the destination's current rules do not route the event
	// there.
	DestNotRouted = "not_routed"
	// DestPending: routed there and not yet passed; a relay will publish it.
	DestPending = "pending"
	// DestQuarantined: the destination's lane stopped at the event: a dead
	// letter of the destination.
	DestQuarantined = "quarantined"
	// DestBlocked: routed there, waiting behind a dead letter of the same lane
	// at the destination (BlockedBehind).
	DestBlocked = "blocked"
)

// EventDestination is one event's state at one destination.
type EventDestination struct {
	Destination string `json:"destination"`
	// Routed says whether the destination's rules, as a relay last
	// registered them, route the event there.
	Routed bool `json:"routed"`
	// State is one of DestDelivered, DestNotRouted, DestPending,
	// DestQuarantined and DestBlocked.
	State string `json:"state"`
	// DeliveredSequence is how far the destination's lane went (0: nowhere).
	DeliveredSequence int64 `json:"delivered_sequence"`
	// BlockedBehind is the sequence of the dead letter the event waits behind
	// (DestBlocked), else 0.
	BlockedBehind int64 `json:"blocked_behind,omitempty"`
	// AttemptCount and LastError are the lane's, while it has not passed the
	// event.
	AttemptCount int    `json:"attempt_count"`
	LastError    string `json:"last_error,omitempty"`
}

// EventDestinations returns the state of event e (as Get returned it) at each
// registered destination, by name: delivered when the destination's lane
// passed it (delivered_sequence >= its sequence) and its rules route it there,
// else quarantined there (its lane stopped at it), not routed when the rules do
// not route it there, blocked behind the lane's dead letter there, or pending. It is empty when the outbox has no
// destinations (one cheap query).
func (a *Admin) EventDestinations(ctx context.Context, e *Event) ([]EventDestination, error) {
	rows, err := a.db.Query(ctx, `SELECT d.name, d.rules, coalesce(l.delivered_sequence, 0), l.quarantined_sequence,
       coalesce(l.attempt_count, 0), coalesce(l.last_error, '')
  FROM `+a.table("outbox_destinations")+` d
  LEFT JOIN `+a.lanes()+` l ON l.destination = d.name AND l.aggregate_type = $1 AND l.aggregate_id = $2
 ORDER BY d.name`, e.AggregateType, e.AggregateID)
	if err != nil {
		return nil, fmt.Errorf("admin: destinations of event %s: %w", e.ID, err)
	}
	out := []EventDestination{}
	var d EventDestination
	var rules []byte
	var quarantined *int64
	_, err = pgx.ForEachRow(rows, []any{&d.Destination, &rules, &d.DeliveredSequence, &quarantined, &d.AttemptCount, &d.LastError}, func() error {
		var rs []relay.Rule
		if err := json.Unmarshal(rules, &rs); err != nil {
			return fmt.Errorf("rules of destination %s: %w", d.Destination, err)
		}
		row := d
		row.Routed = slices.ContainsFunc(rs, func(r relay.Rule) bool { return r.Match(e.AggregateType, e.EventType, e.Headers) })
		switch {
		case e.AggregateSequence <= row.DeliveredSequence:
			row.State, row.AttemptCount, row.LastError = DestDelivered, 0, ""
			if !row.Routed {
				row.State = DestNotRouted
			}
		case quarantined != nil && *quarantined == e.AggregateSequence:
			row.State = DestQuarantined
		case !row.Routed:
			row.State, row.AttemptCount, row.LastError = DestNotRouted, 0, ""
		case quarantined != nil && *quarantined < e.AggregateSequence:
			row.State, row.BlockedBehind, row.AttemptCount, row.LastError = DestBlocked, *quarantined, 0, ""
		default:
			row.State = DestPending
		}
		out = append(out, row)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("admin: destinations of event %s: %w", e.ID, err)
	}
	return out, nil
}
