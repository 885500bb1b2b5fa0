package cli

import (
	"bytes"
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/pgoutbox/pgoutbox"
	"github.com/pgoutbox/pgoutbox/internal/pgtest"
	"github.com/pgoutbox/pgoutbox/internal/wait"
)

// opsRelay is a `pgoutbox relay` process started with --metrics-addr.
type opsRelay struct {
	*relayProc
	addr string // where /metrics is served
}

var servingAddr = regexp.MustCompile(`serving metrics and health probes"? addr=(\S+)`)

// startOpsRelay runs the relay binary with args and env, waiting until it serves
// its metrics.
func startOpsRelay(t *testing.T, env []string, args ...string) *opsRelay {
	t.Helper()
	p, m := startProc(t, "relay", env, append([]string{"relay"}, args...), servingAddr)
	return &opsRelay{relayProc: p, addr: m[1]}
}

func (p *opsRelay) sigterm(t *testing.T) {
	t.Helper()
	pgtest.Must(t, p.cmd.Process.Signal(syscall.SIGTERM), "SIGTERM")
	select {
	case err := <-p.done:
		if err != nil {
			t.Fatalf("relay exited with %v:\n%s", err, p.stderr.String())
		}
	case <-time.After(60 * time.Second):
		t.Fatalf("relay did not stop:\n%s", p.stderr.String())
	}
}

func (p *opsRelay) get(t *testing.T, path string) (int, string) {
	t.Helper()
	resp, err := http.Get("http://" + p.addr + path)
	if err != nil {
		t.Fatalf("GET %s: %v\n%s", path, err, p.stderr.String())
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// metric scrapes /metrics and returns the sample's value (name with its labels
// as exposed, e.g. `pgoutbox_relay_up{dependency="broker"}`); -1 when absent.
func (p *opsRelay) metric(t *testing.T, sample string) float64 {
	t.Helper()
	code, body := p.get(t, "/metrics")
	if code != 200 {
		t.Fatalf("/metrics: %d", code)
	}
	for _, line := range strings.Split(body, "\n") {
		if rest, ok := strings.CutPrefix(line, sample+" "); ok {
			v, err := strconv.ParseFloat(strings.TrimSpace(rest), 64)
			pgtest.Must(t, err, "parse %q", line)
			return v
		}
	}
	return -1
}

// Acceptance: scraping a relay process during a run shows the metrics moving;
// while the broker (a webhook this test owns) answers 503 the oldest pending age
// rises and /readyz says 503; once it answers 200 again the backlog drains, the
// age falls to 0 and /readyz says 200.
func TestRelayMetricsFollowABrokerOutage(t *testing.T) {
	t.Parallel()
	pool, schema := pgtest.Migrated(t, 4)
	e := &relayEnv{t: t, pool: pool, schema: schema}
	var status atomic.Int32
	status.Store(http.StatusOK)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.WriteHeader(int(status.Load()))
	}))
	t.Cleanup(srv.Close)

	e.enqueue(3, 10)
	p := startOpsRelay(t, []string{"PGOUTBOX_METRICS_ADDR=127.0.0.1:0"},
		"--database-url", pgtest.URL(), "--schema", schema, "--broker", srv.URL+"/hook", "--webhook-unsigned",
		"--poll-interval", "100ms", "--backoff-base", "50ms", "--backoff-max", "200ms", "--ack-timeout", "2s")
	wait.For(t, 30*time.Second, "the first events to be published", func() bool { return e.count("published_at IS NULL") == 0 })
	if code, body := p.get(t, "/healthz"); code != 200 || body != "ok\n" {
		t.Fatalf("/healthz: %d %q", code, body)
	}
	if code, body := p.get(t, "/readyz"); code != 200 {
		t.Fatalf("/readyz with everything up: %d %q", code, body)
	}
	published := p.metric(t, "pgoutbox_relay_published_total")
	batches := p.metric(t, "pgoutbox_relay_batch_size_count")
	if published != 30 || batches < 1 || p.metric(t, "pgoutbox_relay_broker_ack_seconds_count") < 1 {
		t.Fatalf("after the first run: published_total %v, batch_size_count %v", published, batches)
	}
	if up := p.metric(t, `pgoutbox_relay_up{dependency="broker"}`); up != 1 {
		t.Fatalf("up{broker} %v", up)
	}

	// The broker goes down.
	status.Store(http.StatusServiceUnavailable)
	e.enqueue(2, 3)
	wait.For(t, 30*time.Second, "/readyz to report the broker down", func() bool {
		code, body := p.get(t, "/readyz")
		return code == 503 && strings.Contains(body, "broker unreachable")
	})
	if up := p.metric(t, `pgoutbox_relay_up{dependency="broker"}`); up != 0 {
		t.Errorf("up{broker} %v with the broker down", up)
	}
	var age float64
	wait.For(t, 30*time.Second, "the pending events to be seen", func() bool {
		age = p.metric(t, "pgoutbox_relay_oldest_pending_age_seconds")
		return p.metric(t, "pgoutbox_relay_pending_events") == 6 && age > 0
	})
	wait.For(t, 30*time.Second, "the oldest pending age to rise", func() bool {
		return p.metric(t, "pgoutbox_relay_oldest_pending_age_seconds") > age+0.2
	})
	if f := p.metric(t, `pgoutbox_relay_publish_failures_total{reason="unavailable"}`); f < 1 {
		t.Errorf("publish_failures_total{reason=unavailable} %v", f)
	}
	if q := p.metric(t, "pgoutbox_relay_quarantined_events"); q != 0 {
		t.Errorf("an outage quarantined %v events", q)
	}

	// The broker is back.
	status.Store(http.StatusOK)
	wait.For(t, 30*time.Second, "the backlog to drain", func() bool { return e.count("published_at IS NULL") == 0 })
	wait.For(t, 30*time.Second, "the oldest pending age to fall to 0", func() bool {
		return p.metric(t, "pgoutbox_relay_oldest_pending_age_seconds") == 0 && p.metric(t, "pgoutbox_relay_pending_events") == 0
	})
	wait.For(t, 30*time.Second, "/readyz to report ready", func() bool { code, _ := p.get(t, "/readyz"); return code == 200 })
	if got := p.metric(t, "pgoutbox_relay_published_total"); got != 36 {
		t.Errorf("published_total %v after the outage, want 36", got)
	}
	if got := p.metric(t, "pgoutbox_relay_batch_size_count"); got <= batches {
		t.Errorf("batch_size_count did not move: %v then %v", batches, got)
	}
	if got := p.metric(t, "pgoutbox_relay_publish_attempts_sum"); got <= 36 {
		t.Errorf("publish_attempts_sum %v: the retried events should count their second attempts", got)
	}
	p.sigterm(t)
}

// --metrics-addr and OTEL_TRACES_EXPORTER mistakes exit 2 with one line at start.
func TestRelayOpsConfigErrors(t *testing.T) {
	t.Parallel()
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	pgtest.Must(t, err, "listen")
	defer busy.Close()
	_, schema := pgtest.Migrated(t, 1)
	cases := []struct {
		env  []string
		args []string
		want string
	}{
		{nil, []string{"--metrics-addr", "9090"}, `--metrics-addr "9090": want host:port`},
		{[]string{"PGOUTBOX_METRICS_ADDR=nonsense"}, nil, `--metrics-addr "nonsense"`},
		{nil, []string{"--metrics-addr", busy.Addr().String(), "--database-url", pgtest.URL(), "--schema", schema}, "--metrics-addr: health: listen on"},
		{[]string{"OTEL_TRACES_EXPORTER=jaeger"}, nil, `unknown exporter "jaeger"`},
		{[]string{"OTEL_TRACES_EXPORTER=otlp", "OTEL_EXPORTER_OTLP_PROTOCOL=grpc"}, nil, "only http/protobuf"},
	}
	for _, tc := range cases {
		args := append([]string{"relay", "--broker", "null://", "--database-url", "postgres://x@127.0.0.1:1/db"}, tc.args...)
		cmd := exec.Command(binary, args...)
		cmd.Env = append(os.Environ(), tc.env...)
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		err := cmd.Run()
		code := 0
		if ee, ok := err.(*exec.ExitError); ok {
			code = ee.ExitCode()
		}
		// The relay logs before failing; the error is the last line.
		lines := strings.Split(strings.TrimSpace(stderr.String()), "\n")
		last := lines[len(lines)-1]
		if code != 2 || !strings.HasPrefix(last, "pgoutbox: ") || !strings.Contains(last, tc.want) {
			t.Errorf("%v %v: exit %d, stderr %q, want a last line with %q", tc.env, tc.args, code, stderr.String(), tc.want)
		}
	}
}

// OTEL_TRACES_EXPORTER=console prints a publish span per event, in the trace
// whose traceparent the producer stored.
func TestRelayConsoleTraces(t *testing.T) {
	t.Parallel()
	pool, schema := pgtest.Migrated(t, 2)
	e := &relayEnv{t: t, pool: pool, schema: schema}
	prod, err := pgoutbox.NewProducer(&pgoutbox.Config{Schema: schema})
	pgtest.Must(t, err, "producer")
	const traceID = "4bf92f3577b34da6a3ce929d0e0e4736"
	_, err = prod.EnqueueTx(context.Background(), pool, pgoutbox.Event{AggregateType: "acct", AggregateID: "1", EventType: "changed",
		Payload: 1, Headers: map[string]string{"traceparent": "00-" + traceID + "-00f067aa0ba902b7-01"}})
	pgtest.Must(t, err, "enqueue")

	cmd := exec.Command(binary, "relay", "--database-url", pgtest.URL(), "--schema", schema, "--broker", "null://")
	cmd.Env = append(os.Environ(), "OTEL_TRACES_EXPORTER=console", "OTEL_SERVICE_NAME=relay-under-test")
	var stdout, stderr syncBuffer
	cmd.Stdout = &stdout
	cmd.Stderr = &stderr
	pgtest.Must(t, cmd.Start(), "start relay")
	var once sync.Once
	t.Cleanup(func() { once.Do(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }) })
	wait.For(t, 30*time.Second, "the event to be published", func() bool { return e.count("published_at IS NULL") == 0 })
	pgtest.Must(t, cmd.Process.Signal(syscall.SIGTERM), "SIGTERM")
	var werr error
	once.Do(func() { werr = cmd.Wait() })
	if werr != nil {
		t.Fatalf("relay: %v\n%s", werr, stderr.String())
	}
	out := stdout.String()
	for _, want := range []string{`"Name":"publish acct"`, `"TraceID":"` + traceID + `"`, `"SpanID":"00f067aa0ba902b7"`, "relay-under-test", `"Key":"messaging.message.id"`} {
		if !strings.Contains(out, want) {
			t.Errorf("console spans lack %s:\n%s", want, out)
		}
	}
}

// The relay's cleanup job counts what it deleted in pgoutbox_cleanup_deleted_rows_total.
func TestRelayCleanupJobFeedsMetrics(t *testing.T) {
	t.Parallel()
	pool, schema := pgtest.Migrated(t, 4)
	e := &relayEnv{t: t, pool: pool, schema: schema}
	old := e.enqueue(3, 5)
	_, err := pool.Exec(context.Background(), "UPDATE "+e.table()+" SET published_at = now() - interval '2 hours' WHERE event_id = ANY($1)", old)
	pgtest.Must(t, err, "publish")
	p := startOpsRelay(t, []string{"PGOUTBOX_METRICS_ADDR=127.0.0.1:0"},
		"--database-url", pgtest.URL(), "--schema", schema, "--broker", "null://",
		"--cleanup-interval", "100ms", "--retention", "1h")
	sample := `pgoutbox_cleanup_deleted_rows_total{table="outbox_events"}`
	wait.For(t, 30*time.Second, "the cleanup counter", func() bool { return p.metric(t, sample) == float64(len(old)) })
	if n := e.count("true"); n != 0 {
		t.Fatalf("%d rows left after cleanup", n)
	}
	p.sigterm(t)
}

// `relay --source cdc` exports traces too: with OTEL_TRACES_EXPORTER=console
// it prints a publish span in the trace whose traceparent the producer stored.
func TestCDCRelayConsoleTraces(t *testing.T) {
	t.Parallel()
	e := newCDCRelayEnv(t)
	e.dropCDC()
	p := e.startCDCRelay([]string{"OTEL_TRACES_EXPORTER=console", "OTEL_SERVICE_NAME=cdc-relay-under-test"})
	prod, err := pgoutbox.NewProducer(&pgoutbox.Config{Schema: e.schema})
	pgtest.Must(t, err, "producer")
	const traceID = "5cf92f3577b34da6a3ce929d0e0e4737"
	_, err = prod.EnqueueTx(context.Background(), e.pool, pgoutbox.Event{AggregateType: "acct", AggregateID: "1", EventType: "changed",
		Payload: 1, Headers: map[string]string{"traceparent": "00-" + traceID + "-00f067aa0ba902b7-01"}})
	pgtest.Must(t, err, "enqueue")
	wait.For(t, 60*time.Second, "the event to be published", func() bool { return e.count("published_at IS NULL") == 0 })
	p.stopClean(t, "relay")
	out := p.stdout.String()
	for _, want := range []string{`"Name":"publish `, `"TraceID":"` + traceID + `"`, `"SpanID":"00f067aa0ba902b7"`, "cdc-relay-under-test",
		`"Key":"messaging.system","Value":{"Type":"STRING","Value":"nats"}`} {
		if !strings.Contains(out, want) {
			t.Errorf("console spans lack %s:\n%s", want, out)
		}
	}
}
