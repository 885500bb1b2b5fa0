package natsinbox_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	natsgo "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/pgoutbox/pgoutbox/inbox"
	"github.com/pgoutbox/pgoutbox/inbox/natsinbox"
	"github.com/pgoutbox/pgoutbox/internal/inboxtest"
	"github.com/pgoutbox/pgoutbox/internal/natstest"
	"github.com/pgoutbox/pgoutbox/internal/pgtest"
)

// Acceptance: every message is on the stream three times (three Nats-Msg-Ids, so
// JetStream delivers each copy); the business table changes once per event.
func TestEveryMessageDeliveredThreeTimesAppliesOnce(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 6)
	var msgs []published
	var events int
	for a := range 10 {
		l := inboxtest.Lane(fmt.Sprint(a), 5)
		events += len(l)
		for copyNo := range 3 {
			for _, m := range l {
				msgs = append(msgs, published{m, fmt.Sprintf("%s-%d", m.EventID, copyNo)})
			}
		}
	}
	e.publish(t, msgs)
	c := e.Consumer(t, inbox.Config{}, nil)
	e.subscribe(t, connect(t), c, natsinbox.Config{})
	waitFor(t, time.Minute, "every copy to be acked", func() bool { return e.settled(t, "billing") })
	if n := e.Count(t, "effects", "true"); n != events {
		t.Fatalf("%d effects, want %d", n, events)
	}
	if s := c.Stats(); s.Applied != int64(events) || s.Duplicates != int64(2*events) {
		t.Fatalf("stats %+v, want %d applied and %d duplicates", s, events, 2*events)
	}
}

// Acceptance (reject): sequence 3 is on the stream before 2. It is refused, nacked
// with a delay, redelivered after 2 and applied in order.
func TestGapRejectedThenAppliedInOrder(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 4)
	l := inboxtest.Lane("42", 4)
	e.publish(t, once(l[0], l[2], l[1], l[3]))
	c := e.Consumer(t, inbox.Config{GapRetryDelay: 20 * time.Millisecond}, nil)
	s := e.subscribe(t, connect(t), c, natsinbox.Config{Concurrency: 1})
	waitFor(t, 30*time.Second, "all four to be applied", func() bool { return e.settled(t, "billing") })
	if got := e.Sequences(t, "42"); !slices.Equal(got, []int64{1, 2, 3, 4}) {
		t.Fatalf("applied %v, want [1 2 3 4]", got)
	}
	if st := c.Stats(); st.Gaps < 1 || st.Applied != 4 {
		t.Fatalf("inbox stats %+v: want at least one rejected gap", st)
	}
	if st := s.Stats(); st.Naked < 1 || st.Acked != 4 {
		t.Fatalf("subscriber stats %+v", st)
	}
}

// Acceptance: a failing handler rolls back, leaves no processed_events row, and the
// message is redelivered until it succeeds; the effect happens once.
func TestHandlerErrorRedelivers(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 4)
	m := inboxtest.Event("7", 1)
	e.publish(t, once(m))
	var calls atomic.Int32
	var mu sync.Mutex
	var rowsSeen []int // committed rows when each attempt runs: what failures left behind
	c := e.Consumer(t, inbox.Config{RetryDelay: 20 * time.Millisecond}, func(ctx context.Context, tx pgx.Tx, ev inbox.Event) error {
		if err := e.Record(ctx, tx, ev); err != nil {
			return err
		}
		var n int
		err := e.pool.QueryRow(ctx, "SELECT (SELECT count(*) FROM "+e.Table("processed_events")+
			") + (SELECT count(*) FROM "+e.Table("effects")+")").Scan(&n)
		mu.Lock()
		rowsSeen = append(rowsSeen, n)
		mu.Unlock()
		if err != nil {
			return err
		}
		if calls.Add(1) <= 2 {
			return errors.New("payment service down")
		}
		return nil
	})
	e.subscribe(t, connect(t), c, natsinbox.Config{Concurrency: 1})
	waitFor(t, 30*time.Second, "the message to be acked", func() bool { return e.settled(t, "billing") })
	mu.Lock()
	defer mu.Unlock()
	if calls.Load() != 3 || !slices.Equal(rowsSeen, []int{0, 0, 0}) {
		t.Fatalf("%d handler calls; committed rows seen at each: %v (want 3 calls, nothing left by the failures)", calls.Load(), rowsSeen)
	}
	if n := e.Count(t, "effects", "true"); n != 1 {
		t.Fatalf("%d effects, want 1", n)
	}
	if st := c.Stats(); st.Failed != 2 || st.Applied != 1 {
		t.Fatalf("stats %+v", st)
	}
}

// A message that is not an outbox event is terminated, not redelivered forever.
func TestUndecodableMessageIsTerminated(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 4)
	_, err := e.target.JS.PublishMsg(context.Background(), &natsgo.Msg{
		Subject: e.target.Prefix + ".order.updated", Data: []byte(`{"no":"headers"}`)})
	pgtest.Must(t, err, "publish")
	good := inboxtest.Event("1", 1)
	e.publish(t, once(good))
	c := e.Consumer(t, inbox.Config{}, nil)
	s := e.subscribe(t, connect(t), c, natsinbox.Config{})
	waitFor(t, 30*time.Second, "both messages to be settled", func() bool { return e.settled(t, "billing") })
	if st := s.Stats(); st.Terminated != 1 || st.Acked != 1 {
		t.Fatalf("subscriber stats %+v", st)
	}
	if info := e.consumerInfo(t, "billing"); info.NumRedelivered != 0 {
		t.Fatalf("%d redeliveries", info.NumRedelivered)
	}
}

// Acceptance: four instances, each its own subscriber and connection on one shared
// durable consumer, consume 10,000 events over 200 aggregates, with 5% of the events
// on the stream twice (a relay re-publish under another msg id). Each aggregate's
// events are applied exactly once, 1..N in order.
func TestFourInstancesApplyTenThousandEventsInOrder(t *testing.T) {
	t.Parallel()
	const aggregates, perAggregate, instances = 200, 50, 4
	e := newEnv(t, instances*2+4)
	rng := rand.New(rand.NewPCG(5, 7))

	// Per aggregate, stream order is sequence order (what the relay guarantees);
	// aggregates are interleaved at random, so consecutive events of one aggregate
	// sometimes sit side by side and reach different instances at once.
	next := make([]int, aggregates)
	lanes := make([][]published, aggregates)
	for a := range lanes {
		lanes[a] = once(inboxtest.Lane(fmt.Sprintf("agg-%03d", a), perAggregate)...)
	}
	type slot struct {
		at float64
		p  published
	}
	var order []slot
	live := make([]int, aggregates)
	for a := range live {
		live[a] = a
	}
	for i := 0; len(live) > 0; i++ {
		k := rng.IntN(len(live))
		a := live[k]
		p := lanes[a][next[a]]
		order = append(order, slot{float64(i), p})
		if rng.IntN(20) == 0 { // a duplicate, a little later
			order = append(order, slot{float64(i+1+rng.IntN(300)) + 0.5, published{p.m, p.msgID + "-republished"}})
		}
		if next[a]++; next[a] == perAggregate {
			live = slices.Delete(live, k, k+1)
		}
	}
	sort.SliceStable(order, func(i, j int) bool { return order[i].at < order[j].at })
	msgs := make([]published, len(order))
	for i, s := range order {
		msgs[i] = s.p
	}
	e.publish(t, msgs)
	dups := len(msgs) - aggregates*perAggregate

	start := time.Now()
	var consumers []*inbox.Consumer[pgx.Tx]
	var subs []*natsinbox.Subscriber
	for range instances {
		c := e.Consumer(t, inbox.Config{}, nil)
		consumers = append(consumers, c)
		subs = append(subs, e.subscribe(t, connect(t), c, natsinbox.Config{Concurrency: 2, MaxAckPending: 500}))
	}
	waitFor(t, 3*time.Minute, "every message to be applied and acked", func() bool {
		return e.Count(t, "effects", "true") == aggregates*perAggregate && e.settled(t, "billing")
	})
	elapsed := time.Since(start)

	for a := range aggregates {
		got := e.Sequences(t, fmt.Sprintf("agg-%03d", a))
		if len(got) != perAggregate {
			t.Fatalf("aggregate %d: %d effects, want %d", a, len(got), perAggregate)
		}
		for i, s := range got {
			if s != int64(i+1) {
				t.Fatalf("aggregate %d applied out of order: %v", a, got)
			}
		}
	}
	var total inbox.Stats
	var per []int64
	for _, c := range consumers {
		s := c.Stats()
		total.Applied += s.Applied
		total.Duplicates += s.Duplicates
		total.Gaps += s.Gaps
		total.Failed += s.Failed
		per = append(per, s.Applied)
	}
	if total.Applied != aggregates*perAggregate || total.Duplicates < int64(dups) || total.Failed != 0 {
		t.Fatalf("stats %+v; want %d applied, at least %d duplicates, no failures", total, aggregates*perAggregate, dups)
	}
	for i, n := range per {
		if n == 0 {
			t.Errorf("instance %d applied nothing (per instance: %v)", i, per)
		}
	}
	var naked int64
	for _, s := range subs {
		naked += s.Stats().Naked
	}
	t.Logf("%d messages (%d duplicates) in %s (%.0f/s); applied per instance %v; %d gap rejections, %d naks",
		len(msgs), dups, elapsed.Round(time.Millisecond), float64(len(msgs))/elapsed.Seconds(), per, total.Gaps, naked)
}

// Graceful Stop lets the delivery in progress commit and ack, and hands the pulled
// but unstarted messages back at once (another instance gets them without waiting
// out AckWait).
func TestStopFinishesInFlightAndReleasesTheRest(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 4)
	var msgs []published
	for a := range 5 {
		msgs = append(msgs, once(inboxtest.Event(fmt.Sprint(a), 1))...)
	}
	e.publish(t, msgs)
	entered := make(chan struct{}, 1)
	release := make(chan struct{})
	blocking := e.Consumer(t, inbox.Config{}, func(ctx context.Context, tx pgx.Tx, ev inbox.Event) error {
		entered <- struct{}{}
		<-release
		return e.Record(ctx, tx, ev)
	})
	cfg := natsinbox.Config{Concurrency: 1, Prefetch: 5, AckWait: time.Minute}
	cfg.Stream = e.target.Stream
	cfg.Logger = quiet
	s, err := natsinbox.New(connect(t), blocking, &cfg)
	pgtest.Must(t, err, "New")
	pgtest.Must(t, s.Start(context.Background()), "Start")
	<-entered
	waitFor(t, 10*time.Second, "the other messages to be pulled", func() bool {
		return e.consumerInfo(t, "billing").NumAckPending == 5
	})

	stopped := make(chan error, 1)
	go func() { stopped <- s.Stop(context.Background()) }()
	select {
	case err := <-stopped:
		t.Fatalf("Stop returned (%v) while a delivery was in progress", err)
	case <-entered:
		t.Fatal("a second delivery started after Stop")
	default:
	}
	close(release)
	pgtest.Must(t, <-stopped, "Stop")
	if st := s.Stats(); st.Acked != 1 || st.Released != 4 {
		t.Fatalf("stats %+v, want 1 acked and 4 released", st)
	}
	if n := e.Count(t, "effects", "true"); n != 1 {
		t.Fatalf("%d effects, want 1", n)
	}
	// Released, not abandoned: a new instance gets them well within AckWait.
	e.subscribe(t, connect(t), e.Consumer(t, inbox.Config{}, nil), natsinbox.Config{})
	waitFor(t, 20*time.Second, "the released messages to be processed", func() bool { return e.settled(t, "billing") })
	if n := e.Count(t, "effects", "true"); n != 5 {
		t.Fatalf("%d effects, want 5", n)
	}
	pgtest.Must(t, s.Stop(context.Background()), "second Stop")
}

// When Stop's deadline passes, the delivery in progress is abandoned: its
// transaction rolls back and the message goes back to the stream.
func TestStopDeadlineAbandonsInFlight(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 4)
	e.publish(t, once(inboxtest.Event("1", 1)))
	entered := make(chan struct{})
	c := e.Consumer(t, inbox.Config{}, func(ctx context.Context, tx pgx.Tx, ev inbox.Event) error {
		if err := e.Record(ctx, tx, ev); err != nil {
			return err
		}
		close(entered)
		<-ctx.Done()
		return ctx.Err()
	})
	cfg := natsinbox.Config{Stream: e.target.Stream, Logger: quiet, AckWait: time.Minute}
	s, err := natsinbox.New(connect(t), c, &cfg)
	pgtest.Must(t, err, "New")
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
	e.subscribe(t, connect(t), e.Consumer(t, inbox.Config{}, nil), natsinbox.Config{})
	waitFor(t, 20*time.Second, "the abandoned message to be redelivered", func() bool { return e.settled(t, "billing") })
	if n := e.Count(t, "effects", "true"); n != 1 {
		t.Fatalf("%d effects, want 1", n)
	}
}

// Acceptance: a consumer process commits and dies (SIGKILL of itself) before it
// acks. JetStream redelivers after AckWait; the next instance finds the event
// applied and acks it: one effect.
func TestCrashAfterCommitBeforeAck(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 4)
	e.publish(t, once(inboxtest.Event("1", 1)))

	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestHelperProcess$", "-test.count=1")
	cmd.Env = append(os.Environ(), helperEnv+"=crash-after-commit", "HELPER_SCHEMA="+e.schema, "HELPER_STREAM="+e.target.Stream)
	out, err := cmd.CombinedOutput()
	if err == nil || cmd.ProcessState == nil || !strings.Contains(cmd.ProcessState.String(), "killed") {
		t.Fatalf("helper ended with %v (%v), want killed; output:\n%s", err, cmd.ProcessState, out)
	}
	if n := e.Count(t, "effects", "true"); n != 1 {
		t.Fatalf("%d effects after the crash, want 1 (the helper committed)", n)
	}
	if info := e.consumerInfo(t, "billing"); info.NumAckPending != 1 {
		t.Fatalf("%d messages awaiting ack after the crash, want 1", info.NumAckPending)
	}

	c := e.Consumer(t, inbox.Config{}, nil)
	e.subscribe(t, connect(t), c, natsinbox.Config{})
	waitFor(t, 30*time.Second, "the redelivery to be acked", func() bool { return e.settled(t, "billing") })
	if n := e.Count(t, "effects", "true"); n != 1 {
		t.Fatalf("%d effects after the redelivery, want 1", n)
	}
	if st := c.Stats(); st.Duplicates != 1 || st.Applied != 0 {
		t.Fatalf("stats %+v, want the redelivery seen as a duplicate", st)
	}
}

const helperEnv = "PGOUTBOX_INBOX_HELPER"

// TestHelperProcess is the consumer process of TestCrashAfterCommitBeforeAck, run as
// a child: it applies the event, and kills itself after the commit and before the
// subscriber can ack.
func TestHelperProcess(t *testing.T) {
	if os.Getenv(helperEnv) != "crash-after-commit" {
		return
	}
	e := &env{schema: os.Getenv("HELPER_SCHEMA")}
	e.pool = pgtest.Pool(t, pgtest.URL(), 2)
	e.Effects = &inboxtest.Effects{Pool: e.pool, Schema: e.schema} // the parent test created the table
	c := e.Consumer(t, inbox.Config{}, nil)
	crash := processorFunc{name: c.Name(), fn: func(ctx context.Context, d inbox.Delivery) inbox.Outcome {
		o := c.Process(ctx, d)
		if o.Status == inbox.StatusApplied {
			p, _ := os.FindProcess(os.Getpid())
			_ = p.Kill() // SIGKILL: no deferred function, no ack
			select {}
		}
		return o
	}}
	s, err := natsinbox.New(connect(t), crash, &natsinbox.Config{
		Stream: os.Getenv("HELPER_STREAM"), AckWait: time.Second, Logger: quiet})
	pgtest.Must(t, err, "New")
	pgtest.Must(t, s.Start(context.Background()), "Start")
	<-time.After(60 * time.Second) // a timeout: the crash comes first
	t.Fatal("helper: no delivery within 60s")
}

// An existing durable consumer is used as it is; one without explicit acks is
// refused.
func TestExistingConsumer(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 2)
	ctx := context.Background()
	_, err := e.target.JS.CreateConsumer(ctx, e.target.Stream, jetstream.ConsumerConfig{
		Durable: "custom", AckPolicy: jetstream.AckExplicitPolicy, AckWait: 7 * time.Second})
	pgtest.Must(t, err, "create consumer")
	_, err = e.target.JS.CreateConsumer(ctx, e.target.Stream, jetstream.ConsumerConfig{
		Durable: "noack", AckPolicy: jetstream.AckNonePolicy})
	pgtest.Must(t, err, "create consumer")
	c := e.Consumer(t, inbox.Config{}, nil)

	e.publish(t, once(inboxtest.Event("1", 1)))
	e.subscribe(t, connect(t), c, natsinbox.Config{Durable: "custom", AckWait: time.Hour})
	waitFor(t, 20*time.Second, "the message to be acked", func() bool { return e.settled(t, "custom") })
	if info := e.consumerInfo(t, "custom"); info.Config.AckWait != 7*time.Second {
		t.Fatalf("AckWait changed to %s", info.Config.AckWait)
	}

	s, err := natsinbox.New(connect(t), c, &natsinbox.Config{Stream: e.target.Stream, Durable: "noack", Logger: quiet})
	pgtest.Must(t, err, "New")
	if err := s.Start(ctx); err == nil || !strings.Contains(err.Error(), "explicit acks") {
		t.Fatalf("Start on a consumer without acks = %v", err)
	}
	pgtest.Must(t, s.Stop(ctx), "Stop")
}

func TestConfigValidation(t *testing.T) {
	t.Parallel()
	proc := processorFunc{name: "billing"}
	dotted := processorFunc{name: "billing.eu"}
	nc, err := natsgo.Connect(natstest.URL())
	pgtest.Must(t, err, "connect")
	defer nc.Close()
	js, err := jetstream.New(nc)
	pgtest.Must(t, err, "jetstream")
	for name, tc := range map[string]struct {
		proc inbox.Processor
		cfg  natsinbox.Config
		want string
	}{
		"name not a durable": {dotted, natsinbox.Config{}, "set Config.Durable"},
		"bad durable":        {proc, natsinbox.Config{Durable: "a b"}, "Config.Durable"},
		"bad stream":         {proc, natsinbox.Config{Stream: "OUT.BOX"}, "Config.Stream"},
		"concurrency":        {proc, natsinbox.Config{Concurrency: -1}, "Config.Concurrency"},
		"max deliver":        {proc, natsinbox.Config{MaxDeliver: -2}, "Config.MaxDeliver"},
		"ack wait":           {proc, natsinbox.Config{AckWait: -time.Second}, "Config.AckWait"},
	} {
		if _, err := natsinbox.New(js, tc.proc, &tc.cfg); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: New = %v, want an error naming %s", name, err, tc.want)
		}
	}
	if _, err := natsinbox.New(js, dotted, &natsinbox.Config{Durable: "billing-eu"}); err != nil {
		t.Fatal(err)
	}
	if _, err := natsinbox.New(nil, proc, nil); err == nil {
		t.Fatal("New without a client accepted")
	}
}

// The handler sees the producer's headers, not the broker's (Nats-Msg-Id).
func TestEventHeadersAreTheProducers(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 2)
	m := inboxtest.Event("1", 1)
	m.Headers = map[string]string{"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", "tenant": "eu"}
	e.publish(t, once(m))
	got := make(chan map[string]string, 1)
	c := e.Consumer(t, inbox.Config{}, func(ctx context.Context, tx pgx.Tx, ev inbox.Event) error {
		got <- ev.Headers
		return nil
	})
	e.subscribe(t, connect(t), c, natsinbox.Config{})
	select {
	case h := <-got:
		if len(h) != 2 || h["traceparent"] != m.Headers["traceparent"] || h["tenant"] != "eu" {
			t.Fatalf("handler saw headers %v, want the producer's %v", h, m.Headers)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("no delivery within 30s")
	}
}
