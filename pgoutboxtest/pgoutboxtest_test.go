package pgoutboxtest_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/goleak"

	"github.com/pgoutbox/pgoutbox"
	"github.com/pgoutbox/pgoutbox/broker"
	"github.com/pgoutbox/pgoutbox/broker/brokertest"
	"github.com/pgoutbox/pgoutbox/internal/pgtest"
	"github.com/pgoutbox/pgoutbox/pgoutboxtest"
	"github.com/pgoutbox/pgoutbox/relay"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// drainTimeout bounds each WaitDrained of these tests: generous, for a machine
// busy with other packages' tests.
const drainTimeout = time.Minute

// poolConns leaves room for the relay (DefaultWorkers + 2) beside the test.
const poolConns = 8

// setup returns a pool, a migrated schema of the test's own and a producer for it.
func setup(t *testing.T) (*pgxpool.Pool, string, *pgoutbox.Producer) {
	t.Helper()
	pool := pgtest.Pool(t, pgtest.URL(), poolConns)
	schema := pgoutboxtest.Schema(t, pool)
	prod, err := pgoutbox.NewProducer(&pgoutbox.Config{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	return pool, schema, prod
}

// enqueue commits events in one transaction.
func enqueue(t *testing.T, pool *pgxpool.Pool, prod *pgoutbox.Producer, events ...pgoutbox.Event) []pgoutbox.Enqueued {
	t.Helper()
	var res []pgoutbox.Enqueued
	err := pgx.BeginFunc(context.Background(), pool, func(tx pgx.Tx) error {
		var err error
		res, err = prod.EnqueueTx(context.Background(), tx, events...)
		return err
	})
	if err != nil {
		t.Fatalf("enqueue: %v", err)
	}
	return res
}

func event(aggType, aggID, typ string) pgoutbox.Event {
	return pgoutbox.Event{AggregateType: aggType, AggregateID: aggID, EventType: typ,
		Payload: map[string]string{"id": aggID, "type": typ}}
}

func waitDrained(t *testing.T, r *pgoutboxtest.Relay) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), drainTimeout)
	defer cancel()
	if err := r.WaitDrained(ctx); err != nil {
		t.Fatalf("WaitDrained: %v", err)
	}
}

func types(msgs []broker.Message) []string {
	var out []string
	for _, m := range msgs {
		out = append(out, m.AggregateType+"/"+m.AggregateID+"#"+string(rune('0'+m.AggregateSequence))+" "+m.EventType)
	}
	return out
}

func TestPublishedAfterWaitDrained(t *testing.T) {
	t.Parallel()
	pool, schema, prod := setup(t)
	r := pgoutboxtest.New(t, pool, &pgoutboxtest.Config{Schema: schema})

	res := enqueue(t, pool, prod,
		event("order", "1", "order.placed"),
		event("order", "2", "order.placed"),
		event("order", "1", "order.paid"))
	waitDrained(t, r)

	if got := r.Published(); len(got) != 3 {
		t.Fatalf("published %v, want 3 messages", types(got))
	}
	got := r.PublishedFor("order", "1")
	if want := []string{"order/1#1 order.placed", "order/1#2 order.paid"}; strings.Join(types(got), ",") != strings.Join(want, ",") {
		t.Fatalf("PublishedFor(order, 1) = %v, want %v", types(got), want)
	}
	if got[0].EventID != res[0].EventID || string(got[0].Payload) != `{"id": "1", "type": "order.placed"}` {
		t.Errorf("first message: id %s payload %s; enqueued id %s", got[0].EventID, got[0].Payload, res[0].EventID)
	}
	if got := r.PublishedFor("order", "3"); len(got) != 0 {
		t.Errorf("PublishedFor(order, 3) = %v, want none", types(got))
	}

	r.Reset()
	if got := r.Published(); len(got) != 0 {
		t.Fatalf("after Reset: %v", types(got))
	}
	enqueue(t, pool, prod, event("order", "2", "order.shipped"))
	waitDrained(t, r)
	if got := types(r.Published()); strings.Join(got, ",") != "order/2#2 order.shipped" {
		t.Fatalf("after Reset and one more event: %v", got)
	}
}

func TestRolledBackEventNeverPublished(t *testing.T) {
	t.Parallel()
	pool, schema, prod := setup(t)
	r := pgoutboxtest.New(t, pool, &pgoutboxtest.Config{Schema: schema})

	errRollback := errors.New("the handler failed")
	err := pgx.BeginFunc(context.Background(), pool, func(tx pgx.Tx) error {
		if _, err := prod.EnqueueTx(context.Background(), tx, event("order", "9", "order.placed")); err != nil {
			return err
		}
		return errRollback
	})
	if !errors.Is(err, errRollback) {
		t.Fatalf("transaction: %v", err)
	}
	enqueue(t, pool, prod, event("order", "10", "order.placed"))
	waitDrained(t, r)

	if got := types(r.Published()); strings.Join(got, ",") != "order/10#1 order.placed" {
		t.Fatalf("published %v, want only order/10's event", got)
	}
	// The rolled-back aggregate's next event is its first: nothing was left behind.
	enqueue(t, pool, prod, event("order", "9", "order.placed"))
	waitDrained(t, r)
	if got := types(r.PublishedFor("order", "9")); strings.Join(got, ",") != "order/9#1 order.placed" {
		t.Fatalf("order/9 after a committed retry: %v", got)
	}
}

// errRefused is the permanent refusal of the test's publisher.
var errRefused = errors.New("schema registry: order.cancelled is not a known subject")

func TestWaitDrainedNamesQuarantinedEvents(t *testing.T) {
	t.Parallel()
	pool, schema, prod := setup(t)
	pub := &brokertest.Recorder{Fail: func(m *broker.Message) error {
		if m.EventType == "order.cancelled" {
			return broker.Permanent(errRefused)
		}
		return nil
	}}
	r := pgoutboxtest.New(t, pool, &pgoutboxtest.Config{Schema: schema, Publisher: pub})

	res := enqueue(t, pool, prod,
		event("order", "1", "order.placed"),
		event("order", "1", "order.cancelled"),
		event("order", "1", "order.refunded"),
		event("order", "2", "order.placed"))

	ctx, cancel := context.WithTimeout(context.Background(), drainTimeout)
	defer cancel()
	err := r.WaitDrained(ctx)
	var qe *pgoutboxtest.QuarantinedError
	if !errors.As(err, &qe) {
		t.Fatalf("WaitDrained = %v, want a *QuarantinedError", err)
	}
	if len(qe.Events) != 1 || qe.Blocked != 1 {
		t.Fatalf("quarantined %+v, blocked %d; want order.cancelled and 1 blocked", qe.Events, qe.Blocked)
	}
	q := qe.Events[0]
	if q.ID != res[1].EventID || q.AggregateSequence != 2 || q.EventType != "order.cancelled" || !strings.Contains(q.LastError, errRefused.Error()) {
		t.Errorf("quarantined event %+v, want %s (#2 order.cancelled) with last error %q", q, res[1].EventID, errRefused)
	}
	for _, want := range []string{res[1].EventID.String(), "order/1 #2", errRefused.Error(), "1 more blocked"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not name %q", err, want)
		}
	}
	if got := types(r.Published()); len(got) != 2 {
		t.Errorf("published %v, want order/1's and order/2's first events", got)
	}
	if got := types(pub.Messages()); len(got) != 2 {
		t.Errorf("the publisher passed in stored %v, want 2 messages", got)
	}
}

func TestWaitDrainedRespectsContext(t *testing.T) {
	t.Parallel()
	pool, schema, prod := setup(t)
	pub := &brokertest.Recorder{}
	pub.Down.Store(true) // unreachable: retried for ever, never quarantined
	r := pgoutboxtest.New(t, pool, &pgoutboxtest.Config{Schema: schema, Publisher: pub})
	enqueue(t, pool, prod, event("order", "1", "order.placed"))

	const within = 500 * time.Millisecond
	ctx, cancel := context.WithTimeout(context.Background(), within)
	defer cancel()
	start := time.Now()
	err := r.WaitDrained(ctx)
	if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "pgoutboxtest: wait for drain") {
		t.Fatalf("WaitDrained with the broker down = %v, want the deadline", err)
	}
	// The count, unless a busy machine let the deadline pass before the first read.
	if strings.Contains(err.Error(), "still unpublished") && !strings.Contains(err.Error(), "1 event(s) still unpublished") {
		t.Errorf("WaitDrained with one event pending = %v, want the count 1", err)
	}
	if took := time.Since(start); took > within+10*time.Second {
		t.Errorf("WaitDrained returned %s after its deadline", took-within)
	}

	pub.Down.Store(false)
	waitDrained(t, r)
	if got := types(r.Published()); len(got) != 1 {
		t.Fatalf("after the broker came back: %v", got)
	}
}

func TestStartAndStopWithoutTB(t *testing.T) {
	t.Parallel()
	pool, schema, prod := setup(t)
	ctx, cancel := context.WithTimeout(context.Background(), drainTimeout)
	defer cancel()
	r, err := pgoutboxtest.Start(ctx, pool, &pgoutboxtest.Config{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	enqueue(t, pool, prod, event("order", "1", "order.placed"))
	if err := r.WaitDrained(ctx); err != nil {
		t.Fatal(err)
	}
	if err := r.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	if err := r.Stop(ctx); err != nil {
		t.Fatalf("second Stop: %v", err)
	}
	if got := types(r.Published()); len(got) != 1 {
		t.Fatalf("published %v", got)
	}
}

func TestConfigValidate(t *testing.T) {
	t.Parallel()
	if err := (*pgoutboxtest.Config)(nil).Validate(); err != nil {
		t.Fatalf("nil config: %v", err)
	}
	if err := (&pgoutboxtest.Config{Schema: "a", Relay: &relay.Config{Schema: "a"}}).Validate(); err != nil {
		t.Fatalf("same schema twice: %v", err)
	}
	err := (&pgoutboxtest.Config{
		Schema:      "a",
		Relay:       &relay.Config{Schema: "b", Workers: -1},
		DrainPoll:   -time.Second,
		StopTimeout: -time.Second,
	}).Validate()
	for _, want := range []string{
		`pgoutboxtest: Config.Relay.Schema ("b") must be empty or Config.Schema ("a")`,
		"Config.DrainPoll (-1s) must be positive",
		"Config.StopTimeout (-1s) must be positive",
		"pgoutboxtest: Config.Relay: relay: Config.Workers (-1)",
	} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("error %v lacks %q", err, want)
		}
	}
	if _, err := pgoutboxtest.Start(context.Background(), nil, nil); err == nil {
		t.Error("Start without a pool succeeded")
	}
}

func TestSchemaDroppedAtCleanup(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t, pgtest.URL(), poolConns)
	var schema string
	t.Run("uses", func(t *testing.T) {
		schema = pgoutboxtest.Schema(t, pool)
		var tables int
		if err := pool.QueryRow(context.Background(),
			"SELECT count(*) FROM pg_tables WHERE schemaname = $1 AND tablename IN ('outbox_events', 'processed_events')", schema).Scan(&tables); err != nil {
			t.Fatal(err)
		}
		if tables != 2 {
			t.Fatalf("schema %s has %d of outbox_events and processed_events", schema, tables)
		}
	})
	var exists bool
	if err := pool.QueryRow(context.Background(),
		"SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = $1)", schema).Scan(&exists); err != nil {
		t.Fatal(err)
	}
	if exists {
		t.Fatalf("schema %s outlived its test", schema)
	}
}

// With the default config a relay serves only a fresh schema of its own: never
// the database's real outbox (public here, in a database of this test's own,
// holding a live pending event), never another default relay's schema. Each
// relay records only its own events, the live event stays pending, and each
// fresh schema is gone once its relay stopped. Serving public takes naming it.
func TestDefaultServesOnlyAFreshSchema(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.Pool(t, pgtest.Database(t), 2*poolConns)
	pgtest.MigrateSchema(t, pool, "public")
	live, err := pgoutbox.NewProducer(nil) // public
	pgtest.Must(t, err, "producer")
	liveRes := enqueue(t, pool, live, event("order", "live", "order.placed"))

	var schemas []string
	t.Run("relays", func(t *testing.T) {
		viaNew := pgoutboxtest.New(t, pool, nil)
		viaStart, err := pgoutboxtest.Start(ctx, pool, &pgoutboxtest.Config{Relay: &relay.Config{Logger: slog.New(slog.DiscardHandler)}})
		pgtest.Must(t, err, "Start")
		t.Cleanup(func() { _ = viaStart.Stop(ctx) }) // should the test fail before its own Stop
		relays := []*pgoutboxtest.Relay{viaNew, viaStart}
		for i, r := range relays {
			s := r.Schema()
			if s == "public" || s == "" || slices.Contains(schemas, s) {
				t.Fatalf("relay %d serves %q (others: %v), want a fresh schema", i, s, schemas)
			}
			schemas = append(schemas, s)
			prod, err := pgoutbox.NewProducer(&pgoutbox.Config{Schema: s})
			pgtest.Must(t, err, "producer")
			enqueue(t, pool, prod, event("order", fmt.Sprint(i), "order.placed"))
		}
		for i, r := range relays {
			waitDrained(t, r)
			if got := types(r.Published()); len(got) != 1 || got[0] != fmt.Sprintf("order/%d#1 order.placed", i) {
				t.Fatalf("relay %d published %v, want its own event only", i, got)
			}
		}
		pgtest.Must(t, viaStart.Stop(ctx), "Stop")
		pgtest.Must(t, viaStart.Stop(ctx), "second Stop")
		if schemaExists(t, pool, schemas[1]) {
			t.Fatalf("Stop left schema %s behind", schemas[1])
		}
	})
	if schemaExists(t, pool, schemas[0]) {
		t.Fatalf("the test's end left schema %s behind", schemas[0])
	}
	var pending int
	pgtest.Must(t, pool.QueryRow(ctx, "SELECT count(*) FROM public.outbox_events WHERE published_at IS NULL AND event_id = $1",
		liveRes[0].EventID).Scan(&pending), "live event")
	if pending != 1 {
		t.Fatal("a default relay published the database's live event")
	}

	// Named explicitly, public is served.
	r := pgoutboxtest.New(t, pool, &pgoutboxtest.Config{Schema: "public"})
	waitDrained(t, r)
	if got := r.Published(); len(got) != 1 || got[0].EventID != liveRes[0].EventID {
		t.Fatalf("explicit public: published %v", types(got))
	}
}

func schemaExists(t *testing.T, pool *pgxpool.Pool, schema string) bool {
	t.Helper()
	var exists bool
	pgtest.Must(t, pool.QueryRow(context.Background(),
		"SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = $1)", schema).Scan(&exists), "schema exists")
	return exists
}
