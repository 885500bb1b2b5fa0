package relay_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/pgoutbox/pgoutbox"
	"github.com/pgoutbox/pgoutbox/broker/brokertest"
	"github.com/pgoutbox/pgoutbox/internal/natstest"
	"github.com/pgoutbox/pgoutbox/internal/pgtest"
	"github.com/pgoutbox/pgoutbox/internal/wait"
	"github.com/pgoutbox/pgoutbox/relay"
)

// Deadlines of the clustered-broker tests: generous, for 2 shared cores.
const (
	clusterPhase   = 2 * time.Minute // a drain step, a recovery
	clusterElected = time.Minute     // a stream leader elected after a loss
	// clusterDedupWindow is the R3 stream's duplicate window, longer than any
	// outage in these tests.
	clusterDedupWindow = 2 * time.Minute
)

// newClusterStream starts a 3-node JetStream cluster with an R3 stream of the
// test's own and a relay publishing to it with defaults but the batch size.
func newClusterStream(t *testing.T, relayID string) (*natstest.Cluster, natstest.Target, *outbox, *relay.Relay) {
	t.Helper()
	cluster := natstest.StartCluster(t, 3)
	target := natstest.OnOwnServer(t, cluster.URL())
	ctx, cancel := context.WithTimeout(context.Background(), clusterElected)
	defer cancel()
	_, err := target.JS.CreateStream(ctx, jetstream.StreamConfig{Name: target.Stream, Subjects: target.Subjects(),
		Replicas: 3, Storage: jetstream.FileStorage, Duplicates: clusterDedupWindow})
	pgtest.Must(t, err, "create the R3 stream")
	o := newOutbox(t, 8)
	pub := dialNATS(t, cluster.URL(), target)
	r := startRelay(t, o, pub, relay.Config{ID: relayID, BatchSize: 100})
	return cluster, target, o, r
}

// A 3-node JetStream cluster with an R3 stream loses nodes while the relay
// drains a backlog: first the stream's leader crashes, then a follower of the
// new leader. The relay publishes on through whichever node leads. With one
// node of three left the stream has no quorum: the relay reports the broker
// unreachable and quarantines nothing; once the nodes are back it drains.
// Nothing is lost, first appearances stay in order per aggregate, and
// re-publishes within the dedup window are dropped by the stream (Nats-Msg-Id).
func TestNATSClusterLosesNodesDuringDrain(t *testing.T) {
	t.Parallel()
	cluster, target, o, r := newClusterStream(t, "clustered")
	ids := o.enqueue(t, 30, 100) // 3,000 events

	published := func(n int) func() bool {
		return func() bool { return o.count(t, "published_at IS NOT NULL") >= n }
	}
	for i, what := range []string{"the stream leader", "the new leader's follower"} {
		wait.For(t, clusterPhase, "publishing before the node loss", published((i+1)*len(ids)/3))
		victim := cluster.StreamLeader(target.Stream)
		if victim < 0 {
			t.Fatalf("no leader of stream %s before losing %s", target.Stream, what)
		}
		if i == 1 {
			victim = cluster.Follower(target.Stream)
		}
		cluster.Kill(victim)
		t.Logf("crashed node %d (%s) with %d of %d events published", victim, what, o.count(t, "published_at IS NOT NULL"), len(ids))
		if i == 0 {
			// Two of three replicas stay: the stream elects a leader and goes on.
			wait.For(t, clusterElected, "a new stream leader", func() bool { return cluster.StreamLeader(target.Stream) >= 0 })
		}
	}
	// One node of three is left: an R3 stream has no quorum and stores
	// nothing. The events stay in the outbox, retried with backoff, never
	// quarantined for the outage.
	wait.For(t, clusterPhase, "the relay to report the broker unreachable", func() bool { return r.Healthy() != nil })
	if n := o.count(t, "quarantined_at IS NOT NULL"); n != 0 {
		t.Fatalf("%d events quarantined for a broker without quorum", n)
	}
	unpublished := o.count(t, "published_at IS NULL")
	cluster.Restart(t)
	if !wait.Until(clusterPhase, func() bool { return o.count(t, "published_at IS NULL") == 0 }) {
		t.Fatalf("the backlog did not drain once the cluster had quorum again: %d unpublished, %d quarantined (%s); stream leader %d; relay healthy: %v; %+v",
			o.count(t, "published_at IS NULL"), o.count(t, "quarantined_at IS NOT NULL"), o.quarantineReason(t),
			cluster.StreamLeader(target.Stream), r.Healthy(), r.Stats())
	}
	wait.For(t, clusterElected, "the relay to report the broker reachable", func() bool { return r.Healthy() == nil })
	// Read once every replica is current: a fetch while the restarted nodes
	// catch up may find no responder.
	wait.For(t, clusterPhase, "every replica current", func() bool { return cluster.StreamCurrent(target.Stream) })
	got := target.Read(t)
	dups := brokertest.CheckStream(t, got, ids)
	t.Logf("%d events (%d waiting for quorum), %d messages on the stream, %d duplicates; relay %+v",
		len(ids), unpublished, len(got), dups, r.Stats())
}

// quarantineReason is a quarantined event's last error, for a failure message.
func (o *outbox) quarantineReason(t *testing.T) string {
	t.Helper()
	var reason *string
	_ = o.pool.QueryRow(context.Background(), "SELECT last_error FROM "+o.table()+" WHERE quarantined_at IS NOT NULL LIMIT 1").Scan(&reason)
	if reason == nil {
		return "none"
	}
	return *reason
}

// steadyProducer commits a small transaction every steadyInterval until
// stopped (or steadyMaxTx transactions), spreading over steadyAggregates.
const (
	steadyInterval   = 10 * time.Millisecond
	steadyPerTx      = 2
	steadyAggregates = 20
	steadyMaxTx      = 20000
)

type steadyProducer struct {
	stop chan struct{}
	done chan struct{}
	mu   sync.Mutex
	ids  []pgoutbox.UUID
	err  error
}

func startSteadyProducer(t *testing.T, o *outbox) *steadyProducer {
	t.Helper()
	p := &steadyProducer{stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(p.done)
		tick := time.NewTicker(steadyInterval)
		defer tick.Stop()
		for n := 0; n < steadyMaxTx; n++ {
			select {
			case <-p.stop:
				return
			case <-tick.C:
			}
			var evs []pgoutbox.Event
			for k := range steadyPerTx {
				evs = append(evs, pgoutbox.Event{AggregateType: "acct", AggregateID: fmt.Sprintf("s%02d", (n*steadyPerTx+k)%steadyAggregates),
					EventType: "acct.changed", Payload: map[string]int{"n": n}})
			}
			res, err := o.prod.EnqueueTx(context.Background(), o.pool, evs...)
			p.mu.Lock()
			if err != nil {
				p.err = err
				p.mu.Unlock()
				return
			}
			for _, r := range res {
				p.ids = append(p.ids, r.EventID)
			}
			p.mu.Unlock()
		}
	}()
	t.Cleanup(p.halt)
	return p
}

// halt stops the producer and waits for its last transaction.
func (p *steadyProducer) halt() {
	select {
	case <-p.stop:
	default:
		close(p.stop)
	}
	<-p.done
}

// committed returns the ids of every event committed so far, and the
// producer's error.
func (p *steadyProducer) committed() ([]pgoutbox.UUID, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]pgoutbox.UUID(nil), p.ids...), p.err
}

// Producers commit continuously (100 small transactions a second) while the
// R3 stream's leader crashes, and later (once it is back) a node that does not
// lead. For each loss the test measures how long the relay took to publish
// again (the first event committed after the crash acknowledged and marked)
// and to catch up (every event committed before the crash published), and how
// many duplicates reached the stream. Nothing is lost, first appearances are in
// order per aggregate.
func TestNATSClusterLosesNodesUnderSteadyFlow(t *testing.T) {
	t.Parallel()
	cluster, target, o, r := newClusterStream(t, "steady")
	prod := startSteadyProducer(t, o)
	wait.For(t, clusterPhase, "steady publishing", func() bool { return o.count(t, "published_at IS NOT NULL") >= 200 })

	dupsBefore := 0
	for _, what := range []string{"leader", "non-leader"} {
		victim := cluster.StreamLeader(target.Stream)
		if what == "non-leader" {
			victim = cluster.Follower(target.Stream)
		}
		if victim < 0 {
			t.Fatalf("no %s of stream %s to crash", what, target.Stream)
		}
		failedBefore := r.Stats().Failed
		before, err := prod.committed()
		pgtest.Must(t, err, "steady producer")
		killed := time.Now()
		cluster.Kill(victim)
		wait.For(t, clusterElected, "a stream leader after the crash", func() bool { return cluster.StreamLeader(target.Stream) >= 0 })
		elected := time.Since(killed)
		var again time.Duration
		wait.Forf(t, clusterPhase, func() string { return "publishing again after crashing the " + what }, func() bool {
			var first *time.Time
			pgtest.Must(t, o.pool.QueryRow(context.Background(),
				"SELECT min(published_at) FROM "+o.table()+" WHERE occurred_at > $1 AND published_at IS NOT NULL", killed).Scan(&first), "first publish")
			if first != nil {
				again = first.Sub(killed)
			}
			return first != nil
		})
		var caughtUp time.Duration
		wait.Forf(t, clusterPhase, func() string { return "catching up after crashing the " + what }, func() bool {
			var pending int
			var last *time.Time
			pgtest.Must(t, o.pool.QueryRow(context.Background(),
				"SELECT count(*) FILTER (WHERE published_at IS NULL), max(published_at) FROM "+o.table()+" WHERE occurred_at <= $1", killed).Scan(&pending, &last), "catch-up")
			if pending == 0 && last != nil {
				caughtUp = max(0, last.Sub(killed)) // 0: nothing was waiting at the crash
			}
			return pending == 0
		})
		if n := o.count(t, "quarantined_at IS NOT NULL"); n != 0 {
			t.Fatalf("%d events quarantined after crashing the %s: %s", n, what, o.quarantineReason(t))
		}
		// The crashed node comes back before the next loss, so that two of
		// three replicas always remain.
		cluster.Restart(t)
		wait.For(t, clusterPhase, "every replica current", func() bool { return cluster.StreamCurrent(target.Stream) })
		got := target.Read(t)
		dups := brokertest.CheckStream(t, got, before)
		t.Logf("crashed the stream's %s (node %d): a stream leader after %s, publishing again after %s, caught up after %s, %d failed attempts, %d duplicates",
			what, victim, elected.Round(time.Millisecond), again.Round(time.Millisecond), caughtUp.Round(time.Millisecond), r.Stats().Failed-failedBefore, dups-dupsBefore)
		dupsBefore = dups
	}
	prod.halt()
	ids, err := prod.committed()
	pgtest.Must(t, err, "steady producer")
	wait.For(t, clusterPhase, "every event published", func() bool { return o.count(t, "published_at IS NULL") == 0 })
	got := target.Read(t)
	dups := brokertest.CheckStream(t, got, ids)
	t.Logf("%d events committed, %d messages on the stream, %d duplicates; relay %+v", len(ids), len(got), dups, r.Stats())
}
