package relay_test

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/pgoutbox/pgoutbox/broker"
	"github.com/pgoutbox/pgoutbox/broker/brokertest"
	"github.com/pgoutbox/pgoutbox/broker/rabbitmq"
	"github.com/pgoutbox/pgoutbox/internal/pgtest"
	"github.com/pgoutbox/pgoutbox/internal/rabbittest"
	"github.com/pgoutbox/pgoutbox/internal/wait"
	"github.com/pgoutbox/pgoutbox/relay"
	"github.com/pgoutbox/pgoutbox/wire"
)

const rabbitURL = "amqp://guest:guest@127.0.0.1:5672/"

// Acceptance: the RabbitMQ connection is closed by the server mid-run (as an
// operator or a node restart would). The relay recovers and nothing is lost; each
// aggregate's first appearances in the queue are in order.
func TestRabbitMQConnectionKilledMidRun(t *testing.T) {
	t.Parallel()
	rabbitConnectionKilledMidRun(t, nil)
}

// The same into a quorum queue (x-queue-type=quorum), RabbitMQ's replicated
// queue: with publisher confirms, the server confirms a message only once a
// quorum of the queue's replicas holds it. The test server is a single node, so
// this proves the relay's part (confirms, retry after the connection is lost,
// order of first appearances), not a replica's loss.
func TestRabbitMQQuorumQueueConnectionKilledMidRun(t *testing.T) {
	t.Parallel()
	rabbitConnectionKilledMidRun(t, amqp.Table{"x-queue-type": "quorum"})
}

// rabbitConnectionKilledMidRun has the server close the relay's connection
// mid-run, with the events routed to a queue declared with queueArgs.
func rabbitConnectionKilledMidRun(t *testing.T, queueArgs amqp.Table) {
	ctl := rabbittest.NewCtl(t)
	o := newOutbox(t, 8)
	name := pgtest.Name("pgoutbox_relay_test")
	ch := rabbittest.Queue(t, rabbitURL, name, queueArgs)

	pub, err := rabbitmq.Dial(context.Background(), rabbitURL, &rabbitmq.Config{Exchange: name, ConnectionName: name, Logger: quietLogger()})
	pgtest.Must(t, err, "dial")
	t.Cleanup(func() { _ = pub.Close() })
	pid := ctl.ConnectionPID(t, name)
	ids := o.enqueue(t, 100, 30)
	// The second batch waits until the server has closed the connection, so the
	// close lands mid-run whatever the speed of the machine.
	gate := &gatedPublisher{Publisher: pub, after: 1, open: make(chan struct{}), reached: make(chan struct{})}
	r := startRelay(t, o, gate, relay.Config{BatchSize: 100, Workers: 1, PollInterval: 100 * time.Millisecond,
		BackoffBase: 20 * time.Millisecond, BackoffMax: 200 * time.Millisecond})
	<-gate.reached
	ctl.CloseConnection(t, pid, "pgoutbox relay test")
	close(gate.open)
	wait.For(t, 2*time.Minute, "the backlog to drain after the connection was closed", func() bool {
		return o.count(t, "published_at IS NULL") == 0
	})

	var got []broker.Message
	for _, d := range rabbittest.Drain(t, ch, name) {
		got = append(got, fromAMQP(t, d))
	}
	dups := brokertest.CheckStream(t, got, ids)
	if now := ctl.ConnectionPID(t, name); now == pid {
		t.Errorf("the publisher still uses connection %s: it was never closed, the test proved nothing", pid)
	}
	t.Logf("%d events, %d messages in the queue (%d duplicates), relay stats %+v", len(ids), len(got), dups, r.Stats())
}

// gatedPublisher lets the first `after` Publish calls through, then holds the next
// one until open is closed (announcing it on reached).
type gatedPublisher struct {
	broker.Publisher
	after         int
	calls         atomic.Int32
	open, reached chan struct{}
}

func (g *gatedPublisher) Publish(ctx context.Context, msgs []broker.Message) []error {
	if int(g.calls.Add(1)) == g.after+1 {
		close(g.reached)
		<-g.open
	}
	return g.Publisher.Publish(ctx, msgs)
}

func fromAMQP(t *testing.T, d amqp.Delivery) broker.Message {
	t.Helper()
	names := slices.Collect(maps.Keys(d.Headers))
	m, err := wire.ParseOutboxHeaders(d.Body, names, func(n string) string {
		if v, ok := d.Headers[n]; ok {
			return fmt.Sprint(v)
		}
		return ""
	})
	pgtest.Must(t, err, "decode message %s", d.MessageId)
	return m
}
