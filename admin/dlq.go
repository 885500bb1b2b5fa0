package admin

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/user"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/pgoutbox"
)

// Dead letters are quarantined events: published_at IS NULL and quarantined_at IS
// NOT NULL. Each blocks its aggregate's later events until an operator retries it
// (Retry, RetryWhere, RetryAll) or skips it (Skip).

// Errors of the dead-letter actions; they arrive wrapped with the event ids concerned.
var (
	// ErrNotFound: no event has the given id.
	ErrNotFound = errors.New("event not found")
	// ErrNoReason: Skip was called without a reason.
	ErrNoReason = errors.New("admin: a skip needs a reason")
	// ErrNotQuarantined: Skip was asked to skip an event that is not quarantined.
	ErrNotQuarantined = errors.New("only quarantined events can be skipped")
	// ErrNoFilter: RetryWhere was called with a filter that selects everything;
	// use RetryAll to mean that.
	ErrNoFilter = errors.New("admin: empty filter (use RetryAll to retry every quarantined event)")
)

// States of an event, as reported in Event.State.
const (
	StatePending     = "pending"     // waiting for a relay
	StateBackingOff  = "backing_off" // failed before; available_at is in the future
	StateLeased      = "leased"      // a relay holds a live lease on it
	StateQuarantined = "quarantined" // a dead letter: retry or skip it
	StatePublished   = "published"   // the broker acknowledged it
	StateSkipped     = "skipped"     // marked published by an operator's skip, never sent
)

// Filter selects quarantined events. Empty fields match everything.
type Filter struct {
	AggregateType string // exact match
	AggregateID   string // exact match
	EventType     string // exact match
	// ErrorContains matches events whose last_error contains it, ignoring case.
	ErrorContains string
	// Limit caps how many events are returned or retried, oldest quarantine first.
	// Zero means no limit.
	Limit int
}

func (f Filter) empty() bool {
	return f.AggregateType == "" && f.AggregateID == "" && f.EventType == "" && f.ErrorContains == ""
}

// where returns the filter's conditions on alias e (" AND ..."), numbering its
// parameters after those already in args.
func (f Filter) where(args []any) (string, []any) {
	c := sqlConds{args: args}
	c.exact(f.AggregateType, f.AggregateID, f.EventType)
	if f.ErrorContains != "" {
		// position() rather than LIKE: the operator's text needs no escaping.
		c.add("position(lower($%d) IN lower(coalesce(e.last_error, ''))) > 0", f.ErrorContains)
	}
	var b strings.Builder
	for _, cond := range c.conds {
		b.WriteString(" AND " + cond)
	}
	return b.String(), c.args
}

// sqlConds collects the conditions of a WHERE clause on alias e and their
// parameters, numbered in order after those it starts with.
type sqlConds struct {
	conds []string
	args  []any
}

// add adds cond, whose %d is the number of its parameter arg.
func (c *sqlConds) add(cond string, arg any) {
	c.args = append(c.args, arg)
	c.conds = append(c.conds, fmt.Sprintf(cond, len(c.args)))
}

// param adds arg and returns its placeholder, for a condition of several.
func (c *sqlConds) param(arg any) string {
	c.args = append(c.args, arg)
	return fmt.Sprintf("$%d", len(c.args))
}

// exact adds the exact matches the operators' filters share: on the aggregate
// type, the aggregate id and the event type, each where set.
func (c *sqlConds) exact(aggregateType, aggregateID, eventType string) {
	if aggregateType != "" {
		c.add("e.aggregate_type = $%d", aggregateType)
	}
	if aggregateID != "" {
		c.add("e.aggregate_id = $%d", aggregateID)
	}
	if eventType != "" {
		c.add("e.event_type = $%d", eventType)
	}
}

// Event is one outbox row as an operator sees it.
type Event struct {
	ID                pgoutbox.UUID `json:"event_id"`
	AggregateType     string        `json:"aggregate_type"`
	AggregateID       string        `json:"aggregate_id"`
	AggregateSequence int64         `json:"aggregate_sequence"`
	EventType         string        `json:"event_type"`
	SchemaVersion     int           `json:"schema_version"`
	// Payload and Headers are loaded by Get only.
	Payload       json.RawMessage   `json:"payload,omitempty"`
	Headers       map[string]string `json:"headers,omitempty"`
	OccurredAt    time.Time         `json:"occurred_at"`
	AvailableAt   time.Time         `json:"available_at"`
	ClaimedBy     string            `json:"claimed_by,omitempty"`
	ClaimUntil    *time.Time        `json:"claim_until,omitempty"`
	PublishedAt   *time.Time        `json:"published_at,omitempty"`
	AttemptCount  int               `json:"attempt_count"`
	LastError     string            `json:"last_error,omitempty"`
	QuarantinedAt *time.Time        `json:"quarantined_at,omitempty"`
	// State is one of the State constants, judged by the database's clock.
	State string `json:"state"`
	// Destination names the destination whose view of the event this is
	// (ListDestinationQuarantined, GetForDestination); empty for the outbox's.
	Destination string `json:"destination,omitempty"`
	// Skip is the audit record of a skipped event (Get only).
	Skip *Skipped `json:"skip,omitempty"`
	// Attempts are the event's failed attempts, newest first (Get only): at
	// most the 20 newest (outbox migration 13), written by the relay that
	// recorded each failure.
	Attempts []Attempt `json:"attempts,omitempty"`
}

// Attempt is one failed publish attempt of an event (table outbox_attempts).
type Attempt struct {
	// Attempt is the event's attempt count after this failure; it restarts at
	// 1 after a dlq retry.
	Attempt int       `json:"attempt"`
	At      time.Time `json:"at"`
	// Age is the time since At, by the database's clock.
	Age     Duration `json:"age_seconds"`
	RelayID string   `json:"relay_id"` // the relay's id, or cdc:<slot> for the CDC source
	// Destination is the destination that failed; empty for the single-broker
	// relay.
	Destination string `json:"destination,omitempty"`
	// Error is the error as the relay stored it in last_error: credentials
	// redacted, at most 2,000 bytes. Producers' and brokers' text: show it
	// escaped.
	Error string `json:"error"`
}

// attemptsShown bounds the attempts Get reads (the relays keep 20 an event).
const attemptsShown = 100

// Skipped is the audit record of one skipped event (table outbox_skipped_events).
type Skipped struct {
	EventID           pgoutbox.UUID `json:"event_id"`
	AggregateType     string        `json:"aggregate_type"`
	AggregateID       string        `json:"aggregate_id"`
	AggregateSequence int64         `json:"aggregate_sequence"`
	EventType         string        `json:"event_type"`
	LastError         string        `json:"last_error,omitempty"`
	AttemptCount      int           `json:"attempt_count"`
	Reason            string        `json:"reason"`
	// SkippedBy is the operator (SkipRequest.Actor); DBUser the database role
	// (current_user) that ran the skip.
	SkippedBy string    `json:"skipped_by"`
	DBUser    string    `json:"db_user"`
	SkippedAt time.Time `json:"skipped_at"`
}

const eventColumns = `e.event_id, e.aggregate_type, e.aggregate_id, e.aggregate_sequence, e.event_type, e.schema_version,
       e.occurred_at, e.available_at, coalesce(e.claimed_by, ''), e.claim_until, e.published_at, e.attempt_count,
       coalesce(e.last_error, ''), e.quarantined_at,
       CASE WHEN s.event_id IS NOT NULL THEN 'skipped'
            WHEN e.published_at IS NOT NULL THEN 'published'
            WHEN e.quarantined_at IS NOT NULL THEN 'quarantined'
            WHEN e.claim_until > now() THEN 'leased'
            WHEN e.available_at > now() THEN 'backing_off'
            ELSE 'pending' END`

func scanEvent(row pgx.CollectableRow, extra ...any) (Event, error) {
	var e Event
	dest := append([]any{&e.ID, &e.AggregateType, &e.AggregateID, &e.AggregateSequence, &e.EventType, &e.SchemaVersion,
		&e.OccurredAt, &e.AvailableAt, &e.ClaimedBy, &e.ClaimUntil, &e.PublishedAt, &e.AttemptCount,
		&e.LastError, &e.QuarantinedAt, &e.State}, extra...)
	err := row.Scan(dest...)
	return e, err
}

// ListQuarantined returns the quarantined events matching f, oldest quarantine
// first, without their payloads and headers. It reads only unpublished rows (the
// outbox's partial index), however long the published history.
func (a *Admin) ListQuarantined(ctx context.Context, f Filter) ([]Event, error) {
	cond, args := f.where(nil)
	q := `
 WHERE e.published_at IS NULL AND e.quarantined_at IS NOT NULL` + cond + `
 ORDER BY e.quarantined_at, e.aggregate_type, e.aggregate_id, e.aggregate_sequence`
	if f.Limit > 0 {
		q += " LIMIT " + strconv.Itoa(f.Limit)
	}
	return a.queryEvents(ctx, "list quarantined", q, args...)
}

// Get returns one event, whatever its state, with its payload, headers and, if it
// was skipped, the audit record. It returns an error wrapping ErrNotFound when no
// event has that id (it may have been deleted by cleanup).
func (a *Admin) Get(ctx context.Context, id pgoutbox.UUID) (*Event, error) {
	q := `SELECT ` + eventColumns + `, e.payload, e.headers,
       s.reason, s.skipped_by, s.db_user, s.skipped_at
  FROM ` + a.events + ` e LEFT JOIN ` + a.skipped + ` s ON s.event_id = e.event_id
 WHERE e.event_id = $1`
	rows, err := a.db.Query(ctx, q, id)
	if err != nil {
		return nil, fmt.Errorf("admin: get event %s: %w", id, err)
	}
	e, err := pgx.CollectExactlyOneRow(rows, func(row pgx.CollectableRow) (Event, error) {
		var payload []byte
		var headers map[string]string
		var reason, by, dbUser *string
		var at *time.Time
		e, err := scanEvent(row, &payload, &headers, &reason, &by, &dbUser, &at)
		if err != nil {
			return e, err
		}
		e.Payload, e.Headers = payload, headers
		if reason != nil {
			e.Skip = &Skipped{EventID: e.ID, AggregateType: e.AggregateType, AggregateID: e.AggregateID,
				AggregateSequence: e.AggregateSequence, EventType: e.EventType, LastError: e.LastError,
				AttemptCount: e.AttemptCount, Reason: *reason, SkippedBy: *by, DBUser: *dbUser, SkippedAt: *at}
		}
		return e, nil
	})
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, fmt.Errorf("admin: get: %w: %s", ErrNotFound, id)
	}
	if err != nil {
		return nil, fmt.Errorf("admin: get event %s: %w", id, err)
	}
	rows, err = a.db.Query(ctx, `SELECT attempt, at, (extract(epoch FROM greatest(now() - at, interval '0')) * 1e9)::bigint,
       relay_id, coalesce(destination, ''), error FROM `+a.attempts+`
 WHERE event_id = $1 ORDER BY attempt_id DESC LIMIT `+fmt.Sprint(attemptsShown), id)
	if err != nil {
		return nil, fmt.Errorf("admin: get the attempts of event %s: %w", id, err)
	}
	if e.Attempts, err = pgx.CollectRows(rows, pgx.RowToStructByPos[Attempt]); err != nil {
		return nil, fmt.Errorf("admin: get the attempts of event %s: %w", id, err)
	}
	return &e, nil
}

// RetryWhere retries the quarantined events that f selects, like Retry: quarantine
// lifted, attempts reset, backoff and lease cleared, relays woken. A filter without
// any criterion is refused with ErrNoFilter (RetryAll says that explicitly). It
// returns the ids retried, ordered by aggregate and sequence. It is RetryEvents
// with the default actor and reason.
func (a *Admin) RetryWhere(ctx context.Context, f Filter) ([]pgoutbox.UUID, error) {
	if f.empty() {
		return nil, ErrNoFilter
	}
	return a.RetryEvents(ctx, RetryRequest{Filter: f})
}

// RetryAll retries every quarantined event. See Retry.
func (a *Admin) RetryAll(ctx context.Context) ([]pgoutbox.UUID, error) {
	return a.RetryEvents(ctx, RetryRequest{All: true})
}

// RetryRequest says which dead letters RetryEvents retries, why, and who decided it.
type RetryRequest struct {
	// Exactly one of IDs, Filter (with a criterion) and All says which events.
	IDs    []pgoutbox.UUID
	Filter Filter
	All    bool
	// Reason is recorded in the operator audit; defaults to DefaultReason.
	Reason string
	// Actor names the operator in the audit; defaults to DefaultActor(). The
	// database role (current_user) is recorded beside it.
	Actor string
}

// oneSelection checks that a request (named req) selects its events one way:
// by ids, a filter or all.
func oneSelection(req string, ids bool, f Filter, all bool) error {
	ways := 0
	for _, b := range []bool{ids, !f.empty(), all} {
		if b {
			ways++
		}
	}
	switch {
	case ways == 0 && f.Limit > 0:
		return ErrNoFilter
	case ways == 0:
		return ErrNoEvents
	case ways > 1:
		return fmt.Errorf("admin: %s: give IDs, a Filter or All, not several of them", req)
	}
	return nil
}

// RetryEvents lifts the quarantine of the events req selects (see Retry) and
// records the action, with the ids retried, in outbox_operator_audit in the same
// transaction. Ids that no event has are ErrNotFound, and then nothing is
// retried; ids of events that are not quarantined are left alone (they are not
// in the result).
func (a *Admin) RetryEvents(ctx context.Context, req RetryRequest) ([]pgoutbox.UUID, error) {
	if err := oneSelection("RetryRequest", len(req.IDs) > 0, req.Filter, req.All); err != nil {
		return nil, err
	}
	actor, reason, err := operator(req.Actor, req.Reason)
	if err != nil {
		return nil, err
	}
	rec := auditRecord{action: ActionRetry, actor: actor, reason: reason}
	var cond string
	args := []any{a.channel}
	limit := 0
	switch {
	case len(req.IDs) > 0:
		cond, args = " AND e.event_id = ANY($2::uuid[])", append(args, req.IDs)
		rec.selection = map[string]any{"event_ids": req.IDs}
	case req.All:
		rec.selection = map[string]any{"all": true}
	default:
		cond, args = req.Filter.where(args)
		limit = req.Filter.Limit
		rec.selection = map[string]any{"filter": req.Filter.audit()}
	}
	var out []pgoutbox.UUID
	err = pgx.BeginFunc(ctx, a.db, func(tx pgx.Tx) error {
		if len(req.IDs) > 0 {
			if err := a.checkExist(ctx, tx, req.IDs, "retried"); err != nil {
				return err
			}
		}
		var err error
		if out, err = a.retry(ctx, tx, cond, args, limit); err != nil {
			return err
		}
		rec.ids, rec.count = out, int64(len(out))
		_, err = writeAudit(ctx, tx, a.schema, rec)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("admin: retry: %w", err)
	}
	return out, nil
}

// checkExist returns an error wrapping ErrNotFound naming the ids no event has,
// saying that nothing was done (verb: "retried", "skipped").
func (a *Admin) checkExist(ctx context.Context, db DB, ids []pgoutbox.UUID, verb string) error {
	rows, err := db.Query(ctx, `SELECT i FROM unnest($1::uuid[]) i
 WHERE NOT EXISTS (SELECT 1 FROM `+a.events+` e WHERE e.event_id = i)`, ids)
	if err != nil {
		return err
	}
	missing, err := pgx.CollectRows(rows, pgx.RowTo[pgoutbox.UUID])
	if err != nil {
		return err
	}
	if len(missing) > 0 {
		names := make([]string, len(missing))
		for i, id := range missing {
			names[i] = id.String()
		}
		return fmt.Errorf("%w: %s (nothing %s)", ErrNotFound, strings.Join(names, ", "), verb)
	}
	return nil
}

// audit returns the filter's criteria for the audit record.
func (f Filter) audit() map[string]any {
	m := map[string]any{}
	for k, v := range map[string]string{"aggregate_type": f.AggregateType, "aggregate_id": f.AggregateID,
		"event_type": f.EventType, "error_contains": f.ErrorContains} {
		if v != "" {
			m[k] = v
		}
	}
	if f.Limit > 0 {
		m["limit"] = f.Limit
	}
	return m
}

// retry lifts the quarantine of the events matching cond (" AND ..." on alias e,
// parameters from $2; $1 is the notify channel). Only quarantined, unpublished rows
// qualify, so a lane's later events stay where the relay's claim rule keeps them:
// behind the retried head, published in sequence order once it is.
func (a *Admin) retry(ctx context.Context, db DB, cond string, args []any, limit int) ([]pgoutbox.UUID, error) {
	lim := ""
	if limit > 0 {
		lim = " LIMIT " + strconv.Itoa(limit)
	}
	q := `WITH chosen AS (
    SELECT e.event_id FROM ` + a.events + ` e
     WHERE e.published_at IS NULL AND e.quarantined_at IS NOT NULL` + cond + `
     ORDER BY e.quarantined_at, e.aggregate_type, e.aggregate_id, e.aggregate_sequence` + lim + `
       FOR UPDATE
), retried AS (
    UPDATE ` + a.events + ` e
       SET quarantined_at = NULL, attempt_count = 0, available_at = now(), claimed_by = NULL, claim_until = NULL
      FROM chosen c
     WHERE e.event_id = c.event_id
    RETURNING e.event_id, e.aggregate_type, e.aggregate_id, e.aggregate_sequence
), wake AS (
    SELECT pg_notify($1, '') WHERE EXISTS (SELECT 1 FROM retried)
)
SELECT event_id FROM retried, (SELECT count(*) FROM wake) w
 ORDER BY aggregate_type, aggregate_id, aggregate_sequence`
	rows, err := db.Query(ctx, q, args...)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowTo[pgoutbox.UUID])
}

// SkipRequest says which dead letters to skip, why, and who decided it.
type SkipRequest struct {
	// IDs are the quarantined events to skip. Required.
	IDs []pgoutbox.UUID
	// Reason is recorded in the audit table. Required (not blank).
	Reason string
	// Actor names the operator in the audit table. Defaults to DefaultActor().
	// The database role (current_user) is recorded beside it.
	Actor string
}

// DefaultActor returns $PGOUTBOX_ACTOR when set, else "<os user>@<hostname>".
func DefaultActor() string {
	if a := strings.TrimSpace(os.Getenv("PGOUTBOX_ACTOR")); a != "" {
		return a
	}
	name := os.Getenv("USER")
	if u, err := user.Current(); err == nil && u.Username != "" {
		name = u.Username
	}
	if name == "" {
		name = "uid" + strconv.Itoa(os.Getuid())
	}
	host, _ := os.Hostname()
	if host == "" {
		host = "unknown-host"
	}
	return name + "@" + host
}

// skipOperator checks a skip's request (ids given, a reason) and returns the
// actor and reason the audit records.
func skipOperator(ids []pgoutbox.UUID, actor, reason string) (string, string, error) {
	if len(ids) == 0 {
		return "", "", ErrNoEvents
	}
	if strings.TrimSpace(reason) == "" {
		return "", "", ErrNoReason
	}
	return operator(actor, reason)
}

// Skip gives up on quarantined events: each is marked published without being sent
// (published_at = now(), quarantined_at and the lease cleared, last_error and
// attempt_count kept), so its aggregate's lane moves on to the next event, and a
// row in outbox_skipped_events records who skipped it, when and why. All of it
// happens in one transaction, with a row in the operator audit
// (outbox_operator_audit), then the relays are woken.
//
// Skipping breaks the aggregate's order for consumers (they never see the event),
// so it is all or nothing: if any id is unknown (ErrNotFound) or not quarantined
// (ErrNotQuarantined), nothing is skipped. A blank reason is ErrNoReason.
func (a *Admin) Skip(ctx context.Context, req SkipRequest) ([]Skipped, error) {
	actor, reason, err := skipOperator(req.IDs, req.Actor, req.Reason)
	if err != nil {
		return nil, err
	}
	var out []Skipped
	err = pgx.BeginFunc(ctx, a.db, func(tx pgx.Tx) error {
		out, err = a.skipTx(ctx, tx, req.IDs, reason, actor, map[string]any{"event_ids": req.IDs})
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("admin: skip: %w", err)
	}
	return out, nil
}

// skipTx skips the quarantined events ids in tx (see Skip), all or nothing,
// and records the skip in the operator audit with selection.
func (a *Admin) skipTx(ctx context.Context, tx pgx.Tx, ids []pgoutbox.UUID, reason, actor string, selection map[string]any) ([]Skipped, error) {
	// Lock the rows first: a relay cannot lease a quarantined row, and nobody
	// else may retry or skip them while we decide.
	rows, err := tx.Query(ctx, `SELECT e.event_id, CASE WHEN e.published_at IS NOT NULL THEN 'published'
            WHEN e.quarantined_at IS NULL THEN 'not quarantined' END
  FROM `+a.events+` e WHERE e.event_id = ANY($1::uuid[]) FOR UPDATE`, ids)
	if err != nil {
		return nil, err
	}
	state := map[pgoutbox.UUID]*string{}
	var id pgoutbox.UUID
	var st *string
	if _, err := pgx.ForEachRow(rows, []any{&id, &st}, func() error { state[id] = st; return nil }); err != nil {
		return nil, err
	}
	var missing, wrong []string
	for _, id := range ids {
		s, ok := state[id]
		switch {
		case !ok:
			missing = append(missing, id.String())
		case s != nil:
			wrong = append(wrong, id.String()+" is "+*s)
		}
	}
	if len(missing) > 0 {
		return nil, fmt.Errorf("%w: %s (nothing skipped)", ErrNotFound, strings.Join(missing, ", "))
	}
	if len(wrong) > 0 {
		return nil, fmt.Errorf("%w: %s (nothing skipped)", ErrNotQuarantined, strings.Join(wrong, ", "))
	}
	// Both CTEs read the rows as they were before this statement: the audit row
	// keeps the failure record, the update moves the lane on.
	rows, err = tx.Query(ctx, `WITH audit AS (
    INSERT INTO `+a.skipped+` AS s (event_id, aggregate_type, aggregate_id, aggregate_sequence, event_type,
                                     last_error, attempt_count, quarantined_at, reason, skipped_by)
    SELECT e.event_id, e.aggregate_type, e.aggregate_id, e.aggregate_sequence, e.event_type,
           e.last_error, e.attempt_count, e.quarantined_at, $2, $3
      FROM `+a.events+` e WHERE e.event_id = ANY($1::uuid[])
    RETURNING s.event_id, s.aggregate_type, s.aggregate_id, s.aggregate_sequence, s.event_type,
              coalesce(s.last_error, ''), s.attempt_count, s.reason, s.skipped_by, s.db_user, s.skipped_at
), moved AS (
    UPDATE `+a.events+` e
       SET published_at = now(), quarantined_at = NULL, claimed_by = NULL, claim_until = NULL
     WHERE e.event_id = ANY($1::uuid[])
    RETURNING e.event_id
)
SELECT a.* FROM audit a JOIN moved m ON m.event_id = a.event_id
 ORDER BY a.aggregate_type, a.aggregate_id, a.aggregate_sequence`, ids, reason, actor)
	if err != nil {
		return nil, err
	}
	out, err := pgx.CollectRows(rows, pgx.RowToStructByPos[Skipped])
	if err != nil {
		return nil, err
	}
	done := make([]pgoutbox.UUID, len(out))
	for i, s := range out {
		done[i] = s.EventID
	}
	if _, err := writeAudit(ctx, tx, a.schema, auditRecord{action: ActionSkip, actor: actor, reason: reason,
		selection: selection, ids: done, count: int64(len(done))}); err != nil {
		return nil, err
	}
	// Delivered at commit: the relays claim the lanes' next events at once.
	_, err = tx.Exec(ctx, "SELECT pg_notify($1, '')", a.channel)
	return out, err
}
