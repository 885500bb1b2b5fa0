package faulttest

import (
	"context"
	"fmt"
	"maps"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/pgoutbox/pgoutbox"
	"github.com/pgoutbox/pgoutbox/broker"
	"github.com/pgoutbox/pgoutbox/broker/brokertest"
	"github.com/pgoutbox/pgoutbox/checker"
	"github.com/pgoutbox/pgoutbox/internal/failpoint"
	"github.com/pgoutbox/pgoutbox/internal/pgtest"
	"github.com/pgoutbox/pgoutbox/internal/rabbittest"
	"github.com/pgoutbox/pgoutbox/internal/wait"
	"github.com/pgoutbox/pgoutbox/wire"
)

// rabbitURL is the shared RabbitMQ server; its credentials reach the relays
// through the environment (broker_env), never the destinations file.
const rabbitURL = "amqp://guest:guest@127.0.0.1:5672/"

// The destinations scenario: relays with three destinations on three brokers —
// "stream" (NATS JetStream, every event), "queue" (RabbitMQ, the order and user
// aggregates) and "hook" (a webhook of the test's own, the paid events) — are
// SIGKILLed at every relay failpoint while a producer writes, rolling some
// transactions back. The webhook answers 503 from the start: the stream and the
// queue must receive every event of theirs while the webhook still has pending
// lanes. Healed, the webhook catches up. The checker then finds, per
// destination, every committed event routed there arrived, in order per
// aggregate, and nothing rolled back or routed elsewhere.
func TestDestinationsCrashAtFailpoints(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envConfig{})
	queue := newRabbitQueue(t)
	hook := &brokertest.HookReceiver{}
	hook.Down.Store(true)
	srv := httptest.NewServer(hook)
	t.Cleanup(srv.Close)

	file := filepath.Join(e.dir, "destinations.yaml")
	q := strconv.Quote
	pgtest.Must(t, os.WriteFile(file, []byte(`destinations:
  - name: stream
    broker: `+q(e.natsURL)+`
    start: backfill
    nats_stream: `+q(e.stream)+`
    topic_template: `+q(e.template)+`
    ack_timeout: 1s
    rules:
      - all: true
  - name: queue
    broker_env: FAULTTEST_RABBITMQ_URL
    start: backfill
    amqp_exchange: `+q(queue.name)+`
    ack_timeout: 1s
    rules:
      - aggregate_types: [order, user]
  - name: hook
    broker: `+q(srv.URL+"/events")+`
    webhook_unsigned: true
    start: backfill
    rules:
      - event_types: paid
`), 0o600), "write the destinations file")
	routes := map[string]func(aggregateType, eventType string) bool{
		"stream": func(string, string) bool { return true },
		"queue":  func(at, _ string) bool { return at == "order" || at == "user" },
		"hook":   func(_, et string) bool { return et == "paid" },
	}
	relay := func(id string, extraEnv []string) *proc {
		return e.start("relay "+id, append([]string{"FAULTTEST_RABBITMQ_URL=" + rabbitURL}, extraEnv...), bin.pgoutbox,
			"relay", "--database-url", e.dbURL("faulttest-"+e.schema+"-"+id), "--schema", e.schema, "--id", id,
			"--destinations-file", file, "--workers", "2",
			"--lease", "2s", "--poll-interval", "200ms", "--backoff-base", "100ms", "--backoff-max", "1s",
			"--batch-size", "50", "--log-level", "info")
	}

	prod := e.producer("p1", nil, producerOpts{txs: 150, rollbackPercent: 20, pause: 5 * time.Millisecond,
		aggregateTypes: "acct,order,user", eventTypes: "changed,paid"})
	wait.For(t, 30*time.Second, "a first backlog", func() bool { return prod.exited() || e.count("outbox_events", "true") >= 20 })

	// One victim after the other, each dying at its point with leases held that
	// the next must wait out.
	for _, c := range []struct {
		point string
		nth   int
	}{{failpoint.RelayClaim, 3}, {failpoint.RelayBeforePublish, 2}, {failpoint.RelayAfterPublish, 2}, {failpoint.RelayMark, 2}} {
		victim := relay("victim-"+strings.ReplaceAll(c.point, "/", "-"), failpointEnv(c.point, fmt.Sprintf("%d*crash", c.nth)))
		victim.wait(t, 60*time.Second)
		if !victim.killedBySIGKILL() || !strings.Contains(victim.out.String(), "failpoint "+c.point+": crash") {
			t.Fatalf("%s did not die at %s: %s\n%s", victim.name, c.point, victim.status(), tail(victim.out.String(), 30))
		}
	}
	relay("r1", nil)
	relay("r2", nil)
	prod.wait(t, 90*time.Second)
	if prod.err != nil {
		t.Fatalf("producer: %v\n%s", prod.err, tail(prod.out.String(), 20))
	}

	// The producer is done: the outbox holds every committed event, and the
	// rules say where each must go.
	expected := e.routedEvents(routes)
	for name, ids := range expected {
		if len(ids) == 0 {
			t.Fatalf("no committed event is routed to %s; the test proves nothing", name)
		}
	}
	ctx := context.Background()
	readStream := func() []checker.Message {
		msgs, err := checker.ReadJetStream(ctx, e.js, e.stream)
		pgtest.Must(t, err, "read the stream")
		return msgs
	}
	wait.For(t, 60*time.Second, "the stream and the queue to hold all their events while the webhook is blocked", func() bool {
		e.failOnCrash()
		return holdsAll(readStream(), expected["stream"]) && holdsAll(queue.read(t), expected["queue"])
	})
	if n := e.pendingLanes("hook", "event_type = 'paid'"); n == 0 {
		t.Fatal("the blocked webhook has no pending lane: it did not hold anything back")
	}
	if n := len(hook.Messages()); n != 0 {
		t.Fatalf("the blocked webhook accepted %d messages", n)
	}
	t.Logf("the stream and the queue had every event while the webhook waited with %d pending lanes, %d events not done",
		e.pendingLanes("hook", "event_type = 'paid'"), e.count("outbox_events", "published_at IS NULL"))

	hook.Down.Store(false)
	wait.For(t, 60*time.Second, "every event done once the webhook is healed", func() bool {
		e.failOnCrash()
		return e.count("outbox_events", "published_at IS NULL") == 0
	})
	e.stopAll()
	if n := e.count("outbox_events", "quarantined_at IS NOT NULL"); n != 0 {
		t.Fatalf("%d events quarantined", n)
	}
	v := e.verdict(func(in *checker.Input) {
		in.Effects, in.Consumers = nil, nil // no consumer here: the destinations are the sinks
		in.Destinations = []checker.Destination{
			{Name: "stream", Expected: expected["stream"], Received: in.Broker},
			{Name: "queue", Expected: expected["queue"], Received: queue.read(t)},
			{Name: "hook", Expected: expected["hook"], Received: checkerMessages(hook.Messages())},
		}
		in.Broker = nil
	})
	mustHold(t, v)
	if v.RolledBack == 0 {
		t.Fatalf("no transaction rolled back; guarantee 2 was not exercised:\n%s", v)
	}
	for name, n := range v.Destinations {
		if n.Expected != len(expected[name]) || n.Expected == 0 {
			t.Fatalf("destination %s: the checker expected %d events, the rules route %d there:\n%s", name, n.Expected, len(expected[name]), v)
		}
	}
}

// routedEvents reads the outbox and returns, per destination, the events its
// rule routes there.
func (e *env) routedEvents(routes map[string]func(aggregateType, eventType string) bool) map[string]map[pgoutbox.UUID]bool {
	e.t.Helper()
	rows, err := e.pool.Query(context.Background(), "SELECT event_id, aggregate_type, event_type FROM "+e.table("outbox_events"))
	pgtest.Must(e.t, err, "read the outbox")
	out := map[string]map[pgoutbox.UUID]bool{}
	for name := range routes {
		out[name] = map[pgoutbox.UUID]bool{}
	}
	for rows.Next() {
		var id pgoutbox.UUID
		var aggType, evType string
		pgtest.Must(e.t, rows.Scan(&id, &aggType, &evType), "read the outbox")
		for name, route := range routes {
			if route(aggType, evType) {
				out[name][id] = true
			}
		}
	}
	pgtest.Must(e.t, rows.Err(), "read the outbox")
	return out
}

// pendingLanes counts the lanes holding an event matching where that the
// destination has not passed yet.
func (e *env) pendingLanes(destination, where string) int {
	e.t.Helper()
	var n int
	err := e.pool.QueryRow(context.Background(), `SELECT count(*) FROM (
		SELECT DISTINCT o.aggregate_type, o.aggregate_id FROM `+e.table("outbox_events")+` o
		LEFT JOIN `+e.table("outbox_destination_lanes")+` l ON l.destination = $1
		  AND l.aggregate_type = o.aggregate_type AND l.aggregate_id = o.aggregate_id
		WHERE `+where+` AND o.aggregate_sequence > coalesce(l.delivered_sequence, 0)) AS pending`, destination).Scan(&n)
	pgtest.Must(e.t, err, "count the pending lanes of %s", destination)
	return n
}

// holdsAll reports whether msgs hold every event of want.
func holdsAll(msgs []checker.Message, want map[pgoutbox.UUID]bool) bool {
	got := make(map[pgoutbox.UUID]bool, len(msgs))
	for _, m := range msgs {
		got[m.EventID] = true
	}
	for id := range want {
		if !got[id] {
			return false
		}
	}
	return true
}

// rabbitQueue is a topic exchange of the test's own with a queue bound to every
// routing key; read drains the queue and returns everything read so far.
type rabbitQueue struct {
	name string
	ch   *amqp.Channel
	got  []checker.Message
}

func newRabbitQueue(t *testing.T) *rabbitQueue {
	t.Helper()
	name := pgtest.Name("pgoutbox_faulttest")
	return &rabbitQueue{name: name, ch: rabbittest.Queue(t, rabbitURL, name, nil)}
}

func (r *rabbitQueue) read(t *testing.T) []checker.Message {
	t.Helper()
	for _, d := range rabbittest.Drain(t, r.ch, r.name) {
		names := slices.Collect(maps.Keys(d.Headers))
		m, err := wire.ParseReceived(d.Body, names, func(n string) string {
			if v, ok := d.Headers[n]; ok {
				return fmt.Sprint(v)
			}
			return ""
		})
		pgtest.Must(t, err, "decode message %s", d.MessageId)
		r.got = append(r.got, checker.Message{EventID: m.EventID, AggregateType: m.AggregateType, AggregateID: m.AggregateID, Sequence: m.AggregateSequence})
	}
	return r.got
}

// checkerMessages is what checker needs of msgs.
func checkerMessages(msgs []broker.Message) []checker.Message {
	out := make([]checker.Message, len(msgs))
	for i, m := range msgs {
		out[i] = checker.Message{EventID: m.EventID, AggregateType: m.AggregateType, AggregateID: m.AggregateID, Sequence: m.AggregateSequence}
	}
	return out
}
