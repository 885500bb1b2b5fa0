package inbox_test

import (
	"context"
	"database/sql"
	"errors"
	"math"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgoutbox/pgoutbox/broker"
	"github.com/pgoutbox/pgoutbox/inbox"
	"github.com/pgoutbox/pgoutbox/internal/pgtest"
	"github.com/pgoutbox/pgoutbox/internal/wait"
	"github.com/pgoutbox/pgoutbox/wire"
)

// Acceptance: every message delivered three times changes the business table once.
func TestEveryDeliveryThreeTimesAppliesOnce(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 4)
	c := f.consumer(t, inbox.Config{Name: "billing"})
	msgs := append(lane("1", 5), lane("2", 5)...)
	for round := range 3 {
		for _, m := range msgs {
			want := inbox.StatusDuplicate
			if round == 0 {
				want = inbox.StatusApplied
			}
			o := process(t, c, m, want)
			if o.Action() != inbox.ActionAck {
				t.Fatalf("%s: action %s, want ack", o.Status, o.Action())
			}
		}
	}
	if n := f.count(t, "effects", "true"); n != len(msgs) {
		t.Fatalf("%d effects, want %d", n, len(msgs))
	}
	if n := f.count(t, "processed_events", "consumer_name = 'billing'"); n != len(msgs) {
		t.Fatalf("%d processed_events rows, want %d", n, len(msgs))
	}
	if s := c.Stats(); s.Applied != 10 || s.Duplicates != 20 || s.Gaps != 0 || s.Failed != 0 {
		t.Fatalf("stats %+v", s)
	}
	pos, err := c.Position(context.Background(), "order", "1")
	pgtest.Must(t, err, "Position")
	if pos != 5 {
		t.Fatalf("position %d, want 5", pos)
	}
}

// Two consumer names apply the same events independently.
func TestConsumersAreIndependent(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 4)
	a := f.consumer(t, inbox.Config{Name: "billing"})
	b := f.consumer(t, inbox.Config{Name: "shipping"})
	for _, m := range lane("1", 3) {
		process(t, a, m, inbox.StatusApplied)
		process(t, b, m, inbox.StatusApplied)
		process(t, a, m, inbox.StatusDuplicate)
	}
	if got := f.sequences(t, "shipping", "1"); !slices.Equal(got, []int64{1, 2, 3}) {
		t.Fatalf("shipping applied %v", got)
	}
}

// Acceptance: a failing handler rolls everything back — its own writes, the
// processed_events row, the position — and the delivery asks for a redelivery.
func TestHandlerErrorRollsBack(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 4)
	var fail atomic.Bool
	fail.Store(true)
	boom := errors.New("downstream table locked")
	h := func(ctx context.Context, tx pgx.Tx, ev inbox.Event) error {
		if _, err := tx.Exec(ctx, "INSERT INTO "+f.table("effects")+" (consumer, event_id, aggregate_id, sequence) VALUES ('c', $1, $2, $3)",
			ev.EventID.String(), ev.AggregateID, ev.AggregateSequence); err != nil {
			return err
		}
		if fail.Load() {
			return boom
		}
		return nil
	}
	c, err := inbox.New(inbox.Pgx(f.pool), h, &inbox.Config{Name: "c", Schema: f.schema, Logger: quiet,
		RetryDelay: 200 * time.Millisecond, MaxRetryDelay: time.Second})
	pgtest.Must(t, err, "New")
	m := event("1", 1)

	o := process(t, c, m, inbox.StatusFailed)
	if !errors.Is(o.Err, boom) || o.Action() != inbox.ActionNak {
		t.Fatalf("err %v, action %s: want the handler's error and a nak", o.Err, o.Action())
	}
	if o.RetryAfter < 100*time.Millisecond || o.RetryAfter > 200*time.Millisecond {
		t.Fatalf("RetryAfter %s, want 100-200ms for a first attempt", o.RetryAfter)
	}
	if n := f.count(t, "effects", "true"); n != 0 {
		t.Fatalf("%d effects after a failed handler", n)
	}
	if n := f.count(t, "processed_events", "true"); n != 0 {
		t.Fatalf("%d processed_events rows after a failed handler", n)
	}
	if n := f.count(t, "consumer_positions", "true"); n != 0 {
		t.Fatalf("%d positions after a failed handler", n)
	}
	d := inbox.DeliveryOf(m)
	d.Attempt = 10
	if o := c.Process(context.Background(), d); o.RetryAfter < 500*time.Millisecond || o.RetryAfter > time.Second {
		t.Fatalf("10th attempt: RetryAfter %s, want capped at MaxRetryDelay (jitter: 0.5-1s)", o.RetryAfter)
	}

	fail.Store(false)
	process(t, c, m, inbox.StatusApplied)
	if n := f.count(t, "effects", "true"); n != 1 {
		t.Fatalf("%d effects after the retry, want 1", n)
	}
	if s := c.Stats(); s.Failed != 2 || s.Applied != 1 {
		t.Fatalf("stats %+v", s)
	}
}

func TestHandlerPanicFailsTheDelivery(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 2)
	c, err := inbox.New(inbox.Pgx(f.pool), func(ctx context.Context, tx pgx.Tx, ev inbox.Event) error {
		panic("nil map")
	}, &inbox.Config{Name: "c", Schema: f.schema, Logger: quiet})
	pgtest.Must(t, err, "New")
	o := process(t, c, event("1", 1), inbox.StatusFailed)
	if !strings.Contains(o.Err.Error(), "panicked: nil map") {
		t.Fatalf("err %v", o.Err)
	}
	if n := f.count(t, "processed_events", "true"); n != 0 {
		t.Fatalf("%d processed_events rows after a panic", n)
	}
}

// A serialization failure or deadlock aborts the transaction; it is run again at once.
func TestSerializationFailureIsRetriedInProcess(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 2)
	var calls atomic.Int32
	c, err := inbox.New(inbox.Pgx(f.pool), func(ctx context.Context, tx pgx.Tx, ev inbox.Event) error {
		if calls.Add(1) < 3 {
			return &pgconn.PgError{Code: "40001", Message: "could not serialize access"}
		}
		return f.pgxHandler("c")(ctx, tx, ev)
	}, &inbox.Config{Name: "c", Schema: f.schema, Logger: quiet})
	pgtest.Must(t, err, "New")
	process(t, c, event("1", 1), inbox.StatusApplied)
	if calls.Load() != 3 || c.Stats().Failed != 0 {
		t.Fatalf("%d handler calls, stats %+v", calls.Load(), c.Stats())
	}
}

// Acceptance: two consumers (same name) race on one event. The second waits for the
// first's transaction — on the aggregate's position row, before it would wait on the
// uncommitted processed_events row — and then sees a duplicate, never an error. If
// the first rolls back, the second applies.
func TestRacingConsumers(t *testing.T) {
	t.Parallel()
	t.Run("pgx", func(t *testing.T) {
		t.Parallel()
		f := newFixture(t, 6)
		testRace(t, f, inbox.Pgx(f.pool), func(ctx context.Context, tx pgx.Tx, q string, args ...any) error {
			_, err := tx.Exec(ctx, q, args...)
			return err
		})
	})
	t.Run("database/sql", func(t *testing.T) {
		t.Parallel()
		f := newFixture(t, 2)
		testRace(t, f, inbox.SQL(sqlDB(t)), func(ctx context.Context, tx *sql.Tx, q string, args ...any) error {
			_, err := tx.ExecContext(ctx, q, args...)
			return err
		})
	})
}

func testRace[TX any](t *testing.T, f *fixture, db inbox.Driver[TX], exec func(ctx context.Context, tx TX, q string, args ...any) error) {
	for _, firstCommits := range []bool{true, false} {
		m := event("race", 1)
		if !firstCommits {
			m = event("race", 2)
		}
		entered := make(chan struct{})
		release := make(chan struct{})
		var calls atomic.Int32
		h := func(ctx context.Context, tx TX, ev inbox.Event) error {
			if err := f.recordEffect(ctx, func(ctx context.Context, q string, args ...any) error {
				return exec(ctx, tx, q, args...)
			}, "race", ev); err != nil {
				return err
			}
			if calls.Add(1) == 1 { // the first transaction holds its locks until released
				close(entered)
				<-release
				if !firstCommits {
					return errors.New("first consumer fails")
				}
			}
			return nil
		}
		mk := func() *inbox.Consumer[TX] {
			c, err := inbox.New(db, h, &inbox.Config{Name: "race", Schema: f.schema, Logger: quiet})
			pgtest.Must(t, err, "New")
			return c
		}
		a, b := mk(), mk()

		var wg sync.WaitGroup
		var oa, ob inbox.Outcome
		wg.Go(func() { oa = a.Process(context.Background(), inbox.DeliveryOf(m)) })
		<-entered
		wg.Go(func() { ob = b.Process(context.Background(), inbox.DeliveryOf(m)) })
		wait.For(t, 10*time.Second, "the second transaction to wait for the first's lock", func() bool {
			var n int
			err := f.pool.QueryRow(context.Background(), `SELECT count(*) FROM pg_stat_activity
				WHERE wait_event_type = 'Lock' AND position($1 IN query) > 0`, f.schema).Scan(&n)
			pgtest.Must(t, err, "pg_stat_activity")
			return n == 1
		})
		close(release)
		wg.Wait()

		if firstCommits {
			if oa.Status != inbox.StatusApplied || ob.Status != inbox.StatusDuplicate || ob.Err != nil {
				t.Fatalf("first commits: outcomes %s (%v) and %s (%v), want applied and duplicate", oa.Status, oa.Err, ob.Status, ob.Err)
			}
			// The second read its processed_events row only after waiting for the
			// first: it knows the event by its id, not merely by its position.
			if ob.ByPosition {
				t.Fatal("first commits: the duplicate is reported ByPosition, as if its id had never been applied")
			}
		} else {
			if oa.Status != inbox.StatusFailed || ob.Status != inbox.StatusApplied {
				t.Fatalf("first rolls back: outcomes %s (%v) and %s (%v), want failed and applied", oa.Status, oa.Err, ob.Status, ob.Err)
			}
		}
		if n := f.count(t, "effects", "event_id = $1", m.EventID.String()); n != 1 {
			t.Fatalf("%d effects of the raced event, want 1", n)
		}
	}
}

// An event whose sequence was allocated again to a different event (as after an
// asynchronous failover of the producers' database, which forgot an event the
// relay had published): under GapReject it is not applied, and it is reported
// (Outcome.ByPosition, Stats.ByPosition), never taken silently for a redelivery;
// under GapAccept it is applied as a late event. A redelivery of the event that
// was applied stays a plain duplicate.
func TestSequenceAllocatedAgain(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 4)
	for _, policy := range []inbox.GapPolicy{inbox.GapReject, inbox.GapAccept} {
		name := "reject"
		if policy == inbox.GapAccept {
			name = "accept"
		}
		c := f.consumer(t, inbox.Config{Name: name, GapPolicy: policy})
		applied := lane(name, 3)
		for _, m := range applied {
			process(t, c, m, inbox.StatusApplied)
		}
		again := event(name, 3) // same aggregate and sequence, another event id
		if policy == inbox.GapReject {
			o := process(t, c, again, inbox.StatusDuplicate)
			if !o.ByPosition || o.Action() != inbox.ActionAck || o.Position != 3 {
				t.Fatalf("%s: sequence allocated again: ByPosition %v, action %s, position %d; want reported, ack, 3", name, o.ByPosition, o.Action(), o.Position)
			}
			if s := c.Stats(); s.Duplicates != 1 || s.ByPosition != 1 {
				t.Fatalf("%s: stats %+v, want 1 duplicate by position", name, s)
			}
			if n := f.count(t, "effects", "event_id = $1", again.EventID.String()); n != 0 {
				t.Fatalf("%s: the event was applied (%d effects)", name, n)
			}
		} else {
			o := process(t, c, again, inbox.StatusApplied)
			if !o.Late || o.ByPosition {
				t.Fatalf("%s: sequence allocated again: Late %v, ByPosition %v; want applied late", name, o.Late, o.ByPosition)
			}
		}
		o := process(t, c, applied[2], inbox.StatusDuplicate)
		if o.ByPosition {
			t.Fatalf("%s: a redelivery of an applied event is reported ByPosition", name)
		}
	}
}

// Acceptance (reject): sequence 3 delivered before 2 is refused without a trace,
// then applied after 2. An old sequence redelivered is a duplicate, not a gap.
func TestRejectGapPolicy(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 2)
	c := f.consumer(t, inbox.Config{Name: "c", GapRetryDelay: 50 * time.Millisecond})
	m := lane("1", 3)

	process(t, c, m[0], inbox.StatusApplied)
	o := process(t, c, m[2], inbox.StatusGapRejected)
	var gap *inbox.GapError
	if !errors.Is(o.Err, inbox.ErrGap) || !errors.As(o.Err, &gap) || gap.Position != 1 || gap.Sequence != 3 || o.Gap != 1 {
		t.Fatalf("outcome %+v", o)
	}
	if o.Action() != inbox.ActionNak || o.RetryAfter != 50*time.Millisecond {
		t.Fatalf("action %s after %s, want a nak after 50ms (one missing sequence)", o.Action(), o.RetryAfter)
	}
	if o := process(t, c, event("1", 5), inbox.StatusGapRejected); o.RetryAfter != 150*time.Millisecond {
		t.Fatalf("three missing sequences: RetryAfter %s, want 150ms", o.RetryAfter)
	}
	if o := process(t, c, event("1", 1000), inbox.StatusGapRejected); o.RetryAfter != 5*time.Second {
		t.Fatalf("998 missing sequences: RetryAfter %s, want MaxGapRetryDelay", o.RetryAfter)
	}
	if n := f.count(t, "processed_events", "event_id = $1", m[2].EventID.String()); n != 0 {
		t.Fatal("a processed_events row was written for a rejected event")
	}
	process(t, c, m[1], inbox.StatusApplied)
	process(t, c, m[2], inbox.StatusApplied)
	o = process(t, c, m[0], inbox.StatusDuplicate)
	if o.Gap != 0 || o.Err != nil {
		t.Fatalf("old sequence: %+v", o)
	}
	if got := f.sequences(t, "c", "1"); !slices.Equal(got, []int64{1, 2, 3}) {
		t.Fatalf("applied %v, want [1 2 3]", got)
	}
	// A first event that is not sequence 1 is a gap too (the consumer has seen
	// nothing of the aggregate).
	process(t, c, event("2", 2), inbox.StatusGapRejected)
	if n := f.count(t, "consumer_positions", "aggregate_id = '2'"); n != 0 {
		t.Fatal("a rejected first event left a position row")
	}
	if s := c.Stats(); s.Gaps != 4 || s.Applied != 3 || s.Duplicates != 1 {
		t.Fatalf("stats %+v", s)
	}
}

// Acceptance (accept): a gap is applied over and reported; the missing event is
// applied when it arrives; redeliveries are duplicates.
func TestAcceptGapPolicy(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 2)
	c := f.consumer(t, inbox.Config{Name: "c", GapPolicy: inbox.GapAccept})
	m := lane("1", 4)
	process(t, c, m[0], inbox.StatusApplied)
	o := process(t, c, m[3], inbox.StatusApplied)
	if o.Gap != 2 || o.Position != 1 || o.Late {
		t.Fatalf("outcome %+v, want a gap of 2 over position 1", o)
	}
	o = process(t, c, m[1], inbox.StatusApplied)
	if !o.Late || o.Gap != 0 || o.Position != 4 {
		t.Fatalf("outcome %+v, want a late event below position 4", o)
	}
	process(t, c, m[3], inbox.StatusDuplicate)
	process(t, c, m[1], inbox.StatusDuplicate)
	if s := c.Stats(); s.Gaps != 1 || s.Late != 1 || s.Applied != 3 || s.Duplicates != 2 {
		t.Fatalf("stats %+v", s)
	}
	pos, err := c.Position(context.Background(), "order", "1")
	pgtest.Must(t, err, "Position")
	if pos != 4 {
		t.Fatalf("position %d, want 4 (a late event never moves it back)", pos)
	}
	if got := f.sequences(t, "c", "1"); !slices.Equal(got, []int64{1, 4, 2}) {
		t.Fatalf("applied %v, want [1 4 2]", got)
	}
}

// Reconciling: an event skipped upstream never comes; the operator moves the
// position past it and the aggregate resumes.
func TestSetPositionReconcilesASkippedEvent(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 2)
	c := f.consumer(t, inbox.Config{Name: "c"})
	ctx := context.Background()
	m := lane("1", 4)
	process(t, c, m[0], inbox.StatusApplied)
	process(t, c, m[2], inbox.StatusGapRejected) // 2 was skipped with "pgoutbox dlq skip"
	pgtest.Must(t, c.SetPosition(ctx, "order", "1", 2), "SetPosition")
	process(t, c, m[2], inbox.StatusApplied)
	process(t, c, m[1], inbox.StatusDuplicate) // should it turn up after all
	if got := f.sequences(t, "c", "1"); !slices.Equal(got, []int64{1, 3}) {
		t.Fatalf("applied %v, want [1 3]", got)
	}

	// Setting a position back does not re-apply, and the next delivery of an
	// applied event catches the position up.
	pgtest.Must(t, c.SetPosition(ctx, "order", "1", 1), "SetPosition back")
	process(t, c, m[2], inbox.StatusDuplicate)
	if pos, _ := c.Position(ctx, "order", "1"); pos != 3 {
		t.Fatalf("position %d after a duplicate above it, want 3", pos)
	}
	process(t, c, m[3], inbox.StatusApplied)

	// A fresh consumer can be seeded: it starts mid-lane.
	late := f.consumer(t, inbox.Config{Name: "late"})
	pgtest.Must(t, late.SetPosition(ctx, "order", "1", 3), "seed")
	process(t, late, m[3], inbox.StatusApplied)
	if err := c.SetPosition(ctx, "order", "1", -1); err == nil {
		t.Fatal("negative position accepted")
	}
}

// Retention deleted an applied event's dedup row; under GapReject its position still
// marks it done.
func TestPositionCoversEventsPastRetention(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 2)
	c := f.consumer(t, inbox.Config{Name: "c"})
	m := lane("1", 2)
	process(t, c, m[0], inbox.StatusApplied)
	process(t, c, m[1], inbox.StatusApplied)
	f.exec(t, "DELETE FROM "+f.table("processed_events"))
	process(t, c, m[0], inbox.StatusDuplicate)
	process(t, c, m[1], inbox.StatusDuplicate)
	if n := f.count(t, "effects", "true"); n != 2 {
		t.Fatalf("%d effects, want 2", n)
	}
}

// Acceptance: the database/sql driver gives the handler a *sql.Tx with the same
// guarantees.
func TestDatabaseSQLDriver(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 2)
	db := sqlDB(t)
	c, err := inbox.New(inbox.SQL(db), f.sqlHandler("sql"), &inbox.Config{Name: "sql", Schema: f.schema, Logger: quiet})
	pgtest.Must(t, err, "New")
	m := lane("1", 3)
	process(t, c, m[0], inbox.StatusApplied)
	process(t, c, m[2], inbox.StatusGapRejected)
	process(t, c, m[1], inbox.StatusApplied)
	for range 3 {
		process(t, c, m[1], inbox.StatusDuplicate)
	}
	process(t, c, m[2], inbox.StatusApplied)
	if got := f.sequences(t, "sql", "1"); !slices.Equal(got, []int64{1, 2, 3}) {
		t.Fatalf("applied %v", got)
	}
	pgtest.Must(t, c.SetPosition(context.Background(), "order", "9", 4), "SetPosition")
	if pos, err := c.Position(context.Background(), "order", "9"); err != nil || pos != 4 {
		t.Fatalf("Position = %d, %v", pos, err)
	}

	failing, err := inbox.New(inbox.SQL(db), func(ctx context.Context, tx *sql.Tx, ev inbox.Event) error {
		if err := f.sqlHandler("sql")(ctx, tx, ev); err != nil {
			return err
		}
		return errors.New("nope")
	}, &inbox.Config{Name: "sql", Schema: f.schema, Logger: quiet})
	pgtest.Must(t, err, "New")
	process(t, failing, event("2", 1), inbox.StatusFailed)
	if n := f.count(t, "processed_events", "true"); n != 3 {
		t.Fatalf("%d processed_events rows, want 3", n)
	}
}

func TestUndecodableDeliveries(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 2)
	c := f.consumer(t, inbox.Config{Name: "c"})
	good := inbox.DeliveryOf(event("1", 1))
	without := func(h string) inbox.Delivery {
		d := good
		d.Headers = map[string]string{}
		for k, v := range good.Headers {
			if k != h {
				d.Headers[k] = v
			}
		}
		return d
	}
	cases := map[string]inbox.Delivery{
		"no headers":    {Body: []byte(`{}`)},
		"no event id":   without(wire.HeaderEventID),
		"no sequence":   without(wire.HeaderAggregateSequence),
		"body not JSON": {Body: []byte(`{"half":`), Headers: good.Headers},
	}
	bad := maps(good.Headers)
	bad[wire.HeaderAggregateSequence] = "0"
	cases["sequence 0"] = inbox.Delivery{Body: good.Body, Headers: bad}
	for name, d := range cases {
		o := c.Process(context.Background(), d)
		if o.Status != inbox.StatusUndecodable || o.Action() != inbox.ActionTerm || !errors.Is(o.Err, inbox.ErrUndecodable) {
			t.Errorf("%s: %s / %s / %v, want undecodable, term", name, o.Status, o.Action(), o.Err)
		}
	}
	// Header names in another case (a broker that folds them) still decode.
	lower := map[string]string{}
	for k, v := range good.Headers {
		lower[strings.ToLower(k)] = v
	}
	if o := c.Process(context.Background(), inbox.Delivery{Body: good.Body, Headers: lower}); o.Status != inbox.StatusApplied {
		t.Fatalf("lower-case headers: %s %v", o.Status, o.Err)
	}
	if f.count(t, "processed_events", "true") != 1 || c.Stats().Undecodable != int64(len(cases)) {
		t.Fatalf("stats %+v", c.Stats())
	}
}

func maps(m map[string]string) map[string]string {
	out := make(map[string]string, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}

func TestDecode(t *testing.T) {
	t.Parallel()
	m := event("7", 3)
	m.SchemaVersion = 2
	ev, err := inbox.Decode(inbox.DeliveryOf(m))
	pgtest.Must(t, err, "Decode")
	if ev.EventID != m.EventID || ev.AggregateType != "order" || ev.AggregateID != "7" || ev.AggregateSequence != 3 ||
		ev.EventType != m.EventType || ev.SchemaVersion != 2 || ev.PublishedSchemaVersion != 2 ||
		!ev.OccurredAt.Equal(m.OccurredAt) || string(ev.Payload) != string(m.Payload) ||
		ev.Headers["traceparent"] != m.Headers["traceparent"] || len(ev.Headers) != 1 {
		t.Fatalf("Decode = %+v from %+v", ev, m)
	}
}

// The handler sees the newest payload shape; the context carries the event and its
// idempotency key.
func TestUpcastingAndHandlerContext(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 2)
	type v1 struct {
		Amount string `json:"amount"` // "12.50"
	}
	type v2 struct {
		AmountCents int64 `json:"amount_cents"`
	}
	type v3 struct {
		AmountCents int64  `json:"amount_cents"`
		Currency    string `json:"currency"`
	}
	var up inbox.Upcasters
	up.Register("order.paid", 1, inbox.UpcastJSON(func(in v1) (v2, error) {
		whole, frac, _ := strings.Cut(in.Amount, ".")
		var cents int64
		for _, c := range whole + (frac + "00")[:2] {
			cents = cents*10 + int64(c-'0')
		}
		return v2{AmountCents: cents}, nil
	})).Register("order.paid", 2, inbox.UpcastJSON(func(in v2) (v3, error) {
		return v3{AmountCents: in.AmountCents, Currency: "EUR"}, nil
	}))

	var got []v3
	var keys []string
	h := inbox.HandleJSON(func(ctx context.Context, tx pgx.Tx, ev inbox.Event, p v3) error {
		if ev.SchemaVersion != 3 {
			t.Errorf("handler saw version %d", ev.SchemaVersion)
		}
		fromCtx, ok := inbox.EventFromContext(ctx)
		if !ok || fromCtx.EventID != ev.EventID {
			t.Errorf("EventFromContext = %v, %v", fromCtx.EventID, ok)
		}
		got = append(got, p)
		keys = append(keys, inbox.IdempotencyKey(ev))
		return nil
	})
	c, err := inbox.New(inbox.Pgx(f.pool), h, &inbox.Config{Name: "c", Schema: f.schema, Logger: quiet, Upcaster: up.Upcast})
	pgtest.Must(t, err, "New")

	old := event("1", 1)
	old.EventType, old.SchemaVersion, old.Payload = "order.paid", 1, []byte(`{"amount":"12.5"}`)
	mid := event("1", 2)
	mid.EventType, mid.SchemaVersion, mid.Payload = "order.paid", 2, []byte(`{"amount_cents":700}`)
	o := process(t, c, old, inbox.StatusApplied)
	if o.Event.PublishedSchemaVersion != 1 || o.Event.SchemaVersion != 3 {
		t.Fatalf("versions %d → %d", o.Event.PublishedSchemaVersion, o.Event.SchemaVersion)
	}
	process(t, c, mid, inbox.StatusApplied)
	if want := []v3{{1250, "EUR"}, {700, "EUR"}}; !slices.Equal(got, want) {
		t.Fatalf("handler saw %v, want %v", got, want)
	}
	if keys[0] != old.EventID.String() || keys[1] != mid.EventID.String() {
		t.Fatalf("idempotency keys %v", keys)
	}

	// A payload the upcaster cannot read fails (and is retried), it is not dropped.
	broken := event("1", 3)
	broken.EventType, broken.Payload = "order.paid", []byte(`{"amount":12}`)
	o = process(t, c, broken, inbox.StatusFailed)
	if o.Action() != inbox.ActionNak || !strings.Contains(o.Err.Error(), "upcast order.paid from v1 to v2") {
		t.Fatalf("outcome %s %v", o.Action(), o.Err)
	}
	// A payload the typed handler cannot decode fails too.
	wrong := event("1", 3)
	wrong.EventType, wrong.SchemaVersion, wrong.Payload = "order.paid", 3, []byte(`{"amount_cents":"x"}`)
	process(t, c, wrong, inbox.StatusFailed)
}

func TestUpcastersRegisterPanicsOnMistakes(t *testing.T) {
	t.Parallel()
	step := func(b []byte) ([]byte, error) { return b, nil }
	for name, fn := range map[string]func(){
		"twice":     func() { var u inbox.Upcasters; u.Register("x", 1, step).Register("x", 1, step) },
		"version 0": func() { var u inbox.Upcasters; u.Register("x", 0, step) },
		"nil step":  func() { var u inbox.Upcasters; u.Register("x", 1, nil) },
	} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("%s: no panic", name)
				}
			}()
			fn()
		}()
	}
	var empty inbox.Upcasters
	if v, p, err := empty.Upcast("x", 4, []byte("{}")); v != 4 || string(p) != "{}" || err != nil {
		t.Fatalf("empty registry changed the payload: %d %s %v", v, p, err)
	}
}

func TestConfigValidation(t *testing.T) {
	t.Parallel()
	for name, cfg := range map[string]*inbox.Config{
		"nil":         nil,
		"no name":     {},
		"bad policy":  {Name: "x", GapPolicy: "buffer"},
		"bad schema":  {Name: "x", Schema: strings.Repeat("s", 64)},
		"delays":      {Name: "x", RetryDelay: time.Minute, MaxRetryDelay: time.Second},
		"gap delays":  {Name: "x", GapRetryDelay: -time.Second},
		"NUL in name": {Name: "a\x00b"},
		"long name":   {Name: strings.Repeat("n", 201)},
	} {
		if err := cfg.Validate(); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	if err := (&inbox.Config{Name: "billing"}).Validate(); err != nil {
		t.Fatal(err)
	}
	if _, err := inbox.New[pgx.Tx](nil, nil, &inbox.Config{Name: "x"}); err == nil {
		t.Fatal("New without driver or handler accepted")
	}
}

// Many deliveries of many aggregates, shuffled and duplicated, from concurrent
// workers that retry what is refused (a broker in miniature): every aggregate is
// applied exactly 1..N in order.
func TestConcurrentShuffledDeliveriesApplyInOrder(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 8)
	c := f.consumer(t, inbox.Config{Name: "c"})
	const aggregates, perAggregate, workers = 20, 15, 6
	var queue []broker.Message
	for a := range aggregates {
		for _, m := range lane(string(rune('a'+a)), perAggregate) {
			queue = append(queue, m, m) // every event twice
		}
	}
	// Reverse each aggregate's events: the worst order for GapReject.
	slices.Reverse(queue)

	work := make(chan broker.Message, len(queue))
	for _, m := range queue {
		work <- m
	}
	var remaining atomic.Int64
	remaining.Store(int64(len(queue)))
	done := make(chan struct{})
	finish := func() {
		if remaining.Add(-1) == 0 {
			close(done)
		}
	}
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for {
				var m broker.Message
				select {
				case m = <-work:
				case <-done:
					return
				}
				o := c.Process(context.Background(), inbox.DeliveryOf(m))
				switch o.Action() {
				case inbox.ActionAck:
					finish()
				case inbox.ActionNak:
					work <- m // redeliver (at once: this broker has no delays)
				default:
					t.Errorf("unexpected outcome %s: %v", o.Status, o.Err)
					finish()
				}
			}
		})
	}
	wg.Wait()
	for a := range aggregates {
		got := f.sequences(t, "c", string(rune('a'+a)))
		if len(got) != perAggregate {
			t.Fatalf("aggregate %c: applied %v", 'a'+a, got)
		}
		for i, s := range got {
			if s != int64(i+1) {
				t.Fatalf("aggregate %c: applied %v, not 1..%d in order", 'a'+a, got, perAggregate)
			}
		}
	}
	if s := c.Stats(); s.Applied != aggregates*perAggregate || s.Duplicates != aggregates*perAggregate {
		t.Fatalf("stats %+v", s)
	}
}

// A hostile sequence cannot wedge an aggregate: the largest bigint is refused as
// undecodable (ErrSequenceOutOfRange) under every policy, the largest accepted
// one leaves a position after which later deliveries still run, a position left
// at the largest bigint by an older version wedges nothing, and SetPosition
// refuses it. Every statement afterwards succeeds ("bigint out of range" was
// returned forever before).
func TestHostileSequencesDoNotWedgeTheAggregate(t *testing.T) {
	t.Parallel()
	const maxBigint = math.MaxInt64
	for name, policy := range map[string]inbox.GapPolicy{"accept": inbox.GapAccept, "reject": inbox.GapReject} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			f := newFixture(t, 2)
			c := f.consumer(t, inbox.Config{Name: "c", GapPolicy: policy})
			ctx := context.Background()

			// Refused at the boundary, in both wire formats' header and a raw header
			// value; the aggregate then carries on.
			m := lane("1", 3)
			process(t, c, m[0], inbox.StatusApplied)
			for _, d := range []inbox.Delivery{
				inbox.DeliveryOf(event("1", maxBigint)),
				withHeader(inbox.DeliveryOf(event("1", 2)), wire.HeaderAggregateSequence, "9223372036854775807"),
				withHeader(inbox.DeliveryOf(event("1", 2)), wire.HeaderAggregateSequence, "+9223372036854775807"),
			} {
				o := c.Process(ctx, d)
				if o.Status != inbox.StatusUndecodable || !errors.Is(o.Err, inbox.ErrUndecodable) || !errors.Is(o.Err, inbox.ErrSequenceOutOfRange) {
					t.Fatalf("sequence %s: status %s, err %v; want undecodable, ErrSequenceOutOfRange",
						d.Headers[wire.HeaderAggregateSequence], o.Status, o.Err)
				}
			}
			process(t, c, m[1], inbox.StatusApplied)
			if err := c.SetPosition(ctx, "order", "1", maxBigint); !errors.Is(err, inbox.ErrSequenceOutOfRange) {
				t.Fatalf("SetPosition(MaxInt64) = %v, want ErrSequenceOutOfRange", err)
			}
			if pos, err := c.Position(ctx, "order", "1"); err != nil || pos != 2 {
				t.Fatalf("position %d, %v after the hostile deliveries; want 2", pos, err)
			}

			// The largest accepted sequence: a gap under GapAccept (applied; later
			// events are late), a rejected gap under GapReject; either way nothing
			// fails afterwards.
			top := event("1", inbox.MaxSequence)
			if policy == inbox.GapAccept {
				process(t, c, top, inbox.StatusApplied)
				o := process(t, c, m[2], inbox.StatusApplied)
				if !o.Late || o.Position != inbox.MaxSequence {
					t.Fatalf("outcome %+v, want a late event below MaxSequence", o)
				}
				process(t, c, top, inbox.StatusDuplicate)
			} else {
				process(t, c, top, inbox.StatusGapRejected)
				process(t, c, m[2], inbox.StatusApplied)
			}

			// A position at the largest bigint, as an older version could leave it:
			// deliveries still end, none fails.
			f.exec(t, "UPDATE "+f.table("consumer_positions")+" SET last_sequence = $1 WHERE consumer_name = 'c'", int64(maxBigint))
			late := event("1", 4)
			want := inbox.StatusDuplicate // at or below the position: done by position
			if policy == inbox.GapAccept {
				want = inbox.StatusApplied // a late event
			}
			process(t, c, late, want)
			process(t, c, late, inbox.StatusDuplicate)
			process(t, c, event("2", 1), inbox.StatusApplied) // other aggregates never noticed
		})
	}
}

// withHeader returns d with header name set to value.
func withHeader(d inbox.Delivery, name, value string) inbox.Delivery {
	h := make(map[string]string, len(d.Headers)+1)
	for k, v := range d.Headers {
		h[k] = v
	}
	h[name] = value
	d.Headers = h
	return d
}
