package inbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/pgoutbox/pgoutbox/internal/retry"
)

// Handler applies one event's business effect through tx, the consumer transaction
// that also holds the event's processed_events row and the aggregate's position. It
// must not commit or roll back tx. Returning an error rolls everything back: the
// event is not marked processed and the broker redelivers it later. ctx carries the
// event ([EventFromContext]) and ends when the delivery is abandoned.
//
// Work outside tx (an HTTP call, an e-mail) is not covered by the transaction: see
// [IdempotencyKey].
type Handler[TX any] func(ctx context.Context, tx TX, ev Event) error

// Processor is the broker-neutral side of a consumer that subscribers drive: a
// subscriber for any broker turns a message into a [Delivery], calls Process, and
// acts on [Outcome.Action] — ack, nack after Outcome.RetryAfter, or terminate.
// *Consumer implements it.
type Processor interface {
	// Name is the consumer's name (Config.Name); subscribers use it as the
	// default name of their durable subscription.
	Name() string

	// Process applies d exactly once and reports what happened. It returns only
	// after the consumer transaction committed or rolled back, so a subscriber that
	// acks after Process returns acks only committed work.
	Process(ctx context.Context, d Delivery) Outcome
}

// Status is what processing a delivery did.
type Status uint8

const (
	// StatusApplied: the handler ran and the transaction committed. Ack.
	StatusApplied Status = iota + 1
	// StatusDuplicate: the event was applied before (or an operator moved the
	// position past it), so nothing was done. Ack.
	StatusDuplicate
	// StatusGapRejected: under GapReject, an earlier event of the aggregate is not
	// applied yet; nothing was written. Nack, redeliver after RetryAfter.
	StatusGapRejected
	// StatusFailed: the handler, the upcaster or the database failed and the
	// transaction rolled back; nothing was written. Nack, redeliver after RetryAfter.
	StatusFailed
	// StatusUndecodable: the message is not an outbox event (Outbox-* headers
	// missing or malformed, body not JSON) and never will be. Terminate.
	StatusUndecodable
)

// String returns the status as the outcome table of the package doc names it.
func (s Status) String() string {
	switch s {
	case StatusApplied:
		return "applied"
	case StatusDuplicate:
		return "duplicate"
	case StatusGapRejected:
		return "gap-rejected"
	case StatusFailed:
		return "failed"
	case StatusUndecodable:
		return "undecodable"
	}
	return fmt.Sprintf("Status(%d)", uint8(s))
}

// Action is what a subscriber tells the broker after Process.
type Action uint8

const (
	// ActionAck acknowledges the message: it is done.
	ActionAck Action = iota + 1
	// ActionNak asks for redelivery after Outcome.RetryAfter.
	ActionNak
	// ActionTerm tells the broker never to redeliver the message.
	ActionTerm
)

// String returns "ack", "nak" or "term".
func (a Action) String() string {
	switch a {
	case ActionAck:
		return "ack"
	case ActionNak:
		return "nak"
	case ActionTerm:
		return "term"
	}
	return fmt.Sprintf("Action(%d)", uint8(a))
}

// Outcome reports what Process did with one delivery.
type Outcome struct {
	// Consumer is the consumer's name.
	Consumer string

	// Status is what happened.
	Status Status

	// Event is the decoded, upcast event; zero for StatusUndecodable.
	Event Event

	// Err says why, for StatusGapRejected (a *GapError), StatusFailed and
	// StatusUndecodable; nil otherwise.
	Err error

	// Position is the consumer's last applied sequence of the event's aggregate
	// before this delivery, once the transaction read it (0: none yet).
	Position int64

	// Gap is the number of sequences missing between Position and the event:
	// for StatusGapRejected, and for StatusApplied under GapAccept. 0 otherwise.
	Gap int64

	// Late is set for StatusApplied under GapAccept when the event's sequence is
	// not above Position: an event missing earlier has arrived.
	Late bool

	// ByPosition is set for StatusDuplicate when this consumer never recorded
	// the event's id: only its sequence, at or below Position, makes it a
	// duplicate. Either an operator declared it done (SetPosition, after "pgoutbox
	// dlq skip"), or retention deleted its processed_events row, or — after an
	// asynchronous failover of the producers' database lost transactions the
	// relay had already published — the sequence was allocated again to another
	// event, whose effect is then not applied. It is logged at WARN and counted
	// (Stats.ByPosition) so that the last case is never silent; see
	// docs/operations.md, "PostgreSQL failover".
	ByPosition bool

	// RetryAfter is how long the broker should wait before redelivering, for
	// ActionNak.
	RetryAfter time.Duration

	// Duration is how long Process took.
	Duration time.Duration
}

// Action returns what the subscriber does with the message.
func (o Outcome) Action() Action {
	switch o.Status {
	case StatusApplied, StatusDuplicate:
		return ActionAck
	case StatusUndecodable:
		return ActionTerm
	}
	return ActionNak
}

// ErrGap is matched (errors.Is) by the *GapError of a StatusGapRejected outcome.
var ErrGap = errors.New("inbox: sequence gap")

// GapError is the error of a delivery rejected for a gap: sequences between Position
// and Sequence have not been applied.
type GapError struct {
	// AggregateType and AggregateID name the aggregate whose events are missing.
	AggregateType string
	AggregateID   string
	// Position is the last sequence the consumer applied for the aggregate.
	Position int64
	// Sequence is the delivered event's sequence.
	Sequence int64
}

// Error says which sequences are missing.
func (e *GapError) Error() string {
	return fmt.Sprintf("inbox: gap in %s/%s: sequence %d delivered, last applied %d (waiting for %d..%d)",
		e.AggregateType, e.AggregateID, e.Sequence, e.Position, e.Position+1, e.Sequence-1)
}

// Is matches ErrGap.
func (e *GapError) Is(target error) bool { return target == ErrGap }

// Observer is told every delivery's outcome, once Process is done. Observe is called
// from the goroutine that called Process and must not block.
type Observer interface {
	// Observe records one outcome.
	Observe(o Outcome)
}

// Stats are a consumer's counters since New.
type Stats struct {
	Applied     int64 // deliveries applied (StatusApplied)
	Duplicates  int64 // deliveries found already applied
	ByPosition  int64 // of Duplicates, those whose id was never recorded (Outcome.ByPosition)
	Gaps        int64 // gaps found: rejected deliveries, and applications over a gap under GapAccept
	Late        int64 // events applied under GapAccept after a later sequence
	Failed      int64 // deliveries rolled back for an error
	Undecodable int64 // deliveries that are not outbox events
}

type counters struct {
	applied, duplicates, byPosition, gaps, late, failed, undecodable atomic.Int64
}

// Consumer applies delivered events exactly once per consumer name: each in one
// transaction holding its processed_events row, the aggregate's position and the
// handler's effect. It is safe for concurrent use; run one per process and consumer
// name, and as many processes as you like.
type Consumer[TX any] struct {
	cfg   Config
	db    Driver[TX]
	h     Handler[TX]
	q     queries
	log   *slog.Logger
	trace *tracer // nil: tracing off
	stats counters
}

// New returns a consumer that applies events with h through db ([Pgx] or [SQL]).
// Invalid settings in cfg are reported here.
//
// The inbox tables must exist: migrate.Up with the inbox line, or "pgoutbox
// migrate --lines inbox".
func New[TX any](db Driver[TX], h Handler[TX], cfg *Config) (*Consumer[TX], error) {
	if db == nil || h == nil {
		return nil, errors.New("inbox: New needs a driver and a handler")
	}
	c, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	return &Consumer[TX]{
		cfg:   c,
		db:    db,
		h:     h,
		q:     newQueries(c.Schema),
		log:   c.Logger.With(slog.String("consumer", c.Name)),
		trace: newTracer(c.Tracing, c.Name),
	}, nil
}

// Name returns the consumer's name.
func (c *Consumer[TX]) Name() string { return c.cfg.Name }

// Stats returns the consumer's counters.
func (c *Consumer[TX]) Stats() Stats {
	s := &c.stats
	return Stats{
		Applied: s.applied.Load(), Duplicates: s.duplicates.Load(), ByPosition: s.byPosition.Load(), Gaps: s.gaps.Load(),
		Late: s.late.Load(), Failed: s.failed.Load(), Undecodable: s.undecodable.Load(),
	}
}

// Process decodes d, upcasts it, and applies it in one transaction:
//
//  1. lock the consumer's position row of the aggregate and read it;
//  2. INSERT INTO processed_events ... ON CONFLICT DO NOTHING RETURNING, unless the
//     gap policy refuses the event;
//  3. only when a row came back: run the handler with the transaction and advance
//     the position;
//  4. commit.
//
// The outcome says what happened and what to tell the broker; Process never
// panics for a panicking handler (the delivery fails). ctx bounds the whole
// transaction, handler included; the handler receives a context derived from it.
func (c *Consumer[TX]) Process(ctx context.Context, d Delivery) Outcome {
	start := time.Now()
	var span trace.Span
	if c.trace != nil {
		ctx, span = c.trace.start(ctx, &d)
	}
	o := c.process(ctx, d)
	o.Consumer = c.cfg.Name
	o.Duration = time.Since(start)
	switch o.Status {
	case StatusGapRejected:
		o.RetryAfter = gapDelay(c.cfg.GapRetryDelay, c.cfg.MaxGapRetryDelay, o.Gap)
	case StatusFailed:
		o.RetryAfter = retry.Exponential{Base: c.cfg.RetryDelay, Max: c.cfg.MaxRetryDelay}.Delay(d.Attempt)
	}
	c.record(&o)
	if span != nil {
		c.trace.end(span, &o)
	}
	if c.cfg.Observer != nil {
		c.cfg.Observer.Observe(o)
	}
	return o
}

func (c *Consumer[TX]) process(ctx context.Context, d Delivery) Outcome {
	ev, err := Decode(d)
	if err != nil {
		return Outcome{Status: StatusUndecodable, Err: err}
	}
	if c.cfg.Upcaster != nil {
		v, p, err := c.cfg.Upcaster(ev.EventType, ev.SchemaVersion, ev.Payload)
		if err != nil {
			return Outcome{Status: StatusFailed, Event: ev, Err: fmt.Errorf("inbox: event %s: %w", ev.EventID, err)}
		}
		ev.SchemaVersion, ev.Payload = v, p
	}
	for attempt := 0; ; attempt++ {
		o := c.transact(ctx, ev)
		if o.Status != StatusFailed || !retryable(o.Err) || attempt >= c.cfg.TxRetries || ctx.Err() != nil {
			return o
		}
		c.log.Debug("transaction aborted by PostgreSQL, running it again",
			slog.String("event_id", ev.EventID.String()), slog.Any("error", o.Err))
	}
}

// transact runs one consumer transaction for ev.
func (c *Consumer[TX]) transact(ctx context.Context, ev Event) (o Outcome) {
	o.Event = ev
	fail := func(format string, args ...any) Outcome {
		o.Status, o.Err = StatusFailed, fmt.Errorf(format, args...)
		return o
	}
	tx, err := c.db.begin(ctx)
	if err != nil {
		return fail("inbox: event %s: begin: %w", ev.EventID, err)
	}
	finished := false
	defer func() {
		if !finished {
			rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			defer cancel()
			_ = tx.rollback(rctx)
		}
	}()

	seq := ev.AggregateSequence
	args := []any{c.cfg.Name, ev.AggregateType, ev.AggregateID, ev.EventID.String(), seq, c.cfg.GapPolicy == GapAccept}
	var fresh, known bool
	if err := tx.queryRow(ctx, c.q.claim, args, &o.Position, &fresh, &known); err != nil {
		return fail("inbox: event %s: record in processed_events: %w", ev.EventID, err)
	}
	last := o.Position

	if !fresh {
		if c.cfg.GapPolicy == GapReject && seq-1 > last && !known {
			o.Status, o.Gap = StatusGapRejected, seq-last-1
			o.Err = &GapError{AggregateType: ev.AggregateType, AggregateID: ev.AggregateID, Position: last, Sequence: seq}
			return o
		}
		// Applied before: its processed_events row exists, or its sequence is not
		// above the position (applied, or skipped by an operator; this also covers
		// events whose processed_events row retention already deleted).
		if !known && seq <= last {
			// Applied meanwhile by a transaction claim waited for? Ask again.
			if err := tx.queryRow(ctx, c.q.known, []any{c.cfg.Name, ev.EventID.String()}, &known); err != nil {
				return fail("inbox: event %s: look up processed_events: %w", ev.EventID, err)
			}
		}
		o.Status, o.ByPosition = StatusDuplicate, !known
		if seq > last {
			// The row exists but the position lags: it was set back by hand. Catch up,
			// or the aggregate would wait for this event forever.
			if err := c.advance(ctx, tx, &ev, last); err != nil {
				return fail("%w", err)
			}
			finished = true
		}
		return o
	}

	switch {
	case seq-1 > last: // not last+1: a position at the largest bigint must not wrap
		o.Gap = seq - last - 1 // only under GapAccept: GapReject inserted nothing
	case seq <= last:
		o.Late = true
	}
	if err := c.handle(context.WithValue(ctx, eventKey{}, ev), tx.native(), ev); err != nil {
		o.Status, o.Err = StatusFailed, err
		return o
	}
	if err := c.advance(ctx, tx, &ev, last); err != nil {
		return fail("%w", err)
	}
	finished = true
	o.Status = StatusApplied
	return o
}

// advance moves the aggregate's position from last to ev's sequence, when that
// is above last, and commits tx. A commit error may hide a commit that
// happened (a lost connection): the redelivery finds out, through
// processed_events.
func (c *Consumer[TX]) advance(ctx context.Context, tx txn[TX], ev *Event, last int64) error {
	if ev.AggregateSequence > last {
		if _, err := tx.exec(ctx, c.q.advance, c.cfg.Name, ev.AggregateType, ev.AggregateID, ev.AggregateSequence); err != nil {
			return fmt.Errorf("inbox: event %s: advance position: %w", ev.EventID, err)
		}
	}
	if err := tx.commit(ctx); err != nil {
		return fmt.Errorf("inbox: event %s: commit: %w", ev.EventID, err)
	}
	return nil
}

// handle runs the handler, turning a panic into an error.
func (c *Consumer[TX]) handle(ctx context.Context, tx TX, ev Event) (err error) {
	defer func() {
		if p := recover(); p != nil {
			c.log.Error("handler panicked", slog.String("event_id", ev.EventID.String()),
				slog.Any("panic", p), slog.String("stack", string(debug.Stack())))
			err = fmt.Errorf("inbox: event %s: handler panicked: %v", ev.EventID, p)
		}
	}()
	if err := c.h(ctx, tx, ev); err != nil {
		return fmt.Errorf("inbox: event %s: handler: %w", ev.EventID, err)
	}
	return nil
}

// record counts and logs an outcome.
func (c *Consumer[TX]) record(o *Outcome) {
	s := &c.stats
	ev := &o.Event
	attrs := func(extra ...slog.Attr) []any {
		a := []any{slog.String("event_id", ev.EventID.String()), slog.String("event_type", ev.EventType),
			slog.String("aggregate_type", ev.AggregateType), slog.String("aggregate_id", ev.AggregateID),
			slog.Int64("sequence", ev.AggregateSequence), slog.Int64("position", o.Position)}
		for _, x := range extra {
			a = append(a, x)
		}
		return a
	}
	switch o.Status {
	case StatusApplied:
		s.applied.Add(1)
		if o.Gap > 0 {
			s.gaps.Add(1)
			c.log.Warn("applied over a sequence gap (GapAccept)", attrs(slog.Int64("missing", o.Gap))...)
		}
		if o.Late {
			s.late.Add(1)
			c.log.Info("applied a late event below the position (GapAccept)", attrs()...)
		}
	case StatusDuplicate:
		s.duplicates.Add(1)
		if o.ByPosition {
			s.byPosition.Add(1)
			c.log.Warn("not applied: this event's id was never applied, but its sequence is at or below the position "+
				"(declared done by an operator, its record deleted by retention, or its sequence allocated again after "+
				"an asynchronous failover of the producers' database)", attrs()...)
		}
	case StatusGapRejected:
		s.gaps.Add(1)
		c.log.Debug("rejected for a sequence gap; redelivery requested",
			attrs(slog.Int64("missing", o.Gap), slog.Duration("retry_after", o.RetryAfter))...)
	case StatusFailed:
		s.failed.Add(1)
		if errors.Is(o.Err, context.Canceled) {
			c.log.Debug("delivery abandoned", attrs(slog.Any("error", o.Err))...)
		} else {
			c.log.Warn("delivery failed and rolled back; redelivery requested",
				attrs(slog.Any("error", o.Err), slog.Duration("retry_after", o.RetryAfter))...)
		}
	case StatusUndecodable:
		s.undecodable.Add(1)
		c.log.Warn("delivery is not an outbox event", slog.Any("error", o.Err))
	}
}

// gapDelay is the redelivery delay of an event rejected for a gap of the given size:
// base × gap, capped at max, without jitter and whatever the attempt. The events
// waiting behind one missing event thus come back in sequence order — the nearest
// first, just after the missing one — and each finds its predecessor applied.
// Jitter, or growth with the attempt count, would shuffle them, and every shuffle
// costs another round of rejections and longer delays.
func gapDelay(base, max time.Duration, gap int64) time.Duration {
	if gap < 1 {
		gap = 1
	}
	if gap > int64(max/base) {
		return max
	}
	return base * time.Duration(gap)
}

// Position returns the last sequence of the aggregate that the consumer applied (or
// that SetPosition set); 0 when there is none. ctx bounds the query.
func (c *Consumer[TX]) Position(ctx context.Context, aggregateType, aggregateID string) (int64, error) {
	var seq int64
	err := c.db.queryRow(ctx, c.q.position, []any{c.cfg.Name, aggregateType, aggregateID}, &seq)
	if errors.Is(err, errNoRows) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("inbox: read position of %s/%s: %w", aggregateType, aggregateID, err)
	}
	return seq, nil
}

// SetPosition declares sequences up to seq of the aggregate done for this consumer,
// whether or not it applied them: the reconciliation after an event was skipped
// upstream ("pgoutbox dlq skip") or lost, which under GapReject would otherwise
// hold the aggregate's later events forever. Events at or below seq that arrive
// afterwards are duplicates, and seq+1 is applied next. It waits for a transaction
// applying an event of the aggregate to finish. ctx bounds the statement.
//
// Setting a position lower than the current one does not make events apply again:
// their processed_events rows still mark them done.
func (c *Consumer[TX]) SetPosition(ctx context.Context, aggregateType, aggregateID string, seq int64) error {
	if seq < 0 {
		return fmt.Errorf("inbox: SetPosition %s/%s: sequence %d is negative", aggregateType, aggregateID, seq)
	}
	if seq > MaxSequence {
		return fmt.Errorf("inbox: SetPosition %s/%s: %w: %d is above %d", aggregateType, aggregateID,
			ErrSequenceOutOfRange, seq, int64(MaxSequence))
	}
	if _, err := c.db.exec(ctx, c.q.setPosition, c.cfg.Name, aggregateType, aggregateID, seq); err != nil {
		return fmt.Errorf("inbox: set position of %s/%s: %w", aggregateType, aggregateID, err)
	}
	c.log.Info("position set", slog.String("aggregate_type", aggregateType), slog.String("aggregate_id", aggregateID),
		slog.Int64("sequence", seq))
	return nil
}

var _ Processor = (*Consumer[any])(nil)
