package admin

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/pgoutbox"
	"github.com/pgoutbox/pgoutbox/broker"
	"github.com/pgoutbox/pgoutbox/internal/retry"
	"github.com/pgoutbox/pgoutbox/migrate"
	"github.com/pgoutbox/pgoutbox/relay"
)

// ReplayFilter selects the published events a replay re-publishes. Empty fields
// select everything; set fields must all match.
type ReplayFilter struct {
	// AggregateType and AggregateID restrict the replay to one aggregate type, or
	// (both set) to one aggregate.
	AggregateType string
	AggregateID   string
	// EventType restricts the replay to one event type.
	EventType string
	// Since and Until bound occurred_at: Since <= occurred_at < Until. A zero time
	// leaves that side open.
	Since, Until time.Time
	// EventIDs restricts the replay to these events.
	EventIDs []pgoutbox.UUID
}

// ReplayRequest says what Replay re-publishes and how.
type ReplayRequest struct {
	// Schema is the PostgreSQL schema holding the outbox tables. Defaults to
	// "public".
	Schema string

	// Filter selects the events.
	Filter ReplayFilter

	// DryRun counts the selected events and publishes nothing.
	DryRun bool

	// BatchSize is how many events are read and published at once; memory stays
	// bounded by it whatever the selection's size. Defaults to 500.
	BatchSize int

	// MaxAttempts is how many times a batch is published while the broker answers
	// with plain (neither permanent nor unavailable) errors before the replay
	// stops. A permanent refusal stops it at once; an unavailable broker is waited
	// for until ctx ends. Defaults to 5.
	MaxAttempts int

	// Progress, when set, is called after each batch with the running totals.
	Progress func(ReplayProgress)

	// ToDestination, when set, replays to one destination of a relay with
	// destinations (relay.Destination.Name, registered in outbox_destinations):
	// only the selected events that destination has passed (its lane's cursor,
	// outbox_destination_lanes.delivered_sequence, is at or past them) and that
	// its rules, as a relay last registered them, route to it; never those it
	// skipped (dlq skip --destination) nor those skipped in the outbox (dlq
	// skip). An event the outbox quarantined as routed to no destination is
	// replayed once the destination's rules take it. pub must
	// then be that destination's publisher; the other destinations and every
	// cursor are left alone. A name relay.Destination would refuse is an error
	// wrapping relay.ErrInvalidDestination, before any SQL; an unregistered one
	// wraps ErrDestinationNotFound (ErrNoDestinations when none is registered).
	// The audit records it as the selection's "destination", the broker as its
	// "broker".
	ToDestination string

	// Reason, Actor and Destination are recorded in the operator audit
	// (outbox_operator_audit) before anything is published: why (defaults to
	// DefaultReason), who (defaults to DefaultActor(); the database role is
	// recorded beside it) and where to (the broker, without credentials). A dry
	// run is not recorded.
	Reason, Actor, Destination string
}

// ReplayProgress is reported after each batch of a replay.
type ReplayProgress struct {
	// Published is how many events the broker acknowledged so far.
	Published int64
	// Total is how many events the filter selected when the replay started.
	Total int64
}

// ReplayResult reports what Replay did.
type ReplayResult struct {
	// Total is how many published events the filter selected when the replay
	// started, and ByAggregateType the same count per aggregate type.
	Total           int64
	ByAggregateType map[string]int64
	// Published is how many events the broker acknowledged (0 for a dry run). It
	// may exceed Total when matching events were published during the replay.
	Published int64
	// Batches is how many batches were published.
	Batches int
	// RunID identifies this replay; the messages' broker dedup ids (Nats-Msg-Id)
	// are "<event id>:replay:<RunID>".
	RunID string
	// Duration is how long the replay took.
	Duration time.Duration
}

// ReplayError is the error of a replay the broker stopped: how far it got and
// which event it could not publish.
type ReplayError struct {
	// Published is how many events the broker acknowledged before the replay
	// stopped, out of Total selected.
	Published, Total int64
	// Event is the message that failed.
	Event broker.Message
	// Err is the broker's answer.
	Err error
}

func (e *ReplayError) Error() string {
	return fmt.Sprintf("admin: replay stopped after publishing %d of %d events: event %s (%s/%s sequence %d) failed: %v; "+
		"aggregates after %s/%s (in aggregate type, id order) were not replayed",
		e.Published, e.Total, e.Event.EventID, e.Event.AggregateType, e.Event.AggregateID, e.Event.AggregateSequence, e.Err,
		e.Event.AggregateType, e.Event.AggregateID)
}

func (e *ReplayError) Unwrap() error { return e.Err }

// Replay re-publishes already-published events through pub: the same event ids,
// payloads and wire headers as the first time, each aggregate's events in
// sequence order. Events an operator skipped (pgoutbox dlq skip) are never
// replayed: they were not published. The outbox rows are only read, never
// changed, so a replay does not disturb the relays.
//
// Events are read in (aggregate_type, aggregate_id, aggregate_sequence) order, a
// batch at a time (keyset pagination, so memory is bounded), and each batch is
// published whole before the next is read. Every message carries
// [broker.Message.DedupID] "<event id>:replay:<run id>", so a broker that drops
// repeats of an id (NATS JetStream within its duplicate window) stores the replay;
// consumers still dedup on Outbox-Event-Id.
//
// A batch whose messages fail as unavailable is published again with backoff
// until ctx ends; plain errors are retried MaxAttempts times; a permanent refusal
// stops the replay. The error is then a *ReplayError saying how far it got.
// ctx bounds the whole replay.
func Replay(ctx context.Context, db DB, pub broker.Publisher, req ReplayRequest) (res ReplayResult, err error) {
	start := time.Now()
	res = ReplayResult{RunID: pgoutbox.NewEventID().String(), ByAggregateType: map[string]int64{}}
	if req.Schema == "" {
		req.Schema = migrate.DefaultSchema
	}
	if req.BatchSize == 0 {
		req.BatchSize = 500
	}
	if req.MaxAttempts == 0 {
		req.MaxAttempts = 5
	}
	switch {
	case migrate.ValidateSchema(req.Schema) != nil:
		return res, fmt.Errorf("admin: ReplayRequest.Schema: %w", migrate.ValidateSchema(req.Schema))
	case req.BatchSize < 1:
		return res, fmt.Errorf("admin: ReplayRequest.BatchSize %d: must be positive", req.BatchSize)
	case req.MaxAttempts < 1:
		return res, fmt.Errorf("admin: ReplayRequest.MaxAttempts %d: must be positive", req.MaxAttempts)
	case !req.Filter.Since.IsZero() && !req.Filter.Until.IsZero() && !req.Filter.Until.After(req.Filter.Since):
		return res, fmt.Errorf("admin: ReplayFilter: Until %s is not after Since %s",
			req.Filter.Until.Format(time.RFC3339), req.Filter.Since.Format(time.RFC3339))
	case pub == nil && !req.DryRun:
		return res, errors.New("admin: replay: no publisher")
	}
	if req.ToDestination != "" {
		if err := checkDestinationName(req.ToDestination); err != nil {
			return res, err
		}
	}

	where, args, err := replayWhere(ctx, db, req.Schema, req.Filter, req.ToDestination)
	if err != nil {
		return res, err
	}
	events := pgx.Identifier{req.Schema, "outbox_events"}.Sanitize()
	rows, err := db.Query(ctx, fmt.Sprintf("SELECT e.aggregate_type, count(*) FROM %s e WHERE %s GROUP BY 1 ORDER BY 1", events, where), args...)
	if err != nil {
		return res, fmt.Errorf("admin: replay: count: %w", err)
	}
	var typ string
	var n int64
	_, err = pgx.ForEachRow(rows, []any{&typ, &n}, func() error {
		res.ByAggregateType[typ] = n
		res.Total += n
		return nil
	})
	if err != nil {
		return res, fmt.Errorf("admin: replay: count: %w", err)
	}
	if req.DryRun {
		res.Duration = time.Since(start)
		return res, nil
	}
	auditID, err := auditReplay(ctx, db, req, &res)
	if err != nil {
		return res, err
	}
	defer func() {
		// The outcome, in its own statement: the replay's events are published
		// whatever happens to it.
		out := map[string]any{"published": res.Published, "batches": res.Batches}
		if err != nil {
			out["error"] = err.Error()
		}
		b, _ := json.Marshal(out)
		if uerr := queryRow(context.WithoutCancel(ctx), db, "UPDATE "+auditTable(req.Schema)+
			" SET outcome = $2::jsonb WHERE audit_id = $1", []any{auditID, string(b)}); uerr != nil && err == nil {
			err = fmt.Errorf("admin: replay: record the outcome in the audit: %w", uerr)
		}
	}()

	// Keyset pagination on the (aggregate_type, aggregate_id, aggregate_sequence)
	// unique index: each page starts strictly after the last row of the previous.
	k := len(args)
	page := fmt.Sprintf(`SELECT e.event_id, e.aggregate_type, e.aggregate_id, e.aggregate_sequence, e.event_type,
       e.schema_version, e.payload, e.headers, e.occurred_at
  FROM %s e
 WHERE %s AND (e.aggregate_type, e.aggregate_id, e.aggregate_sequence) > ($%d::text, $%d::text, $%d::bigint)
 ORDER BY e.aggregate_type, e.aggregate_id, e.aggregate_sequence
 LIMIT $%d`, events, where, k+1, k+2, k+3, k+4)
	var after struct {
		typ, id string
		seq     int64
	}
	for {
		rows, err := db.Query(ctx, page, append(args, after.typ, after.id, after.seq, req.BatchSize)...)
		if err != nil {
			return res, fmt.Errorf("admin: replay: read events: %w", err)
		}
		msgs, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (broker.Message, error) {
			var m broker.Message
			err := row.Scan(&m.EventID, &m.AggregateType, &m.AggregateID, &m.AggregateSequence, &m.EventType,
				&m.SchemaVersion, &m.Payload, &m.Headers, &m.OccurredAt)
			m.DedupID = m.EventID.String() + ":replay:" + res.RunID
			m.Tenant, m.Schema = req.Schema, req.Schema // as the relay of the outbox fills them
			return m, err
		})
		if err != nil {
			return res, fmt.Errorf("admin: replay: read events: %w", err)
		}
		if len(msgs) == 0 {
			break
		}
		if err := publishBatch(ctx, pub, msgs, req.MaxAttempts, &res); err != nil {
			res.Duration = time.Since(start)
			return res, err
		}
		res.Batches++
		if req.Progress != nil {
			req.Progress(ReplayProgress{Published: res.Published, Total: res.Total})
		}
		last := msgs[len(msgs)-1]
		after.typ, after.id, after.seq = last.AggregateType, last.AggregateID, last.AggregateSequence
		if len(msgs) < req.BatchSize {
			break
		}
	}
	res.Duration = time.Since(start)
	return res, nil
}

// auditReplay records the replay about to start in the operator audit, in a
// transaction of its own that commits before anything is published.
func auditReplay(ctx context.Context, db DB, req ReplayRequest, res *ReplayResult) (int64, error) {
	actor, reason, err := operator(req.Actor, req.Reason)
	if err != nil {
		return 0, err
	}
	f := req.Filter
	sel := map[string]any{"run_id": res.RunID}
	dest := map[string]string{"destination": req.Destination}
	if req.ToDestination != "" { // named as dlq retry/skip --destination name it
		dest = map[string]string{"destination": req.ToDestination, "broker": req.Destination}
	}
	for k, v := range map[string]string{"aggregate_type": f.AggregateType, "aggregate_id": f.AggregateID,
		"event_type": f.EventType, "destination": dest["destination"], "broker": dest["broker"]} {
		if v != "" {
			sel[k] = v
		}
	}
	if !f.Since.IsZero() {
		sel["since"] = f.Since.UTC()
	}
	if !f.Until.IsZero() {
		sel["until"] = f.Until.UTC()
	}
	if f.AggregateType == "" && f.AggregateID == "" && f.EventType == "" && f.Since.IsZero() && f.Until.IsZero() && len(f.EventIDs) == 0 {
		sel["all"] = true
	}
	var id int64
	err = pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		var err error
		id, err = writeAudit(ctx, tx, req.Schema, auditRecord{action: ActionReplay, actor: actor, reason: reason,
			selection: sel, ids: f.EventIDs, count: res.Total})
		return err
	})
	if err != nil {
		return 0, fmt.Errorf("admin: replay: %w", err)
	}
	return id, nil
}

// replayWhere builds the condition selecting the filter's published events
// (passed by destination dest when it is not empty), with only the clauses the
// filter needs, so each query gets a plan fit for it.
func replayWhere(ctx context.Context, db DB, schema string, f ReplayFilter, dest string) (string, []any, error) {
	c := sqlConds{conds: []string{"e.published_at IS NOT NULL"}}
	if dest != "" {
		c.conds = nil
		if err := destinationWhere(ctx, db, schema, dest, &c); err != nil {
			return "", nil, err
		}
	}
	c.exact(f.AggregateType, f.AggregateID, f.EventType)
	if !f.Since.IsZero() {
		c.add("e.occurred_at >= $%d", f.Since)
	}
	if !f.Until.IsZero() {
		c.add("e.occurred_at < $%d", f.Until)
	}
	if len(f.EventIDs) > 0 {
		c.add("e.event_id = ANY($%d::uuid[])", f.EventIDs)
	}
	// A skipped dead letter has published_at set but never reached the broker.
	// The audit table comes with a later migration; without it nothing was skipped.
	skipped := pgx.Identifier{schema, "outbox_skipped_events"}.Sanitize()
	var hasSkipped bool
	if err := queryRow(ctx, db, "SELECT to_regclass($1) IS NOT NULL", []any{skipped}, &hasSkipped); err != nil {
		return "", nil, fmt.Errorf("admin: replay: look up %s: %w", skipped, err)
	}
	if hasSkipped {
		c.conds = append(c.conds, "NOT EXISTS (SELECT 1 FROM "+skipped+" s WHERE s.event_id = e.event_id)")
	}
	return strings.Join(c.conds, " AND "), c.args, nil
}

// ErrNoDestinations is returned by a replay to a destination
// (ReplayRequest.ToDestination) when the outbox has none registered: no relay
// with destinations ever served it. It wraps ErrDestinationNotFound.
var ErrNoDestinations = fmt.Errorf("%w: no destination is registered (a relay with destinations registers them)", ErrDestinationNotFound)

// destinationWhere adds to c the clauses choosing the events destination dest
// has: its lane's cursor passed them, its registered rules route them there,
// and it did not skip them (a dlq skip --destination moves the cursor past an
// event without sending it; the audit keeps which). An event the outbox
// quarantined as routed to no destination is passed by every cursor: once the
// rules take it, it is replayed, which is how an operator sends it where it
// should have gone (docs/operations.md, "Destinations"). The rules' values go
// in as parameters, never into the text.
func destinationWhere(ctx context.Context, db DB, schema, dest string, c *sqlConds) error {
	table := pgx.Identifier{schema, "outbox_destinations"}.Sanitize()
	var exists bool
	if err := queryRow(ctx, db, "SELECT to_regclass($1) IS NOT NULL", []any{table}, &exists); err != nil {
		return fmt.Errorf("admin: replay: look up %s: %w", table, err)
	}
	if !exists {
		return fmt.Errorf("admin: replay to %s: %w", dest, ErrNoDestinations)
	}
	var registered int64
	var raw []byte
	if err := queryRow(ctx, db, "SELECT (SELECT count(*) FROM "+table+"), (SELECT rules FROM "+table+" WHERE name = $1)",
		[]any{dest}, &registered, &raw); err != nil {
		return fmt.Errorf("admin: replay: read destination %s: %w", dest, err)
	}
	switch {
	case registered == 0:
		return fmt.Errorf("admin: replay to %s: %w", dest, ErrNoDestinations)
	case raw == nil:
		return fmt.Errorf("admin: replay: %w: %s", ErrDestinationNotFound, dest)
	}
	var rules []relay.Rule
	if err := json.Unmarshal(raw, &rules); err != nil {
		return fmt.Errorf("admin: replay: the rules of destination %s: %w", dest, err)
	}
	name := c.param(dest)
	c.conds = append(c.conds,
		// A scalar subquery, not EXISTS: it stays a probe of the lane's row per
		// event the keyset page reads. As a semi-join, the plan a prepared
		// statement settles on walks the destination's lanes from the first on
		// every page, each page slower than the last (100k events: 240/s).
		// No lane row: the destination has passed nothing there (NULL, false).
		"e.aggregate_sequence <= (SELECT l.delivered_sequence FROM "+pgx.Identifier{schema, "outbox_destination_lanes"}.Sanitize()+
			" l WHERE l.destination = "+name+" AND l.aggregate_type = e.aggregate_type AND l.aggregate_id = e.aggregate_id)",
		// Uncorrelated, so read once per statement and hashed: not one scan of
		// the audit per event.
		"e.event_id NOT IN (SELECT x FROM "+auditTable(schema)+" a, unnest(a.event_ids) x WHERE a.action = '"+ActionSkip+
			"' AND a.selection->>'destination' = "+name+" AND x IS NOT NULL)",
		rulesWhere(rules, c))
	return nil
}

// rulesWhere is the condition of relay.Destination.Match on the row e: any
// rule matches, each rule's lists and headers all match.
func rulesWhere(rules []relay.Rule, c *sqlConds) string {
	// Before any parameter is added: one the text does not use would have no type.
	if slices.ContainsFunc(rules, func(r relay.Rule) bool { return r.All }) {
		return "true"
	}
	var ors []string
	for _, r := range rules {
		var all []string
		if len(r.AggregateTypes) > 0 {
			all = append(all, "e.aggregate_type = ANY("+c.param(r.AggregateTypes)+"::text[])")
		}
		if len(r.EventTypes) > 0 {
			all = append(all, "e.event_type = ANY("+c.param(r.EventTypes)+"::text[])")
		}
		if len(r.Headers) > 0 {
			b, _ := json.Marshal(r.Headers) // a map of strings always marshals
			all = append(all, "e.headers @> "+c.param(string(b))+"::jsonb")
		}
		if len(all) > 0 { // a rule without any matches nothing (relay.Rule.validate refuses it)
			ors = append(ors, "("+strings.Join(all, " AND ")+")")
		}
	}
	if len(ors) == 0 {
		return "false"
	}
	return "(" + strings.Join(ors, " OR ") + ")"
}

// queryRow runs a one-row query through DB, which only has Query.
func queryRow(ctx context.Context, db DB, q string, args []any, dest ...any) error {
	rows, err := db.Query(ctx, q, args...)
	if err != nil {
		return err
	}
	_, err = pgx.ForEachRow(rows, dest, func() error { return nil })
	return err
}

// publishBatch publishes msgs until the broker acknowledged every one, retrying
// what failed (and what was not sent behind it) in order.
func publishBatch(ctx context.Context, pub broker.Publisher, msgs []broker.Message, maxAttempts int, res *ReplayResult) error {
	var wait retry.Backoff // the reconnect schedule: 100ms doubling to 5s, jittered
	plain := 0
	for {
		// The relay's rule (broker.CheckMessage): an event published before the
		// rule existed, with reserved or invalid headers, is refused, not re-sent.
		results := broker.PublishValid(ctx, pub, msgs, nil)
		if len(results) != len(msgs) {
			return fmt.Errorf("admin: replay: the publisher returned %d results for %d messages", len(results), len(msgs))
		}
		var again []broker.Message
		var cause error
		var failed broker.Message
		for i, err := range results {
			switch {
			case err == nil:
				res.Published++
				continue
			case broker.IsPermanent(err):
				return &ReplayError{Published: res.Published, Total: res.Total, Event: msgs[i], Err: err}
			case !errors.Is(err, broker.ErrPredecessorFailed) && cause == nil:
				cause, failed = err, msgs[i]
			}
			again = append(again, msgs[i])
		}
		if len(again) == 0 {
			return nil
		}
		if cause == nil { // only "not sent": nothing to wait for
			cause, failed = broker.ErrPredecessorFailed, again[0]
		}
		if ctx.Err() != nil {
			return &ReplayError{Published: res.Published, Total: res.Total, Event: failed, Err: ctx.Err()}
		}
		if !broker.IsUnavailable(cause) && !errors.Is(cause, broker.ErrPredecessorFailed) {
			if plain++; plain >= maxAttempts {
				return &ReplayError{Published: res.Published, Total: res.Total, Event: failed,
					Err: fmt.Errorf("%d attempts: %w", plain, cause)}
			}
		}
		if !retry.Sleep(ctx, wait.Next()) {
			return &ReplayError{Published: res.Published, Total: res.Total, Event: failed, Err: fmt.Errorf("%w (last broker error: %v)", ctx.Err(), cause)}
		}
		msgs = again
	}
}
