package cli

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/pgoutbox/broker"
	"github.com/pgoutbox/pgoutbox/broker/brokertest"
	natsbroker "github.com/pgoutbox/pgoutbox/broker/nats"
	"github.com/pgoutbox/pgoutbox/broker/webhook"
	"github.com/pgoutbox/pgoutbox/internal/natstest"
	"github.com/pgoutbox/pgoutbox/internal/pgtest"
	"github.com/pgoutbox/pgoutbox/internal/wait"
	"github.com/pgoutbox/pgoutbox/relay"
	"github.com/pgoutbox/pgoutbox/wire"
)

// Acceptance: four relay processes drain 20,000 events over 300 aggregates; SIGTERM
// stops each with status 0.
func TestRelayProcessesDrainInOrder(t *testing.T) {
	t.Parallel()
	e := newRelayEnv(t)
	ids := e.enqueue(300, 67)
	var procs []*relayProc
	for i := range 4 {
		procs = append(procs, e.startRelay(fmt.Sprintf("proc-%d", i), natstest.URL()))
	}
	wait.For(t, 3*time.Minute, "the backlog to drain", func() bool { return e.count("published_at IS NULL") == 0 })
	for i, p := range procs {
		p.stopClean(t, fmt.Sprintf("relay %d", i))
	}
	dups := brokertest.CheckStream(t, e.target.Read(t), ids)
	var per []string
	rows, err := e.pool.Query(context.Background(), "SELECT claimed_by || '=' || count(*) FROM "+e.table()+" GROUP BY claimed_by ORDER BY 1")
	pgtest.Must(t, err, "per relay")
	per, err = pgx.CollectRows(rows, pgx.RowTo[string])
	pgtest.Must(t, err, "per relay")
	t.Logf("%d events published by %v, %d duplicates", len(ids), per, dups)
}

// Acceptance: SIGTERM with events in flight exits 0, leaves no lease held and loses
// nothing.
func TestRelaySIGTERMWithEventsInFlight(t *testing.T) {
	t.Parallel()
	e := newRelayEnv(t)
	ids := e.enqueue(200, 100)
	p := e.startRelay("term", natstest.URL(), "--batch-size", "200")
	wait.For(t, time.Minute, "publishing to begin", func() bool { return e.count("published_at IS NOT NULL") > 0 })
	p.stopClean(t, "relay")
	if n := e.count("published_at IS NULL AND claimed_by IS NOT NULL"); n != 0 {
		t.Fatalf("%d events still leased after SIGTERM:\n%s", n, p.stderr.String())
	}
	left := e.count("published_at IS NULL")
	p2 := e.startRelay("after-term", natstest.URL())
	wait.For(t, time.Minute, "the rest to drain", func() bool { return e.count("published_at IS NULL") == 0 })
	p2.stop(t, syscall.SIGTERM)
	dups := brokertest.CheckStream(t, e.target.Read(t), ids)
	t.Logf("%d of %d events were left after SIGTERM; %d duplicates", left, len(ids), dups)
}

// Acceptance: a relay SIGKILLed while holding leases. Its publishes reach NATS but the
// acks are held back by a proxy, so it dies owning its batch; another relay
// publishes those events once the lease expires, in order, nothing lost.
func TestRelaySIGKILLHoldingLeases(t *testing.T) {
	t.Parallel()
	e := newRelayEnv(t)
	proxy := newAckHoldingProxy(t, strings.TrimPrefix(natstest.URL(), "nats://"))
	victim := e.startRelay("victim", "nats://"+proxy.addr(), "--lease", "2s", "--publish-timeout", "1500ms", "--ack-timeout", "10s")
	proxy.holdAcks()
	ids := e.enqueue(50, 4)
	wait.For(t, 30*time.Second, "the victim to hold leases", func() bool {
		return e.count("claimed_by = 'victim' AND claim_until > now() AND published_at IS NULL") > 0
	})
	victim.kill(t)
	held := e.count("claimed_by = 'victim' AND published_at IS NULL")
	if held == 0 {
		t.Fatal("the victim released its leases before being killed; the test proves nothing")
	}

	// The successor runs in-process so that its takeover count can be read.
	pub, err := natsbroker.Dial(context.Background(), natstest.URL(), &natsbroker.Config{
		Stream: e.target.Stream, StreamSubjects: e.target.Subjects(), Subject: broker.MustParseTemplate(e.target.Template)})
	pgtest.Must(t, err, "dial")
	defer pub.Close()
	r, err := relay.New(e.pool, pub, &relay.Config{Schema: e.schema, ID: "successor", PollInterval: 100 * time.Millisecond})
	pgtest.Must(t, err, "relay")
	pgtest.Must(t, r.Start(context.Background()), "start")
	defer r.Stop(context.Background())
	wait.For(t, 30*time.Second, "the successor to publish everything", func() bool { return e.count("published_at IS NULL") == 0 })
	dups := brokertest.CheckStream(t, e.target.Read(t), ids)
	if s := r.Stats(); s.TakenOver < int64(held) {
		t.Fatalf("successor took over %d leases, the victim held %d", s.TakenOver, held)
	}
	t.Logf("victim died holding %d leases; successor took them over; %d duplicates dropped or counted", held, dups)
}

// ackHoldingProxy forwards TCP between a client and a server; holdAcks stops
// forwarding server → client bytes (the client's publishes still arrive, their acks
// do not).
type ackHoldingProxy struct {
	ln   net.Listener
	hold atomic.Bool
	wait chan struct{} // closed when the test ends, releasing held copies
}

func newAckHoldingProxy(t *testing.T, server string) *ackHoldingProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	pgtest.Must(t, err, "listen")
	p := &ackHoldingProxy{ln: ln, wait: make(chan struct{})}
	var wg sync.WaitGroup
	var conns sync.Map
	t.Cleanup(func() {
		ln.Close()
		close(p.wait)
		conns.Range(func(k, _ any) bool { k.(net.Conn).Close(); return true })
		wg.Wait()
	})
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s, err := net.Dial("tcp", server)
			if err != nil {
				c.Close()
				continue
			}
			conns.Store(c, true)
			conns.Store(s, true)
			wg.Add(2)
			go func() { defer wg.Done(); _, _ = io.Copy(s, c); s.Close() }()
			go func() {
				defer wg.Done()
				buf := make([]byte, 32<<10)
				for {
					n, err := s.Read(buf)
					if n > 0 && p.hold.Load() {
						<-p.wait // never forward again
						return
					}
					if n > 0 {
						if _, werr := c.Write(buf[:n]); werr != nil {
							return
						}
					}
					if err != nil {
						c.Close()
						return
					}
				}
			}()
		}
	}()
	return p
}

func (p *ackHoldingProxy) addr() string { return p.ln.Addr().String() }
func (p *ackHoldingProxy) holdAcks()    { p.hold.Store(true) }

func TestRelayFlagErrors(t *testing.T) {
	t.Parallel()
	cases := []struct {
		args []string
		want string
	}{
		{[]string{"--broker", "kafkaa://x:9092"}, `unknown scheme "kafkaa"`},
		{[]string{"--broker", "not a url"}, "is not a broker URL"},
		{[]string{"--broker", "kafka://host:notaport"}, "kafka:"},
		{[]string{"--broker", "kafka://user:hunter2@host:9092?sasl=bogus"}, "kafka:"},
		{[]string{"--broker", "https://example.com/hook", "--topic-template", "x.{event_type}"}, "does not apply to webhooks"},
		{[]string{"--broker", "ftp://host"}, `unknown scheme "ftp"`},
		{[]string{"--batch-size", "0"}, "--batch-size must be positive"},
		{[]string{"--batch-size", "20000"}, "--batch-size (20000) must be in 1..10000"},
		{[]string{"--lease", "0s"}, "--lease must be positive"},
		{[]string{"--lease", "1s", "--publish-timeout", "2s"}, "--publish-timeout (2s) must be positive and shorter than --lease (1s)"},
		{[]string{"--topic-template", "x.{nope}"}, "unknown placeholder {nope}"},
		{[]string{"--log-level", "loud"}, "--log-level"},
		{[]string{"--max-attempts", "-1"}, "--max-attempts (-1) must be positive"},
		{[]string{"--format", "xml"}, `--format: wire: unknown format "xml"`},
		{[]string{"--format", "cloudevents", "--ce-source", "/a b"}, "--ce-source: wire: CloudEvents source"},
		{[]string{"--ce-source", "/app"}, "--ce-source applies to --format cloudevents only"},
	}
	for _, tc := range cases {
		if !slices.Contains(tc.args, "--broker") {
			tc.args = append([]string{"--broker", "null://"}, tc.args...)
		}
		_, errOut, code := run(t, append([]string{"relay", "--database-url", "postgres://x@127.0.0.1:1/db"}, tc.args...)...)
		if code != 2 || !strings.Contains(errOut, tc.want) || strings.Count(errOut, "\n") != 1 || strings.Contains(errOut, "hunter2") {
			t.Errorf("relay %v: exit %d, stderr %q, want one line with %q", tc.args, code, errOut, tc.want)
		}
	}
}

func TestRelayRefusesUnmigratedSchema(t *testing.T) {
	t.Parallel()
	pool, schema := pgtest.Schema(t, 1)
	_ = pool
	_, errOut, code := run(t, "relay", "--database-url", pgtest.URL(), "--schema", schema, "--broker", "null://")
	if code != 1 || !strings.Contains(errOut, "run 'pgoutbox migrate --schema "+schema+"' first") {
		t.Fatalf("exit %d, stderr %q", code, errOut)
	}
}

// A relay process publishes to a webhook: every request is signed with the secret
// from the environment, each aggregate's events arrive in order.
func TestRelayToWebhook(t *testing.T) {
	t.Parallel()
	e := newRelayEnv(t)
	secret := "0123456789abcdef0123456789abcdef"
	verifier := &webhook.Verifier{Secrets: [][]byte{[]byte(secret)}}
	var mu sync.Mutex
	var got []broker.Message
	srv := httptest.NewServer(verifier.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		names := make([]string, 0, len(r.Header))
		for k := range r.Header {
			names = append(names, k)
		}
		m, err := wire.ParseOutboxHeaders(body, names, r.Header.Get)
		if err != nil || r.Header.Get("Idempotency-Key") != m.EventID.String() {
			http.Error(w, fmt.Sprint("bad request: ", err), http.StatusBadRequest)
			return
		}
		mu.Lock()
		got = append(got, m)
		mu.Unlock()
	})))
	t.Cleanup(srv.Close)

	ids := e.enqueue(5, 10)
	cmd := exec.Command(binary, "relay", "--database-url", pgtest.URL(), "--schema", e.schema, "--broker", srv.URL+"/hooks/{aggregate_type}")
	cmd.Env = append(os.Environ(), "PGOUTBOX_WEBHOOK_SECRET="+secret)
	var stderr syncBuffer
	cmd.Stderr = &stderr
	pgtest.Must(t, cmd.Start(), "start relay")
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	wait.For(t, 30*time.Second, "the events to be delivered", func() bool { return e.count("published_at IS NULL") == 0 })
	pgtest.Must(t, cmd.Process.Signal(syscall.SIGTERM), "SIGTERM")
	if err := cmd.Wait(); err != nil {
		t.Fatalf("relay: %v\n%s", err, stderr.String())
	}
	mu.Lock()
	defer mu.Unlock()
	brokertest.CheckStream(t, got, ids)

	// Without a secret the relay refuses to start.
	_, errOut, code := run(t, "relay", "--database-url", pgtest.URL(), "--broker", "https://example.invalid/hook")
	if code != 2 || !strings.Contains(errOut, "PGOUTBOX_WEBHOOK_SECRET") {
		t.Fatalf("no secret: exit %d, %q", code, errOut)
	}
}

func TestRelayHelpDocumentsEveryBroker(t *testing.T) {
	t.Parallel()
	out, _, code := run(t, "relay", "--help")
	for _, want := range []string{"embedded", "nats://", "kafka://", "amqp://", "https://", "null://", "redis://", "--topic-template",
		"PGOUTBOX_WEBHOOK_SECRET", "PGOUTBOX_REDIS_PASSWORD", "(env DATABASE_URL)", "(env PGOUTBOX_BATCH_SIZE)", "--format", "--ce-source"} {
		if code != 0 || !strings.Contains(out, want) {
			t.Errorf("relay --help lacks %q", want)
		}
	}
}
