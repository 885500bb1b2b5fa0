package faulttest

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pgoutbox/pgoutbox/broker/nats/natsembed"
	"github.com/pgoutbox/pgoutbox/checker"
	"github.com/pgoutbox/pgoutbox/internal/netns"
	"github.com/pgoutbox/pgoutbox/internal/pgtest"
	"github.com/pgoutbox/pgoutbox/internal/wait"
)

// faultSoakRecovery bounds the wait, after a fault is healed, for every event
// that occurred before the heal to be published.
const faultSoakRecovery = 90 * time.Second

// faultSoak is the world of TestFaultSoak: a primary with a synchronous
// standby, both listening on loopback and on two relay hosts' database links;
// a NATS server of its own on a fixed port and store; relays A and B on hosts
// of their own (network namespaces), running cleanup with a short retention;
// a consumer and a steady producer (with rollbacks) in the root namespace.
type faultSoak struct {
	t                *testing.T
	e                *env
	primary, standby *pgtest.Cluster
	hosts            [2]*netns.Host
	relays           [2]*proc
	on               [2]relayHost

	natsMu    sync.Mutex
	nats      *natsembed.Server
	natsCfg   natsembed.Config
	natsLogs  syncBuffer
	relayArgs []string
}

// soakPhase is one fault of the cycle: what it does, how long it lasted, how
// long the pipeline took to publish everything that occurred before the heal,
// and what it cost.
type soakPhase struct {
	name              string
	start, healed     time.Time
	recovered         time.Duration
	p50, p99, maxLat  time.Duration
	events            int
	rssMiB            [2]float64
	fault             func(s *faultSoak, hold time.Duration)
	unpublishedAtHeal int // the backlog when the fault was healed
}

// The soak across faults: a steady load with cleanup running while, phase
// after phase, a relay is SIGKILLed, the relays' database sessions are
// terminated, the broker restarts, relay A's host is cut from the database,
// from the broker and from both, and the primary fails over to its
// synchronous standby (a new standby then takes the old primary's port, so the
// next cycle can fail over again). After each fault it measures the time until
// everything that occurred before the heal is published; at the end the
// checker runs on everything, and each phase's commit→broker latency (p50,
// p99) and the relays' memory are reported. CI runs one cycle of short phases;
// -faultsoak.duration runs cycles for that long (e.g. 2h).
func TestFaultSoak(t *testing.T) {
	s := newFaultSoak(t)
	phases := []soakPhase{
		{name: "steady", fault: func(_ *faultSoak, hold time.Duration) { time.Sleep(hold) }}, // the baseline
		{name: "relay SIGKILL", fault: (*faultSoak).killRelay},
		{name: "db sessions terminated", fault: (*faultSoak).terminateSessions},
		{name: "broker restart", fault: (*faultSoak).restartBroker},
		{name: "A cut from db", fault: func(s *faultSoak, hold time.Duration) { s.cut(hold, "db") }},
		{name: "A cut from broker", fault: func(s *faultSoak, hold time.Duration) { s.cut(hold, "broker") }},
		{name: "A cut from both", fault: func(s *faultSoak, hold time.Duration) { s.cut(hold, "db", "broker") }},
		{name: "primary failover", fault: (*faultSoak).failover},
	}
	prod := s.e.producer("p1", nil, producerOpts{txs: 0, aggregates: 20, rollbackPercent: 15, pause: 10 * time.Millisecond})
	wait.For(t, time.Minute, "events published before the first fault", func() bool {
		return s.e.count("outbox_events", "published_at IS NOT NULL") >= 50
	})

	start := time.Now()
	var done []soakPhase
	for cycle := 0; cycle == 0 || time.Since(start) < *faultSoakDuration; cycle++ {
		for _, p := range phases {
			p.start = time.Now()
			p.fault(s, *faultSoakPhase)
			p.healed = time.Now()
			p.unpublishedAtHeal = s.unpublished(time.Now())
			if !wait.Until(faultSoakRecovery, func() bool { return s.unpublished(p.healed) == 0 }) {
				t.Fatalf("cycle %d, %s: events that occurred before the heal still unpublished after %s", cycle+1, p.name, faultSoakRecovery)
			}
			p.recovered = time.Since(p.healed)
			p.rssMiB = s.rss()
			done = append(done, p)
		}
	}
	chaos := time.Since(start)
	prod.term(t)
	s.e.waitDrained(2 * time.Minute)
	for _, r := range s.relays {
		if r.exited() {
			t.Fatalf("%s exited during the soak: %s\n%s", r.name, r.status(), tail(r.out.String(), 30))
		}
	}
	s.e.stopAll()
	var stream []checker.Message
	v := s.e.verdict(func(in *checker.Input) {
		in.Retention = true // the relays' cleanup deleted published rows
		stream = in.Broker
	})
	latencies(done, stream)
	t.Log(report(done, chaos, v))
	mustHold(t, v)
}

func newFaultSoak(t *testing.T) *faultSoak {
	t.Helper()
	s := &faultSoak{t: t}
	var cfg *pgtest.ClusterConfig
	s.hosts, cfg = newRelayHosts(t, 80, map[string]string{"synchronous_commit": "on"})
	var err error
	s.primary, err = pgtest.StartCluster(cfg)
	pgtest.Must(t, err, "start primary")
	s.standby, err = s.primary.StartStandby(true)
	pgtest.Must(t, err, "start synchronous standby")
	ports := []int{s.primary.Port, s.standby.Port}
	t.Cleanup(func() {
		for _, c := range []*pgtest.Cluster{s.primary, s.standby} {
			if c != nil {
				_ = c.Stop()
			}
		}
	})
	multiHost := func(addr string) string {
		return fmt.Sprintf("postgres://postgres@%s:%d,%s:%d/test?sslmode=disable&target_session_attrs=read-write&connect_timeout=5",
			addr, ports[0], addr, ports[1])
	}

	// The broker: a fixed port and store, so a restart finds its streams and its
	// clients find it; on every address (loopback and the hosts' broker links).
	s.natsCfg = natsembed.Config{Host: "0.0.0.0", Port: natsembed.RandomPort, StoreDir: t.TempDir(), ReadyTimeout: time.Minute,
		Logger: warnLogger(&s.natsLogs)}
	s.startBroker()
	port, err := strconv.Atoi(s.nats.URL()[strings.LastIndex(s.nats.URL(), ":")+1:])
	pgtest.Must(t, err, "NATS port of %s", s.nats.URL())
	s.natsCfg.Port = port
	t.Cleanup(func() { s.natsMu.Lock(); s.nats.Shutdown(); s.natsMu.Unlock() })

	s.e = newEnv(t, envConfig{dbServer: multiHost("127.0.0.1"), natsURL: fmt.Sprintf("nats://127.0.0.1:%d", port)})
	s.relayArgs = []string{"--cleanup-interval", "1s", "--retention", "3s", "--force"}
	for i, h := range s.hosts {
		s.on[i] = relayHost{host: h, dbServer: multiHost(h.Link("db").RootAddr.String()),
			natsURL: fmt.Sprintf("nats://%s:%d", h.Link("broker").RootAddr, port)}
		s.relays[i] = s.e.relayOn(s.on[i], string(rune('a'+i)), nil, s.relayArgs...)
	}
	for _, r := range s.relays {
		r.waitLine(t, "relay starting")
	}
	s.e.consumer("c0", nil)
	return s
}

func (s *faultSoak) startBroker() {
	s.t.Helper()
	srv, err := natsembed.New(&s.natsCfg)
	pgtest.Must(s.t, err, "start NATS; its log:\n%s", s.natsLogs.String())
	s.natsMu.Lock()
	s.nats = srv
	s.natsMu.Unlock()
}

// killRelay SIGKILLs relay B and starts it again on its host at once: its
// leases expire and A or the new B takes them over.
func (s *faultSoak) killRelay(time.Duration) {
	s.relays[1].kill(s.t)
	s.relays[1] = s.e.relayOn(s.on[1], "b", nil, s.relayArgs...)
	s.relays[1].waitLine(s.t, "relay starting")
}

// terminateSessions ends every database session of the relays, again and
// again for hold.
func (s *faultSoak) terminateSessions(hold time.Duration) {
	pattern := "faulttest-" + s.e.schema + "-%"
	for end := time.Now().Add(hold); time.Now().Before(end); time.Sleep(300 * time.Millisecond) { // chaos pacing
		_, err := s.e.pool.Exec(context.Background(), `SELECT pg_terminate_backend(pid) FROM pg_stat_activity
			WHERE application_name LIKE $1 AND pid <> pg_backend_pid()`, pattern)
		pgtest.Must(s.t, err, "terminate relay sessions")
	}
}

// restartBroker shuts the NATS server down for hold and starts it again on its
// port and store.
func (s *faultSoak) restartBroker(hold time.Duration) {
	s.natsMu.Lock()
	s.nats.Shutdown()
	s.natsMu.Unlock()
	time.Sleep(hold) // the outage
	s.startBroker()
}

// cut makes relay A's links of the given roles a black hole for hold, then
// heals them.
func (s *faultSoak) cut(hold time.Duration, roles ...string) {
	for _, r := range roles {
		pgtest.Must(s.t, s.hosts[0].Link(r).Cut(), "cut %s", r)
	}
	time.Sleep(hold) // the partition
	for _, r := range roles {
		pgtest.Must(s.t, s.hosts[0].Link(r).Heal(), "heal %s", r)
	}
}

// failover crashes the primary and promotes the synchronous standby; a new
// synchronous standby then takes the old primary's port (the processes' URLs
// name both ports).
func (s *faultSoak) failover(time.Duration) {
	old := s.primary
	pgtest.Must(s.t, old.Crash(), "crash the primary")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pgtest.Must(s.t, s.standby.Promote(ctx), "promote the standby")
	s.primary = s.standby
	_ = old.Stop()
	standby, err := s.primary.StartStandbyOn(true, old.Port)
	pgtest.Must(s.t, err, "a new synchronous standby on port %d", old.Port)
	s.standby = standby
}

// unpublished counts the events that occurred up to before and are not
// published; -1 while the database does not answer (a failover).
func (s *faultSoak) unpublished(before time.Time) int {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var n int
	if err := s.e.pool.QueryRow(ctx, "SELECT count(*) FROM "+s.e.table("outbox_events")+
		" WHERE published_at IS NULL AND occurred_at <= $1", before).Scan(&n); err != nil {
		return -1
	}
	return n
}

// rss returns each relay's resident memory in MiB (0 if unreadable).
func (s *faultSoak) rss() [2]float64 {
	var out [2]float64
	for i, r := range s.relays {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", r.cmd.Process.Pid))
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(b), "\n") {
			if f := strings.Fields(line); len(f) >= 2 && f[0] == "VmRSS:" {
				kb, _ := strconv.ParseFloat(f[1], 64)
				out[i] = kb / 1024
			}
		}
	}
	return out
}

// latencies sets each phase's commit→broker latency percentiles over the first
// appearance of every event that occurred during it (until the next phase).
func latencies(phases []soakPhase, stream []checker.Message) {
	seen := map[string]bool{}
	byPhase := make([][]time.Duration, len(phases))
	for _, m := range stream {
		id := m.EventID.String()
		if seen[id] || m.StoredAt.IsZero() {
			continue
		}
		seen[id] = true
		for i := len(phases) - 1; i >= 0; i-- {
			if !m.OccurredAt.Before(phases[i].start) {
				byPhase[i] = append(byPhase[i], m.StoredAt.Sub(m.OccurredAt))
				break
			}
		}
	}
	for i, d := range byPhase {
		if len(d) == 0 {
			continue
		}
		slices.Sort(d)
		phases[i].events = len(d)
		phases[i].p50, phases[i].p99, phases[i].maxLat = d[len(d)/2], d[len(d)*99/100], d[len(d)-1]
	}
}

func report(phases []soakPhase, chaos time.Duration, v *checker.Verdict) string {
	var b strings.Builder
	fmt.Fprintf(&b, "fault soak: %s, %d phases\n", chaos.Round(time.Second), len(phases))
	fmt.Fprintf(&b, "  %-24s %8s %8s %10s %7s %9s %9s %9s %14s\n", "phase", "fault", "backlog", "recovered", "events", "p50", "p99", "max", "relay RSS MiB")
	for _, p := range phases {
		fmt.Fprintf(&b, "  %-24s %8s %8d %10s %7d %9s %9s %9s %6.1f %6.1f\n", p.name, p.healed.Sub(p.start).Round(100*time.Millisecond),
			p.unpublishedAtHeal, p.recovered.Round(10*time.Millisecond), p.events, p.p50.Round(time.Millisecond), p.p99.Round(time.Millisecond),
			p.maxLat.Round(time.Millisecond), p.rssMiB[0], p.rssMiB[1])
	}
	b.WriteString("  " + v.String())
	return b.String()
}
