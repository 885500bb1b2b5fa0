package relay

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/pgoutbox/pgoutbox"
	"github.com/pgoutbox/pgoutbox/broker"
	"github.com/pgoutbox/pgoutbox/internal/failpoint"
	"github.com/pgoutbox/pgoutbox/internal/pgbound"
	"github.com/pgoutbox/pgoutbox/internal/pipeline"
	"github.com/pgoutbox/pgoutbox/internal/retry"
)

// A relay with destinations (Config.Destinations) routes each event to the
// destinations whose rules match it, and keeps per destination and per lane
// how far that destination has got (outbox_destination_lanes, outbox
// migration 12; docs/design.md, "Destinations"). Each destination has a
// stream of its own (Config.Workers workers, its wake-ups, its lane cursor):
//
//   - claim leases lanes for the destination, each with its run: the lane's
//     events past the destination's cursor (routedClaimSQL);
//   - the events of the run that the destination's rules match are published
//     with the pipeline (pipeline.Publish, Judge), on the destination's
//     publisher; the others are passed over;
//   - settle moves the cursor over the acked and passed-over prefix of each
//     run, records a failure (backoff, quarantine) on the lane's row for this
//     destination alone, and marks done (published_at) what every destination
//     of the relay has passed (routedSettleSQL).
//
// An event no destination takes (no rule matches it, or its row cannot become
// a message) is a dead letter in outbox_events, never dropped silently.

// errGroupDestinations refuses destinations in a Group.
var errGroupDestinations = errors.New("relay: a Group does not support destinations (GroupConfig.Config.Destinations): " +
	"run a relay per outbox with Config.Destinations")

// routed is the engine of a relay with destinations.
type routed struct {
	r     *Relay
	q     routedQueries
	dests []*dest
	names []string // every destination's name, for the done mark
	// known are the destinations registered in the outbox when the relay
	// registered its own, whether it serves them or not (one left out of its
	// configuration counts as removed); one registered since makes it wait
	// (unservedSQL).
	known []string
	// registerBounds bound the registration's statements: a StartBackfill
	// destination's reopenSQL updates every retained event.
	registerBounds pgbound.Bounds

	unservedMu      sync.Mutex
	unserved        []string  // registered destinations the relay does not serve, as last checked
	unservedChecked time.Time // when; checked again after unservedCheckEvery while claims lease nothing
}

// unservedCheckEvery is how often a relay whose claims lease nothing looks
// for registered destinations it does not serve (unservedSQL), to say why.
const unservedCheckEvery = 10 * time.Second

// dest is one destination's stream.
type dest struct {
	Destination
	ro   *routed
	log  *slog.Logger
	pipe pipeline.Config
	// broker is what the destination's last batch said about its broker.
	broker retry.BrokerHealth
	stream *stream

	claimMu sync.Mutex
	cur     pgoutbox.Lane // the next claim scans the lanes before it (none: from the last lane)

	mu     sync.Mutex
	leased map[pgoutbox.Lane]struct{} // lanes leased and not yet settled
}

// registerStatementTimeout bounds each registration statement: reopening the
// retained events for a backfill may take a while on a large outbox.
const registerStatementTimeout = 5 * time.Minute

func newRouted(r *Relay) *routed {
	c := &r.cfg
	ro := &routed{r: r, q: newRoutedQueries(c.Schema),
		registerBounds: pgbound.New(max(c.StatementTimeout, registerStatementTimeout), c.LockTimeout)}
	for _, d := range c.Destinations {
		log := r.log.With(slog.String("destination", d.Name))
		d.Rules = cloneRules(d.Rules) // the caller's slices may change after New
		ds := &dest{Destination: d, ro: ro, log: log, leased: map[pgoutbox.Lane]struct{}{}}
		ds.pipe = r.pipe
		ds.pipe.Broker, ds.pipe.Log = d.Publisher, log
		ds.stream = &stream{wake: make(chan struct{}, c.Workers), next: ds.next}
		ro.dests = append(ro.dests, ds)
		ro.names = append(ro.names, d.Name)
		r.streams = append(r.streams, ds.stream)
	}
	return ro
}

// cloneRules copies rules deeply.
func cloneRules(rules []Rule) []Rule {
	out := make([]Rule, len(rules))
	for i, r := range rules {
		out[i] = Rule{All: r.All, AggregateTypes: slices.Clone(r.AggregateTypes), EventTypes: slices.Clone(r.EventTypes),
			Headers: maps.Clone(r.Headers)}
	}
	return out
}

// register records every destination at start, one transaction each: a new
// one is inserted, and its progress seeded when it starts now (or the done
// events reopened when it backfills); a known one keeps its progress, and a
// change of its rules is recorded, audited and logged.
func (ro *routed) register(ctx context.Context) error {
	for _, d := range ro.dests {
		if err := ro.registerOne(ctx, d); err != nil {
			return fmt.Errorf("relay: register destination %q: %w", d.Name, err)
		}
	}
	rows, err := ro.r.pool.Query(ctx, ro.q.registered)
	if err != nil {
		return fmt.Errorf("relay: read the registered destinations: %w", err)
	}
	known, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return fmt.Errorf("relay: read the registered destinations: %w", err)
	}
	var removed []string
	for _, n := range known {
		if !slices.Contains(ro.names, n) {
			removed = append(removed, n)
		}
	}
	if len(removed) > 0 {
		ro.r.log.Warn("destinations registered in the outbox but not configured for this relay count as removed: events are done without them; their progress is kept until pgoutbox destinations drop",
			slog.Any("removed", quoteAll(removed)))
	}
	ro.known = known
	return nil
}

func (ro *routed) registerOne(ctx context.Context, d *dest) error {
	rules, err := json.Marshal(d.Rules)
	if err != nil {
		return err
	}
	r := ro.r
	return pgbound.BeginFunc(ctx, r.pool, ro.registerBounds, func(tx pgx.Tx) error {
		rows, err := tx.Query(ctx, ro.q.register, d.Name, string(rules), string(d.Start))
		if err != nil {
			return err
		}
		created := rows.Next()
		rows.Close()
		if err := rows.Err(); err != nil {
			return err
		}
		if created {
			if _, err := tx.Exec(ctx, ro.q.lockLanes); err != nil {
				return err
			}
			switch d.Start {
			case StartNow:
				_, err = tx.Exec(ctx, ro.q.seedNow, d.Name)
			case StartBackfill:
				_, err = tx.Exec(ctx, ro.q.reopen)
			}
			if err == nil {
				d.log.Info("destination registered", slog.String("start", string(d.Start)))
			}
			return err
		}
		var old []byte
		var changed bool
		if err := tx.QueryRow(ctx, ro.q.rules, d.Name, string(rules)).Scan(&old, &changed); err != nil {
			return err
		}
		if !changed {
			return nil
		}
		sel, err := json.Marshal(map[string]any{"destination": d.Name, "old_rules": json.RawMessage(old), "new_rules": json.RawMessage(rules)})
		if err != nil {
			return err
		}
		reason := fmt.Sprintf("relay %s registered destination %s with rules different from those recorded", truncate(r.cfg.ID, 200), d.Name)
		if _, err := tx.Exec(ctx, ro.q.audit, r.cfg.ID, reason, string(sel)); err != nil {
			return err
		}
		d.log.Info("destination's rules changed", slog.String("old_rules", truncate(string(old), 2000)),
			slog.String("new_rules", truncate(string(rules), 2000)))
		return nil
	})
}

// checkUnserved looks, at most every unservedCheckEvery, for registered
// destinations the relay does not serve, which make its claims lease nothing
// (unservedSQL), and says so in the log and in Healthy.
func (ro *routed) checkUnserved(ctx context.Context) {
	ro.unservedMu.Lock()
	defer ro.unservedMu.Unlock()
	if time.Since(ro.unservedChecked) < unservedCheckEvery {
		return
	}
	rows, err := ro.r.pool.Query(ctx, ro.q.unserved, ro.known)
	if err != nil {
		return // the next claim's error says what is wrong with the database
	}
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return
	}
	ro.unservedChecked = time.Now()
	if len(names) > 0 && !slices.Equal(names, ro.unserved) {
		ro.r.log.Warn("destinations registered in the outbox since this relay started are not served by it: it delivers nothing until it is restarted with them in its destinations file, or they are dropped (pgoutbox destinations drop)",
			slog.Any("unserved", quoteAll(names)), slog.Any("served", quoteAll(ro.names)))
	}
	ro.unserved = names
}

// servedAll forgets the unserved destinations last seen, once a claim leased
// lanes again.
func (ro *routed) servedAll() {
	ro.unservedMu.Lock()
	ro.unserved = nil
	ro.unservedMu.Unlock()
}

// quoteAll quotes names (each cut to 80 bytes) for a log line.
func quoteAll(names []string) []string {
	out := make([]string, len(names))
	for i, n := range names {
		out[i] = fmt.Sprintf("%q", truncate(n, 80))
	}
	return out
}

// brokerErrors are the destinations' broker states, for Healthy, each naming
// its destination, and the registered destinations the relay does not serve.
func (ro *routed) brokerErrors() []error {
	var errs []error
	ro.unservedMu.Lock()
	if len(ro.unserved) > 0 {
		errs = append(errs, fmt.Errorf("%w: %s", ErrUnservedDestination, strings.Join(quoteAll(ro.unserved), ", ")))
	}
	ro.unservedMu.Unlock()
	for _, d := range ro.dests {
		for _, err := range d.broker.Errors(ErrBrokerUnreachable, ErrBrokerMisconfigured) {
			errs = append(errs, fmt.Errorf("destination %q: %w", d.Name, err))
		}
	}
	return errs
}

// routedEvent is one event of a leased run, and what the destination does
// with it.
type routedEvent struct {
	pipeline.Event
	// send: the destination's rules take it and it can become a message.
	send bool
	// dead is why no destination takes it ("" when some does): it is
	// quarantined in outbox_events and passed over.
	dead string
}

// run is one lane leased for a destination, with its events past the cursor.
type run struct {
	lane      pgoutbox.Lane
	delivered int64 // the cursor when leased
	attempts  int   // the lane's attempt_count for the destination
	events    []routedEvent
}

// next is the destination's stream: claim, then process.
func (d *dest) next() (int, bool, func() time.Duration, error) {
	runs, full, err := d.claim()
	if err != nil {
		return 0, false, nil, err
	}
	return len(runs), full, func() time.Duration { return d.process(runs) }, nil
}

// lanesPerClaim is the most lanes one claim leases: about BatchSize events
// when the runs are full.
func (ro *routed) lanesPerClaim() int {
	c := &ro.r.cfg
	return max(1, (c.BatchSize+c.RunLength-1)/c.RunLength)
}

// claim leases the destination's next lanes, continuing its lane scan from
// its cursor as Relay.claim does, but downwards (routedClaimSQL): the next
// claim scans the lanes before the lowest one leased. full reports a claim
// that leased as many lanes as it may.
func (d *dest) claim() ([]run, bool, error) {
	r := d.ro.r
	d.claimMu.Lock()
	defer d.claimMu.Unlock()
	if r.lc.IsStopping() {
		return nil, false, errStopping
	}
	ctx, cancel := context.WithTimeout(r.lc.Hard(), r.cfg.Lease/2)
	defer cancel()
	limit := d.ro.lanesPerClaim()
	start := time.Now()
	runs, takenOver, err := d.claimFrom(ctx, d.cur, limit)
	if err != nil {
		return nil, false, err
	}
	if len(runs) == 0 && d.cur != (pgoutbox.Lane{}) {
		if runs, takenOver, err = d.claimFrom(ctx, pgoutbox.Lane{}, limit); err != nil {
			return nil, false, err
		}
	}
	events := 0
	for i := range runs {
		events += len(runs[i].events)
	}
	if obs := r.cfg.Observer; obs != nil && len(runs) > 0 {
		obs.BatchClaimed(ClaimedBatch{Tenant: r.cfg.Tenant, Destination: d.Name, Events: events, TakenOver: takenOver, Duration: time.Since(start)})
	}
	if len(runs) == 0 {
		d.ro.checkUnserved(ctx)
	} else {
		d.ro.servedAll() // a claim leases only while the relay serves every registered destination
	}
	d.cur = pgoutbox.Lane{}
	if len(runs) < limit {
		return runs, false, nil
	}
	d.cur = runs[0].lane
	for i := range runs[1:] {
		if runs[i+1].lane.Compare(d.cur) < 0 {
			d.cur = runs[i+1].lane
		}
	}
	return runs, true, nil
}

func (d *dest) claimFrom(ctx context.Context, from pgoutbox.Lane, limit int) ([]run, int, error) {
	r := d.ro.r
	var runs []run
	takenOver := 0
	b := &pgx.Batch{}
	args := []any{r.cfg.ID, r.cfg.Lease.Milliseconds(), limit, r.cfg.RunLength, d.Name, d.ro.names}
	if from == (pgoutbox.Lane{}) {
		b.Queue(d.ro.q.claimTop, append(args, d.ro.known)...)
	} else {
		b.Queue(d.ro.q.claim, append(args, from.AggregateType, from.AggregateID, d.ro.known)...)
	}
	err := pgbound.Send(ctx, r.pool, r.bounds, b, func(br pgx.BatchResults) error {
		rows, err := br.Query()
		if err != nil {
			return err
		}
		defer rows.Close()
		if err := failpoint.Inject(failpoint.RelayClaim); err != nil {
			return err
		}
		for rows.Next() {
			var lane pgoutbox.Lane
			var delivered int64
			var attempts int
			var prev *string
			var id pgtype.UUID
			var seq, version *int64
			var eventType *string
			var payload, headers []byte
			var occurred *time.Time
			if err := rows.Scan(&lane.AggregateType, &lane.AggregateID, &delivered, &attempts, &prev,
				&id, &seq, &eventType, &version, &payload, &headers, &occurred); err != nil {
				return err
			}
			if len(runs) == 0 || runs[len(runs)-1].lane != lane {
				runs = append(runs, run{lane: lane, delivered: delivered, attempts: attempts})
				if prev != nil && *prev != r.cfg.ID {
					takenOver++
				}
			}
			if !id.Valid {
				continue // no event past the cursor: a retried dead letter to quarantine again
			}
			ru := &runs[len(runs)-1]
			if n := len(ru.events); n > 0 && *seq != ru.events[n-1].Msg.AggregateSequence+1 {
				continue // a gap (events deleted by cleanup after a skip): the run ends before it
			}
			var e routedEvent
			e.Msg.EventID = pgoutbox.UUID(id.Bytes)
			e.Msg.AggregateType, e.Msg.AggregateID, e.Msg.AggregateSequence = lane.AggregateType, lane.AggregateID, *seq
			e.Msg.EventType, e.Msg.SchemaVersion, e.Msg.Payload, e.Msg.OccurredAt = *eventType, int(*version), payload, *occurred
			e.Msg.Tenant, e.Msg.Schema = r.cfg.Tenant, r.cfg.Schema
			e.Msg.Headers, e.Refused = pipeline.DecodeHeaders("relay", e.Msg.EventID, headers)
			ru.events = append(ru.events, e)
		}
		return rows.Err()
	})
	if err != nil {
		return nil, 0, fmt.Errorf("claim lanes for destination %q: %w", d.Name, err)
	}
	for i := range runs {
		d.route(&runs[i])
	}
	if len(runs) > 0 {
		r.stats.claims.Add(1)
		r.stats.takenOver.Add(int64(takenOver))
		d.mu.Lock()
		for i := range runs {
			d.leased[runs[i].lane] = struct{}{}
			r.stats.claimed.Add(int64(len(runs[i].events)))
		}
		d.mu.Unlock()
	}
	return runs, takenOver, nil
}

// route decides, for each event of ru, whether the destination sends it,
// passes it over, or (no destination takes it) passes it as a dead letter.
// The first event the destination sends carries the lane's attempts.
func (d *dest) route(ru *run) {
	first := true
	for i := range ru.events {
		e := &ru.events[i]
		m := &e.Msg
		switch {
		case e.Refused != nil:
			e.dead = deadLetterPrefix + retry.ErrorText(e.Refused)
		case d.Match(m.AggregateType, m.EventType, m.Headers):
			e.send = true
			if first {
				e.Attempts, first = ru.attempts, false
			}
		case !d.ro.matchesAny(m):
			e.dead = deadLetterPrefix + "no rule of " + strings.Join(d.ro.names, ", ") + " matches it"
		}
	}
}

// matchesAny reports whether some destination of the relay takes m.
func (ro *routed) matchesAny(m *broker.Message) bool {
	for _, d := range ro.dests {
		if d.Match(m.AggregateType, m.EventType, m.Headers) {
			return true
		}
	}
	return false
}

// process publishes the events the destination sends and settles the runs.
func (d *dest) process(runs []run) time.Duration {
	r := d.ro.r
	var send []routedEvent
	for i := range runs {
		for _, e := range runs[i].events {
			if e.send {
				send = append(send, e)
			}
		}
	}
	var results []error
	var took time.Duration
	if len(send) > 0 {
		if err := failpoint.Inject(failpoint.RelayBeforePublish); err != nil {
			results = pipeline.Unavailable(len(send), err)
		} else {
			results, took = pipeline.Publish(r.lc.Hard(), &d.pipe, send)
		}
		_ = failpoint.Inject(failpoint.RelayAfterPublish)
	}
	j := pipeline.Judge(&d.pipe, send, results, r.lc.Hard().Err() != nil)
	start := time.Now()
	if !d.record(runs, &j) {
		return 0
	}
	settleDuration := time.Since(start)
	d.forget(runs)
	r.stats.Add(&j)
	if j.Events != nil {
		r.cfg.Observer.BatchSettled(SettledBatch{Tenant: r.cfg.Tenant, Destination: d.Name, Events: j.Events,
			PublishDuration: took, SettleDuration: settleDuration})
	}
	if j.RetryIn > 0 {
		select {
		case r.retry <- time.Now().Add(j.RetryIn):
		default:
		}
	}
	if len(send) > 0 {
		d.broker.Settled(d.log, j.Broker)
	}
	if j.BrokerDown() {
		return min(j.RetryIn, r.cfg.PollInterval)
	}
	return 0
}

// laneOutcome is what settle records for one lane.
type laneOutcome struct {
	advance    int64 // the cursor's new position (its old one when nothing moved)
	err        *string
	delayMs    int64
	quarantine bool
	failedSeq  int64
	attempt    int
}

// outcomes computes each run's outcome from the judged results: the cursor
// moves over the prefix that is acked or passed over; the first event sent
// and not acked stops it, with its failure if it failed.
func outcomes(runs []run, j *pipeline.Judged) ([]laneOutcome, []pgoutbox.UUID, []string) {
	acked := make(map[pgoutbox.UUID]bool, len(j.Acked))
	for _, id := range j.Acked {
		acked[id] = true
	}
	failed := make(map[pgoutbox.UUID]*pipeline.Failure, len(j.Failed))
	for i := range j.Failed {
		failed[j.Failed[i].ID] = &j.Failed[i]
	}
	out := make([]laneOutcome, len(runs))
	var deadIDs []pgoutbox.UUID
	var deadErrs []string
	for i := range runs {
		ru := &runs[i]
		o := laneOutcome{advance: ru.delivered}
		for _, e := range ru.events {
			if e.send && !acked[e.Msg.EventID] {
				if f := failed[e.Msg.EventID]; f != nil {
					text := f.Verdict.Text
					o.err, o.delayMs, o.quarantine = &text, f.Verdict.Delay.Milliseconds(), f.Verdict.Quarantine
					o.failedSeq, o.attempt = e.Msg.AggregateSequence, f.Verdict.Attempt
				}
				break // not attempted (released) or failed: the cursor stops before it
			}
			if e.dead != "" {
				deadIDs, deadErrs = append(deadIDs, e.Msg.EventID), append(deadErrs, e.dead)
			}
			o.advance = e.Msg.AggregateSequence
		}
		out[i] = o
	}
	return out, deadIDs, deadErrs
}

// record writes the outcome of runs in one transaction, retrying while the
// database fails and the relay runs (Relay.recordWith).
func (d *dest) record(runs []run, j *pipeline.Judged) bool {
	return d.ro.r.recordWith(func() *pgx.Batch { return d.settleStatements(runs, j) },
		fmt.Sprintf("settle lanes for destination %q", d.Name), d.log, slog.Int("lanes", len(runs)))
}

// retriedDeadLetter is the last_error of a dead letter an operator retried
// after every destination had passed it.
const retriedDeadLetter = deadLetterPrefix + "retried after every destination had passed it, so none will send it: " +
	"replay it to a destination (pgoutbox replay) or skip it (pgoutbox dlq skip)"

// settleStatements returns the dead-letter and settle statements of runs.
func (d *dest) settleStatements(runs []run, j *pipeline.Judged) *pgx.Batch {
	r := d.ro.r
	out, deadIDs, deadErrs := outcomes(runs, j)
	b := &pgx.Batch{}
	if len(deadIDs) > 0 {
		b.Queue(d.ro.q.deadLetter, uuids(deadIDs), deadErrs, d.ro.known)
	}
	n := len(runs)
	types, ids := make([]string, n), make([]string, n)
	advance, delays, failedSeq := make([]int64, n), make([]int64, n), make([]int64, n)
	errs := make([]*string, n)
	quarantine := make([]bool, n)
	attempts := make([]int32, n)
	for i := range runs {
		types[i], ids[i] = runs[i].lane.AggregateType, runs[i].lane.AggregateID
		o := out[i]
		advance[i], errs[i], delays[i], quarantine[i], failedSeq[i], attempts[i] = o.advance, o.err, o.delayMs, o.quarantine, o.failedSeq, int32(o.attempt)
	}
	b.Queue(d.ro.q.settle, d.Name, r.cfg.ID, d.ro.names, types, ids, advance, errs, delays, quarantine, failedSeq, attempts, retriedDeadLetter, d.ro.known)
	return b
}

// forget drops settled runs' lanes from those still leased.
func (d *dest) forget(runs []run) {
	d.mu.Lock()
	for i := range runs {
		delete(d.leased, runs[i].lane)
	}
	d.mu.Unlock()
}

// releaseOutstanding tries once, when the relay has stopped, to give back the
// leases whose settling failed; past stopReleaseTimeout they expire.
func (ro *routed) releaseOutstanding() {
	r := ro.r
	ctx, cancel := context.WithTimeout(context.Background(), stopReleaseTimeout)
	defer cancel()
	for _, d := range ro.dests {
		d.mu.Lock()
		var types, ids []string
		for l := range d.leased {
			types, ids = append(types, l.AggregateType), append(ids, l.AggregateID)
		}
		d.mu.Unlock()
		if len(types) == 0 {
			continue
		}
		b := &pgx.Batch{}
		b.Queue(ro.q.release, d.Name, r.cfg.ID, types, ids)
		if err := pgbound.Send(ctx, r.pool, r.bounds, b, nil); err != nil {
			d.log.Warn("could not release leases; they expire on their own", slog.Int("lanes", len(types)), slog.Any("error", err))
			continue
		}
		d.mu.Lock()
		clear(d.leased)
		d.mu.Unlock()
	}
}
