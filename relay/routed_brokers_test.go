package relay_test

import (
	"context"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/pgoutbox/pgoutbox"
	"github.com/pgoutbox/pgoutbox/broker"
	"github.com/pgoutbox/pgoutbox/broker/brokertest"
	"github.com/pgoutbox/pgoutbox/broker/rabbitmq"
	"github.com/pgoutbox/pgoutbox/broker/webhook"
	"github.com/pgoutbox/pgoutbox/internal/natstest"
	"github.com/pgoutbox/pgoutbox/internal/pgtest"
	"github.com/pgoutbox/pgoutbox/internal/rabbittest"
	"github.com/pgoutbox/pgoutbox/internal/wait"
	"github.com/pgoutbox/pgoutbox/relay"
)

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
// RabbitMQ, a webhook), with different rules. The webhook answers 503 at
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
	ch := rabbittest.Queue(t, rabbitURL, name, nil)
	rabbitPub, err := rabbitmq.Dial(context.Background(), rabbitURL, &rabbitmq.Config{Exchange: name, ConnectionName: name, Logger: quietLogger()})
	pgtest.Must(t, err, "dial RabbitMQ")
	t.Cleanup(func() { _ = rabbitPub.Close() })
	var queued []broker.Message
	readQueue := func() []broker.Message {
		for _, d := range rabbittest.Drain(t, ch, name) {
			queued = append(queued, fromAMQP(t, d))
		}
		return queued
	}

	hook := &brokertest.HookReceiver{}
	hook.Down.Store(true)
	srv := httptest.NewServer(hook)
	t.Cleanup(srv.Close)
	hookPub, err := webhook.New(&webhook.Config{URL: srv.URL, AllowUnsigned: true, Logger: quietLogger()})
	pgtest.Must(t, err, "webhook")
	t.Cleanup(func() { _ = hookPub.Close() })

	cfg := fastRetry(routedDests(relay.StartBackfill, natsPub, rabbitPub, hookPub))
	cfg.MaxAttempts = 1_000_000 // the receiver's 503s must not quarantine while it is down
	cfg.BackoffMax = 200 * time.Millisecond
	r := startRouted(t, o, cfg)

	wait.For(t, 60*time.Second, "NATS and RabbitMQ to hold all their events", func() bool {
		return holds(target.Read(t), wantFor("orders", evs)) && holds(readQueue(), wantFor("users", evs))
	})
	if n := o.count(t, "published_at IS NOT NULL"); n != 0 {
		t.Fatalf("%d events done while the webhook had not passed them", n)
	}
	if n := len(hook.Messages()); n != 0 {
		t.Fatalf("the broken webhook accepted %d messages", n)
	}
	if n := o.count(t, "published_at IS NULL AND quarantined_at IS NULL"); n == 0 {
		t.Fatal("nothing pending while the webhook is broken")
	}

	hook.Down.Store(false)
	wait.For(t, 60*time.Second, "every event done once the webhook is healed", func() bool {
		return o.count(t, "published_at IS NULL AND quarantined_at IS NULL") == 0
	})
	checkRouted(t, "orders", target.Read(t), wantFor("orders", evs))
	checkRouted(t, "users", readQueue(), wantFor("users", evs))
	checkRouted(t, "eu", hook.Messages(), wantFor("eu", evs))
	if n := o.count(t, "quarantined_at IS NOT NULL"); n != len(unrouted(evs)) {
		t.Fatalf("%d events quarantined, want the %d no rule takes", n, len(unrouted(evs)))
	}
	t.Logf("stats %+v", r.Stats())
}
