// Package health serves a process's operational endpoints over HTTP: Prometheus
// metrics and the liveness and readiness probes that orchestrators (Kubernetes,
// Nomad, a load balancer) poll. The relay (`pgoutbox relay --metrics-addr`) and
// consumers use it alike:
//
//	GET /metrics   the Prometheus exposition of Config.Gatherer
//	GET /healthz   200 "ok" while the process serves HTTP at all (liveness)
//	GET /readyz    200 when every Config.Checks passes, else 503; the body has one
//	               line per check, "name: ok" or "name: <error>" (readiness)
//
// A failing readiness check should mean "this process cannot do its work now"
// (database or broker unreachable), never "restart me": keep liveness trivial,
// or an outage of a dependency restarts every replica for nothing.
//
// Outside the standard library it pulls in the Prometheus client only: no database
// driver and no broker client.
package health

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/pgoutbox/pgoutbox/internal/config"
)

// Check is one readiness check: Func reports nil when Name is usable.
type Check struct {
	// Name labels the check in /readyz's body, e.g. "database" or "broker".
	Name string
	// Func reports whether the dependency is usable. It receives a context bounded
	// by Config.CheckTimeout; a pgxpool.Pool's or a broker.Pinger's Ping fits.
	Func func(ctx context.Context) error
}

// Status adapts a context-free health report, such as relay.Relay.Healthy or a
// subscriber's, to Check.Func.
func Status(f func() error) func(context.Context) error {
	return func(context.Context) error { return f() }
}

// DefaultCheckTimeout bounds each readiness check when Config.CheckTimeout is
// zero.
const DefaultCheckTimeout = 2 * time.Second

// readHeaderTimeout bounds reading a request's headers, so that a client that
// opens connections and sends nothing cannot hold them.
const readHeaderTimeout = 10 * time.Second

// Config configures the endpoints. A nil *Config and the zero value serve
// /healthz, an always-ready /readyz and no /metrics; each field names its
// default.
type Config struct {
	// Gatherer is what /metrics exposes, typically the *prometheus.Registry the
	// process's collectors are registered on. Nil means none: /metrics answers
	// 404.
	Gatherer prometheus.Gatherer

	// Checks are run, concurrently, on every /readyz request; each needs a Name
	// and a Func. Nil means none.
	Checks []Check

	// CheckTimeout bounds each check. It must not be negative. Zero means
	// DefaultCheckTimeout (2s).
	CheckTimeout time.Duration

	// Logger receives readiness changes (ready → not ready and back) and server
	// errors. Nil means slog.Default().
	Logger *slog.Logger
}

// Validate reports what Handler would reject in c, zero fields meaning their
// defaults: an error naming each bad field, joined. A nil c is valid.
func (c *Config) Validate() error {
	_, err := c.withDefaults()
	return err
}

// withDefaults returns a copy of c with its defaults filled in, and validates it.
func (c *Config) withDefaults() (Config, error) {
	return config.Resolve("health", c, func(c *Config) {
		config.Default(&c.CheckTimeout, DefaultCheckTimeout)
		if c.Logger == nil {
			c.Logger = slog.Default()
		}
	}, func(c *Config, p *config.Problems) {
		p.Check(c.CheckTimeout > 0, "Config.CheckTimeout (%s) must not be negative", c.CheckTimeout)
		for i, ch := range c.Checks {
			p.Check(ch.Name != "" && ch.Func != nil, "Config.Checks[%d] (%q) needs a Name and a Func", i, ch.Name)
		}
	})
}

// Handler returns the endpoints as an http.Handler, to mount on a mux of your
// own; Start serves them on an address of their own. cfg may be nil for all
// defaults; invalid settings are reported here.
func Handler(cfg *Config) (http.Handler, error) {
	c, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	mux := http.NewServeMux()
	if c.Gatherer != nil {
		mux.Handle("GET /metrics", promhttp.HandlerFor(c.Gatherer, promhttp.HandlerOpts{
			ErrorLog:      slog.NewLogLogger(c.Logger.Handler(), slog.LevelWarn),
			ErrorHandling: promhttp.ContinueOnError,
		}))
	}
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		_, _ = fmt.Fprintln(w, "ok")
	})
	rd := &readiness{cfg: c}
	mux.Handle("GET /readyz", rd)
	return mux, nil
}

type readiness struct {
	cfg      Config
	mu       sync.Mutex
	notReady bool
}

func (rd *readiness) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	errs := make([]error, len(rd.cfg.Checks))
	var wg sync.WaitGroup
	for i, c := range rd.cfg.Checks {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(r.Context(), rd.cfg.CheckTimeout)
			defer cancel()
			errs[i] = c.Func(ctx)
		})
	}
	wg.Wait()
	var body strings.Builder
	var failed []string
	for i, c := range rd.cfg.Checks {
		if errs[i] != nil {
			failed = append(failed, c.Name)
			// One line per check, whatever the error text holds.
			fmt.Fprintf(&body, "%s: %s\n", c.Name, strings.Join(strings.Fields(errs[i].Error()), " "))
		} else {
			fmt.Fprintf(&body, "%s: ok\n", c.Name)
		}
	}
	rd.logChange(failed, errs)
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	if len(failed) > 0 {
		w.WriteHeader(http.StatusServiceUnavailable)
	} else if len(rd.cfg.Checks) == 0 {
		body.WriteString("ok\n")
	}
	_, _ = w.Write([]byte(body.String()))
}

func (rd *readiness) logChange(failed []string, errs []error) {
	rd.mu.Lock()
	defer rd.mu.Unlock()
	switch {
	case len(failed) > 0 && !rd.notReady:
		rd.notReady = true
		rd.cfg.Logger.Warn("not ready", slog.String("failing", strings.Join(failed, ",")), slog.Any("error", errors.Join(errs...)))
	case len(failed) == 0 && rd.notReady:
		rd.notReady = false
		rd.cfg.Logger.Info("ready again")
	}
}

// Server serves the endpoints on an address of their own. Create it with Start.
//
// It is not a service of package internal/lifecycle, whose Start(ctx) runs a
// made service: Start here listens and serves in one step, so that a bad or busy
// address fails before anything else runs, and a Server cannot exist unstarted,
// be started twice or after Stop. Its Stop has the same graceful-then-hard shape
// (in-flight requests until ctx ends, then closed) and may be called any number
// of times.
type Server struct {
	srv  *http.Server
	ln   net.Listener
	done chan error
	once sync.Once
	err  error
}

// Start listens on addr (host:port; ":9090" for every interface, port 0 for any
// free port) and serves h (usually Handler's) in the background. A bad or busy
// address fails here, before anything else runs.
func Start(addr string, h http.Handler, logger *slog.Logger) (*Server, error) {
	if logger == nil {
		logger = slog.Default()
	}
	if _, _, err := net.SplitHostPort(addr); err != nil {
		return nil, fmt.Errorf("health: address %q: want host:port, e.g. :9090 or 127.0.0.1:9090", addr)
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("health: listen on %s: %w", addr, err)
	}
	s := &Server{
		srv: &http.Server{
			Handler:           h,
			ReadHeaderTimeout: readHeaderTimeout,
			ErrorLog:          slog.NewLogLogger(logger.Handler(), slog.LevelWarn),
		},
		ln:   ln,
		done: make(chan error, 1),
	}
	go func() {
		err := s.srv.Serve(ln)
		if errors.Is(err, http.ErrServerClosed) {
			err = nil
		}
		s.done <- err
	}()
	return s, nil
}

// Addr returns the address the server listens on, with the actual port when
// Start was given port 0.
func (s *Server) Addr() string { return s.ln.Addr().String() }

// Stop stops accepting connections and waits for in-flight requests, at most
// until ctx ends (then it closes them). It is safe to call more than once.
func (s *Server) Stop(ctx context.Context) error {
	s.once.Do(func() {
		err := s.srv.Shutdown(ctx)
		if err != nil {
			_ = s.srv.Close()
		}
		if serr := <-s.done; serr != nil {
			err = errors.Join(err, serr)
		}
		if err != nil {
			s.err = fmt.Errorf("health: stop: %w", err)
		}
	})
	return s.err
}
