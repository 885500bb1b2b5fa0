package sqsinbox_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awssqs "github.com/aws/aws-sdk-go-v2/service/sqs"
	sqstypes "github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/pgoutbox"
	"github.com/pgoutbox/pgoutbox/broker"
	"github.com/pgoutbox/pgoutbox/broker/aws/sqs"
	"github.com/pgoutbox/pgoutbox/inbox"
	"github.com/pgoutbox/pgoutbox/inbox/sqsinbox"
	"github.com/pgoutbox/pgoutbox/internal/inboxtest"
	"github.com/pgoutbox/pgoutbox/internal/pgtest"
	"github.com/pgoutbox/pgoutbox/internal/wait"
	"github.com/pgoutbox/pgoutbox/pgoutboxtest"
	"github.com/pgoutbox/pgoutbox/relay"
	"github.com/pgoutbox/pgoutbox/wire"
)

func start(t *testing.T, proc inbox.Processor, cfg *sqsinbox.Config) *sqsinbox.Subscriber {
	t.Helper()
	sub, err := sqsinbox.New(sqsClient(), proc, cfg)
	pgtest.Must(t, err, "sqsinbox.New")
	pgtest.Must(t, sub.Start(context.Background()), "Start")
	inboxtest.StopAtEnd(t, sub)
	return sub
}

// The relay publishes to an SQS FIFO queue (the broker/aws/sqs adapter) and
// the subscriber applies every event once, each aggregate in order, with
// several aggregates in parallel.
func TestRelayToInbox(t *testing.T) {
	t.Parallel()
	url := newQueue(t, false)
	pool, _ := pgtest.Migrated(t, 10)
	pub, err := sqs.New(t.Context(), sqsClient(), &sqs.Config{Destination: broker.MustParseTemplate(url), Logger: quiet})
	pgtest.Must(t, err, "sqs.New")
	t.Cleanup(func() { _ = pub.Close() })
	r := pgoutboxtest.New(t, pool, &pgoutboxtest.Config{Publisher: pub, Relay: &relay.Config{Logger: quiet}})
	prod, err := pgoutbox.NewProducer(&pgoutbox.Config{Schema: r.Schema()})
	pgtest.Must(t, err, "NewProducer")

	const aggregates, perAggregate = 4, 6
	ctx := context.Background()
	for seq := range perAggregate { // one transaction per round, the aggregates interleaved
		tx, err := pool.Begin(ctx)
		pgtest.Must(t, err, "begin")
		for a := range aggregates {
			_, err := prod.EnqueueTx(ctx, tx, pgoutbox.Event{AggregateType: "order", AggregateID: fmt.Sprintf("e%d", a),
				EventType: "updated", Payload: map[string]int{"step": seq + 1}})
			pgtest.Must(t, err, "enqueue")
		}
		pgtest.Must(t, tx.Commit(ctx), "commit")
	}
	wctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	pgtest.Must(t, r.WaitDrained(wctx), "WaitDrained")

	e := newEffects(t)
	c := e.Consumer(t, inbox.Config{}, nil)
	sub := start(t, c, testConfig(url, 4))
	wait.For(t, time.Minute, "every event applied", func() bool { return e.Count(t, "effects", "true") == aggregates*perAggregate })
	e.CheckInOrder(t, "e%d", aggregates, perAggregate)
	wait.For(t, time.Minute, "every message deleted", func() bool { return sub.Stats().Deleted >= aggregates*perAggregate })
	if st := c.Stats(); st.Applied != aggregates*perAggregate || st.Gaps != 0 {
		t.Fatalf("inbox stats %+v: want every event applied once, no gap", st)
	}
}

func newEffects(t *testing.T) *inboxtest.Effects {
	pool, schema := pgtest.Migrated(t, 8)
	return inboxtest.NewEffects(t, pool, schema)
}

// A message handed back for a retry holds back its group: the later messages
// of the group received with it go back unprocessed, and the group is applied
// in order even under inbox.GapAccept, which would not reject them.
func TestRetryHoldsTheGroup(t *testing.T) {
	t.Parallel()
	tg := newTarget(t)
	tg.Publish(t, inboxtest.Lane("h0", 6)...)
	e := newEffects(t)
	var failed atomic.Bool
	c := e.Consumer(t, inbox.Config{GapPolicy: inbox.GapAccept, RetryDelay: 20 * time.Millisecond}, func(ctx context.Context, tx pgx.Tx, ev inbox.Event) error {
		if ev.AggregateSequence == 2 && failed.CompareAndSwap(false, true) {
			return errors.New("payment service down")
		}
		return e.Record(ctx, tx, ev)
	})
	sub := start(t, c, testConfig(tg.url, 1))
	wait.For(t, time.Minute, "six effects", func() bool { return e.Count(t, "effects", "true") == 6 })
	e.CheckInOrder(t, "h%d", 1, 6)
	st := sub.Stats()
	if st.Retried != 1 {
		t.Fatalf("stats %+v: want one retry", st)
	}
	t.Logf("held back behind the retry: %d", st.HeldBack)
}

// A standard queue keeps no order: Start refuses it, naming the setting that
// accepts it; with AllowStandard it starts.
func TestStandardQueueRefused(t *testing.T) {
	t.Parallel()
	url := newQueue(t, true)
	e := newEffects(t)
	sub, err := sqsinbox.New(sqsClient(), e.Consumer(t, inbox.Config{}, nil), testConfig(url, 1))
	pgtest.Must(t, err, "New")
	err = sub.Start(context.Background())
	if !errors.Is(err, sqsinbox.ErrNotFIFO) || !strings.Contains(err.Error(), "Config.AllowStandard") {
		t.Fatalf("Start on a standard queue = %v, want ErrNotFIFO naming Config.AllowStandard", err)
	}
	cfg := testConfig(url, 1)
	cfg.AllowStandard = true
	start(t, e.Consumer(t, inbox.Config{}, nil), cfg)
}

// A queue that does not exist fails Start; a name is looked up.
func TestQueueLookup(t *testing.T) {
	t.Parallel()
	e := newEffects(t)
	sub, err := sqsinbox.New(sqsClient(), e.Consumer(t, inbox.Config{}, nil), testConfig("no-such-queue.fifo", 1))
	pgtest.Must(t, err, "New")
	if err := sub.Start(context.Background()); err == nil || !strings.Contains(err.Error(), "Config.Queue") {
		t.Fatalf("Start on a missing queue = %v, want an error naming Config.Queue", err)
	}
	tg := newTarget(t)
	tg.Publish(t, inboxtest.Event("n", 1))
	name := tg.url[strings.LastIndexByte(tg.url, '/')+1:]
	start(t, e.Consumer(t, inbox.Config{}, nil), testConfig(name, 1))
	wait.For(t, time.Minute, "the event applied", func() bool { return e.Count(t, "effects", "true") == 1 })
}

// Hostile or mistaken settings are refused by New, each naming its field,
// and without echoing more than a bounded prefix of a value.
func TestConfigRefused(t *testing.T) {
	long := strings.Repeat("q", 5000)
	for _, tc := range []struct {
		cfg  sqsinbox.Config
		want string
	}{
		{sqsinbox.Config{}, "Config.Queue"},
		{sqsinbox.Config{Queue: long}, "Config.Queue"},
		{sqsinbox.Config{Queue: "a queue"}, "Config.Queue"},
		{sqsinbox.Config{Queue: "q\nforged log line"}, "Config.Queue"},
		{sqsinbox.Config{Queue: "q", WaitTime: 21 * time.Second}, "Config.WaitTime"},
		{sqsinbox.Config{Queue: "q", WaitTime: 1500 * time.Millisecond}, "Config.WaitTime"},
		{sqsinbox.Config{Queue: "q", MaxMessages: 11}, "Config.MaxMessages"},
		{sqsinbox.Config{Queue: "q", VisibilityTimeout: time.Second}, "Config.VisibilityTimeout"},
		{sqsinbox.Config{Queue: "q", VisibilityTimeout: 13 * time.Hour}, "Config.VisibilityTimeout"},
		{sqsinbox.Config{Queue: "q", Concurrency: -1}, "Config.Concurrency"},
		{sqsinbox.Config{Queue: "q", MaxMessages: 10, Prefetch: 5}, "Config.Prefetch"},
		{sqsinbox.Config{Queue: "q", ProcessTimeout: -time.Second}, "Config.ProcessTimeout"},
	} {
		err := tc.cfg.Validate()
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: Validate = %v, want an error naming %s", tc.cfg, err, tc.want)
			continue
		}
		if strings.Contains(err.Error(), long[:200]) || strings.Contains(err.Error(), "\nforged") {
			t.Errorf("the error echoes the value: %v", err)
		}
	}
	if err := (&sqsinbox.Config{Queue: "orders.fifo"}).Validate(); err != nil {
		t.Errorf("a queue name alone: %v", err)
	}
	if _, err := sqsinbox.New(nil, nil, &sqsinbox.Config{Queue: "q"}); err == nil {
		t.Error("New without a client and a processor: no error")
	}
}

// The hold-back itself: after a message is handed back for a retry, the rest
// of its group's run is not processed but made visible at once (SQS then
// delivers the group again from the retried one, hidden for its delay).
func TestHoldBackHandsBackAtOnce(t *testing.T) {
	t.Parallel()
	tg := newTarget(t)
	tg.Publish(t, inboxtest.Event("a", 1), inboxtest.Event("b", 1))
	c := sqsClient()
	var got []sqstypes.Message
	wait.For(t, time.Minute, "both messages received", func() bool {
		out, err := c.ReceiveMessage(t.Context(), &awssqs.ReceiveMessageInput{QueueUrl: aws.String(tg.url),
			MaxNumberOfMessages: 10, WaitTimeSeconds: 1, VisibilityTimeout: 60, MessageAttributeNames: []string{"All"}})
		pgtest.Must(t, err, "receive")
		got = append(got, out.Messages...)
		return len(got) == 2
	})
	e := newEffects(t)
	sub, err := sqsinbox.New(c, e.Consumer(t, inbox.Config{}, nil), testConfig(tg.url, 1))
	pgtest.Must(t, err, "New")
	if offered := sqsinbox.NakThenDeliver(sub, tg.url, got, time.Minute); len(offered) != 1 || offered[0] {
		t.Fatalf("offered %v, want the message behind the retry held back", offered)
	}
	if st := sub.Stats(); st.Retried != 1 || st.HeldBack != 1 {
		t.Fatalf("stats %+v: want one retried, one held back", st)
	}
	wait.For(t, time.Minute, "the held-back message visible again", func() bool {
		out, err := c.ReceiveMessage(t.Context(), &awssqs.ReceiveMessageInput{QueueUrl: aws.String(tg.url),
			MaxNumberOfMessages: 10, WaitTimeSeconds: 1, VisibilityTimeout: 60})
		pgtest.Must(t, err, "receive")
		for _, m := range out.Messages {
			if aws.ToString(m.MessageId) == aws.ToString(got[0].MessageId) {
				t.Fatal("the retried message came back before its delay")
			}
			if aws.ToString(m.MessageId) == aws.ToString(got[1].MessageId) {
				return true
			}
		}
		return false
	})
}

// The CloudEvents format (a structured-mode CloudEvent as the body) and the
// default one, fed by the relay's publisher, read back as published.
func TestCloudEvents(t *testing.T) {
	t.Parallel()
	e := newEffects(t)
	url := newQueue(t, false)
	publish := func(t *testing.T, enc wire.Encoding) broker.Publisher {
		p, err := sqs.New(t.Context(), sqsClient(), &sqs.Config{Destination: broker.MustParseTemplate(url), Encoding: enc, Logger: quiet})
		pgtest.Must(t, err, "sqs.New")
		return p
	}
	inboxtest.CloudEvents(t, e, publish, func(t *testing.T, proc inbox.Processor) {
		start(t, proc, testConfig(url, 2))
	})
}
