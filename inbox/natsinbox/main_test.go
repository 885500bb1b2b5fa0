package natsinbox_test

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	natsgo "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/goleak"

	"github.com/pgoutbox/pgoutbox/broker"
	"github.com/pgoutbox/pgoutbox/inbox"
	"github.com/pgoutbox/pgoutbox/inbox/natsinbox"
	"github.com/pgoutbox/pgoutbox/internal/inboxtest"
	"github.com/pgoutbox/pgoutbox/internal/natstest"
	"github.com/pgoutbox/pgoutbox/internal/pgtest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var quiet = slog.New(slog.DiscardHandler)

// env is one test's world: a migrated schema with a business table (effects: one row
// per application, numbered in application order) and a stream of its own on the
// shared NATS server.
type env struct {
	*inboxtest.Effects
	pool   *pgxpool.Pool
	schema string
	target natstest.Target
}

func newEnv(t testing.TB, maxConns int32) *env {
	t.Helper()
	pool, schema := pgtest.Migrated(t, maxConns)
	e := &env{pool: pool, schema: schema, target: newStream(t)}
	e.Effects = inboxtest.NewEffects(t, pool, schema)
	return e
}

// newStream creates a stream of its own on the shared NATS server.
func newStream(t testing.TB) natstest.Target {
	t.Helper()
	target := natstest.New(t, natstest.URL())
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err := target.JS.CreateStream(ctx, jetstream.StreamConfig{
		Name: target.Stream, Subjects: target.Subjects(), Storage: jetstream.MemoryStorage})
	pgtest.Must(t, err, "create stream")
	return target
}

// connect opens a JetStream client of its own (an instance's connection).
func connect(t testing.TB) jetstream.JetStream {
	t.Helper()
	nc, err := natsgo.Connect(natstest.URL())
	pgtest.Must(t, err, "connect to NATS")
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	pgtest.Must(t, err, "jetstream")
	return js
}

// subscribe starts a subscriber on the env's stream, stopped when the test ends.
func (e *env) subscribe(t testing.TB, js jetstream.JetStream, proc inbox.Processor, cfg natsinbox.Config) *natsinbox.Subscriber {
	t.Helper()
	cfg.Stream = e.target.Stream
	if cfg.Logger == nil {
		cfg.Logger = quiet
	}
	s, err := natsinbox.New(js, proc, &cfg)
	pgtest.Must(t, err, "natsinbox.New")
	pgtest.Must(t, s.Start(context.Background()), "Start")
	inboxtest.StopAtEnd(t, s)
	return s
}

// published is one message to put on the stream, with its Nats-Msg-Id: a new id
// makes the stream store a copy (a forced redelivery of the same event).
type published struct {
	m     broker.Message
	msgID string
}

func once(msgs ...broker.Message) []published {
	out := make([]published, len(msgs))
	for i, m := range msgs {
		out[i] = published{m, m.EventID.String()}
	}
	return out
}

// publish stores msgs on the env's stream, in order, as the relay would send them.
func (e *env) publish(t testing.TB, msgs []published) { publishTo(t, e.target, msgs) }

// publishTo stores msgs on target's stream, in order.
func publishTo(t testing.TB, target natstest.Target, msgs []published) {
	t.Helper()
	js := target.JS
	futures := make([]jetstream.PubAckFuture, 0, len(msgs))
	for _, p := range msgs {
		nm := &natsgo.Msg{Subject: target.Prefix + "." + p.m.AggregateType + "." + p.m.EventType, Data: p.m.Payload, Header: natsgo.Header{}}
		for k, v := range p.m.WireHeaders() {
			nm.Header.Set(k, v)
		}
		f, err := js.PublishMsgAsync(nm, jetstream.WithMsgID(p.msgID))
		pgtest.Must(t, err, "publish")
		futures = append(futures, f)
	}
	select {
	case <-js.PublishAsyncComplete():
	case <-time.After(60 * time.Second):
		t.Fatal("publishes not acknowledged within 60s")
	}
	for _, f := range futures {
		select {
		case err := <-f.Err():
			t.Fatalf("publish: %v", err)
		default:
		}
	}
}

// consumerInfo reads the durable consumer's state from the server.
func (e *env) consumerInfo(t testing.TB, durable string) *jetstream.ConsumerInfo {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := e.target.JS.Consumer(ctx, e.target.Stream, durable)
	pgtest.Must(t, err, "consumer %s", durable)
	info, err := c.Info(ctx)
	pgtest.Must(t, err, "consumer info")
	return info
}

// settled reports whether the durable consumer has nothing left to deliver or ack.
func (e *env) settled(t testing.TB, durable string) bool {
	info := e.consumerInfo(t, durable)
	return info.NumPending == 0 && info.NumAckPending == 0
}
