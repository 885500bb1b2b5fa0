package relay_test

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strconv"
	"testing"
	"time"

	"github.com/pgoutbox/pgoutbox/broker"
	"github.com/pgoutbox/pgoutbox/broker/brokertest"
	natsbroker "github.com/pgoutbox/pgoutbox/broker/nats"
	"github.com/pgoutbox/pgoutbox/broker/nats/natsembed"
	"github.com/pgoutbox/pgoutbox/internal/natstest"
	"github.com/pgoutbox/pgoutbox/internal/pgtest"
	"github.com/pgoutbox/pgoutbox/internal/wait"
	"github.com/pgoutbox/pgoutbox/relay"
)

func mustTemplate(t *testing.T, s string) broker.Template {
	t.Helper()
	tmpl, err := broker.ParseTemplate(s)
	pgtest.Must(t, err, "template")
	return tmpl
}

// dialNATS connects a publisher for target at serverURL, closed when the test ends.
func dialNATS(t *testing.T, serverURL string, target natstest.Target) *natsbroker.Publisher {
	t.Helper()
	pub, err := natsbroker.Dial(context.Background(), serverURL, &natsbroker.Config{
		Stream: target.Stream, StreamSubjects: target.Subjects(), Subject: mustTemplate(t, target.Template),
		AckTimeout: 2 * time.Second, Logger: quietLogger(),
	})
	pgtest.Must(t, err, "dial NATS")
	t.Cleanup(func() { _ = pub.Close() })
	return pub
}

// Acceptance: 4 relays drain 20,000 events over 300 aggregates to the real NATS
// server; every event is on the stream and each aggregate's first appearances are
// 1..N in order.
func TestFourRelaysDrainToNATS(t *testing.T) {
	t.Parallel()
	o := newOutbox(t, 16)
	target := natstest.New(t, natstest.URL())
	ids := o.enqueue(t, 300, 67) // 20,100 events
	start := time.Now()
	var relays []*relay.Relay
	for i := range 4 {
		pub := dialNATS(t, natstest.URL(), target)
		relays = append(relays, startRelay(t, o, pub, relay.Config{ID: fmt.Sprintf("relay-%d", i)}))
	}
	wait.For(t, 3*time.Minute, "the backlog to drain", func() bool { return o.count(t, "published_at IS NULL") == 0 })
	elapsed := time.Since(start)
	got := target.Read(t)
	dups := brokertest.CheckStream(t, got, ids)
	var per []int64
	for _, r := range relays {
		per = append(per, r.Stats().Published)
	}
	t.Logf("%d events in %s (%.0f/s) by relays %v; %d messages on the stream, %d duplicates",
		len(ids), elapsed.Round(time.Millisecond), float64(len(ids))/elapsed.Seconds(), per, len(got), dups)
}

// Acceptance: the broker goes away mid-run. A backlog builds with attempts and
// backoff recorded, nothing is quarantined for the outage, and when the broker is
// back the backlog drains with nothing lost and order held.
func TestBrokerOutageBacklogDrains(t *testing.T) {
	t.Parallel()
	o := newOutbox(t, 8)
	dir := t.TempDir()
	srv, err := natsembed.New(&natsembed.Config{StoreDir: dir, Port: -1})
	pgtest.Must(t, err, "start NATS")
	serverURL := srv.URL()
	t.Cleanup(func() { srv.Shutdown() })
	target := natstest.OnOwnServer(t, serverURL)

	pub := dialNATS(t, serverURL, target)
	r := startRelay(t, o, pub, relay.Config{MaxAttempts: 3, BackoffBase: 20 * time.Millisecond, BackoffMax: 200 * time.Millisecond,
		PollInterval: 100 * time.Millisecond, PublishTimeout: 3 * time.Second, Lease: 10 * time.Second})
	first := o.enqueue(t, 20, 10)
	wait.For(t, 30*time.Second, "the first events", func() bool { return o.count(t, "published_at IS NULL") == 0 })

	srv.Shutdown()
	second := o.enqueue(t, 50, 10)
	wait.For(t, 30*time.Second, "failed attempts to be recorded", func() bool {
		return o.count(t, "published_at IS NULL AND attempt_count > 0 AND last_error IS NOT NULL") >= 10
	})
	// The relay marks the broker down once a settle has committed: wait for that
	// rather than race it.
	wait.For(t, 30*time.Second, "the relay to report the broker down", func() bool {
		return errors.Is(r.Healthy(), relay.ErrBrokerUnreachable)
	})
	if n := o.count(t, "quarantined_at IS NOT NULL"); n != 0 {
		t.Fatalf("%d events quarantined because the broker was down", n)
	}
	if n := o.count(t, "published_at IS NULL"); n != len(second) {
		t.Fatalf("backlog of %d events, want %d", n, len(second))
	}

	u, _ := url.Parse(serverURL)
	port, _ := strconv.Atoi(u.Port())
	srv2, err := natsembed.New(&natsembed.Config{StoreDir: dir, Port: port})
	pgtest.Must(t, err, "restart NATS")
	t.Cleanup(func() { srv2.Shutdown() })
	wait.For(t, 60*time.Second, "the backlog to drain", func() bool { return o.count(t, "published_at IS NULL") == 0 })
	dups := brokertest.CheckStream(t, target.Read(t), append(first, second...))
	if err := r.Healthy(); err != nil {
		t.Errorf("relay still unhealthy after the broker came back: %v", err)
	}
	t.Logf("stats %+v, %d duplicates", r.Stats(), dups)
}
