package cli

import (
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/pgoutbox/pgoutbox/broker"
	"github.com/pgoutbox/pgoutbox/broker/brokerotel"
	"github.com/pgoutbox/pgoutbox/health"
	"github.com/pgoutbox/pgoutbox/relay"
)

// relayMode is one way of running the relay — one outbox (singleRelay), many
// tenants (tenantsRelay), the CDC source (cdcRelay) — and supplies only what
// differs between them; runDaemon does the rest in one order for all.
type relayMode interface {
	// check validates the mode's flags and configuration with the daemon's
	// logger, touching no network.
	check(ctx context.Context, logger *slog.Logger) error
	// useBroker adapts the checked broker target to the mode; brokerLog is
	// the logger whose every line names the broker.
	useBroker(t *brokerTarget, brokerLog *slog.Logger) error
	// metrics registers the mode's collectors (only with --metrics-addr).
	metrics(reg *prometheus.Registry) error
	// connect opens the mode's databases and checks them; closeDB is called
	// on the way out, after everything else stopped.
	connect(ctx context.Context) (closeDB func(), err error)
	// service builds the long-running service that publishes to pub, or
	// with --destinations-file (singleRelay only) to dests, pub nil.
	service(pub broker.Publisher, dests []relay.Destination) (service, error)
	// health returns what --metrics-addr serves, /metrics from reg, and
	// the endpoints it has, for the log.
	health(reg *prometheus.Registry) (h http.Handler, endpoints string, err error)
	// started runs once the service started (more services, a log line);
	// stop is called on the way out, before the service's own stop.
	started(ctx context.Context) (stop func(), err error)
	// stopping is the log line when a signal came, and the error when the
	// service did not stop within --shutdown-timeout.
	stopping() (line string, timedOut error)
}

// service is a long-running service: relay.Relay, relay.Group, cdc.Source.
type service interface {
	Start(ctx context.Context) error
	Stop(ctx context.Context) error
}

// runDaemon runs a relay until SIGTERM or SIGINT (ctx's end): it owns the
// logger, validation, the broker (with publish spans when tracing is on),
// tracing and its flush, the metrics and health server, start, signals — also
// during start-up — and the graceful stop.
func runDaemon(ctx context.Context, f *relayFlags, stderr io.Writer, m relayMode) error {
	if f.stopMax <= 0 {
		return usagef("--shutdown-timeout must be positive, got %s", f.stopMax)
	}
	logger, err := f.log.logger(stderr)
	if err != nil {
		return err
	}
	// Everything is validated before the network is touched.
	if err := m.check(ctx, logger); err != nil {
		return err
	}
	var target *brokerTarget // nil with --destinations-file: each destination has its own
	if f.destinationsFile != "" {
		if f.dests, err = readDestinationsFile(ctx, f.destinationsFile); err != nil {
			return err
		}
		if err := m.useBroker(nil, logger.With(slog.String("destinations", f.dests.names()))); err != nil {
			return err
		}
	} else {
		if target, err = f.broker.parse(); err != nil {
			return err
		}
		if err := m.useBroker(target, logger.With(slog.String("broker", target.describe()))); err != nil {
			return err
		}
	}
	var reg *prometheus.Registry
	if f.metricsAddr != "" {
		if _, _, err := net.SplitHostPort(f.metricsAddr); err != nil {
			return usagef("--metrics-addr %q: want host:port, e.g. :9090 or 127.0.0.1:9090", f.metricsAddr)
		}
		reg = prometheus.NewRegistry()
		reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
		if err := m.metrics(reg); err != nil {
			return err
		}
	}
	traces, err := setupTracing(ctx, f.stdout)
	if err != nil {
		return err
	}
	defer flushTraces(traces, logger)

	closeDB, err := m.connect(ctx)
	if err != nil {
		return err
	}
	defer closeDB()
	var pub broker.Publisher
	var dests []relay.Destination
	var closeBroker func()
	if target != nil {
		pub, closeBroker, err = openPublisher(ctx, target, traces, logger)
	} else {
		dests, closeBroker, err = f.dests.open(ctx, traces, logger)
	}
	if err != nil {
		return err
	}
	defer closeBroker()
	svc, err := m.service(pub, dests)
	if err != nil {
		return err
	}
	if reg != nil {
		stop, err := serveHealth(f.metricsAddr, reg, m, logger)
		if err != nil {
			return err
		}
		defer stop()
	}
	// SIGTERM or SIGINT during Start (a first listing or connection that
	// hangs) stops the service as well: Start then returns at once.
	stopEarly := context.AfterFunc(ctx, func() {
		sctx, cancel := context.WithTimeout(context.Background(), f.stopMax)
		defer cancel()
		_ = svc.Stop(sctx)
	})
	defer stopEarly()
	if err := svc.Start(context.WithoutCancel(ctx)); err != nil {
		return err
	}
	stopMore, err := m.started(ctx)
	if err != nil {
		return err
	}
	defer stopMore()
	<-ctx.Done() // SIGTERM or SIGINT
	line, timedOut := m.stopping()
	logger.Info(line, slog.Duration("shutdown_timeout", f.stopMax))
	sctx, cancel := context.WithTimeout(context.Background(), f.stopMax)
	defer cancel()
	if err := svc.Stop(sctx); err != nil {
		return timedOut
	}
	return nil
}

// serveHealth starts the metrics and health server of --metrics-addr. A
// failure to listen is a usage error: the address is the user's choice.
func serveHealth(addr string, reg *prometheus.Registry, m relayMode, logger *slog.Logger) (stop func(), err error) {
	h, endpoints, err := m.health(reg)
	if err != nil {
		return nil, err
	}
	srv, err := health.Start(addr, h, logger)
	if err != nil {
		return nil, usagef("--metrics-addr: %v", err)
	}
	logger.Info("serving metrics and health probes", slog.String("addr", srv.Addr()), slog.String("endpoints", endpoints))
	return func() {
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Stop(sctx)
	}, nil
}

// flushTraces flushes the spans still buffered, for at most 5s.
func flushTraces(traces *tracing, logger *slog.Logger) {
	fctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := traces.shutdown(fctx); err != nil {
		logger.Warn("could not flush traces", slog.Any("error", err))
	}
}

// openPublisher connects to the broker, with publish spans when tracing is on.
func openPublisher(ctx context.Context, target *brokerTarget, traces *tracing, logger *slog.Logger) (broker.Publisher, func(), error) {
	pub, closeBroker, err := target.open(ctx, logger)
	if err != nil {
		return nil, nil, err
	}
	if tp := traces.provider(); tp != nil {
		if pub, err = brokerotel.New(pub, &brokerotel.Config{TracerProvider: tp, System: target.system(), Destination: target.destination()}); err != nil {
			closeBroker()
			return nil, nil, err
		}
	}
	return pub, closeBroker, nil
}
