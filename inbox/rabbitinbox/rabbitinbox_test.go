package rabbitinbox_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/pgoutbox/pgoutbox/broker"
	"github.com/pgoutbox/pgoutbox/broker/rabbitmq"
	"github.com/pgoutbox/pgoutbox/inbox"
	"github.com/pgoutbox/pgoutbox/inbox/rabbitinbox"
	"github.com/pgoutbox/pgoutbox/internal/inboxtest"
	"github.com/pgoutbox/pgoutbox/internal/pgtest"
	"github.com/pgoutbox/pgoutbox/internal/wait"
	"github.com/pgoutbox/pgoutbox/wire"
)

// Acceptance: three instances, each a subscriber with its own connection on one
// queue, consume 3,000 events over 60 aggregates, every event published twice (a
// relay re-publish, a little later). Each aggregate is applied exactly once per
// event, 1..N in order, although consecutive events of one aggregate often reach
// different instances: the later one is refused, requeued and applied after.
func TestThreeInstancesApplyEveryAggregateInOrder(t *testing.T) {
	t.Parallel()
	const aggregates, perAggregate, instances = 60, 50, 3
	e := newEnv(t, instances*4+4)
	rng := rand.New(rand.NewPCG(3, 11))

	// The relay's order: per aggregate in sequence, aggregates interleaved at
	// random.
	lanes := make([][]broker.Message, aggregates)
	for a := range lanes {
		lanes[a] = inboxtest.Lane(fmt.Sprintf("agg-%02d", a), perAggregate)
	}
	var order []broker.Message
	for live := aggregates; live > 0; {
		a := rng.IntN(aggregates)
		if len(lanes[a]) == 0 {
			continue
		}
		order = append(order, lanes[a][0])
		if lanes[a] = lanes[a][1:]; len(lanes[a]) == 0 {
			live--
		}
	}

	start := time.Now()
	var consumers []*inbox.Consumer[pgx.Tx]
	var subs []*rabbitinbox.Subscriber
	for range instances {
		c := e.Consumer(t, inbox.Config{}, nil)
		consumers = append(consumers, c)
		subs = append(subs, e.subscribe(t, c, rabbitinbox.Config{Concurrency: 4, Prefetch: 32}))
	}
	// Published in chunks while the instances consume; after each chunk the
	// previous one goes out again, as a relay that lost its marks re-publishes.
	const chunk = 250
	var prev []broker.Message
	for i := 0; i < len(order); i += chunk {
		cur := order[i:min(i+chunk, len(order))]
		e.publish(t, cur...)
		if prev != nil {
			e.publish(t, prev...)
		}
		prev = cur
	}
	e.publish(t, prev...)
	published := int64(2 * len(order))

	acked := func() (n int64) {
		for _, s := range subs {
			n += s.Stats().Acked
		}
		return n
	}
	wait.For(t, 3*time.Minute, "every message to be applied and acked", func() bool {
		return acked() == published && e.Count(t, "effects", "true") == aggregates*perAggregate && e.ready(t, e.queue) == 0
	})
	elapsed := time.Since(start)

	e.CheckInOrder(t, "agg-%02d", aggregates, perAggregate)
	total, per := inboxtest.SumStats(consumers)
	if total.Applied != aggregates*perAggregate || total.Duplicates < int64(len(order)) || total.Failed != 0 {
		t.Fatalf("stats %+v; want %d applied, at least %d duplicates, no failures", total, aggregates*perAggregate, len(order))
	}
	for i, n := range per {
		if n == 0 {
			t.Errorf("instance %d applied nothing (per instance: %v)", i, per)
		}
	}
	var requeued int64
	for _, s := range subs {
		requeued += s.Stats().Requeued
	}
	for _, s := range subs {
		pgtest.Must(t, s.Stop(context.Background()), "Stop")
	}
	if ready, unacked := e.depth(t); ready+unacked != 0 {
		t.Fatalf("%d ready and %d unacknowledged messages left in the queue", ready, unacked)
	}
	t.Logf("%d messages (%d duplicates) in %s (%.0f/s); applied per instance %v; %d gap rejections, %d requeued",
		published, len(order), elapsed.Round(time.Millisecond), float64(published)/elapsed.Seconds(), per, total.Gaps, requeued)
}

// Acceptance: a failing handler rolls back, leaves no processed_events row, and the
// message is requeued until it succeeds; the effect happens once. The inbox asks
// for a minute's delay; the subscriber holds the message for MaxRequeueDelay
// before requeueing it.
func TestHandlerErrorRequeues(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 4)
	e.publish(t, inboxtest.Event("7", 1))
	const maxDelay = 100 * time.Millisecond
	var calls atomic.Int32
	var mu sync.Mutex
	var rowsSeen []int // committed rows when each attempt runs: what failures left behind
	var times []time.Time
	c := e.Consumer(t, inbox.Config{RetryDelay: time.Minute, MaxRetryDelay: time.Hour}, func(ctx context.Context, tx pgx.Tx, ev inbox.Event) error {
		mu.Lock()
		times = append(times, time.Now())
		mu.Unlock()
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
	s := e.subscribe(t, c, rabbitinbox.Config{Concurrency: 1, MaxRequeueDelay: maxDelay})
	wait.For(t, 30*time.Second, "the message to be acked", func() bool { return s.Stats().Acked == 1 })
	mu.Lock()
	defer mu.Unlock()
	if calls.Load() != 3 || !slices.Equal(rowsSeen, []int{0, 0, 0}) {
		t.Fatalf("%d handler calls; committed rows seen at each: %v (want 3 calls, nothing left by the failures)", calls.Load(), rowsSeen)
	}
	for i := 1; i < len(times); i++ {
		if d := times[i].Sub(times[i-1]); d < maxDelay {
			t.Errorf("attempt %d came %s after the previous one, before MaxRequeueDelay (%s)", i+1, d, maxDelay)
		}
	}
	if n := e.Count(t, "effects", "true"); n != 1 {
		t.Fatalf("%d effects, want 1", n)
	}
	if st := c.Stats(); st.Failed != 2 || st.Applied != 1 {
		t.Fatalf("inbox stats %+v", st)
	}
	if st := s.Stats(); st.Requeued != 2 || st.Acked != 1 {
		t.Fatalf("subscriber stats %+v, want 2 requeued and 1 acked", st)
	}
}

// A quorum queue counts deliveries (x-delivery-count): the inbox sees attempts
// 1, 2, 3, and the header is not among the event's headers.
func TestQuorumQueueCountsAttempts(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 4)
	queue := uniqueName("pgotest-inbox-quorum")
	e.deleteAtEnd(t, "", queue)
	var fails atomic.Int32
	c := e.Consumer(t, inbox.Config{}, func(ctx context.Context, tx pgx.Tx, ev inbox.Event) error {
		if len(ev.Headers) != 0 {
			return fmt.Errorf("unexpected headers %v", ev.Headers)
		}
		if fails.Add(1) <= 2 {
			return errors.New("payment service down")
		}
		return e.Record(ctx, tx, ev)
	})
	var mu sync.Mutex
	var attempts []int
	counting := inboxtest.Processor{Consumer: c.Name(), Fn: func(ctx context.Context, d inbox.Delivery) inbox.Outcome {
		mu.Lock()
		attempts = append(attempts, d.Attempt)
		mu.Unlock()
		return c.Process(ctx, d)
	}}
	s := e.subscribe(t, counting, rabbitinbox.Config{Queue: queue, Exchange: e.exchange,
		QueueArguments: amqp.Table{"x-queue-type": "quorum"}, MaxRequeueDelay: 20 * time.Millisecond})
	e.publish(t, inboxtest.Event("1", 1))
	wait.For(t, 30*time.Second, "the message to be acked", func() bool { return s.Stats().Acked == 1 })
	mu.Lock()
	defer mu.Unlock()
	if !slices.Equal(attempts, []int{1, 2, 3}) {
		t.Fatalf("attempts %v, want [1 2 3]", attempts)
	}
}

// Stop does not wait out a retry delay: the message is requeued at once.
func TestStopRequeuesWaitingMessagesAtOnce(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 4)
	e.publish(t, inboxtest.Event("7", 1))
	c := e.Consumer(t, inbox.Config{RetryDelay: time.Hour, MaxRetryDelay: time.Hour}, func(context.Context, pgx.Tx, inbox.Event) error {
		return errors.New("payment service down")
	})
	s := e.subscribe(t, c, rabbitinbox.Config{MaxRequeueDelay: time.Hour})
	wait.For(t, 30*time.Second, "the delivery to fail", func() bool { return c.Stats().Failed == 1 })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	pgtest.Must(t, s.Stop(ctx), "Stop")
	if st := s.Stats(); st.Requeued != 1 {
		t.Fatalf("stats %+v, want the waiting message requeued", st)
	}
	wait.For(t, 10*time.Second, "the message to be back in the queue", func() bool { return e.ready(t, e.queue) == 1 })
}

// Acceptance: the server closes the subscriber's connection (as rabbitmqctl
// close_connection does) while deliveries are in progress. The subscriber
// reconnects and the server redelivers whatever was not acked: nothing is lost,
// nothing applied twice, each aggregate in order.
func TestReconnectsAfterServerClosesConnection(t *testing.T) {
	t.Parallel()
	const aggregates, perAggregate = 40, 30
	e := newEnv(t, 8)
	var msgs []broker.Message
	for i := range perAggregate {
		for a := range aggregates {
			msgs = append(msgs, inboxtest.Event(fmt.Sprintf("agg-%02d", a), int64(i+1)))
		}
	}
	e.publish(t, msgs...)

	// Once a third is applied, deliveries are held before processing; the
	// connection is closed under them.
	c := e.Consumer(t, inbox.Config{GapRetryDelay: 20 * time.Millisecond}, nil)
	var hold atomic.Bool
	held := make(chan struct{}, 64)
	release := make(chan struct{})
	gate := inboxtest.Processor{Consumer: c.Name(), Fn: func(ctx context.Context, d inbox.Delivery) inbox.Outcome {
		if c.Stats().Applied >= aggregates*perAggregate/3 && hold.CompareAndSwap(false, true) {
			held <- struct{}{}
			<-release
		}
		return c.Process(ctx, d)
	}}
	name := uniqueName("pgotest-inbox-reconnect")
	s := e.subscribe(t, gate, rabbitinbox.Config{ConnectionName: name, Concurrency: 4})

	select {
	case <-held:
	case <-time.After(time.Minute):
		t.Fatal("no delivery held within a minute")
	}
	pgtest.Must(t, closeConnection(name), "close the subscriber's connection")
	wait.For(t, 30*time.Second, "the subscriber to reconnect", func() bool { return s.Stats().Reconnects == 1 })
	close(release)

	wait.For(t, 2*time.Minute, "every event to be applied", func() bool {
		return e.Count(t, "effects", "true") == aggregates*perAggregate && e.ready(t, e.queue) == 0
	})
	pgtest.Must(t, s.Stop(context.Background()), "Stop")
	for a := range aggregates {
		got := e.Sequences(t, fmt.Sprintf("agg-%02d", a))
		if len(got) != perAggregate {
			t.Fatalf("aggregate %d: %d effects, want %d", a, len(got), perAggregate)
		}
		for i, seq := range got {
			if seq != int64(i+1) {
				t.Fatalf("aggregate %d applied out of order: %v", a, got)
			}
		}
	}
	if ready, unacked := e.depth(t); ready+unacked != 0 {
		t.Fatalf("%d ready and %d unacknowledged messages left in the queue", ready, unacked)
	}
	cs, ss := c.Stats(), s.Stats()
	if cs.Applied != aggregates*perAggregate || ss.Unsettled < 1 {
		t.Fatalf("inbox stats %+v, subscriber stats %+v: want every event applied once, and the held delivery's ack lost", cs, ss)
	}
	t.Logf("inbox %+v; subscriber %+v", cs, ss)
}

// Acceptance: the consumer transaction commits, and the connection is gone
// before the ack is sent (a crash at that point ends the same way). The server
// redelivers the message; the inbox finds it applied, and it is acked as a
// duplicate: one effect.
func TestConnectionLostAfterCommitBeforeAck(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 4)
	e.publish(t, inboxtest.Event("1", 1))
	c := e.Consumer(t, inbox.Config{}, nil)
	name := uniqueName("pgotest-inbox-crash")
	var sub atomic.Pointer[rabbitinbox.Subscriber]
	var crashed atomic.Bool
	crashErr := make(chan error, 1)
	crash := inboxtest.Processor{Consumer: c.Name(), Fn: func(ctx context.Context, d inbox.Delivery) inbox.Outcome {
		o := c.Process(ctx, d)
		if o.Status == inbox.StatusApplied && crashed.CompareAndSwap(false, true) {
			// Committed. The server closes the connection, and the
			// subscriber notices (it has reconnected) before it can ack.
			err := closeConnection(name)
			if err == nil && !wait.Until(30*time.Second, func() bool { return sub.Load().Stats().Reconnects == 1 }) {
				err = errors.New("no reconnect within 30s")
			}
			crashErr <- err
		}
		return o
	}}
	s := e.dial(t, crash, rabbitinbox.Config{ConnectionName: name})
	sub.Store(s)
	pgtest.Must(t, s.Start(context.Background()), "Start")

	select {
	case err := <-crashErr:
		pgtest.Must(t, err, "close the connection after the commit")
	case <-time.After(30 * time.Second):
		t.Fatal("no delivery within 30s")
	}
	wait.For(t, 30*time.Second, "the redelivery to be acked", func() bool { return s.Stats().Acked == 1 })
	pgtest.Must(t, s.Stop(context.Background()), "Stop")
	if n := e.Count(t, "effects", "true"); n != 1 {
		t.Fatalf("%d effects, want 1", n)
	}
	if st := c.Stats(); st.Applied != 1 || st.Duplicates != 1 {
		t.Fatalf("inbox stats %+v, want the redelivery seen as a duplicate", st)
	}
	if st := s.Stats(); st.Unsettled != 1 || st.Reconnects != 1 {
		t.Fatalf("subscriber stats %+v, want the first ack lost and one reconnect", st)
	}
	if ready, unacked := e.depth(t); ready+unacked != 0 {
		t.Fatalf("%d ready and %d unacknowledged messages left in the queue", ready, unacked)
	}
}

// A message that is not an outbox event is rejected without requeue — the queue's
// dead-letter exchange gets it — and logged; it is not redelivered forever.
func TestUndecodableMessageIsRejected(t *testing.T) {
	t.Parallel()
	dlx, dead := uniqueName("pgotest-inbox-dlx"), uniqueName("pgotest-inbox-dead")
	e := newEnvArgs(t, 4, amqp.Table{"x-dead-letter-exchange": dlx})
	e.deleteAtEnd(t, dlx, dead)
	e.onChannel(t, func(ch *amqp.Channel) error {
		if err := ch.ExchangeDeclare(dlx, amqp.ExchangeFanout, false, false, false, false, nil); err != nil {
			return err
		}
		if _, err := ch.QueueDeclare(dead, false, false, false, false, nil); err != nil {
			return err
		}
		if err := ch.QueueBind(dead, "", dlx, false, nil); err != nil {
			return err
		}
		return ch.PublishWithContext(context.Background(), e.exchange, "order.updated", false, false,
			amqp.Publishing{MessageId: "not-an-event", Body: []byte(`{"no":"headers"}`)})
	})
	e.publish(t, inboxtest.Event("1", 1))

	var logs strings.Builder
	var logMu sync.Mutex
	logger := slog.New(slog.NewTextHandler(writerFunc(func(p []byte) (int, error) {
		logMu.Lock()
		defer logMu.Unlock()
		return logs.Write(p)
	}), nil))
	c := e.Consumer(t, inbox.Config{}, nil)
	s := e.subscribe(t, c, rabbitinbox.Config{Logger: logger})
	wait.For(t, 30*time.Second, "both messages to be settled", func() bool {
		st := s.Stats()
		return st.Acked == 1 && st.Rejected == 1
	})
	wait.For(t, 10*time.Second, "the rejected message to be dead-lettered", func() bool { return e.ready(t, dead) == 1 })
	if st := c.Stats(); st.Undecodable != 1 || st.Applied != 1 {
		t.Fatalf("inbox stats %+v", st)
	}
	pgtest.Must(t, s.Stop(context.Background()), "Stop")
	if ready, unacked := e.depth(t); ready+unacked != 0 {
		t.Fatalf("%d ready and %d unacknowledged messages left in the queue", ready, unacked)
	}
	logMu.Lock()
	defer logMu.Unlock()
	if out := logs.String(); !strings.Contains(out, "level=ERROR msg=\"rejected a message that is not an outbox event") ||
		!strings.Contains(out, "message_id=not-an-event") || !strings.Contains(out, "undecodable delivery") {
		t.Fatalf("log does not report the rejected message:\n%s", out)
	}
}

type writerFunc func(p []byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }

// With Config.Exchange, the subscriber declares a missing exchange and queue and
// binds the queue with the binding keys only; an existing queue is used as it is.
func TestDeclaresAndBindsQueue(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 4)
	exchange, queue := uniqueName("pgotest-inbox-x"), uniqueName("pgotest-inbox-q")
	e.deleteAtEnd(t, exchange, queue)
	c := e.Consumer(t, inbox.Config{}, nil)
	s := e.subscribe(t, c, rabbitinbox.Config{Queue: queue, Exchange: exchange, BindingKeys: []string{"order.*"},
		QueueArguments: amqp.Table{"x-queue-type": "classic"}})
	e.onChannel(t, func(ch *amqp.Channel) error {
		return ch.ExchangeDeclarePassive(exchange, amqp.ExchangeTopic, true, false, false, false, nil)
	})

	pub, err := rabbitmq.Dial(context.Background(), amqpURL, &rabbitmq.Config{Exchange: exchange, Logger: quiet})
	pgtest.Must(t, err, "dial the publisher")
	defer pub.Close()
	invoice := inboxtest.Event("9", 1)
	invoice.AggregateType = "invoice"
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	results := pub.Publish(ctx, []broker.Message{inboxtest.Event("1", 1), invoice})
	pgtest.Must(t, results[0], "publish the order event")
	if !errors.Is(results[1], rabbitmq.ErrUnroutable) {
		t.Fatalf("publish an invoice event = %v, want unroutable: the queue is bound with order.* only", results[1])
	}
	wait.For(t, 20*time.Second, "the order event to be applied", func() bool { return s.Stats().Acked == 1 })

	// A second instance finds the queue and binds it again, harmlessly.
	other := e.subscribe(t, c, rabbitinbox.Config{Queue: queue, Exchange: exchange, BindingKeys: []string{"order.*"}})
	pgtest.Must(t, other.Stop(context.Background()), "Stop")
	if n := e.Count(t, "effects", "true"); n != 1 {
		t.Fatalf("%d effects, want 1", n)
	}
}

// Dial reports what keeps the subscriber from consuming, and never shows the
// password.
func TestDialErrors(t *testing.T) {
	t.Parallel()
	proc := inboxtest.Processor{Consumer: "billing"}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	missing := uniqueName("pgotest-inbox-missing")
	for name, tc := range map[string]struct {
		url  string
		want string
	}{
		"missing queue":     {amqpURL, "does not exist"},
		"bad scheme":        {"http://guest:s3cret@127.0.0.1:5672/", "scheme"},
		"bad port":          {"amqp://guest:s3cret@127.0.0.1:port/", "port"},
		"unreachable":       {"amqp://guest:s3cret@127.0.0.1:1/", "connect to amqp://guest@127.0.0.1:1/"},
		"wrong credentials": {"amqp://guest:s3cret@127.0.0.1:5672/", "403"},
	} {
		_, err := rabbitinbox.Dial(ctx, tc.url, proc, &rabbitinbox.Config{Queue: missing, Logger: quiet})
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: Dial = %v, want an error containing %q", name, err, tc.want)
		}
		if err != nil && strings.Contains(err.Error(), "s3cret") {
			t.Errorf("%s: the error shows the password: %v", name, err)
		}
	}
}

func TestConfigValidation(t *testing.T) {
	t.Parallel()
	proc := inboxtest.Processor{Consumer: "billing"}
	for name, tc := range map[string]struct {
		cfg  *rabbitinbox.Config
		want string
	}{
		"no config":           {nil, "Config.Queue is required"},
		"no queue":            {&rabbitinbox.Config{}, "Config.Queue is required"},
		"long queue":          {&rabbitinbox.Config{Queue: strings.Repeat("q", 256)}, "Config.Queue"},
		"keys without ex":     {&rabbitinbox.Config{Queue: "q", BindingKeys: []string{"#"}}, "need Config.Exchange"},
		"args without ex":     {&rabbitinbox.Config{Queue: "q", QueueArguments: amqp.Table{}}, "need Config.Exchange"},
		"bad args":            {&rabbitinbox.Config{Queue: "q", Exchange: "x", QueueArguments: amqp.Table{"x": struct{}{}}}, "Config.QueueArguments"},
		"prefetch":            {&rabbitinbox.Config{Queue: "q", Prefetch: 70000}, "Config.Prefetch"},
		"concurrency":         {&rabbitinbox.Config{Queue: "q", Concurrency: -1}, "Config.Concurrency"},
		"process timeout":     {&rabbitinbox.Config{Queue: "q", ProcessTimeout: -time.Second}, "Config.ProcessTimeout"},
		"requeue delay":       {&rabbitinbox.Config{Queue: "q", MaxRequeueDelay: -time.Second}, "Config.MaxRequeueDelay"},
		"backoff above cap":   {&rabbitinbox.Config{Queue: "q", ReconnectBackoff: time.Minute, MaxReconnectBackoff: time.Second}, "Config.ReconnectBackoff"},
		"long binding key":    {&rabbitinbox.Config{Queue: "q", Exchange: "x", BindingKeys: []string{strings.Repeat("k", 256)}}, "Config.BindingKeys"},
		"connect timeout":     {&rabbitinbox.Config{Queue: "q", ConnectTimeout: -time.Second}, "Config.ConnectTimeout"},
		"consumer tag (long)": {&rabbitinbox.Config{Queue: "q", ConsumerTag: strings.Repeat("t", 256)}, "Config.ConsumerTag"},
	} {
		if _, err := rabbitinbox.Dial(context.Background(), amqpURL, proc, tc.cfg); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: Dial = %v, want an error naming %s", name, err, tc.want)
		}
	}
	if _, err := rabbitinbox.Dial(context.Background(), amqpURL, nil, &rabbitinbox.Config{Queue: "q"}); err == nil {
		t.Fatal("Dial without a processor accepted")
	}
}

// TestCloudEventsFormat: the relay's RabbitMQ adapter publishes in the
// CloudEvents format (and once in the default format); the subscriber's
// consumer applies each event once, as with the default format.
func TestCloudEventsFormat(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 4)
	publish := func(t *testing.T, enc wire.Encoding) broker.Publisher {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		p, err := rabbitmq.Dial(ctx, amqpURL, &rabbitmq.Config{Exchange: e.exchange, Logger: quiet, Encoding: enc})
		pgtest.Must(t, err, "dial the publisher")
		return p
	}
	inboxtest.CloudEvents(t, e.Effects, publish, func(t *testing.T, proc inbox.Processor) {
		e.subscribe(t, proc, rabbitinbox.Config{})
	})
}
