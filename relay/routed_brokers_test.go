package relay_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/pgoutbox/pgoutbox"
	"github.com/pgoutbox/pgoutbox/broker"
	"github.com/pgoutbox/pgoutbox/broker/rabbitmq"
	"github.com/pgoutbox/pgoutbox/broker/webhook"
	"github.com/pgoutbox/pgoutbox/internal/natstest"
	"github.com/pgoutbox/pgoutbox/internal/pgtest"
	"github.com/pgoutbox/pgoutbox/internal/wait"
	"github.com/pgoutbox/pgoutbox/relay"
	"github.com/pgoutbox/pgoutbox/wire"
)

// hookReceiver is a webhook receiver that answers 500 while broken, and
// keeps the messages it accepted.
type hookReceiver struct {
	broken atomic.Bool
	mu     sync.Mutex
	got    []broker.Message
}

func (h *hookReceiver) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if h.broken.Load() {
		http.Error(w, "receiver down for maintenance", http.StatusInternalServerError)
		return
	}
	body, err := io.ReadAll(r.Body)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	names := make([]string, 0, len(r.Header))
	for k := range r.Header {
		names = append(names, k)
	}
	m, err := wire.ParseOutboxHeaders(body, names, r.Header.Get)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	h.mu.Lock()
	h.got = append(h.got, m)
	h.mu.Unlock()
	w.WriteHeader(http.StatusNoContent)
}

func (h *hookReceiver) messages() []broker.Message {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]broker.Message(nil), h.got...)
}

// holds reports whether got holds every id of want.
func holds(got []broker.Message, want []pgoutbox.UUID) bool {
	seen := make(map[pgoutbox.UUID]bool, len(got))
	for _, m := range got {
		seen[m.EventID] = true
	}
	for _, id := range want {
		if !seen[id] {
			return false
		}
	}
	return true
}

// Acceptance: three destinations on three real brokers (NATS JetStream,
// RabbitMQ, a webhook), with different rules. The webhook answers 500 at
// first: NATS and RabbitMQ receive all their events meanwhile, and no event
// the webhook takes counts as done. Healed, the webhook catches up in order;
// each destination has exactly its events, in order per aggregate.
func TestDestinationsOnRealBrokers(t *testing.T) {
	t.Parallel()
	o := newOutbox(t, 16)
	evs := o.enqueueRouted(t, 15)

	target := natstest.New(t, natstest.URL())
	natsPub := dialNATS(t, natstest.URL(), target)

	name := pgtest.Name("pgoutbox_routed_test")
	conn, err := amqp.Dial(rabbitURL)
	pgtest.Must(t, err, "connect to RabbitMQ")
	t.Cleanup(func() { conn.Close() })
	ch, err := conn.Channel()
	pgtest.Must(t, err, "channel")
	pgtest.Must(t, ch.ExchangeDeclare(name, "topic", true, false, false, false, nil), "declare exchange")
	_, err = ch.QueueDeclare(name, true, false, false, false, nil)
	pgtest.Must(t, err, "declare queue")
	pgtest.Must(t, ch.QueueBind(name, "#", name, false, nil), "bind")
	t.Cleanup(func() {
		_, _ = ch.QueueDelete(name, false, false, false)
		_ = ch.ExchangeDelete(name, false, false)
	})
	rabbitPub, err := rabbitmq.Dial(context.Background(), rabbitURL, &rabbitmq.Config{Exchange: name, ConnectionName: name, Logger: quietLogger()})
	pgtest.Must(t, err, "dial RabbitMQ")
	t.Cleanup(func() { _ = rabbitPub.Close() })
	var queued []broker.Message
	readQueue := func() []broker.Message {
		for {
			d, ok, err := ch.Get(name, true)
			pgtest.Must(t, err, "get")
			if !ok {
				return queued
			}
			queued = append(queued, fromAMQP(t, d))
		}
	}

	hook := &hookReceiver{}
	hook.broken.Store(true)
	srv := httptest.NewServer(hook)
	t.Cleanup(srv.Close)
	hookPub, err := webhook.New(&webhook.Config{URL: srv.URL, AllowUnsigned: true, Logger: quietLogger()})
	pgtest.Must(t, err, "webhook")
	t.Cleanup(func() { _ = hookPub.Close() })

	cfg := fastRetry(routedDests(relay.StartBackfill, natsPub, rabbitPub, hookPub))
	cfg.MaxAttempts = 1_000_000 // the receiver's 500s must not quarantine while it is down
	cfg.BackoffMax = 200 * time.Millisecond
	r := startRouted(t, o, cfg)

	wait.For(t, 60*time.Second, "NATS and RabbitMQ to hold all their events", func() bool {
		return holds(target.Read(t), wantFor("orders", evs)) && holds(readQueue(), wantFor("users", evs))
	})
	if n := o.count(t, "published_at IS NOT NULL"); n != 0 {
		t.Fatalf("%d events done while the webhook had not passed them", n)
	}
	if n := len(hook.messages()); n != 0 {
		t.Fatalf("the broken webhook accepted %d messages", n)
	}
	if n := o.count(t, "published_at IS NULL AND quarantined_at IS NULL"); n == 0 {
		t.Fatal("nothing pending while the webhook is broken")
	}

	hook.broken.Store(false)
	wait.For(t, 60*time.Second, "every event done once the webhook is healed", func() bool {
		return o.count(t, "published_at IS NULL AND quarantined_at IS NULL") == 0
	})
	checkRouted(t, "orders", target.Read(t), wantFor("orders", evs))
	checkRouted(t, "users", readQueue(), wantFor("users", evs))
	checkRouted(t, "eu", hook.messages(), wantFor("eu", evs))
	if n := o.count(t, "quarantined_at IS NOT NULL"); n != len(unrouted(evs)) {
		t.Fatalf("%d events quarantined, want the %d no rule takes", n, len(unrouted(evs)))
	}
	t.Logf("stats %+v", r.Stats())
}
