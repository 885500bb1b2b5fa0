// Package inboxtest is the conformance suite of the inbox subscribers: the
// cases every subscriber (natsinbox, rabbitinbox, kafkainbox) passes against
// its real broker, feeding a real inbox.Consumer on a real PostgreSQL
// (127.0.0.1:5432, database test, as the repository's other tests; see
// internal/pgtest).
//
// # Adding a subscriber
//
// A subscriber for a new broker is its broker-specific part plus the shared
// core (inbox/internal/subscriber, for brokers that settle message by message)
// and a test that runs this suite with a small Harness:
//
//	func TestConformance(t *testing.T) {
//		inboxtest.Run(t, inboxtest.Harness{
//			New: func(t *testing.T) inboxtest.Target { return newTarget(t) }, // a fresh stream/queue/topic
//		})
//	}
//
// The Target publishes outbox messages to the fresh destination, makes a
// started subscriber on it for a given inbox.Processor, and says which
// optional capabilities it has (a raw undecodable message, a connection
// closed by the server). A case the broker cannot do is skipped with the
// reason. The subscriber's Start and Stop also pass the one lifecycle table
// (internal/lifecycle/lifecycletest), under the subtest Lifecycle.
//
// # Cases
//
//	AtLeastOnceRedelivery  a handler error: redelivered, applied once
//	AckOnlyAfterCommit     committed but not acked (the crash between commit
//	                       and ack): the redelivery is absorbed as a duplicate
//	DuplicateAbsorbed      every message delivered three times: applied once
//	GapPolicies            out-of-order sequences: under GapReject refused,
//	                       then applied in order; under GapAccept applied once each
//	PoisonHandling         an undecodable message is terminated, rejected or
//	                       skipped, and the next event is applied
//	ProducerHeaders        the handler sees the producer's headers, not the broker's
//	BrokerRestart          the connection closed by the server: the subscriber
//	                       reconnects and keeps applying
//	StopFinishesInFlight   a graceful Stop lets the delivery in progress commit,
//	                       and hands back the rest: the next subscriber gets them
//	                       within ReleasedWithin
//	StopDeadlineAbandonsInFlight
//	                       Stop's deadline passed: the delivery in progress rolls
//	                       back, and the next subscriber applies it
//	Lifecycle              the lifecycle table, StopDeadline included
//
// Outside the standard library it pulls in pgx and the OpenTelemetry trace API,
// through package inbox; each subscriber's test brings its own broker.
package inboxtest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/pgoutbox/broker"
	"github.com/pgoutbox/pgoutbox/inbox"
	fixtures "github.com/pgoutbox/pgoutbox/internal/inboxtest"
	"github.com/pgoutbox/pgoutbox/internal/lifecycle/lifecycletest"
	"github.com/pgoutbox/pgoutbox/internal/pgtest"
	"github.com/pgoutbox/pgoutbox/internal/wait"
)

// Settle bounds how long the suite waits for messages to be applied.
const Settle = time.Minute

// ReleasedWithin bounds how long messages handed back at a graceful Stop take to
// reach the next subscriber: well below a broker's redelivery timeout
// (JetStream's AckWait defaults to 30s), so that a message abandoned instead of
// handed back shows.
const ReleasedWithin = 20 * time.Second

// Subscriber is a subscriber as the suite drives it.
type Subscriber = lifecycletest.Service

// Knobs are the subscriber settings a case asks for.
type Knobs struct {
	// Concurrency is the subscriber's Config.Concurrency; 0 means its default.
	Concurrency int
}

// Target is one fresh destination (stream, queue, topic) on the broker.
type Target interface {
	// Publish puts msgs on the destination, in order, as the relay sends them.
	// Publishing a message again stores another copy (a relay re-publish).
	Publish(t *testing.T, msgs ...broker.Message)
	// NewSubscriber makes a subscriber of the destination for proc, not
	// started. The suite starts and stops it.
	NewSubscriber(t *testing.T, proc inbox.Processor, k Knobs) Subscriber
}

// RawPublisher is a Target that can publish a message that is not an outbox
// event (no Outbox-* headers), for PoisonHandling.
type RawPublisher interface {
	PublishRaw(t *testing.T, body []byte)
}

// Restarter is a Target that can have the server close the connections of its
// subscribers (an operator closing them, a broker restart), for BrokerRestart.
type Restarter interface {
	CloseConnections(t *testing.T)
}

// Harness makes Targets for the suite.
type Harness struct {
	// New returns a fresh destination; it is called once per case.
	New func(t *testing.T) Target
	// NewRestartable, if set, returns the fresh destination of BrokerRestart,
	// when only some (a broker of the test's own) can restart; nil means New.
	NewRestartable func(t *testing.T) Target
	// Skip names cases the broker cannot do ("BrokerRestart",
	// "GapPolicies/Reject"), with the reason.
	Skip map[string]string
}

// Run runs the suite, each case a parallel subtest.
func Run(t *testing.T, h Harness) {
	cases := []struct {
		name string
		run  func(t *testing.T, e *env)
	}{
		{"AtLeastOnceRedelivery", atLeastOnce},
		{"AckOnlyAfterCommit", ackOnlyAfterCommit},
		{"DuplicateAbsorbed", duplicateAbsorbed},
		{"GapPolicies", gapPolicies},
		{"PoisonHandling", poison},
		{"ProducerHeaders", producerHeaders},
		{"BrokerRestart", brokerRestart},
		{"StopFinishesInFlight", stopFinishesInFlight},
		{"StopDeadlineAbandonsInFlight", stopDeadlineAbandons},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if why, ok := h.Skip[c.name]; ok {
				t.Skip(why)
			}
			t.Parallel()
			c.run(t, &env{h: h})
		})
	}
	t.Run("Lifecycle", func(t *testing.T) {
		t.Parallel()
		lifecycle(t, h)
	})
}

// env is one case's world: a migrated schema with the effects table, and the
// broker's destination.
type env struct {
	h Harness
	*fixtures.Effects
	target Target
}

func (e *env) setUp(t *testing.T) {
	t.Helper()
	pool, schema := pgtest.Migrated(t, 6)
	e.Effects = fixtures.NewEffects(t, pool, schema)
	e.target = e.h.New(t)
}

// start makes and starts a subscriber, stopped when the test ends.
func (e *env) start(t *testing.T, proc inbox.Processor, k Knobs) Subscriber {
	t.Helper()
	s := e.target.NewSubscriber(t, proc, k)
	pgtest.Must(t, s.Start(context.Background()), "Start")
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := s.Stop(ctx); err != nil {
			t.Errorf("Stop: %v", err)
		}
	})
	return s
}

func (e *env) applied(t *testing.T, n int) {
	t.Helper()
	wait.For(t, Settle, fmt.Sprintf("%d effects", n), func() bool { return e.Count(t, "effects", "true") >= n })
}

// ProcessorFunc is an inbox.Processor made of a function.
type ProcessorFunc struct {
	ProcName string
	Fn       func(ctx context.Context, d inbox.Delivery) inbox.Outcome
}

// Name returns ProcName.
func (p ProcessorFunc) Name() string { return p.ProcName }

// Process calls Fn.
func (p ProcessorFunc) Process(ctx context.Context, d inbox.Delivery) inbox.Outcome {
	return p.Fn(ctx, d)
}

// atLeastOnce: a failing handler rolls back and the message comes again until
// it succeeds; the effect happens once and the failures leave nothing behind.
func atLeastOnce(t *testing.T, e *env) {
	e.setUp(t)
	e.target.Publish(t, fixtures.Event("7", 1))
	var calls atomic.Int32
	c := e.Consumer(t, inbox.Config{RetryDelay: 20 * time.Millisecond}, func(ctx context.Context, tx pgx.Tx, ev inbox.Event) error {
		if err := e.Record(ctx, tx, ev); err != nil {
			return err
		}
		if calls.Add(1) <= 2 {
			return errors.New("payment service down")
		}
		return nil
	})
	e.start(t, c, Knobs{Concurrency: 1})
	e.applied(t, 1)
	wait.For(t, Settle, "the applied outcome", func() bool { return c.Stats().Applied == 1 })
	if n := e.Count(t, "effects", "true"); n != 1 || calls.Load() != 3 {
		t.Fatalf("%d effects after %d handler calls, want 1 after 3", n, calls.Load())
	}
	if st := c.Stats(); st.Failed != 2 {
		t.Fatalf("inbox stats %+v, want 2 failed", st)
	}
}

// ackOnlyAfterCommit: the first delivery commits but its settlement is lost, as
// in a crash between commit and ack (the processor reports a failure after the
// commit, so the subscriber does not ack). The broker delivers it again and the
// inbox absorbs it as a duplicate.
func ackOnlyAfterCommit(t *testing.T, e *env) {
	e.setUp(t)
	e.target.Publish(t, fixtures.Event("9", 1))
	c := e.Consumer(t, inbox.Config{RetryDelay: 20 * time.Millisecond}, nil)
	var first atomic.Bool
	var mu sync.Mutex
	var statuses []inbox.Status
	proc := ProcessorFunc{ProcName: c.Name(), Fn: func(ctx context.Context, d inbox.Delivery) inbox.Outcome {
		o := c.Process(ctx, d)
		mu.Lock()
		statuses = append(statuses, o.Status)
		mu.Unlock()
		if o.Status == inbox.StatusApplied && first.CompareAndSwap(false, true) {
			// Committed; the ack never happens.
			return inbox.Outcome{Status: inbox.StatusFailed, Err: errors.New("crash after commit"), RetryAfter: 20 * time.Millisecond}
		}
		return o
	}}
	e.start(t, proc, Knobs{Concurrency: 1})
	wait.For(t, Settle, "the redelivery to be found a duplicate", func() bool { return c.Stats().Duplicates >= 1 })
	if n := e.Count(t, "effects", "true"); n != 1 {
		t.Fatalf("%d effects, want 1", n)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(statuses) < 2 || statuses[0] != inbox.StatusApplied || statuses[1] != inbox.StatusDuplicate {
		t.Fatalf("outcomes %v, want applied then duplicate", statuses)
	}
}

// duplicateAbsorbed: every message is on the broker three times; each event is
// applied once.
func duplicateAbsorbed(t *testing.T, e *env) {
	e.setUp(t)
	var msgs []broker.Message
	events := 0
	for a := range 5 {
		l := fixtures.Lane(fmt.Sprint(a), 4)
		events += len(l)
		for range 3 {
			msgs = append(msgs, l...)
		}
	}
	e.target.Publish(t, msgs...)
	c := e.Consumer(t, inbox.Config{GapRetryDelay: 20 * time.Millisecond}, nil)
	e.start(t, c, Knobs{})
	wait.For(t, Settle, "every copy to be processed", func() bool {
		st := c.Stats()
		return st.Applied == int64(events) && st.Duplicates == int64(2*events)
	})
	if n := e.Count(t, "effects", "true"); n != events {
		t.Fatalf("%d effects, want %d", n, events)
	}
	for a := range 5 {
		if got := e.Sequences(t, fmt.Sprint(a)); !slices.Equal(got, []int64{1, 2, 3, 4}) {
			t.Fatalf("aggregate %d applied %v, want [1 2 3 4]", a, got)
		}
	}
}

// gapPolicies: sequence 3 arrives before 2.
func gapPolicies(t *testing.T, e *env) {
	t.Run("Reject", func(t *testing.T) {
		if why, ok := e.h.Skip["GapPolicies/Reject"]; ok {
			t.Skip(why)
		}
		t.Parallel()
		e := &env{h: e.h}
		e.setUp(t)
		l := fixtures.Lane("42", 4)
		e.target.Publish(t, l[0], l[2], l[1], l[3])
		c := e.Consumer(t, inbox.Config{GapRetryDelay: 20 * time.Millisecond}, nil)
		e.start(t, c, Knobs{Concurrency: 1})
		e.applied(t, 4)
		if got := e.Sequences(t, "42"); !slices.Equal(got, []int64{1, 2, 3, 4}) {
			t.Fatalf("applied %v, want [1 2 3 4]", got)
		}
		if st := c.Stats(); st.Gaps < 1 {
			t.Fatalf("inbox stats %+v: want at least one rejected gap", st)
		}
	})
	t.Run("Accept", func(t *testing.T) {
		t.Parallel()
		e := &env{h: e.h}
		e.setUp(t)
		l := fixtures.Lane("43", 4)
		e.target.Publish(t, l[0], l[2], l[1], l[3])
		c := e.Consumer(t, inbox.Config{GapPolicy: inbox.GapAccept}, nil)
		e.start(t, c, Knobs{Concurrency: 1})
		e.applied(t, 4)
		wait.For(t, Settle, "four applied outcomes", func() bool { return c.Stats().Applied == 4 })
		got := e.Sequences(t, "43")
		if slices.Sort(got); !slices.Equal(got, []int64{1, 2, 3, 4}) {
			t.Fatalf("applied %v, want each of 1..4 once", got)
		}
		if st := c.Stats(); st.Gaps < 1 {
			t.Fatalf("inbox stats %+v: want the gap reported", st)
		}
	})
}

// poison: a message that is not an outbox event is settled for good (terminated,
// rejected or skipped, as the broker allows) and does not hold up the next one.
func poison(t *testing.T, e *env) {
	e.setUp(t)
	raw, ok := e.target.(RawPublisher)
	if !ok {
		t.Skip("the target cannot publish a raw message")
	}
	raw.PublishRaw(t, []byte(`{"no":"headers"}`))
	e.target.Publish(t, fixtures.Event("1", 1))
	c := e.Consumer(t, inbox.Config{}, nil)
	e.start(t, c, Knobs{Concurrency: 1})
	e.applied(t, 1)
	// The applied row commits before the consumer counts its outcome: wait on
	// both counts, then check neither went past one.
	wait.For(t, Settle, "the undecodable and the applied outcomes", func() bool {
		st := c.Stats()
		return st.Undecodable >= 1 && st.Applied >= 1
	})
	if st := c.Stats(); st.Undecodable != 1 || st.Applied != 1 {
		t.Fatalf("inbox stats %+v, want 1 undecodable and 1 applied", st)
	}
}

// producerHeaders: the handler sees the producer's headers, not the broker's.
func producerHeaders(t *testing.T, e *env) {
	e.setUp(t)
	m := fixtures.Event("1", 1)
	m.Headers = map[string]string{"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", "tenant": "eu"}
	e.target.Publish(t, m)
	got := make(chan map[string]string, 1)
	c := e.Consumer(t, inbox.Config{}, func(ctx context.Context, tx pgx.Tx, ev inbox.Event) error {
		select {
		case got <- ev.Headers:
		default:
		}
		return nil
	})
	e.start(t, c, Knobs{})
	select {
	case h := <-got:
		if len(h) != 2 || h["traceparent"] != m.Headers["traceparent"] || h["tenant"] != "eu" {
			t.Fatalf("handler saw headers %v, want the producer's %v", h, m.Headers)
		}
	case <-time.After(Settle):
		t.Fatalf("no delivery within %s", Settle)
	}
}

// brokerRestart: the server closes the subscriber's connection between two
// batches; the subscriber reconnects and applies the second.
func brokerRestart(t *testing.T, e *env) {
	e.setUp(t)
	if e.h.NewRestartable != nil {
		e.target = e.h.NewRestartable(t)
	}
	r, ok := e.target.(Restarter)
	if !ok {
		t.Skip("the target cannot close connections from the server")
	}
	l := fixtures.Lane("5", 6)
	e.target.Publish(t, l[:3]...)
	c := e.Consumer(t, inbox.Config{GapRetryDelay: 20 * time.Millisecond}, nil)
	e.start(t, c, Knobs{})
	e.applied(t, 3)
	r.CloseConnections(t)
	e.target.Publish(t, l[3:]...)
	e.applied(t, 6)
	if got := e.Sequences(t, "5"); !slices.Equal(got, []int64{1, 2, 3, 4, 5, 6}) {
		t.Fatalf("applied %v, want 1..6 once each, in order", got)
	}
}

// lifecycle runs the lifecycle table on the subscriber; Busy is a handler that
// blocks until released (or its transaction is abandoned).
func lifecycle(t *testing.T, h Harness) {
	type busy struct {
		entered chan struct{}
		release chan struct{}
		once    sync.Once
		publish func()
	}
	made := map[Subscriber]*busy{}
	var mu sync.Mutex
	lifecycletest.Run(t, lifecycletest.Harness{
		New: func(t *testing.T) lifecycletest.Service {
			e := &env{h: h}
			e.setUp(t)
			b := &busy{entered: make(chan struct{}, 1), release: make(chan struct{})}
			c := e.Consumer(t, inbox.Config{}, func(ctx context.Context, tx pgx.Tx, ev inbox.Event) error {
				select {
				case b.entered <- struct{}{}:
				default:
				}
				select {
				case <-b.release:
				case <-ctx.Done():
				}
				return e.Record(ctx, tx, ev)
			})
			s := e.target.NewSubscriber(t, c, Knobs{Concurrency: 1})
			t.Cleanup(func() {
				b.once.Do(func() { close(b.release) })
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				defer cancel()
				_ = s.Stop(ctx) // the table has stopped it; a stop left over is done here
			})
			mu.Lock()
			made[s] = b
			mu.Unlock()
			b.publish = func() { e.target.Publish(t, fixtures.Event("1", 1)) }
			return s
		},
		Busy: func(t *testing.T, s lifecycletest.Service) func() {
			mu.Lock()
			b := made[s]
			mu.Unlock()
			b.publish()
			select {
			case <-b.entered:
			case <-time.After(Settle):
				t.Fatalf("the handler was not called within %s", Settle)
			}
			return func() { b.once.Do(func() { close(b.release) }) }
		},
	})
}

// blocking returns a consumer whose handler signals entered and waits for
// release (or for its transaction to be abandoned) before recording the effect.
func (e *env) blocking(t *testing.T) (c *inbox.Consumer[pgx.Tx], entered chan struct{}, release func()) {
	entered = make(chan struct{}, 16)
	ch := make(chan struct{})
	var once sync.Once
	c = e.Consumer(t, inbox.Config{}, func(ctx context.Context, tx pgx.Tx, ev inbox.Event) error {
		entered <- struct{}{}
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		}
		return e.Record(ctx, tx, ev)
	})
	release = func() { once.Do(func() { close(ch) }) }
	t.Cleanup(release)
	return c, entered, release
}

// stopFinishesInFlight: five aggregates, one subscriber processing one at a
// time; Stop while the first is in its handler waits for it, starts no other,
// and the next subscriber applies the four others promptly.
func stopFinishesInFlight(t *testing.T, e *env) {
	e.setUp(t)
	for a := range 5 {
		e.target.Publish(t, fixtures.Event(fmt.Sprint(a), 1))
	}
	c, entered, release := e.blocking(t)
	s := e.target.NewSubscriber(t, c, Knobs{Concurrency: 1})
	pgtest.Must(t, s.Start(context.Background()), "Start")
	<-entered
	st, ok := s.(interface{ Stopping() <-chan struct{} })
	if !ok {
		t.Fatalf("%T has no Stopping method: the case cannot tell when the stop began", s)
	}
	stopped := make(chan error, 1)
	go func() { stopped <- s.Stop(context.Background()) }()
	// Released only once the stop has begun: released earlier, the worker
	// rightly takes the next delivery.
	select {
	case <-st.Stopping():
	case <-time.After(Settle):
		t.Fatalf("the stop did not begin within %s", Settle)
	}
	select {
	case err := <-stopped:
		t.Fatalf("Stop returned (%v) while a delivery was in progress", err)
	default:
	}
	release()
	pgtest.Must(t, <-stopped, "Stop")
	select {
	case <-entered:
		t.Fatal("a second delivery started after Stop")
	default:
	}
	if n := e.Count(t, "effects", "true"); n != 1 {
		t.Fatalf("%d effects after Stop, want the one in flight", n)
	}
	e.start(t, e.Consumer(t, inbox.Config{}, nil), Knobs{})
	wait.For(t, ReleasedWithin, "the handed-back messages to be applied", func() bool { return e.Count(t, "effects", "true") == 5 })
}

// stopDeadlineAbandons: Stop's deadline passes with a delivery in its handler:
// the stop turns hard, the transaction rolls back, and the next subscriber
// applies the event.
func stopDeadlineAbandons(t *testing.T, e *env) {
	e.setUp(t)
	e.target.Publish(t, fixtures.Event("1", 1))
	c, entered, _ := e.blocking(t)
	s := e.target.NewSubscriber(t, c, Knobs{Concurrency: 1})
	pgtest.Must(t, s.Start(context.Background()), "Start")
	<-entered
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	if err := s.Stop(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Stop = %v, want the deadline", err)
	}
	if n := e.Count(t, "effects", "true") + e.Count(t, "processed_events", "true"); n != 0 {
		t.Fatalf("%d rows left by an abandoned delivery", n)
	}
	e.start(t, e.Consumer(t, inbox.Config{}, nil), Knobs{})
	wait.For(t, ReleasedWithin, "the abandoned event to be applied", func() bool { return e.Count(t, "effects", "true") == 1 })
}
