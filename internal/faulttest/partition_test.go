package faulttest

import (
	"context"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/pgoutbox"
	"github.com/pgoutbox/pgoutbox/broker/nats/natsembed"
	"github.com/pgoutbox/pgoutbox/internal/failpoint"
	"github.com/pgoutbox/pgoutbox/internal/netns"
	"github.com/pgoutbox/pgoutbox/internal/pgtest"
	"github.com/pgoutbox/pgoutbox/internal/wait"
)

// The partition tests' timings (the relays run with env.relay's 2s lease).
const (
	// partitionLease is the relays' --lease (env.relayOn).
	partitionLease = 2 * time.Second
	// partitionHold is the least time a cut lasts: past the lease, so that the
	// other relay has taken over, and a few of the cut relay's retries.
	partitionHold = 3 * partitionLease
	// partitionWithin bounds each wait of a partition test: a takeover, a
	// recovery, the drain.
	partitionWithin = 60 * time.Second
	// metricsAddr is where each relay serves /readyz, on its own host's
	// loopback (every host has one): reachable whatever link is cut.
	metricsAddr = "127.0.0.1:9090"
	// relayAPause is relay A's pause between a claim and its publish, and
	// again between the broker's ack and its mark.
	relayAPause = 100 * time.Millisecond
	// readyzTimeout bounds one /readyz request (its checks take up to 2s each).
	readyzTimeout = 5 * time.Second
)

// partition is one case's world: a PostgreSQL server and a NATS server of its
// own in the root namespace, two relays on hosts of their own (A and B, each
// with a link to the database and one to the broker), and, in the root
// namespace, a consumer and a producer writing steadily with rollbacks.
type partition struct {
	t      *testing.T
	e      *env
	hosts  [2]*netns.Host
	relays [2]*proc
	ids    [2]string
	prod   *proc
}

func newPartition(t *testing.T) *partition {
	t.Helper()
	p := &partition{t: t, ids: [2]string{"a", "b"}}
	var cfg *pgtest.ClusterConfig
	p.hosts, cfg = newRelayHosts(t, 60, nil)
	cluster, err := pgtest.StartCluster(cfg)
	pgtest.Must(t, err, "start PostgreSQL")
	t.Cleanup(func() { _ = cluster.Stop() })
	// The broker listens on every address: on loopback for the producer and
	// consumer, and on each host's broker link for its relay.
	var logs syncBuffer
	srv, err := natsembed.New(&natsembed.Config{Host: "0.0.0.0", Port: natsembed.RandomPort, ReadyTimeout: time.Minute,
		Logger: warnLogger(&logs)})
	pgtest.Must(t, err, "start NATS; its log:\n%s", logs.String())
	t.Cleanup(srv.Shutdown)
	u, err := url.Parse(srv.URL())
	pgtest.Must(t, err, "NATS URL")
	natsPort := u.Port()

	p.e = newEnv(t, envConfig{dbServer: cluster.URL + "&connect_timeout=5", natsURL: "nats://127.0.0.1:" + natsPort})
	for i, h := range p.hosts {
		// Relay A pauses after a claim and after the broker's ack: it holds
		// leases most of the time (its batches otherwise take a few
		// milliseconds), so that a cut catches it holding some, both
		// unpublished (their publish fails into a cut broker link and the
		// failure is recorded late) and acknowledged (their mark is late).
		var env []string
		if i == 0 {
			pause := "=delay(" + relayAPause.String() + ")"
			env = []string{failpoint.EnvVar + "=" + failpoint.RelayBeforePublish + pause + ";" + failpoint.RelayAfterPublish + pause}
		}
		on := relayHost{host: h,
			dbServer: fmt.Sprintf("postgres://postgres@%s:%d/test?sslmode=disable", h.Link("db").RootAddr, cluster.Port),
			natsURL:  fmt.Sprintf("nats://%s:%s", h.Link("broker").RootAddr, natsPort)}
		p.relays[i] = p.e.relayOn(on, p.ids[i], env, "--metrics-addr", metricsAddr)
	}
	for _, r := range p.relays {
		r.waitLine(t, "relay starting")
	}
	p.e.consumer("c0", nil)
	p.prod = p.e.producer("p1", nil, producerOpts{txs: 0, aggregates: 15, rollbackPercent: 15, pause: 10 * time.Millisecond})
	return p
}

// newRelayHosts makes two relay hosts, each with a link to the database and one
// to the broker, and the config of a cluster they reach: it listens on loopback
// and on each host's database link, trusts the hosts, and has maxConns
// connections and settings besides.
func newRelayHosts(t *testing.T, maxConns int, settings map[string]string) ([2]*netns.Host, *pgtest.ClusterConfig) {
	t.Helper()
	var hosts [2]*netns.Host
	listen := []string{"127.0.0.1"}
	cfg := &pgtest.ClusterConfig{MaxConnections: maxConns, Settings: map[string]string{}}
	for i := range hosts {
		hosts[i] = netns.New(t, "db", "broker")
		db := hosts[i].Link("db")
		listen = append(listen, db.RootAddr.String())
		cfg.HBA = append(cfg.HBA, "host all all "+db.HostAddr.String()+"/32 trust")
	}
	maps.Copy(cfg.Settings, settings)
	cfg.Settings["listen_addresses"] = strings.Join(listen, ",")
	return hosts, cfg
}

// published counts the events published whose run relay id leased.
func (p *partition) published(id string) int {
	return p.e.count("outbox_events", "published_at IS NOT NULL AND claimed_by = $1", id)
}

// leasedBy returns the events relay id holds unpublished.
func (p *partition) leasedBy(id string) []pgoutbox.UUID {
	p.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	rows, err := p.e.pool.Query(ctx, "SELECT event_id FROM "+p.e.table("outbox_events")+
		" WHERE claimed_by = $1 AND published_at IS NULL AND claim_until > now()", id)
	pgtest.Must(p.t, err, "leased events")
	var ids []pgoutbox.UUID
	for rows.Next() {
		var id pgoutbox.UUID
		pgtest.Must(p.t, rows.Scan(&id), "leased events")
		ids = append(ids, id)
	}
	pgtest.Must(p.t, rows.Err(), "leased events")
	return ids
}

// failedUnpublished returns the events with a failed attempt recorded and not
// yet published.
func (p *partition) failedUnpublished() []pgoutbox.UUID {
	p.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	rows, err := p.e.pool.Query(ctx, "SELECT event_id FROM "+p.e.table("outbox_events")+
		" WHERE last_error IS NOT NULL AND published_at IS NULL")
	pgtest.Must(p.t, err, "failed events")
	ids, err := pgx.CollectRows(rows, pgx.RowTo[pgoutbox.UUID])
	pgtest.Must(p.t, err, "failed events")
	return ids
}

// unpublishedOf counts the events of ids not yet published.
func (p *partition) unpublishedOf(ids []pgoutbox.UUID) int {
	return p.e.count("outbox_events", "published_at IS NULL AND event_id = ANY($1::uuid[])", uuidArray(ids))
}

func uuidArray(ids []pgoutbox.UUID) [][16]byte {
	out := make([][16]byte, len(ids))
	for i, id := range ids {
		out[i] = id
	}
	return out
}

// readyz asks relay i's /readyz from inside its host; it returns the status
// code (0 when there was no answer) and the body.
func (p *partition) readyz(i int) (int, string) {
	client := &http.Client{Timeout: readyzTimeout, Transport: &http.Transport{
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			return p.hosts[i].DialContext(ctx, network, addr)
		},
		DisableKeepAlives: true,
	}}
	resp, err := client.Get("http://" + metricsAddr + "/readyz")
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// probe is one /readyz answer and when its request started.
type probe struct {
	at   time.Time
	code int
	body string
}

// prober asks a relay's /readyz every probeEvery, each request on its own, so
// that a request hanging on a cut link does not delay the next.
type prober struct {
	mu   sync.Mutex
	got  []probe
	stop chan struct{}
	wg   sync.WaitGroup
}

// probeEvery is the resolution of the /readyz figures.
const probeEvery = 100 * time.Millisecond

func (p *partition) probeReadyz(i int) *prober {
	pr := &prober{stop: make(chan struct{})}
	pr.wg.Add(1)
	go func() {
		defer pr.wg.Done()
		t := time.NewTicker(probeEvery)
		defer t.Stop()
		for {
			select {
			case <-pr.stop:
				return
			case <-t.C:
			}
			pr.wg.Add(1)
			go func() {
				defer pr.wg.Done()
				at := time.Now()
				code, body := p.readyz(i)
				pr.mu.Lock()
				pr.got = append(pr.got, probe{at, code, body})
				pr.mu.Unlock()
			}()
		}
	}()
	p.t.Cleanup(pr.close)
	return pr
}

// first returns the earliest answer to a request started at or after from
// that was ready (200) or not, as ok says.
func (pr *prober) first(from time.Time, ok bool) (probe, bool) {
	pr.mu.Lock()
	defer pr.mu.Unlock()
	var best probe
	found := false
	for _, g := range pr.got {
		if !g.at.Before(from) && (g.code == http.StatusOK) == ok && (!found || g.at.Before(best.at)) {
			best, found = g, true
		}
	}
	return best, found
}

func (pr *prober) close() {
	select {
	case <-pr.stop:
	default:
		close(pr.stop)
	}
	pr.wg.Wait()
}

// eventState is what the relays' settle statements write of an event.
type eventState struct {
	publishedAt, claimUntil, quarantinedAt *time.Time
	availableAt                            time.Time
	attempts                               int
	lastError, claimedBy                   *string
}

// same reports whether two states are equal, times to the microsecond.
func (s eventState) same(o eventState) bool {
	eq := func(a, b *time.Time) bool { return (a == nil) == (b == nil) && (a == nil || a.Equal(*b)) }
	str := func(a, b *string) bool { return (a == nil) == (b == nil) && (a == nil || *a == *b) }
	return eq(s.publishedAt, o.publishedAt) && eq(s.claimUntil, o.claimUntil) && eq(s.quarantinedAt, o.quarantinedAt) &&
		s.availableAt.Equal(o.availableAt) && s.attempts == o.attempts && str(s.lastError, o.lastError) && str(s.claimedBy, o.claimedBy)
}

func (p *partition) states() map[pgoutbox.UUID]eventState {
	p.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	rows, err := p.e.pool.Query(ctx, "SELECT event_id, published_at, claim_until, quarantined_at, available_at, attempt_count, last_error, claimed_by FROM "+
		p.e.table("outbox_events"))
	pgtest.Must(p.t, err, "event states")
	m := map[pgoutbox.UUID]eventState{}
	for rows.Next() {
		var id pgoutbox.UUID
		var s eventState
		pgtest.Must(p.t, rows.Scan(&id, &s.publishedAt, &s.claimUntil, &s.quarantinedAt, &s.availableAt, &s.attempts, &s.lastError, &s.claimedBy), "event states")
		m[id] = s
	}
	pgtest.Must(p.t, rows.Err(), "event states")
	return m
}

// dbNow is the database server's clock.
func (p *partition) dbNow() time.Time {
	p.t.Helper()
	var now time.Time
	pgtest.Must(p.t, p.e.pool.QueryRow(context.Background(), "SELECT now()").Scan(&now), "now()")
	return now
}

// partitionCase is what one case cuts between relay A's host and the servers,
// and what A says once it has noticed.
type partitionCase struct {
	name    string
	links   []string // the roles of A's links to cut
	noticed []string // log lines of relay A after the cut
}

// Relay A, on a host of its own, is cut off by a network partition (a black
// hole: nothing answers, nothing is refused) while it holds leases and
// publishes under a steady load with rollbacks; relay B, on another host,
// takes over A's lanes; the partition heals and A works again. Nothing
// committed is lost, nothing rolled back is published, first appearances keep
// their order, and A's late writes (its settle statements, retried through the
// partition, and the publishes its socket still held) overwrite none of B's:
// an event published before the heal is left exactly as it was.
// docs/operations.md ("Network partitions") reports the figures it logs.
func TestPartition(t *testing.T) {
	for _, c := range []partitionCase{
		{name: "database", links: []string{"db"}, noticed: []string{"database unreachable"}},
		{name: "broker", links: []string{"broker"}, noticed: []string{"broker unreachable"}},
		{name: "both", links: []string{"db", "broker"}, noticed: []string{"database unreachable"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			partitionCaseRun(t, c)
		})
	}
}

func partitionCaseRun(t *testing.T, c partitionCase) {
	p := newPartition(t)
	e, a, b := p.e, p.relays[0], p.relays[1]
	wait.Forf(t, partitionWithin, func() string {
		return fmt.Sprintf("both relays to publish (a %d, b %d)", p.published("a"), p.published("b"))
	}, func() bool {
		e.failOnCrash()
		return p.published("a") >= 20 && p.published("b") >= 20
	})
	if code, body := p.readyz(0); code != http.StatusOK {
		t.Fatalf("relay a not ready before the cut: %d %s", code, body)
	}
	// The backlog's level before the cut, over a second of steady load.
	var level, samples int
	sampled := time.Now()
	wait.For(t, partitionWithin, "a second of backlog samples", func() bool {
		level += e.count("outbox_events", "published_at IS NULL")
		samples++
		return time.Since(sampled) >= time.Second
	})
	level /= samples
	readyz := p.probeReadyz(0)

	// Cut while A holds leases: wait for a moment it does, cut, and take what
	// it held from the database (the test's own connection is not cut).
	var held []pgoutbox.UUID
	var cutAt time.Time
	cut := func() {
		for _, role := range c.links {
			pgtest.Must(t, p.hosts[0].Link(role).Cut(), "cut")
		}
		cutAt = time.Now()
	}
	heal := func() {
		for _, role := range c.links {
			pgtest.Must(t, p.hosts[0].Link(role).Heal(), "heal")
		}
	}
	for try := 0; len(held) == 0; try++ {
		if try == 5 {
			t.Fatal("relay a held no lease at any of 5 cuts")
		}
		wait.For(t, partitionWithin, "relay a to hold leases", func() bool { return len(p.leasedBy("a")) > 0 })
		cut()
		if held = p.leasedBy("a"); len(held) == 0 {
			heal()
		}
	}
	if !slices.Contains(c.links, "db") {
		// A still reaches the database: it marks what the broker acked before
		// the cut, and records as failed what it publishes into the cut. The
		// first events it fails are the lanes B must take over.
		wait.For(t, partitionWithin, "relay a to fail a publish", func() bool {
			held = p.failedUnpublished()
			return len(held) > 0
		})
	}
	// While the cut lasts: A notices and says so, /readyz fails, B publishes
	// every event A held at the cut and goes on publishing.
	var tookOver, noticed time.Duration
	var peak int
	bAtCut := p.published("b")
	wait.Forf(t, partitionWithin, func() string {
		return fmt.Sprintf("relay b to take over the %d events relay a held (%d left), relay a to say %q and fail /readyz, and the cut to last %s",
			len(held), p.unpublishedOf(held), c.noticed, partitionHold)
	}, func() bool {
		e.failOnCrash()
		peak = max(peak, e.count("outbox_events", "published_at IS NULL"))
		if tookOver == 0 && p.unpublishedOf(held) == 0 {
			tookOver = time.Since(cutAt)
		}
		if noticed == 0 && containsAll(a.out.String(), c.noticed) {
			noticed = time.Since(cutAt)
		}
		_, unready := readyz.first(cutAt, false)
		return tookOver > 0 && noticed > 0 && unready && time.Since(cutAt) >= partitionHold && p.published("b") > bAtCut+20
	})
	unready, _ := readyz.first(cutAt, false)

	// Heal. A's settles and publishes still in flight land now.
	beforeHeal := p.states()
	healDB := p.dbNow()
	heal()
	healAt := time.Now()
	var again time.Duration
	wait.Forf(t, partitionWithin, func() string {
		return fmt.Sprintf("relay a to be ready and publish again (publishing after %s)", again)
	}, func() bool {
		e.failOnCrash()
		if again == 0 && e.count("outbox_events", "claimed_by = 'a' AND published_at > $1", healDB) > 0 {
			again = time.Since(healAt)
		}
		_, ready := readyz.first(healAt, true)
		return ready && again > 0
	})
	ready, _ := readyz.first(healAt, true)
	readyz.close()

	if testing.Verbose() {
		t.Logf("relay a said:\n%s", tail(a.out.String(), 40))
	}
	p.prod.term(t)
	e.waitDrained(partitionWithin)
	e.stopAll()
	v := e.verdict()
	mustHold(t, v)

	// No late write touched B's work: an event published before the heal is
	// left exactly as it was (no settle statement may change a published
	// event), and no attempt count went back.
	after := p.states()
	var changed []string
	regressed := 0
	for id, s := range beforeHeal {
		now := after[id]
		if s.publishedAt != nil && !s.same(now) {
			changed = append(changed, fmt.Sprintf("%s: %+v → %+v", id, s, now))
		}
		if now.attempts < s.attempts {
			regressed++
		}
	}
	if len(changed) > 0 || regressed > 0 {
		t.Fatalf("late writes of relay a: %d events published before the heal changed, %d attempt counts went back; the first changes:\n%s",
			len(changed), regressed, strings.Join(changed[:min(len(changed), 5)], "\n"))
	}
	if n := e.count("outbox_events", "quarantined_at IS NOT NULL"); n > 0 {
		t.Fatalf("%d events quarantined by the partition", n)
	}
	for _, r := range []*proc{a, b} {
		if strings.Contains(r.out.String(), "panic") {
			t.Fatalf("%s panicked:\n%s", r.name, tail(r.out.String(), 40))
		}
	}
	t.Logf("partition %s: relay a's work at the cut: %d events (the run heads it leased; cut from the broker only: the first it failed); it logged %q %s after the cut; its /readyz failed from %s (%q); "+
		"relay b had published them %s after the cut; unpublished events: %d before the cut, at most %d during it; "+
		"after the heal relay a was ready in %s and published again in %s; lost 0, duplicates %d, order violations 0 (checker)",
		c.name, len(held), c.noticed, noticed.Round(time.Millisecond), unready.at.Sub(cutAt).Round(time.Millisecond),
		strings.ReplaceAll(strings.TrimSpace(unready.body), "\n", "; "), tookOver.Round(time.Millisecond), level, peak,
		ready.at.Sub(healAt).Round(time.Millisecond), again.Round(time.Millisecond), v.Duplicates)
}

func containsAll(s string, subs []string) bool {
	for _, sub := range subs {
		if !strings.Contains(s, sub) {
			return false
		}
	}
	return true
}
