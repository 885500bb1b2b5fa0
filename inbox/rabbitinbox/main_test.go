package rabbitinbox_test

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	amqp "github.com/rabbitmq/amqp091-go"
	"go.uber.org/goleak"

	"github.com/pgoutbox/pgoutbox/broker"
	"github.com/pgoutbox/pgoutbox/broker/rabbitmq"
	"github.com/pgoutbox/pgoutbox/inbox"
	"github.com/pgoutbox/pgoutbox/inbox/rabbitinbox"
	"github.com/pgoutbox/pgoutbox/internal/inboxtest"
	"github.com/pgoutbox/pgoutbox/internal/pgtest"
	"github.com/pgoutbox/pgoutbox/migrate"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// amqpURL is the RabbitMQ server the test machine runs (PGOUTBOX_TEST_AMQP_URL
// overrides it). Other tests use it too: tests never stop it, work on exchanges and
// queues of their own, deleted when they end, and close only connections they
// named themselves.
var amqpURL = cmp.Or(os.Getenv("PGOUTBOX_TEST_AMQP_URL"), "amqp://guest:guest@127.0.0.1:5672/")

var quiet = slog.New(slog.DiscardHandler)

func uniqueName(prefix string) string {
	var r [5]byte
	_, _ = rand.Read(r[:])
	return prefix + "-" + hex.EncodeToString(r[:])
}

// env is one test's world: a schema with the inbox tables and a business table
// (effects: one row per application, numbered in application order), and a
// queue of its own on the shared RabbitMQ server.
type env struct {
	*inboxtest.Effects
	*target
	pool   *pgxpool.Pool
	schema string
}

// target is an exchange and a queue bound to it with "#" on the shared RabbitMQ
// server, and the relay's publisher on that exchange.
type target struct {
	admin    *amqp.Connection
	exchange string
	queue    string
	pub      *rabbitmq.Publisher
}

func newEnv(t testing.TB, maxConns int32) *env { return newEnvArgs(t, maxConns, nil) }

// newEnvArgs is newEnv with the queue declared with args.
func newEnvArgs(t testing.TB, maxConns int32, args amqp.Table) *env {
	t.Helper()
	ctx := context.Background()
	pool, schema := pgtest.Schema(t, maxConns)
	_, err := migrate.Up(ctx, pool, &migrate.Config{Schema: schema, Lines: []migrate.Line{migrate.LineInbox}})
	pgtest.Must(t, err, "migrate")
	e := &env{pool: pool, schema: schema, target: newTarget(t, args)}
	e.Effects = inboxtest.NewEffects(t, pool, schema)
	return e
}

// newTarget declares a fresh exchange and queue, deleted when the test ends.
func newTarget(t testing.TB, args amqp.Table) *target {
	t.Helper()
	e := &target{}
	var err error
	e.admin, err = amqp.Dial(amqpURL)
	pgtest.Must(t, err, "connect to the shared RabbitMQ server")
	t.Cleanup(func() { _ = e.admin.Close() })
	e.exchange, e.queue = uniqueName("pgotest-inbox-x"), uniqueName("pgotest-inbox-q")
	e.deleteAtEnd(t, e.exchange, e.queue)
	e.onChannel(t, func(ch *amqp.Channel) error {
		if err := ch.ExchangeDeclare(e.exchange, amqp.ExchangeTopic, false, false, false, false, nil); err != nil {
			return err
		}
		// Not exclusive: the subscribers consume it on connections of their own.
		if _, err := ch.QueueDeclare(e.queue, false, false, false, false, args); err != nil {
			return err
		}
		return ch.QueueBind(e.queue, "#", e.exchange, false, nil)
	})

	e.pub, err = rabbitmq.Dial(context.Background(), amqpURL, &rabbitmq.Config{Exchange: e.exchange, Logger: quiet})
	pgtest.Must(t, err, "dial the publisher")
	t.Cleanup(func() { _ = e.pub.Close() })
	return e
}

// deleteAtEnd deletes the exchange and the queue when the test ends; "" skips one.
// Cleanups run last-registered first: after the subscribers stopped, before the
// admin connection closes.
func (e *target) deleteAtEnd(t testing.TB, exchange, queue string) {
	t.Cleanup(func() {
		ch, err := e.admin.Channel()
		if err != nil {
			t.Errorf("delete %s, %s: %v", exchange, queue, err)
			return
		}
		defer ch.Close()
		if queue != "" {
			if _, err := ch.QueueDelete(queue, false, false, false); err != nil {
				t.Errorf("delete queue %s: %v", queue, err)
			}
		}
		if exchange != "" {
			if err := ch.ExchangeDelete(exchange, false, false); err != nil {
				t.Errorf("delete exchange %s: %v", exchange, err)
			}
		}
	})
}

// onChannel runs fn on a channel of the admin connection.
func (e *target) onChannel(t testing.TB, fn func(ch *amqp.Channel) error) {
	t.Helper()
	ch, err := e.admin.Channel()
	pgtest.Must(t, err, "open channel")
	defer ch.Close()
	pgtest.Must(t, fn(ch), "on the admin channel")
}

// ready returns how many messages of queue wait to be delivered (not those
// delivered and unacknowledged).
func (e *target) ready(t testing.TB, queue string) int {
	t.Helper()
	var n int
	e.onChannel(t, func(ch *amqp.Channel) error {
		q, err := ch.QueueDeclarePassive(queue, false, false, false, false, nil)
		n = q.Messages
		return err
	})
	return n
}

// depth asks the server how many messages the queue holds, ready and
// unacknowledged: after every subscriber has stopped (closing its connection
// requeues what it did not ack), both must be 0 for nothing to be left behind.
func (e *target) depth(t testing.TB) (ready, unacked int) {
	t.Helper()
	out, err := exec.Command("rabbitmqctl", "-q", "list_queues", "--no-table-headers",
		"name", "messages_ready", "messages_unacknowledged").CombinedOutput()
	pgtest.Must(t, err, "rabbitmqctl list_queues: %s", out)
	for _, line := range strings.Split(string(out), "\n") {
		f := strings.Fields(line)
		if len(f) == 3 && f[0] == e.queue {
			ready, _ = strconv.Atoi(f[1])
			unacked, _ = strconv.Atoi(f[2])
			return ready, unacked
		}
	}
	t.Fatalf("queue %s not listed by rabbitmqctl:\n%s", e.queue, out)
	return 0, 0
}

// closeConnection has the server close the connection named name, as an operator
// would (rabbitmqctl close_connection). It touches no other connection.
func closeConnection(name string) error {
	out, err := exec.Command("rabbitmqctl", "-q", "list_connections", "--no-table-headers", "pid", "client_properties").CombinedOutput()
	if err != nil {
		return fmt.Errorf("rabbitmqctl list_connections: %v: %s", err, out)
	}
	for _, line := range strings.Split(string(out), "\n") {
		if pid, props, ok := strings.Cut(line, "\t"); ok && strings.Contains(props, `{"connection_name","`+name+`"}`) {
			if out, err := exec.Command("rabbitmqctl", "-q", "close_connection", pid, "pgoutbox test: connection closed by the server").CombinedOutput(); err != nil {
				return fmt.Errorf("rabbitmqctl close_connection: %v: %s", err, out)
			}
			return nil
		}
	}
	return fmt.Errorf("no connection named %q", name)
}

// dial returns a subscriber on the env's queue, not started, with a connection
// name of its own, stopped when the test ends.
func (e *env) dial(t testing.TB, proc inbox.Processor, cfg rabbitinbox.Config) *rabbitinbox.Subscriber {
	t.Helper()
	cfg.Queue = cmp.Or(cfg.Queue, e.queue)
	cfg.ConnectionName = cmp.Or(cfg.ConnectionName, uniqueName("pgotest-inbox"))
	cfg.ReconnectBackoff = cmp.Or(cfg.ReconnectBackoff, 20*time.Millisecond)
	cfg.MaxReconnectBackoff = cmp.Or(cfg.MaxReconnectBackoff, 500*time.Millisecond)
	if cfg.Logger == nil {
		cfg.Logger = quiet
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := rabbitinbox.Dial(ctx, amqpURL, proc, &cfg)
	pgtest.Must(t, err, "rabbitinbox.Dial")
	inboxtest.StopAtEnd(t, s)
	return s
}

// subscribe is dial and Start.
func (e *env) subscribe(t testing.TB, proc inbox.Processor, cfg rabbitinbox.Config) *rabbitinbox.Subscriber {
	t.Helper()
	s := e.dial(t, proc, cfg)
	pgtest.Must(t, s.Start(context.Background()), "Start")
	return s
}

// publish sends msgs through the relay's publisher, each of which must be
// confirmed.
func (e *target) publish(t testing.TB, msgs ...broker.Message) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for i, err := range e.pub.Publish(ctx, msgs) {
		pgtest.Must(t, err, "publish %s/%s #%d", msgs[i].AggregateType, msgs[i].AggregateID, msgs[i].AggregateSequence)
	}
}
