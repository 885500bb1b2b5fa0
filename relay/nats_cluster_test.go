package relay_test

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/pgoutbox/pgoutbox/broker/brokertest"
	"github.com/pgoutbox/pgoutbox/internal/natstest"
	"github.com/pgoutbox/pgoutbox/internal/pgtest"
	"github.com/pgoutbox/pgoutbox/internal/wait"
	"github.com/pgoutbox/pgoutbox/relay"
)

// A 3-node JetStream cluster with an R3 stream loses a node while the relay
// drains a backlog: first the stream's leader, then a follower of the new
// leader. The relay publishes on through whichever node leads; nothing is
// lost, first appearances stay in order per aggregate, and re-publishes within
// the dedup window are dropped by the stream (Nats-Msg-Id).
func TestNATSClusterLosesNodesDuringDrain(t *testing.T) {
	t.Parallel()
	cluster := natstest.StartCluster(t, 3)
	target := natstest.OnOwnServer(t, cluster.URL())
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	_, err := target.JS.CreateStream(ctx, jetstream.StreamConfig{Name: target.Stream, Subjects: target.Subjects(),
		Replicas: 3, Storage: jetstream.FileStorage, Duplicates: 2 * time.Minute})
	pgtest.Must(t, err, "create the R3 stream")

	o := newOutbox(t, 8)
	ids := o.enqueue(t, 50, 100) // 5,000 events
	pub := dialNATS(t, cluster.URL(), target)
	r := startRelay(t, o, pub, relay.Config{ID: "clustered", BatchSize: 100})

	published := func(n int) func() bool {
		return func() bool { return o.count(t, "published_at IS NOT NULL") >= n }
	}
	for i, what := range []string{"the stream leader", "the new leader's follower"} {
		wait.For(t, 2*time.Minute, "publishing before the node loss", published((i+1)*len(ids)/3))
		leader := cluster.StreamLeader(target.Stream)
		if leader < 0 {
			t.Fatalf("no leader of stream %s before losing %s", target.Stream, what)
		}
		victim := leader
		if i == 1 {
			victim = cluster.Follower(target.Stream)
		}
		cluster.Kill(victim)
		t.Logf("killed node %d (%s) with %d of %d events published", victim, what, o.count(t, "published_at IS NOT NULL"), len(ids))
		if i == 0 {
			// Two of three replicas stay: the stream elects a leader and goes on.
			wait.For(t, time.Minute, "a new stream leader", func() bool { return cluster.StreamLeader(target.Stream) >= 0 })
		}
	}
	// One node of three is left: an R3 stream has no quorum and refuses
	// writes. The events stay in the outbox, retried with backoff, never
	// quarantined for the outage.
	wait.For(t, time.Minute, "the relay to see the broker refuse", func() bool { return r.Healthy() != nil })
	if n := o.count(t, "quarantined_at IS NOT NULL"); n != 0 {
		t.Fatalf("%d events quarantined for a broker without quorum", n)
	}
	cluster.Restart(t)
	if !wait.Until(3*time.Minute, func() bool { return o.count(t, "published_at IS NULL") == 0 }) {
		var lastErr *string
		_ = o.pool.QueryRow(context.Background(), "SELECT last_error FROM "+o.table()+" WHERE quarantined_at IS NOT NULL LIMIT 1").Scan(&lastErr)
		t.Fatalf("the backlog did not drain once the cluster had quorum again: %d unpublished; stream leader %d; relay healthy: %v; %+v; a quarantined event's error: %v",
			o.count(t, "published_at IS NULL"), cluster.StreamLeader(target.Stream), r.Healthy(), r.Stats(), deref(lastErr))
	}
	wait.For(t, time.Minute, "the stream to have a leader to read from", func() bool { return cluster.StreamLeader(target.Stream) >= 0 })
	got := target.Read(t)
	dups := brokertest.CheckStream(t, got, ids)
	t.Logf("%d events, %d messages on the stream, %d duplicates; relay %+v", len(ids), len(got), dups, r.Stats())
}

func deref(s *string) string {
	if s == nil {
		return "(none)"
	}
	return *s
}
