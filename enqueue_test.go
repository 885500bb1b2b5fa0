package pgoutbox_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"go.opentelemetry.io/otel/trace"
	"go.uber.org/goleak"

	"github.com/pgoutbox/pgoutbox"
	"github.com/pgoutbox/pgoutbox/internal/pgtest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// fixture is a migrated schema of its own with a producer bound to it.
type fixture struct {
	pool   *pgxpool.Pool
	schema string
	p      *pgoutbox.Producer
}

func newFixture(t testing.TB, maxConns int32) *fixture {
	t.Helper()
	pool, schema := pgtest.Migrated(t, maxConns)
	p, err := pgoutbox.NewProducer(&pgoutbox.Config{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	return &fixture{pool: pool, schema: schema, p: p}
}

// table returns the schema-qualified name of one of the schema's tables.
func (f *fixture) table(name string) string { return pgx.Identifier{f.schema, name}.Sanitize() }

func (f *fixture) count(t *testing.T) int {
	t.Helper()
	var n int
	if err := f.pool.QueryRow(context.Background(), "SELECT count(*) FROM "+f.table("outbox_events")).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func ev(aggID string, payload any) pgoutbox.Event {
	return pgoutbox.Event{AggregateType: "order", AggregateID: aggID, EventType: "order.created", Payload: payload}
}

// Guarantees 1 and 2: commit gives exactly one row per event; rollback, a returned
// error and a panic give none.
func TestEnqueueCommitRollbackErrorPanic(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 4)
	ctx := context.Background()

	var committed []pgoutbox.Enqueued
	err := pgx.BeginFunc(ctx, f.pool, func(tx pgx.Tx) error {
		var err error
		committed, err = f.p.EnqueueTx(ctx, tx, ev("1", map[string]int{"n": 1}), ev("2", nil), ev("1", "x"))
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if f.count(t) != 3 {
		t.Fatalf("after commit: %d rows, want 3", f.count(t))
	}
	for _, e := range committed {
		var n int
		pgtest.Must(t, f.pool.QueryRow(ctx, "SELECT count(*) FROM "+f.table("outbox_events")+" WHERE event_id = $1", e.EventID).Scan(&n), "count")
		if n != 1 {
			t.Errorf("event %s: %d rows, want 1", e.EventID, n)
		}
	}

	errBusiness := errors.New("business rule failed")
	err = pgx.BeginFunc(ctx, f.pool, func(tx pgx.Tx) error {
		if _, err := f.p.EnqueueTx(ctx, tx, ev("1", 1)); err != nil {
			return err
		}
		return errBusiness
	})
	if !errors.Is(err, errBusiness) {
		t.Fatalf("BeginFunc = %v, want the business error", err)
	}

	tx, err := f.pool.Begin(ctx)
	pgtest.Must(t, err, "begin")
	_, err = f.p.EnqueueTx(ctx, tx, ev("3", 1))
	pgtest.Must(t, err, "enqueue")
	pgtest.Must(t, tx.Rollback(ctx), "rollback")

	func() {
		defer func() {
			if r := recover(); r != "boom" {
				t.Fatalf("recovered %v, want the panic", r)
			}
		}()
		_ = pgx.BeginFunc(ctx, f.pool, func(tx pgx.Tx) error {
			if _, err := f.p.EnqueueTx(ctx, tx, ev("4", 1)); err != nil {
				return err
			}
			panic("boom")
		})
	}()

	if n := f.count(t); n != 3 {
		t.Fatalf("after rollback, error and panic: %d rows, want still 3", n)
	}
	// The rolled-back transactions left no gap in aggregate 1's lane.
	res, err := f.p.EnqueueTx(ctx, f.pool, ev("1", 2))
	pgtest.Must(t, err, "enqueue")
	if res[0].AggregateSequence != 3 {
		t.Fatalf("next sequence of aggregate 1 = %d, want 3", res[0].AggregateSequence)
	}
}

// The acceptance test of sequencing: 32 goroutines × 100 transactions over 8
// aggregates, mixing the pgx API, the database/sql API and the SQL function, with
// 20% rollbacks. Every aggregate's committed sequences must be exactly 1..N, each
// multi-event transaction's consecutive, and the table must hold exactly the
// committed events.
func TestConcurrentSequencesNoGapNoDuplicate(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 16)
	ctx := context.Background()
	sqldb := stdlib.OpenDBFromPool(f.pool)
	t.Cleanup(func() { sqldb.Close() })

	const goroutines, txPerGoroutine, aggregates = 32, 100, 8
	type txResult struct {
		events []pgoutbox.Enqueued
		aggs   []string // aggregate of each event
	}
	var (
		mu        sync.Mutex
		committed []txResult
		rolled    []pgoutbox.UUID
	)
	var wg sync.WaitGroup
	errs := make(chan error, goroutines)
	for g := range goroutines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(g), 42))
			for i := range txPerGoroutine {
				// One to three events, over one or two aggregates.
				n := 1 + rng.IntN(3)
				aggs := make([]string, n)
				for j := range aggs {
					aggs[j] = fmt.Sprintf("agg-%d", rng.IntN(aggregates))
				}
				path := (g + i) % 3
				if path == 2 {
					// One function call per event locks aggregates in call order; like any
					// caller touching several aggregates, lock them in a consistent order
					// (the Go API sorts them itself).
					slices.Sort(aggs)
				}
				rollback := rng.IntN(5) == 0
				res, err := runTx(ctx, f, sqldb, path, aggs, rollback)
				if err != nil {
					errs <- fmt.Errorf("goroutine %d tx %d: %w", g, i, err)
					return
				}
				mu.Lock()
				if rollback {
					for _, e := range res {
						rolled = append(rolled, e.EventID)
					}
				} else {
					committed = append(committed, txResult{res, aggs})
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}

	// What the database holds, per aggregate, ordered by sequence.
	rows, err := f.pool.Query(ctx, "SELECT event_id::text, aggregate_id, aggregate_sequence FROM "+f.table("outbox_events")+" ORDER BY aggregate_id, aggregate_sequence")
	pgtest.Must(t, err, "query")
	type stored struct {
		agg string
		seq int64
	}
	byID := map[string]stored{}
	perAgg := map[string][]int64{}
	for rows.Next() {
		var id, agg string
		var seq int64
		pgtest.Must(t, rows.Scan(&id, &agg, &seq), "scan")
		byID[id] = stored{agg, seq}
		perAgg[agg] = append(perAgg[agg], seq)
	}
	pgtest.Must(t, rows.Err(), "rows")

	for agg, seqs := range perAgg {
		for i, s := range seqs {
			if s != int64(i+1) {
				t.Fatalf("aggregate %s: sequences %v are not 1..%d", agg, seqs, len(seqs))
			}
		}
	}
	total := 0
	for _, tx := range committed {
		last := map[string]int64{}
		for i, e := range tx.events {
			s, ok := byID[e.EventID.String()]
			if !ok {
				t.Fatalf("committed event %s is missing", e.EventID)
			}
			if s.agg != tx.aggs[i] || s.seq != e.AggregateSequence {
				t.Fatalf("event %s stored as %s/%d, API said %s/%d", e.EventID, s.agg, s.seq, tx.aggs[i], e.AggregateSequence)
			}
			if prev, ok := last[s.agg]; ok && s.seq != prev+1 {
				t.Fatalf("transaction's events of %s got sequences %d then %d, want consecutive", s.agg, prev, s.seq)
			}
			last[s.agg] = s.seq
			total++
		}
	}
	for _, id := range rolled {
		if _, ok := byID[id.String()]; ok {
			t.Fatalf("rolled-back event %s is in the outbox", id)
		}
	}
	if len(byID) != total {
		t.Fatalf("outbox holds %d events, %d were committed", len(byID), total)
	}
	t.Logf("%d committed events, %d rolled back, over %d aggregates", total, len(rolled), len(perAgg))
}

// runTx runs one business transaction through one of three producer paths (0: pgx,
// 1: database/sql, 2: the SQL function) and rolls it back if asked. Events go in
// one call when the path allows, to cover multi-event statements.
func runTx(ctx context.Context, f *fixture, sqldb *sql.DB, path int, aggs []string, rollback bool) ([]pgoutbox.Enqueued, error) {
	events := make([]pgoutbox.Event, len(aggs))
	for i, a := range aggs {
		events[i] = ev(a, map[string]int{"i": i})
	}
	var out []pgoutbox.Enqueued
	switch path {
	case 0, 2:
		tx, err := f.pool.Begin(ctx)
		if err != nil {
			return nil, err
		}
		defer tx.Rollback(ctx)
		if path == 0 {
			if out, err = f.p.EnqueueTx(ctx, tx, events...); err != nil {
				return nil, err
			}
		} else {
			fn := pgx.Identifier{f.schema, "outbox_enqueue"}.Sanitize()
			for _, e := range events {
				var id pgoutbox.UUID
				var seq int64
				err := tx.QueryRow(ctx, "SELECT "+fn+"($1, $2, $3, $4::jsonb)", e.AggregateType, e.AggregateID, e.EventType, `{"via":"sql"}`).Scan(&id)
				if err != nil {
					return nil, err
				}
				err = tx.QueryRow(ctx, "SELECT aggregate_sequence FROM "+f.table("outbox_events")+" WHERE event_id = $1", id).Scan(&seq)
				if err != nil {
					return nil, err
				}
				out = append(out, pgoutbox.Enqueued{EventID: id, AggregateSequence: seq})
			}
		}
		if rollback {
			return out, tx.Rollback(ctx)
		}
		return out, tx.Commit(ctx)
	default:
		tx, err := sqldb.BeginTx(ctx, nil)
		if err != nil {
			return nil, err
		}
		defer tx.Rollback()
		if out, err = f.p.EnqueueSQLTx(ctx, tx, events...); err != nil {
			return nil, err
		}
		if rollback {
			return out, tx.Rollback()
		}
		return out, tx.Commit()
	}
}

func TestEnqueueSequencesContinueAcrossCallsAndChunks(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 2)
	ctx := context.Background()
	tx, err := f.pool.Begin(ctx)
	pgtest.Must(t, err, "begin")
	defer tx.Rollback(ctx)

	first, err := f.p.EnqueueTx(ctx, tx, ev("a", 1), ev("b", 1))
	pgtest.Must(t, err, "enqueue")
	// 2,500 events run as three statements; the lane must stay consecutive.
	many := make([]pgoutbox.Event, 2500)
	for i := range many {
		many[i] = ev([]string{"a", "b"}[i%2], i)
	}
	res, err := f.p.EnqueueTx(ctx, tx, many...)
	pgtest.Must(t, err, "enqueue many")
	if first[0].AggregateSequence != 1 || first[1].AggregateSequence != 1 {
		t.Fatalf("first call: %+v", first)
	}
	for i, r := range res {
		if want := int64(2 + i/2); r.AggregateSequence != want {
			t.Fatalf("event %d: sequence %d, want %d", i, r.AggregateSequence, want)
		}
	}
	pgtest.Must(t, tx.Commit(ctx), "commit")
	if n := f.count(t); n != 2502 {
		t.Fatalf("%d rows, want 2502", n)
	}
}

// Every validation error comes before any SQL: the caller's transaction is still
// usable afterwards, for pgx and for database/sql.
func TestValidationLeavesTransactionUsable(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 4)
	small, err := pgoutbox.NewProducer(&pgoutbox.Config{Schema: f.schema, MaxPayloadBytes: 16})
	pgtest.Must(t, err, "producer")
	sqldb := stdlib.OpenDBFromPool(f.pool)
	t.Cleanup(func() { sqldb.Close() })

	valid := ev("v", 1)
	cases := []struct {
		name     string
		p        *pgoutbox.Producer
		ev       pgoutbox.Event
		field    string
		tooLarge bool
	}{
		{"empty aggregate type", f.p, pgoutbox.Event{AggregateID: "1", EventType: "t"}, "AggregateType", false},
		{"empty aggregate id", f.p, pgoutbox.Event{AggregateType: "o", EventType: "t"}, "AggregateID", false},
		{"empty event type", f.p, pgoutbox.Event{AggregateType: "o", AggregateID: "1"}, "EventType", false},
		{"NUL in aggregate id", f.p, pgoutbox.Event{AggregateType: "o", AggregateID: "a\x00b", EventType: "t"}, "AggregateID", false},
		{"invalid UTF-8 in event type", f.p, pgoutbox.Event{AggregateType: "o", AggregateID: "1", EventType: "\xff"}, "EventType", false},
		{"invalid raw JSON", f.p, ev("1", json.RawMessage(`{"a":`)), "Payload", false},
		{"invalid []byte JSON", f.p, ev("1", []byte(`not json`)), "Payload", false},
		{"unmarshalable value", f.p, ev("1", make(chan int)), "Payload", false},
		{"JSON with NUL escape", f.p, ev("1", json.RawMessage(`{"a":"\u0000"}`)), "Payload", false},
		{"string with NUL", f.p, ev("1", "a\x00b"), "Payload", false},
		{"lone surrogate", f.p, ev("1", json.RawMessage(`"\udc00"`)), "Payload", false},
		{"number out of range", f.p, ev("1", json.RawMessage(`1e200000`)), "Payload", false},
		{"payload too large", small, ev("1", strings.Repeat("x", 20)), "Payload", true},
		{"negative schema version", f.p, pgoutbox.Event{AggregateType: "o", AggregateID: "1", EventType: "t", SchemaVersion: -1}, "SchemaVersion", false},
		{"empty header key", f.p, pgoutbox.Event{AggregateType: "o", AggregateID: "1", EventType: "t", Headers: map[string]string{"": "x"}}, "Headers", false},
		{"NUL in header value", f.p, pgoutbox.Event{AggregateType: "o", AggregateID: "1", EventType: "t", Headers: map[string]string{"k": "\x00"}}, "Headers", false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			check := func(err error) {
				t.Helper()
				var ve *pgoutbox.ValidationError
				if !errors.As(err, &ve) || !errors.Is(err, pgoutbox.ErrInvalidEvent) {
					t.Fatalf("err = %v, want a *ValidationError", err)
				}
				if ve.Field != tc.field || ve.Index != 1 {
					t.Fatalf("error names field %s of event #%d, want %s of #1: %v", ve.Field, ve.Index, tc.field, err)
				}
				if errors.Is(err, pgoutbox.ErrPayloadTooLarge) != tc.tooLarge {
					t.Fatalf("errors.Is(err, ErrPayloadTooLarge) = %v: %v", !tc.tooLarge, err)
				}
			}

			tx, err := f.pool.Begin(ctx)
			pgtest.Must(t, err, "begin")
			defer tx.Rollback(ctx)
			_, err = tc.p.EnqueueTx(ctx, tx, valid, tc.ev)
			check(err)
			// Still usable: a query and a valid enqueue succeed and commit.
			res, err := tc.p.EnqueueTx(ctx, tx, valid)
			pgtest.Must(t, err, "enqueue after the error")
			pgtest.Must(t, tx.Commit(ctx), "commit after the error")

			stx, err := sqldb.BeginTx(ctx, nil)
			pgtest.Must(t, err, "begin sql")
			defer stx.Rollback()
			_, err = tc.p.EnqueueSQLTx(ctx, stx, valid, tc.ev)
			check(err)
			res2, err := tc.p.EnqueueSQLTx(ctx, stx, valid)
			pgtest.Must(t, err, "database/sql enqueue after the error")
			pgtest.Must(t, stx.Commit(), "database/sql commit after the error")
			if res[0].AggregateSequence >= res2[0].AggregateSequence {
				t.Fatalf("sequences %d then %d", res[0].AggregateSequence, res2[0].AggregateSequence)
			}
		})
	}
}

func TestDuplicateIDsInOneCallAreRejected(t *testing.T) {
	t.Parallel()
	id := pgoutbox.NewEventID()
	a, b := ev("1", 1), ev("2", 2)
	a.ID, b.ID = id, id
	p, _ := pgoutbox.NewProducer(nil)
	err := p.Validate(a, b)
	var ve *pgoutbox.ValidationError
	if !errors.As(err, &ve) || ve.Field != "ID" || ve.Index != 1 {
		t.Fatalf("err = %v, want a ValidationError on ID of #1", err)
	}
}

// Our pre-checks must agree with jsonb: what we accept it stores, what we reject it
// would have refused (so no valid payload is turned away).
func TestPayloadChecksAgreeWithJSONB(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t, pgtest.URL(), 2)
	ctx := context.Background()
	payloads := []string{
		`{}`, `null`, `"\u0000"`, `"\\u0000"`, `"\\\u0000"`, `"a\u0001b"`, `"\ud800"`, `"\udc00"`, `"\ud83d\ude00"`,
		`"\ud83d\u0041"`, `"\uD83D\uDE00"`, `1e131071`, `1e131072`, `-1e131071`, `10e131071`, `0.1e131073`,
		`1e-16383`, `1e-16384`, `0.5e-16383`, `0e-20000`, `0e999999`, `123.45e-16381`, `123.45e-16382`,
		`[1.5E+3, -0.0, 0.001e3]`, `{"e":"1e999999","n":2E-3}`, `1e99999999999999999999`, `"\u00e9\u4e2d"`,
	}
	prod, _ := pgoutbox.NewProducer(nil)
	for _, p := range payloads {
		ourErr := prod.Validate(ev("1", json.RawMessage(p)))
		var out string
		pgErr := pool.QueryRow(ctx, "SELECT $1::jsonb::text", p).Scan(&out)
		var pe *pgconn.PgError
		if pgErr != nil && !errors.As(pgErr, &pe) {
			t.Fatalf("%s: %v", p, pgErr)
		}
		accepted := ourErr == nil
		if accepted != (pgErr == nil) {
			t.Errorf("payload %s: we accept=%v, jsonb error=%v", p, accepted, pgErr)
		}
		// The same text from a MarshalJSON method takes the json.Marshal path,
		// which skips the second JSON validation but none of jsonb's rules.
		if err := prod.Validate(ev("1", marshalsAs(p))); (err == nil) != (pgErr == nil) {
			t.Errorf("payload %s through MarshalJSON: we accept=%v, jsonb error=%v", p, err == nil, pgErr)
		}
	}
}

// marshalsAs is a payload whose MarshalJSON returns the given bytes verbatim.
type marshalsAs string

func (m marshalsAs) MarshalJSON() ([]byte, error) { return []byte(m), nil }

// A payload encoded by json.Marshal skips a second JSON validation, never jsonb's
// rules: what a MarshalJSON method returns is checked by encoding/json (invalid
// JSON), by the producer (invalid UTF-8, \u0000, numbers beyond numeric), and
// its stored size is measured as for raw JSON. The same texts as raw JSON get the
// same verdicts.
func TestMarshaledPayloadChecks(t *testing.T) {
	t.Parallel()
	p, err := pgoutbox.NewProducer(&pgoutbox.Config{MaxPayloadBytes: 64})
	pgtest.Must(t, err, "producer")
	for _, tc := range []struct {
		text string
		ok   bool
	}{
		{`{"a": 1}`, true},
		{`{"a": 1`, false},
		{`"\u0000"`, false},
		{"\"\xff\"", false},
		{`"\ud800"`, false},
		{`1e131072`, false},
		{`[` + strings.Repeat(`1,`, 40) + `1]`, false}, // 121 bytes as jsonb text, above 64
		{`{"k": "v", "k": "` + strings.Repeat("x", 40) + `"}`, true},
	} {
		for _, payload := range []any{marshalsAs(tc.text), map[string]any{"x": marshalsAs(tc.text)}, json.RawMessage(tc.text)} {
			err := p.Validate(pgoutbox.Event{AggregateType: "t", AggregateID: "1", EventType: "e", Payload: payload})
			if (err == nil) != tc.ok {
				t.Errorf("%T %q: err = %v, want ok = %v", payload, tc.text, err, tc.ok)
			}
		}
	}
}

func TestTraceContextSavedInHeaders(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 2)
	tid, _ := trace.TraceIDFromHex("4bf92f3577b34da6a3ce929d0e0e4736")
	sid, _ := trace.SpanIDFromHex("00f067aa0ba902b7")
	sc := trace.NewSpanContext(trace.SpanContextConfig{TraceID: tid, SpanID: sid, TraceFlags: trace.FlagsSampled})
	ctx := trace.ContextWithSpanContext(context.Background(), sc)

	withHdr := ev("1", 1)
	withHdr.Headers = map[string]string{"tenant": "acme"}
	own := ev("2", 1)
	own.Headers = map[string]string{"traceparent": "00-11111111111111111111111111111111-2222222222222222-01"}
	res, err := f.p.EnqueueTx(ctx, f.pool, withHdr, own)
	pgtest.Must(t, err, "enqueue")
	res2, err := f.p.EnqueueTx(context.Background(), f.pool, ev("3", 1))
	pgtest.Must(t, err, "enqueue without trace")

	headers := func(id pgoutbox.UUID) map[string]string {
		var h map[string]string
		pgtest.Must(t, f.pool.QueryRow(context.Background(), "SELECT headers FROM "+f.table("outbox_events")+" WHERE event_id = $1", id).Scan(&h), "headers")
		return h
	}
	want := "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	if h := headers(res[0].EventID); h["traceparent"] != want || h["tenant"] != "acme" {
		t.Errorf("headers = %v, want traceparent %s and tenant", h, want)
	}
	if h := headers(res[1].EventID); h["traceparent"] != own.Headers["traceparent"] {
		t.Errorf("the producer's own traceparent was overwritten: %v", h)
	}
	var stored string
	pgtest.Must(t, f.pool.QueryRow(context.Background(), "SELECT headers::text FROM "+f.table("outbox_events")+" WHERE event_id = $1", res2[0].EventID).Scan(&stored), "headers text")
	if stored != "{}" {
		t.Errorf("no headers and no trace in ctx: headers = %s, want {}", stored)
	}
}

func TestPayloadEncodingAndColumns(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 2)
	ctx := context.Background()
	at := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	id := pgoutbox.NewEventID()
	events := []pgoutbox.Event{
		{AggregateType: "order", AggregateID: "7", EventType: "created", Payload: json.RawMessage(`{"b": 2, "a": 1}`), SchemaVersion: 3, ID: id, OccurredAt: at},
		{AggregateType: "order", AggregateID: "7", EventType: "bytes", Payload: []byte(`[1,2]`)},
		{AggregateType: "order", AggregateID: "7", EventType: "string", Payload: "hello"},
		{AggregateType: "order", AggregateID: "7", EventType: "struct", Payload: struct {
			Total int `json:"total"`
		}{42}},
		{AggregateType: "order", AggregateID: "7", EventType: "nil"},
	}
	res, err := f.p.EnqueueTx(ctx, f.pool, events...)
	pgtest.Must(t, err, "enqueue")
	if res[0].EventID != id {
		t.Fatalf("given id not kept: %s", res[0].EventID)
	}
	want := []string{`{"a": 1, "b": 2}`, `[1, 2]`, `"hello"`, `{"total": 42}`, `null`}
	for i, r := range res {
		var payload, evType string
		var seq int64
		var version, attempts int
		var occurred, available time.Time
		var published *time.Time
		pgtest.Must(t, f.pool.QueryRow(ctx, "SELECT payload::text, event_type, aggregate_sequence, schema_version, attempt_count, occurred_at, available_at, published_at FROM "+
			f.table("outbox_events")+" WHERE event_id = $1", r.EventID).Scan(&payload, &evType, &seq, &version, &attempts, &occurred, &available, &published), "read")
		if payload != want[i] || seq != int64(i+1) || evType != events[i].EventType || attempts != 0 || published != nil {
			t.Errorf("event %d: payload %s seq %d type %s attempts %d published %v", i, payload, seq, evType, attempts, published)
		}
		if wantV := max(events[i].SchemaVersion, 1); version != wantV {
			t.Errorf("event %d: schema_version %d, want %d", i, version, wantV)
		}
		if i == 0 && !occurred.Equal(at) {
			t.Errorf("occurred_at %v, want %v", occurred, at)
		}
		if i > 0 && time.Since(occurred) > time.Minute {
			t.Errorf("default occurred_at %v is not now", occurred)
		}
		if available.IsZero() {
			t.Errorf("available_at not set")
		}
	}
}

func TestEnqueueWrapsDatabaseErrors(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 2)
	ctx := context.Background()
	e := ev("1", 1)
	e.ID = pgoutbox.NewEventID()
	_, err := f.p.EnqueueTx(ctx, f.pool, e)
	pgtest.Must(t, err, "enqueue")
	_, err = f.p.EnqueueTx(ctx, f.pool, e) // same id again
	var pe *pgconn.PgError
	if !errors.As(err, &pe) || pe.Code != "23505" || !strings.HasPrefix(err.Error(), "pgoutbox: enqueue: ") {
		t.Fatalf("err = %v, want a wrapped unique violation", err)
	}
	missing, err := pgoutbox.NewProducer(&pgoutbox.Config{Schema: f.schema + "_missing"})
	pgtest.Must(t, err, "producer")
	if _, err := missing.EnqueueTx(ctx, f.pool, ev("1", 1)); err == nil || !strings.Contains(err.Error(), "does not exist") {
		t.Fatalf("err = %v, want the missing table reported", err)
	}
}

func TestNewProducerRejectsBadSchema(t *testing.T) {
	t.Parallel()
	for _, s := range []string{strings.Repeat("s", 64), "a\x00", "\xff"} {
		if _, err := pgoutbox.NewProducer(&pgoutbox.Config{Schema: s}); err == nil {
			t.Errorf("schema %q accepted", s)
		}
	}
	// Odd but legal names are quoted, not refused.
	if _, err := pgoutbox.NewProducer(&pgoutbox.Config{Schema: `My "Schema"`}); err != nil {
		t.Errorf("quoted schema refused: %v", err)
	}
}

func TestConfigValidate(t *testing.T) {
	t.Parallel()
	var nilCfg *pgoutbox.Config
	if err := nilCfg.Validate(); err != nil {
		t.Errorf("nil Config: %v", err)
	}
	if err := (&pgoutbox.Config{MaxPayloadBytes: -1}).Validate(); err != nil {
		t.Errorf("negative MaxPayloadBytes (the hard maximum): %v", err)
	}
	err := (&pgoutbox.Config{Schema: "a\x00", MaxPayloadBytes: pgoutbox.HardMaxPayloadBytes + 1}).Validate()
	if err == nil || !strings.Contains(err.Error(), "Config.Schema") || !strings.Contains(err.Error(), "Config.MaxPayloadBytes") {
		t.Errorf("two invalid fields: %v, want both named", err)
	}
	if _, err := pgoutbox.NewProducer(&pgoutbox.Config{MaxPayloadBytes: pgoutbox.HardMaxPayloadBytes + 1}); err == nil {
		t.Error("NewProducer accepted a limit above HardMaxPayloadBytes")
	}
}

func TestSQLFunctionValidation(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 2)
	ctx := context.Background()
	fn := pgx.Identifier{f.schema, "outbox_enqueue"}.Sanitize()
	cases := []struct {
		args []any
		sql  string
		want string
	}{
		{[]any{"", "1", "t", "{}"}, "($1, $2, $3, $4::jsonb)", "aggregate_type must not be empty"},
		{[]any{nil, "1", "t", "{}"}, "($1, $2, $3, $4::jsonb)", "aggregate_type must not be empty"},
		{[]any{"o", "", "t", "{}"}, "($1, $2, $3, $4::jsonb)", "aggregate_id must not be empty"},
		{[]any{"o", "1", "", "{}"}, "($1, $2, $3, $4::jsonb)", "event_type must not be empty"},
		{[]any{"o", "1", "t", nil}, "($1, $2, $3, $4::jsonb)", "payload must not be NULL"},
		{[]any{"o", "1", "t", "{}", 0}, "($1, $2, $3, $4::jsonb, $5)", "schema_version must be at least 1"},
		{[]any{"o", "1", "t", "{}", 1, "[]"}, "($1, $2, $3, $4::jsonb, $5, $6::jsonb)", "headers must be a JSON object"},
		{[]any{"o", "1", "t", "{}", 1, `{"k": 1}`}, "($1, $2, $3, $4::jsonb, $5, $6::jsonb)", "string values"},
		{[]any{"o", "1", "t", `"` + strings.Repeat("x", 1<<20) + `"`}, "($1, $2, $3, $4::jsonb)", "above the limit of 1015808 bytes"},
	}
	for _, tc := range cases {
		_, err := f.pool.Exec(ctx, "SELECT "+fn+tc.sql, tc.args...)
		var pe *pgconn.PgError
		if !errors.As(err, &pe) || !strings.Contains(pe.Message, tc.want) {
			t.Errorf("args %.60v: err = %v, want %q", tc.args, err, tc.want)
		}
	}

	// The limit follows the pgoutbox.max_payload_bytes setting.
	tx, err := f.pool.Begin(ctx)
	pgtest.Must(t, err, "begin")
	defer tx.Rollback(ctx)
	_, err = tx.Exec(ctx, "SET LOCAL pgoutbox.max_payload_bytes = 10")
	pgtest.Must(t, err, "set")
	if _, err := tx.Exec(ctx, "SELECT "+fn+"('o', '1', 't', '\"0123456789\"')"); err == nil || !strings.Contains(err.Error(), "above the limit of 10 bytes") {
		t.Fatalf("err = %v, want the setting's limit", err)
	}

	// Named notation and defaults work; the id is a UUIDv7.
	var id pgoutbox.UUID
	var headers string
	var version int
	pgtest.Must(t, f.pool.QueryRow(ctx, "SELECT "+fn+"(aggregate_type => 'o', aggregate_id => '1', event_type => 't', payload => '{}', headers => '{\"k\":\"v\"}')").Scan(&id), "named call")
	pgtest.Must(t, f.pool.QueryRow(ctx, "SELECT headers::text, schema_version FROM "+f.table("outbox_events")+" WHERE event_id = $1", id).Scan(&headers, &version), "read")
	if ts, ok := id.Time(); !ok || time.Since(ts) > time.Minute || headers != `{"k": "v"}` || version != 1 {
		t.Fatalf("id %s (v7 time %v %v), headers %s, version %d", id, ts, ok, headers, version)
	}
}

func TestUUID(t *testing.T) {
	t.Parallel()
	prev := pgoutbox.NewEventID()
	for range 10000 {
		id := pgoutbox.NewEventID()
		if id.String() <= prev.String() {
			t.Fatalf("ids not increasing: %s then %s", prev, id)
		}
		if id[6]>>4 != 7 || id[8]>>6 != 2 {
			t.Fatalf("%s is not an RFC 9562 version 7 UUID", id)
		}
		prev = id
	}
	parsed, err := pgoutbox.ParseUUID(prev.String())
	if err != nil || parsed != prev {
		t.Fatalf("ParseUUID(%s) = %s, %v", prev, parsed, err)
	}
	if p2, err := pgoutbox.ParseUUID(strings.ReplaceAll(strings.ToUpper(prev.String()), "-", "")); err != nil || p2 != prev {
		t.Fatalf("ParseUUID of compact upper-case form = %s, %v", p2, err)
	}
	for _, bad := range []string{"", "xyz", prev.String() + "0", strings.Replace(prev.String(), "-", "g", 1)} {
		if _, err := pgoutbox.ParseUUID(bad); err == nil {
			t.Errorf("ParseUUID(%q) accepted", bad)
		}
	}
	if ts, ok := prev.Time(); !ok || time.Since(ts) > time.Minute {
		t.Errorf("Time() = %v, %v", ts, ok)
	}
	b, _ := json.Marshal(prev)
	var back pgoutbox.UUID
	if err := json.Unmarshal(b, &back); err != nil || back != prev {
		t.Errorf("JSON round trip: %s, %v", back, err)
	}
	if slices.Equal(prev[:], make([]byte, 16)) || prev.IsZero() {
		t.Error("zero id")
	}
}
