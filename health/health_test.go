package health_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/goleak"

	"github.com/pgoutbox/pgoutbox/health"
	"github.com/pgoutbox/pgoutbox/internal/pgtest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// mustHandler is health.Handler for a valid config.
func mustHandler(tb testing.TB, cfg *health.Config) http.Handler {
	tb.Helper()
	h, err := health.Handler(cfg)
	if err != nil {
		tb.Fatalf("Handler: %v", err)
	}
	return h
}

func quiet() *slog.Logger { return slog.New(slog.DiscardHandler) }

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("read %s: %v", url, err)
	}
	return resp.StatusCode, string(b)
}

// The probes follow the checks: /readyz turns 503 naming the failing check (a
// real database ping among them), and back to 200; /healthz stays 200; /metrics
// serves the gatherer.
func TestProbesFollowChecks(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t, pgtest.URL(), 2)
	var brokerErr atomic.Pointer[error]
	reg := prometheus.NewRegistry()
	c := prometheus.NewCounter(prometheus.CounterOpts{Name: "pgoutbox_test_things_total", Help: "Things."})
	reg.MustRegister(c)
	c.Add(3)
	srv, err := health.Start("127.0.0.1:0", mustHandler(t, &health.Config{
		Gatherer: reg,
		Checks: []health.Check{
			{Name: "database", Func: pool.Ping},
			{Name: "broker", Func: health.Status(func() error {
				if p := brokerErr.Load(); p != nil {
					return *p
				}
				return nil
			})},
			{Name: "bounded", Func: func(ctx context.Context) error {
				if _, ok := ctx.Deadline(); !ok {
					return errors.New("no deadline")
				}
				return nil
			}},
		},
		Logger: quiet(),
	}), quiet())
	pgtest.Must(t, err, "start")
	t.Cleanup(func() { _ = srv.Stop(context.Background()) })
	base := "http://" + srv.Addr()

	if code, body := get(t, base+"/readyz"); code != 200 || body != "database: ok\nbroker: ok\nbounded: ok\n" {
		t.Fatalf("readyz: %d %q", code, body)
	}
	down := errors.New("relay: broker unreachable\n(multi-line detail)")
	brokerErr.Store(&down)
	if code, body := get(t, base+"/readyz"); code != 503 || !strings.Contains(body, "broker: relay: broker unreachable (multi-line detail)\n") ||
		!strings.Contains(body, "database: ok") {
		t.Fatalf("readyz with the broker down: %d %q", code, body)
	}
	if code, body := get(t, base+"/healthz"); code != 200 || body != "ok\n" {
		t.Fatalf("healthz: %d %q", code, body)
	}
	brokerErr.Store(nil)
	if code, _ := get(t, base+"/readyz"); code != 200 {
		t.Fatalf("readyz after recovery: %d", code)
	}
	if code, body := get(t, base+"/metrics"); code != 200 || !strings.Contains(body, "pgoutbox_test_things_total 3") {
		t.Fatalf("metrics: %d %q", code, body)
	}
	if resp, err := http.Post(base+"/readyz", "text/plain", nil); err != nil || resp.StatusCode != http.StatusMethodNotAllowed {
		t.Fatalf("POST /readyz: %v %v", resp, err)
	} else {
		resp.Body.Close()
	}

	pgtest.Must(t, srv.Stop(context.Background()), "stop")
	pgtest.Must(t, srv.Stop(context.Background()), "second stop")
	if _, err := http.Get(base + "/healthz"); err == nil {
		t.Fatal("still serving after Stop")
	}
}

// A check that does not return within CheckTimeout fails with the deadline.
func TestCheckTimeout(t *testing.T) {
	t.Parallel()
	srv, err := health.Start("127.0.0.1:0", mustHandler(t, &health.Config{
		Checks:       []health.Check{{Name: "stuck", Func: func(ctx context.Context) error { <-ctx.Done(); return ctx.Err() }}},
		CheckTimeout: 50 * time.Millisecond,
		Logger:       quiet(),
	}), quiet())
	pgtest.Must(t, err, "start")
	t.Cleanup(func() { _ = srv.Stop(context.Background()) })
	if code, body := get(t, "http://"+srv.Addr()+"/readyz"); code != 503 || body != "stuck: context deadline exceeded\n" {
		t.Fatalf("readyz with a stuck check: %d %q", code, body)
	}
}

func TestNoGathererNoMetrics(t *testing.T) {
	t.Parallel()
	srv, err := health.Start("127.0.0.1:0", mustHandler(t, nil), quiet())
	pgtest.Must(t, err, "start")
	t.Cleanup(func() { _ = srv.Stop(context.Background()) })
	if code, _ := get(t, "http://"+srv.Addr()+"/metrics"); code != 404 {
		t.Fatalf("metrics without a gatherer: %d", code)
	}
	if code, body := get(t, "http://"+srv.Addr()+"/readyz"); code != 200 || body != "ok\n" {
		t.Fatalf("readyz without checks: %d %q", code, body)
	}
}

// Bad and busy addresses fail at Start.
func TestStartRejectsBadAddresses(t *testing.T) {
	t.Parallel()
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	pgtest.Must(t, err, "listen")
	defer busy.Close()
	for _, addr := range []string{"9090", "localhost", "127.0.0.1:notaport", "127.0.0.1:70000", busy.Addr().String()} {
		if srv, err := health.Start(addr, mustHandler(t, nil), quiet()); err == nil {
			_ = srv.Stop(context.Background())
			t.Errorf("Start(%q) succeeded", addr)
		} else if !strings.HasPrefix(err.Error(), "health: ") {
			t.Errorf("Start(%q): %v", addr, err)
		}
	}
}

// A consumer process serves its inbox metrics (inbox/inboxprom registered on reg)
// and probes the way the relay does.
func Example() {
	reg := prometheus.NewRegistry()
	// metrics, _ := inboxprom.New(reg); set as inbox.Config.Observer
	h, err := health.Handler(&health.Config{
		Gatherer: reg,
		Checks: []health.Check{
			{Name: "database", Func: func(ctx context.Context) error { return nil }}, // pool.Ping
		},
	})
	if err != nil {
		panic(err)
	}
	srv, err := health.Start("127.0.0.1:0", h, nil)
	if err != nil {
		panic(err)
	}
	defer srv.Stop(context.Background())
	resp, err := http.Get("http://" + srv.Addr() + "/readyz")
	if err != nil {
		panic(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	fmt.Print(resp.StatusCode, " ", string(body))
	// Output: 200 database: ok
}

func TestConfigValidate(t *testing.T) {
	t.Parallel()
	var defaults *health.Config
	if err := defaults.Validate(); err != nil {
		t.Errorf("nil config: %v", err)
	}
	bad := &health.Config{CheckTimeout: -time.Second, Checks: []health.Check{{Name: "database"}}}
	for _, field := range []string{"Config.CheckTimeout", "Config.Checks[0]"} {
		if err := bad.Validate(); err == nil || !strings.Contains(err.Error(), field) {
			t.Errorf("Validate: %v, want an error naming %s", err, field)
		}
	}
	if _, err := health.Handler(bad); err == nil {
		t.Error("Handler accepted an invalid config")
	}
}
