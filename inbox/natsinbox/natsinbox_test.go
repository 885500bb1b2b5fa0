package natsinbox_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	natsgo "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/pgoutbox/pgoutbox/broker"
	natsbroker "github.com/pgoutbox/pgoutbox/broker/nats"
	"github.com/pgoutbox/pgoutbox/inbox"
	"github.com/pgoutbox/pgoutbox/inbox/natsinbox"
	"github.com/pgoutbox/pgoutbox/internal/inboxtest"
	"github.com/pgoutbox/pgoutbox/internal/natstest"
	"github.com/pgoutbox/pgoutbox/internal/pgtest"
	"github.com/pgoutbox/pgoutbox/internal/wait"
	"github.com/pgoutbox/pgoutbox/wire"
)

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
	wait.For(t, 3*time.Minute, "every message to be applied and acked", func() bool {
		return e.Count(t, "effects", "true") == aggregates*perAggregate && e.settled(t, "billing")
	})
	elapsed := time.Since(start)

	e.CheckInOrder(t, "agg-%03d", aggregates, perAggregate)
	total, per := inboxtest.SumStats(consumers)
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
	wait.For(t, 30*time.Second, "the redelivery to be acked", func() bool { return e.settled(t, "billing") })
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
	crash := inboxtest.KillAfterApply(c) // SIGKILL after the commit: no ack
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
	wait.For(t, 20*time.Second, "the message to be acked", func() bool { return e.settled(t, "custom") })
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
	proc := inboxtest.Processor{Consumer: "billing"}
	dotted := inboxtest.Processor{Consumer: "billing.eu"}
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

// TestCloudEventsFormat: the relay's NATS adapter publishes in the CloudEvents
// format (and once in the default format); the subscriber's consumer applies
// each event once, as with the default format.
func TestCloudEventsFormat(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 4)
	publish := func(t *testing.T, enc wire.Encoding) broker.Publisher {
		t.Helper()
		p, err := natsbroker.New(t.Context(), connect(t), &natsbroker.Config{
			Stream: e.target.Stream, StreamSubjects: e.target.Subjects(),
			Subject: broker.MustParseTemplate(e.target.Template), Logger: quiet, Encoding: enc,
		})
		pgtest.Must(t, err, "nats publisher")
		return p
	}
	inboxtest.CloudEvents(t, e.Effects, publish, func(t *testing.T, proc inbox.Processor) {
		e.subscribe(t, connect(t), proc, natsinbox.Config{})
	})
}
