package faulttest

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/pgoutbox"
	"github.com/pgoutbox/pgoutbox/broker/nats/natsembed"
	"github.com/pgoutbox/pgoutbox/checker"
	"github.com/pgoutbox/pgoutbox/internal/failpoint"
	"github.com/pgoutbox/pgoutbox/internal/pgtest"
	"github.com/pgoutbox/pgoutbox/internal/wait"
)

// fleet is a set of restartable relays and consumers; kill SIGKILLs one at random
// and starts a replacement (a relay under a new id: ids must be unique among
// running relays).
type fleet struct {
	e        *env
	mu       sync.Mutex
	relays   []*proc
	cons     []*proc
	restarts int
}

func newFleet(e *env, relays, consumers int) *fleet {
	f := &fleet{e: e}
	for i := range relays {
		f.relays = append(f.relays, e.relay(fmt.Sprintf("r%d", i), nil))
	}
	for i := range consumers {
		f.cons = append(f.cons, e.consumer(fmt.Sprintf("c%d", i), nil))
	}
	return f
}

// kill SIGKILLs a random relay or consumer and restarts it; it returns what it
// killed and when, and when the replacement started.
func (f *fleet) kill(t *testing.T, rng *rand.Rand) (what string, killed, restarted time.Time) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.restarts++
	n := len(f.relays) + len(f.cons)
	i := rng.IntN(n)
	var p *proc
	if i < len(f.relays) {
		p = f.relays[i]
	} else {
		p = f.cons[i-len(f.relays)]
	}
	killed = time.Now()
	p.kill(t)
	restarted = time.Now()
	if i < len(f.relays) {
		what = "relay"
		f.relays[i] = f.e.relay(fmt.Sprintf("r%d-%d", i, f.restarts), nil)
	} else {
		what = "consumer"
		f.cons[i-len(f.relays)] = f.e.consumer(fmt.Sprintf("c%d-%d", i-len(f.relays), f.restarts), nil)
	}
	return what, killed, restarted
}

// Random SIGKILLs of relays and consumers while producers write (with rollbacks).
func TestRandomKills(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envConfig{})
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 1))
	f := newFleet(e, 2, 2)
	popts := producerOpts{txs: 150, aggregates: 15, rollbackPercent: 15, pause: 15 * time.Millisecond}
	p1, p2 := e.producer("p1", nil, popts), e.producer("p2", nil, popts)
	kills := 0
	for !p1.exited() || !p2.exited() {
		time.Sleep(time.Duration(200+rng.IntN(400)) * time.Millisecond) // chaos pacing, not synchronisation
		f.kill(t, rng)
		kills++
	}
	if p1.err != nil || p2.err != nil {
		t.Fatalf("producers: %v, %v", p1.err, p2.err)
	}
	if kills < 5 {
		t.Fatalf("only %d kills happened while producing; the test proves little", kills)
	}
	e.waitDrained(90 * time.Second)
	e.stopAll()
	v := e.verdict()
	mustHold(t, v)
	t.Logf("%d SIGKILLs of relays and consumers", kills)
}

// pg_terminate_backend of every connection of the relays, over and over while
// events flow: the relays reconnect and lose nothing.
func TestTerminateRelayBackends(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envConfig{})
	f := newFleet(e, 2, 1)
	// A relay that cannot reach the database at start-up exits 1 (by design: a
	// supervisor restarts it); the cuts begin once both are running.
	for _, r := range f.relays {
		r.waitLine(t, "relay starting")
	}
	prod := e.producer("p1", nil, producerOpts{txs: 200, aggregates: 15, rollbackPercent: 15, pause: 10 * time.Millisecond})
	ctx := context.Background()
	pattern := "faulttest-" + e.schema + "-%" // the relays' application_name
	terminated, rounds := 0, 0
	for !prod.exited() {
		time.Sleep(300 * time.Millisecond) // chaos pacing
		var n int
		err := e.pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE pg_terminate_backend(pid))
			FROM pg_stat_activity WHERE application_name LIKE $1 AND pid <> pg_backend_pid()`, pattern).Scan(&n)
		pgtest.Must(t, err, "terminate relay backends")
		terminated += n
		if n > 0 {
			rounds++
		}
	}
	if prod.err != nil {
		t.Fatalf("producer: %v", prod.err)
	}
	if rounds < 3 {
		t.Fatalf("relay connections were cut in only %d rounds; the test proves little", rounds)
	}
	e.waitDrained(90 * time.Second)
	for _, r := range f.relays {
		if r.exited() {
			t.Fatalf("%s exited after losing its connections: %s\n%s", r.name, r.status(), tail(r.out.String(), 20))
		}
	}
	e.stopAll()
	mustHold(t, e.verdict())
	t.Logf("terminated %d relay backends in %d rounds", terminated, rounds)
}

// A NATS server of the test's own, shut down mid-run and started again on the same
// port and store: relays record the outage, reconnect, and publish everything;
// the stream keeps what it had.
func TestNATSRestart(t *testing.T) {
	t.Parallel()
	storeDir := t.TempDir()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	pgtest.Must(t, err, "pick a port")
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	var mu sync.Mutex
	var srv *natsembed.Server
	startServer := func() {
		var logs syncBuffer
		s, err := natsembed.New(&natsembed.Config{StoreDir: storeDir, Port: port, ReadyTimeout: time.Minute,
			Logger: warnLogger(&logs)})
		pgtest.Must(t, err, "start NATS on port %d; its log:\n%s", port, logs.String())
		mu.Lock()
		srv = s
		mu.Unlock()
	}
	startServer()
	t.Cleanup(func() { mu.Lock(); srv.Shutdown(); mu.Unlock() })

	e := newEnv(t, envConfig{natsURL: fmt.Sprintf("nats://127.0.0.1:%d", port)})
	f := newFleet(e, 2, 1)
	prod := e.producer("p1", nil, producerOpts{txs: 200, aggregates: 15, rollbackPercent: 15, pause: 10 * time.Millisecond})
	wait.For(t, 60*time.Second, "events to be applied before the restart", func() bool { return e.count("effects", "true") >= 40 })

	srv.Shutdown()
	down := time.Now()
	before := e.count("outbox_events", "true")
	// The first producer may be done by now (a slow consumer under load); this one
	// makes sure the relays have events to fail during the outage.
	during := e.producer("p2", nil, producerOpts{txs: 30, aggregates: 15, pause: 10 * time.Millisecond})
	wait.For(t, 60*time.Second, "the relays to notice the outage, fail a publish, and the producers to go on", func() bool {
		failed := false
		for _, r := range f.relays {
			if !strings.Contains(r.out.String(), "nats: disconnected") {
				return false
			}
			failed = failed || strings.Contains(r.out.String(), "broker unreachable")
		}
		return failed && ((prod.exited() && during.exited()) || e.count("outbox_events", "true") >= before+30)
	})
	startServer()
	t.Logf("NATS was down for %s", time.Since(down).Round(time.Millisecond))

	for _, p := range []*proc{prod, during} {
		p.wait(t, 90*time.Second)
		if p.err != nil {
			t.Fatalf("producer %s: %v", p.name, p.err)
		}
	}
	e.waitDrained(90 * time.Second)
	for _, r := range f.relays {
		if !strings.Contains(r.out.String(), "nats: reconnected") {
			t.Errorf("%s never reconnected:\n%s", r.name, tail(r.out.String(), 20))
		}
	}
	e.stopAll()
	mustHold(t, e.verdict())
}

// held is an event a paused relay held a lease on.
type held struct {
	id            pgoutbox.UUID
	aggregateID   string
	seq           int64
	publishedAt   *time.Time
	attemptCount  int
	claimedByNext string
}

// A relay paused (SIGSTOP) past its lease while holding a batch, its rows taken
// over by another relay which goes on publishing later events of the same
// aggregates; then resumed (SIGCONT). The stale holder publishes its old batch
// again and settles it: order of first appearances and every event must survive,
// and its settle must not rewrite what the successor recorded.
func TestStaleLeaseHolder(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ name, point string }{
		{"paused-before-publish", failpoint.RelayBeforePublish}, // its publish comes after the successor's
		{"paused-before-mark", failpoint.RelayAfterPublish},     // its mark comes after the successor's
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			staleLeaseHolder(t, c.point)
		})
	}
}

func staleLeaseHolder(t *testing.T, point string) {
	e := newEnv(t, envConfig{})
	ctx := context.Background()
	e.consumer("c1", nil)
	prod := e.producer("p1", nil, producerOpts{txs: 300, aggregates: 4, maxEvents: 2, rollbackPercent: 10, pause: 10 * time.Millisecond})
	wait.For(t, 30*time.Second, "a first backlog", func() bool { return e.count("outbox_events", "true") >= 10 })
	// The stale relay dawdles at the point on every batch, so that it is caught
	// holding leases.
	stale := e.relay("stale", failpointEnv(point, "delay(1500ms)"))
	wait.For(t, 30*time.Second, "the relay to hold leases", func() bool {
		return e.count("outbox_events", "claimed_by = 'stale' AND claim_until > now() + interval '300 milliseconds' AND published_at IS NULL") > 0
	})
	stale.signal(t, syscall.SIGSTOP)
	rows, err := e.pool.Query(ctx, "SELECT event_id, aggregate_id, aggregate_sequence FROM "+e.table("outbox_events")+
		" WHERE claimed_by = 'stale' AND published_at IS NULL ORDER BY aggregate_id, aggregate_sequence")
	pgtest.Must(t, err, "read the stale relay's leases")
	hs, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (held, error) {
		var h held
		return h, r.Scan(&h.id, &h.aggregateID, &h.seq)
	})
	pgtest.Must(t, err, "read the stale relay's leases")
	if len(hs) == 0 {
		t.Fatal("the relay was paused holding nothing; the test proves nothing")
	}
	top := map[string]int64{}
	for _, h := range hs {
		top[h.aggregateID] = max(top[h.aggregateID], h.seq)
	}

	e.relay("successor", nil)
	wait.For(t, 60*time.Second, "the successor to take over and publish beyond the paused relay's batch", func() bool {
		for agg, seq := range top {
			if e.count("outbox_events", "aggregate_id = $1 AND aggregate_sequence > $2 AND published_at IS NOT NULL", agg, seq) == 0 {
				return false
			}
		}
		return e.count("outbox_events", "claimed_by = 'stale' AND published_at IS NULL") == 0
	})
	for i := range hs {
		h := &hs[i]
		err := e.pool.QueryRow(ctx, "SELECT published_at, attempt_count, coalesce(claimed_by, '') FROM "+e.table("outbox_events")+" WHERE event_id = $1",
			h.id).Scan(&h.publishedAt, &h.attemptCount, &h.claimedByNext)
		pgtest.Must(t, err, "read a taken-over event")
		if h.publishedAt == nil {
			t.Fatalf("event %s (%s #%d) not published by the successor", h.id, h.aggregateID, h.seq)
		}
	}
	// Resume only once the stream's duplicate window (1s) has passed since the
	// successor's publishes, so that the stale copies are stored and visible.
	ids := make([]pgoutbox.UUID, len(hs))
	for i, h := range hs {
		ids[i] = h.id
	}
	wait.For(t, 30*time.Second, "the duplicate window to pass", func() bool {
		var past bool
		err := e.pool.QueryRow(ctx, "SELECT max(published_at) < now() - interval '1500 milliseconds' FROM "+e.table("outbox_events")+
			" WHERE event_id = ANY($1::uuid[])", ids).Scan(&past)
		return err == nil && past
	})
	stale.signal(t, syscall.SIGCONT)

	prod.wait(t, 90*time.Second)
	if prod.err != nil {
		t.Fatalf("producer: %v", prod.err)
	}
	e.waitDrained(90 * time.Second)
	// The resumed relay finished its stale batch: it settled (a log line per
	// settle is not printed, so wait for its stop, which settles everything).
	e.stopAll()
	v := e.verdict()
	mustHold(t, v)

	// Its settle did not rewrite what the successor recorded.
	for _, h := range hs {
		var publishedAt *time.Time
		pgtest.Must(t, e.pool.QueryRow(ctx, "SELECT published_at FROM "+e.table("outbox_events")+" WHERE event_id = $1", h.id).Scan(&publishedAt), "read")
		if publishedAt == nil || !publishedAt.Equal(*h.publishedAt) {
			t.Errorf("event %s: published_at changed from %v to %v after the stale relay resumed", h.id, h.publishedAt, publishedAt)
		}
	}
	// Evidence that the stale relay really published its batch late: a copy of a
	// held event after a higher sequence of its aggregate.
	if point == failpoint.RelayBeforePublish {
		if !lateCopy(t, e, hs) {
			t.Fatalf("no held event appears on the broker after a later sequence: the stale relay did not publish late\n%s", v)
		}
	}
	t.Logf("the paused relay held %d events; taken over and published beyond; %d broker duplicates", len(hs), v.Duplicates)
}

// lateCopy reports whether some held event has a copy on the broker after a
// message with a higher sequence of its aggregate.
func lateCopy(t *testing.T, e *env, hs []held) bool {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	msgs, err := checker.ReadJetStream(ctx, e.js, e.stream)
	pgtest.Must(t, err, "read stream")
	isHeld := map[pgoutbox.UUID]bool{}
	for _, h := range hs {
		isHeld[h.id] = true
	}
	high := map[string]int64{}
	for _, m := range msgs {
		if isHeld[m.EventID] && high[m.AggregateID] > m.Sequence {
			return true
		}
		high[m.AggregateID] = max(high[m.AggregateID], m.Sequence)
	}
	return false
}
