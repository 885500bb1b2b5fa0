package pgoutbox

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel/propagation"

	"github.com/pgoutbox/pgoutbox/migrate"
)

// maxEventsPerStatement keeps one INSERT under PostgreSQL's 65535 bind parameters
// (9 per event); larger calls run several statements in the same transaction, which
// still get consecutive sequences because the first one took the aggregates' locks.
const maxEventsPerStatement = 1000

// DefaultSchema is the schema of the outbox tables when Config.Schema is empty,
// the same as migrate's.
const DefaultSchema = migrate.DefaultSchema

// Config configures a Producer. A nil *Config means all defaults.
type Config struct {
	// Schema is the PostgreSQL schema holding the outbox tables (see package
	// migrate). Empty means DefaultSchema ("public").
	Schema string

	// MaxPayloadBytes is the largest payload accepted, in bytes of the text jsonb
	// stores (what the relay publishes; see JSONBTextLength). Larger payloads fail
	// with ErrPayloadTooLarge before any SQL runs. Zero means
	// DefaultMaxPayloadBytes (1 MiB - 32 KiB); a negative value means
	// HardMaxPayloadBytes, and a larger value is an error. Keep it in step with the database setting
	// pgoutbox.max_payload_bytes, which bounds the SQL function outbox_enqueue.
	MaxPayloadBytes int

	// Propagator writes the trace context of the ctx passed to Enqueue into each
	// event's headers, so the relay and consumers can link their spans to the
	// producer's trace. Nil means W3C Trace Context (traceparent, tracestate).
	// It writes nothing when ctx carries no valid span.
	Propagator propagation.TextMapPropagator
}

// Producer writes events to the outbox inside its caller's transactions. It holds no
// connection and is safe for concurrent use.
type Producer struct {
	schema     string
	maxPayload int
	propagator propagation.TextMapPropagator
	stmt1      string // the INSERT for one event, the common case
}

// Validate reports every invalid field of c, each error naming its field; zero
// fields stand for their defaults, and a nil c (all defaults) is valid.
func (c *Config) Validate() error {
	if c == nil {
		return nil
	}
	var errs []error
	if c.Schema != "" {
		if err := migrate.ValidateSchema(c.Schema); err != nil {
			errs = append(errs, fmt.Errorf("pgoutbox: Config.Schema: %w", err))
		}
	}
	if c.MaxPayloadBytes > HardMaxPayloadBytes {
		errs = append(errs, fmt.Errorf("pgoutbox: Config.MaxPayloadBytes (%d) is above the hard maximum of %d (HardMaxPayloadBytes)", c.MaxPayloadBytes, HardMaxPayloadBytes))
	}
	return errors.Join(errs...)
}

// NewProducer returns a Producer for cfg (nil means all defaults).
func NewProducer(cfg *Config) (*Producer, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	var c Config
	if cfg != nil {
		c = *cfg
	}
	if c.Schema == "" {
		c.Schema = DefaultSchema
	}
	switch {
	case c.MaxPayloadBytes == 0:
		c.MaxPayloadBytes = DefaultMaxPayloadBytes
	case c.MaxPayloadBytes < 0:
		c.MaxPayloadBytes = HardMaxPayloadBytes
	}
	if c.Propagator == nil {
		c.Propagator = propagation.TraceContext{}
	}
	p := &Producer{schema: c.Schema, maxPayload: c.MaxPayloadBytes, propagator: c.Propagator}
	p.stmt1 = p.insertOneSQL()
	return p, nil
}

var defaultProducer, _ = NewProducer(nil)

// Enqueued is where an event landed.
type Enqueued struct {
	// EventID is the event's id, published as Outbox-Event-Id.
	EventID UUID
	// AggregateSequence is the event's position in its aggregate's lane, from 1.
	AggregateSequence int64
}

// PgxQuerier is satisfied by pgx.Tx, *pgx.Conn, *pgxpool.Pool and *pgxpool.Conn.
type PgxQuerier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// SQLQuerier is satisfied by *sql.Tx, *sql.Conn and *sql.DB.
type SQLQuerier interface {
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
}

// EnqueueTx writes events to the outbox of the public schema with default settings;
// see Producer.EnqueueTx.
func EnqueueTx(ctx context.Context, tx PgxQuerier, events ...Event) ([]Enqueued, error) {
	return defaultProducer.EnqueueTx(ctx, tx, events...)
}

// EnqueueSQLTx writes events to the outbox of the public schema with default settings;
// see Producer.EnqueueSQLTx.
func EnqueueSQLTx(ctx context.Context, tx *sql.Tx, events ...Event) ([]Enqueued, error) {
	return defaultProducer.EnqueueSQLTx(ctx, tx, events...)
}

// EnqueueTx writes events to the outbox through tx, normally the transaction that
// also writes the business rows: the events become visible to the relay when, and
// only if, that transaction commits. It returns where each event landed, in the order
// given.
//
// Events of one aggregate get consecutive sequence numbers in call order, continuing
// after those of earlier calls in the same transaction. Allocating them locks the
// aggregate's counter row until the transaction ends, so concurrent transactions that
// enqueue for the same aggregate wait for each other: keep such transactions short,
// and touch several aggregates in a consistent order to avoid deadlocks (within one
// call the order is already consistent).
//
// Invalid events are reported as a *ValidationError before any SQL is sent, so tx is
// still usable. Passing a pool instead of a transaction enqueues the events in a
// transaction of their own. ctx bounds the statement and supplies the trace context.
func (p *Producer) EnqueueTx(ctx context.Context, tx PgxQuerier, events ...Event) ([]Enqueued, error) {
	return p.enqueue(ctx, events, func(ctx context.Context, q string, args []any) (scanner, error) {
		rows, err := tx.Query(ctx, q, args...)
		if err != nil {
			return nil, err
		}
		return pgxRows{rows}, nil
	})
}

// EnqueueSQLTx is EnqueueTx for database/sql. Any PostgreSQL driver works (pgx's
// stdlib, lib/pq); arguments are plain strings, integers and times.
func (p *Producer) EnqueueSQLTx(ctx context.Context, tx SQLQuerier, events ...Event) ([]Enqueued, error) {
	return p.enqueue(ctx, events, func(ctx context.Context, q string, args []any) (scanner, error) {
		return tx.QueryContext(ctx, q, args...)
	})
}

// QueueTx adds to b the statement that enqueues events (one per 1,000 events), so
// that it travels with the caller's own statements in one round trip instead of
// one of its own. Send b in the transaction that writes the business rows
// (tx.SendBatch), or send it outside any transaction (pool.SendBatch): a batch
// sent outside a transaction runs as one implicit transaction, so its business
// statements and its events commit together or not at all. The statements run
// in the order they were queued.
//
// Sequence numbers and locking are those of EnqueueTx. Invalid events are
// reported as a *ValidationError and nothing is queued. ctx supplies the trace
// context saved with the events.
//
// Where the events landed is known once the batch's results have been read:
// call the BatchResults' Close (which also returns the first statement error),
// then Queued.Result. As with EnqueueTx, the events exist only if the transaction
// that ran the batch commits: a statement that fails after them rolls them back.
func (p *Producer) QueueTx(ctx context.Context, b *pgx.Batch, events ...Event) (*Queued, error) {
	rows, err := p.encodeAll(ctx, events)
	if err != nil {
		return nil, err
	}
	q := &Queued{chunks: (len(rows) + maxEventsPerStatement - 1) / maxEventsPerStatement,
		out: make([]Enqueued, len(rows))}
	for start := 0; start < len(rows); start += maxEventsPerStatement {
		chunk := rows[start:min(start+maxEventsPerStatement, len(rows))]
		sql, args := p.insertStatement(chunk)
		b.Queue(sql, args...).Query(func(rs pgx.Rows) error {
			got, err := readEnqueued(pgxRows{rs}, chunk)
			if err != nil {
				q.err = err
				return err
			}
			copy(q.out[start:], got)
			q.read++
			return nil
		})
	}
	return q, nil
}

// Queued is the outcome of a QueueTx, known once the batch's results have been
// read.
type Queued struct {
	out          []Enqueued
	chunks, read int
	err          error
}

// Result returns where each event landed, in the order given to QueueTx. It is an
// error to ask before the batch's results have been read, or after the statement
// failed.
func (q *Queued) Result() ([]Enqueued, error) {
	switch {
	case q.err != nil:
		return nil, q.err
	case q.read < q.chunks:
		return nil, errors.New("pgoutbox: queued events: the batch's results have not been read (close the BatchResults first)")
	}
	return q.out, nil
}

// scanner is the part of pgx.Rows and *sql.Rows that enqueue reads.
type scanner interface {
	Next() bool
	Scan(dest ...any) error
	Err() error
	Close() error
}

type pgxRows struct{ pgx.Rows }

func (r pgxRows) Close() error { r.Rows.Close(); return nil }

type queryFunc func(ctx context.Context, sql string, args []any) (scanner, error)

// Validate checks events as EnqueueTx would, without touching a database, and
// returns the first problem as a *ValidationError.
func (p *Producer) Validate(events ...Event) error {
	_, err := p.encodeAll(context.Background(), events)
	return err
}

func (p *Producer) encodeAll(ctx context.Context, events []Event) ([]row, error) {
	trace := propagation.MapCarrier{}
	p.propagator.Inject(ctx, trace)
	rows := make([]row, len(events))
	for i := range events {
		r, err := encode(i, &events[i], p.maxPayload, trace)
		if err != nil {
			return nil, err
		}
		rows[i] = r
	}
	if err := checkUniqueIDs(rows); err != nil {
		return nil, err
	}
	return rows, nil
}

func (p *Producer) enqueue(ctx context.Context, events []Event, query queryFunc) ([]Enqueued, error) {
	if len(events) == 0 {
		return nil, nil
	}
	rows, err := p.encodeAll(ctx, events)
	if err != nil {
		return nil, err
	}

	out := make([]Enqueued, 0, len(rows))
	for start := 0; start < len(rows); start += maxEventsPerStatement {
		chunk := rows[start:min(start+maxEventsPerStatement, len(rows))]
		got, err := p.insert(ctx, chunk, query)
		if err != nil {
			return nil, err
		}
		out = append(out, got...)
	}
	return out, nil
}

func checkUniqueIDs(rows []row) error {
	if len(rows) < 2 {
		return nil
	}
	seen := make(map[UUID]int, len(rows))
	for i, r := range rows {
		if j, dup := seen[r.id]; dup {
			return &ValidationError{Index: i, Field: "ID", Reason: fmt.Sprintf("%s repeats the id of event #%d", r.id, j)}
		}
		seen[r.id] = i
	}
	return nil
}

func (p *Producer) insert(ctx context.Context, chunk []row, query queryFunc) ([]Enqueued, error) {
	q, args := p.insertStatement(chunk)
	rs, err := query(ctx, q, args)
	if err != nil {
		return nil, fmt.Errorf("pgoutbox: enqueue: %w", err)
	}
	return readEnqueued(rs, chunk)
}

// insertStatement returns the statement that enqueues chunk, and its arguments.
func (p *Producer) insertStatement(chunk []row) (string, []any) {
	q := p.stmt1
	if len(chunk) > 1 {
		q = p.insertSQL(len(chunk))
	}
	args := make([]any, 0, 9*len(chunk))
	for i, r := range chunk {
		var occurred any
		if r.occurredAt != nil {
			occurred = *r.occurredAt
		}
		args = append(args, i, r.id.String(), r.aggregateType, r.aggregateID, r.eventType,
			r.schemaVersion, r.payload, r.headers, occurred)
	}
	return q, args
}

// readEnqueued reads the result of insertStatement(chunk) and closes rs.
func readEnqueued(rs scanner, chunk []row) ([]Enqueued, error) {
	defer rs.Close()
	out := make([]Enqueued, len(chunk))
	n := 0
	for rs.Next() {
		var ord int
		var seq int64
		if err := rs.Scan(&ord, &seq); err != nil {
			return nil, fmt.Errorf("pgoutbox: enqueue: read result: %w", err)
		}
		if ord < 0 || ord >= len(chunk) {
			return nil, fmt.Errorf("pgoutbox: enqueue: result for unknown event #%d", ord)
		}
		out[ord] = Enqueued{EventID: chunk[ord].id, AggregateSequence: seq}
		n++
	}
	if err := rs.Err(); err != nil {
		return nil, fmt.Errorf("pgoutbox: enqueue: %w", err)
	}
	if n != len(chunk) {
		return nil, errors.New("pgoutbox: enqueue: the database returned fewer rows than events sent")
	}
	return out, nil
}

// insertOneSQL builds the statement for the common case of one event: the same
// parameters and result as insertSQL(1), without the grouping and numbering that
// only several events need. The counter upsert's row lock serialises writers of
// the aggregate, as in insertSQL. Both call outbox_wake (outbox migration 4), which
// notifies the relays only when one of them waits for work.
func (p *Producer) insertOneSQL() string {
	return fmt.Sprintf(`WITH counter AS (
    INSERT INTO %[1]s AS c (aggregate_type, aggregate_id, last_sequence) VALUES ($3::text, $4::text, 1)
    ON CONFLICT (aggregate_type, aggregate_id) DO UPDATE SET last_sequence = c.last_sequence + 1
    RETURNING c.last_sequence
),
ins AS (
    INSERT INTO %[2]s (event_id, aggregate_type, aggregate_id, aggregate_sequence, event_type, schema_version, payload, headers, occurred_at)
    SELECT $2::uuid, $3::text, $4::text, counter.last_sequence, $5::text, $6::int, $7::jsonb, $8::jsonb, coalesce($9::timestamptz, now())
    FROM counter
    RETURNING aggregate_sequence
),
wake AS MATERIALIZED (
    SELECT %[3]s() AS notified
)
SELECT $1::int, aggregate_sequence FROM ins, wake`,
		pgx.Identifier{p.schema, "outbox_aggregate_sequences"}.Sanitize(), pgx.Identifier{p.schema, "outbox_events"}.Sanitize(),
		pgx.Identifier{p.schema, "outbox_wake"}.Sanitize())
}

// insertSQL builds the statement that enqueues n events in one round trip.
//
// The counters CTE upserts one row per aggregate, adding the number of its events in
// this statement; the upsert's row lock is what serialises writers of the aggregate
// (held to the end of the caller's transaction). Aggregates are locked in sorted order
// so two multi-aggregate calls cannot deadlock each other. Each event's sequence is
// then the counter's new value minus the events after it in call order.
func (p *Producer) insertSQL(n int) string {
	var b strings.Builder
	events := pgx.Identifier{p.schema, "outbox_events"}.Sanitize()
	counters := pgx.Identifier{p.schema, "outbox_aggregate_sequences"}.Sanitize()
	b.WriteString("WITH ev (ord, event_id, aggregate_type, aggregate_id, event_type, schema_version, payload, headers, occurred_at) AS (VALUES ")
	for i := range n {
		if i > 0 {
			b.WriteString(", ")
		}
		a := 9*i + 1
		fmt.Fprintf(&b, "($%d::int, $%d::uuid, $%d::text, $%d::text, $%d::text, $%d::int, $%d::jsonb, $%d::jsonb, $%d::timestamptz)",
			a, a+1, a+2, a+3, a+4, a+5, a+6, a+7, a+8)
	}
	fmt.Fprintf(&b, `),
n AS (
    SELECT aggregate_type, aggregate_id, count(*) AS n FROM ev GROUP BY aggregate_type, aggregate_id
),
counters AS (
    INSERT INTO %[1]s AS c (aggregate_type, aggregate_id, last_sequence)
    SELECT aggregate_type, aggregate_id, n FROM n ORDER BY aggregate_type, aggregate_id
    ON CONFLICT (aggregate_type, aggregate_id) DO UPDATE SET last_sequence = c.last_sequence + excluded.last_sequence
    RETURNING c.aggregate_type, c.aggregate_id, c.last_sequence
),
seq AS (
    SELECT ev.*, counters.last_sequence - n.n
        + row_number() OVER (PARTITION BY ev.aggregate_type, ev.aggregate_id ORDER BY ev.ord) AS aggregate_sequence
    FROM ev JOIN n USING (aggregate_type, aggregate_id) JOIN counters USING (aggregate_type, aggregate_id)
),
ins AS (
    INSERT INTO %[2]s (event_id, aggregate_type, aggregate_id, aggregate_sequence, event_type, schema_version, payload, headers, occurred_at)
    SELECT event_id, aggregate_type, aggregate_id, aggregate_sequence, event_type, schema_version, payload, headers, coalesce(occurred_at, now())
    FROM seq
),
wake AS MATERIALIZED (
    SELECT %[3]s() AS notified
)
SELECT ord, aggregate_sequence FROM seq, wake`, counters, events, pgx.Identifier{p.schema, "outbox_wake"}.Sanitize())
	return b.String()
}
