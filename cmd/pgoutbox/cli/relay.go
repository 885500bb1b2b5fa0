package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"runtime/debug"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/pgoutbox/pgoutbox/admin"
	"github.com/pgoutbox/pgoutbox/broker"
	"github.com/pgoutbox/pgoutbox/broker/brokerotel"
	"github.com/pgoutbox/pgoutbox/migrate"
	"github.com/pgoutbox/pgoutbox/relay"
)

type relayFlags struct {
	db      dbFlags
	broker  brokerFlags
	log     logFlags
	cfg     relay.Config
	stopMax time.Duration

	cleanupInterval time.Duration // 0: no cleanup job
	retention       time.Duration

	metricsAddr string
	stdout      io.Writer        // console trace exporter
	cdc         cdcFlags         // --source and the CDC source's names (relay_cdc.go)
	tenants     relayTenantFlags // --tenants: many outboxes (relay_tenants.go)
}

func newRelayCmd() *cobra.Command {
	var f relayFlags
	cmd := &cobra.Command{
		Use:   "relay",
		Short: "Publish committed outbox events to a broker until stopped",
		Long: `Run a relay: claim committed events in small batches, publish them to the
broker, and mark them published once the broker acknowledged them. Any number of
relays may run against one outbox; events of one aggregate are published in
sequence order across all of them. A commit wakes the relay at once through
LISTEN/NOTIFY; --poll-interval is the fallback. Through a connection pooler in
transaction mode (PgBouncer pool_mode=transaction) LISTEN cannot work: use
--no-notify, and default_query_exec_mode=exec in the database URL.

SIGTERM or SIGINT stops it gracefully: no new claims, in-flight publishes finish
(at most --shutdown-timeout), unpublished leases are released, exit status 0.
An unreachable database or broker is retried with backoff; nothing is lost.
The polling relay runs Go's garbage collector at GOGC=200 unless GOGC is set.

` + cdcHelp + "\n\n" + tenantsHelp + "\n\n" + brokerHelp + "\n\n" + boundsHelp + "\n\n" + metricsHelp + "\n\n" + tracingHelp,
		Example: `  DATABASE_URL=postgres://app@db/app pgoutbox relay --broker nats://nats:4222
  PGOUTBOX_BROKER=kafka://kafka:9092 pgoutbox relay
  pgoutbox relay --broker embedded --embedded-dir /var/lib/pgoutbox/nats --embedded-port 4222   # trying it out only
  pgoutbox relay --broker 'nats://a:4222,nats://b:4222' --topic-template 'events.{aggregate_type}' --nats-stream EVENTS
  pgoutbox relay --broker nats://nats:4222 --tenants 'tenant_*'          # every tenant_* outbox schema, found as they come
  pgoutbox relay --broker kafka://kafka:9092 --tenants-file /etc/pgoutbox/tenants.yaml`,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := rejectZero(cmd.Flags(), "batch-size", "run-length", "workers", "lease", "publish-timeout",
				"poll-interval", "max-attempts", "backoff-base", "backoff-max"); err != nil {
				return err
			}
			f.stdout = cmd.OutOrStdout()
			isCDC, err := f.cdc.isCDC()
			switch {
			case err != nil:
				return err
			case isCDC && f.tenants.enabled():
				return usagef("--source cdc serves one schema per replication slot: run a CDC relay per tenant, or poll with --tenants (docs/operations.md, \"Many tenants\")")
			case f.tenants.enabled():
				tuneGC()
				return runRelayTenants(cmd.Context(), &f, cmd.Flags(), cmd.ErrOrStderr())
			case isCDC:
				return runRelayCDC(cmd.Context(), &f, cmd.ErrOrStderr())
			}
			tuneGC() // the polling relay only: the CDC source holds more memory, for no gain measured
			return runRelay(cmd.Context(), &f, cmd.ErrOrStderr())
		},
	}
	fs := cmd.Flags()
	f.db.register(fs)
	f.broker.register(fs)
	f.log.register(fs)
	f.cdc.register(fs)
	f.tenants.register(fs)
	fs.StringVar(&f.cfg.ID, "id", "", "relay id written in claimed_by; unique per running relay (env PGOUTBOX_RELAY_ID) (default <hostname>-<pid>)")
	fs.IntVar(&f.cfg.BatchSize, "batch-size", 500, "most events claimed at once (env PGOUTBOX_BATCH_SIZE)")
	fs.IntVar(&f.cfg.RunLength, "run-length", 10, "most events of one aggregate claimed at once (env PGOUTBOX_RUN_LENGTH)")
	fs.IntVar(&f.cfg.Workers, "workers", 4, "concurrent claim/publish loops (env PGOUTBOX_WORKERS)")
	fs.DurationVar(&f.cfg.Lease, "lease", 30*time.Second, "how long claimed events stay reserved before another relay may take them over (env PGOUTBOX_LEASE)")
	fs.DurationVar(&f.cfg.PublishTimeout, "publish-timeout", 0, "bound on one batch's publish; must be shorter than --lease (env PGOUTBOX_PUBLISH_TIMEOUT) (default lease/2)")
	fs.DurationVar(&f.cfg.PollInterval, "poll-interval", 2*time.Second, "how often to look for events without a notification (env PGOUTBOX_POLL_INTERVAL)")
	fs.BoolVar(&f.cfg.DisableNotify, "no-notify", false, "do not LISTEN for commits; rely on polling alone (env PGOUTBOX_NO_NOTIFY)")
	fs.DurationVar(&f.cfg.StatementTimeout, "statement-timeout", 0, "server-side bound on each of the relay's statements; at most lease/4 (env PGOUTBOX_STATEMENT_TIMEOUT) (default 5s, or lease/4 if shorter)")
	fs.DurationVar(&f.cfg.LockTimeout, "lock-timeout", 0, "how long a statement of the relay waits for a lock another session holds on the outbox before the outbox is reported stuck and skipped; at most --statement-timeout (env PGOUTBOX_LOCK_TIMEOUT) (default 1s, or the statement timeout if shorter)")
	fs.IntVar(&f.cfg.MaxAttempts, "max-attempts", 10, "failed publishes before an event is quarantined (env PGOUTBOX_MAX_ATTEMPTS)")
	fs.DurationVar(&f.cfg.BackoffBase, "backoff-base", time.Second, "first retry delay, doubled per attempt (env PGOUTBOX_BACKOFF_BASE)")
	fs.DurationVar(&f.cfg.BackoffMax, "backoff-max", 5*time.Minute, "longest retry delay (env PGOUTBOX_BACKOFF_MAX)")
	fs.StringVar(&f.metricsAddr, "metrics-addr", "", "serve /metrics, /healthz and /readyz on this host:port, e.g. :9090 (env PGOUTBOX_METRICS_ADDR) (default off)")
	fs.DurationVar(&f.cleanupInterval, "cleanup-interval", 0, "run pgoutbox cleanup this often inside the relay; one relay at a time does (env PGOUTBOX_CLEANUP_INTERVAL) (default off)")
	fs.DurationVar(&f.retention, "retention", admin.DefaultRetention, "with --cleanup-interval: keep published events this long (env PGOUTBOX_RETENTION)")
	fs.Bool("force", false, "accept a --retention below 1h (no environment variable: it must be said on the command line)")
	fs.DurationVar(&f.stopMax, "shutdown-timeout", 30*time.Second, "on SIGTERM, how long to wait for in-flight publishes (env PGOUTBOX_SHUTDOWN_TIMEOUT)")
	return cmd
}

// pingAfterLongIdle is the relay pool's ShouldPing. pgxpool's default pings a
// connection idle for over a second before handing it out, and an idle relay
// claims once per --poll-interval (2s): a ping before every claim doubled the
// round trips of an idle relay (pgoutbox bench idle; docs/performance.md). A
// claim on a dead connection fails and is retried on another, so only
// connections idle long enough for a server or a firewall to have dropped them
// are pinged.
func pingAfterLongIdle(_ context.Context, p pgxpool.ShouldPingParams) bool {
	return p.IdleDuration > time.Minute
}

// relayGCPercent is the relay's GOGC unless the environment sets one. A relay's
// live heap is small and its garbage is per event: collecting at 200% instead of
// 100% growth trades a few MiB of peak RSS for less CPU per event, which leaves
// more CPU to PostgreSQL and the broker on a shared box (the figures are in
// docs/performance.md).
const relayGCPercent = 200

func tuneGC() {
	if _, set := os.LookupEnv("GOGC"); !set {
		debug.SetGCPercent(relayGCPercent)
	}
}

func runRelay(ctx context.Context, f *relayFlags, stderr io.Writer) error {
	if f.stopMax <= 0 {
		return usagef("--shutdown-timeout must be positive, got %s", f.stopMax)
	}
	if f.cleanupInterval < 0 || f.retention <= 0 {
		return usagef("--cleanup-interval must not be negative and --retention must be positive, got %s and %s", f.cleanupInterval, f.retention)
	}
	logger, err := f.log.logger(stderr)
	if err != nil {
		return err
	}
	cfg := f.cfg
	cfg.Schema = f.db.schema
	cfg.Logger = logger
	// Validate everything before touching the network.
	if err := cfg.Validate(); err != nil {
		return usageError{flagNames(err)}
	}
	target, err := f.broker.parse()
	if err != nil {
		return err
	}
	// Every line of the relay, "relay starting" first, names where events go.
	cfg.Logger = logger.With(slog.String("broker", target.describe()))
	if _, err := f.db.parse(); err != nil { // a bad URL fails before anything starts
		return err
	}
	ops, err := newRelayOps(f.metricsAddr)
	if err != nil {
		return err
	}
	if ops != nil {
		cfg.Observer = ops.metrics
	}
	traces, err := setupTracing(ctx, f.stdout)
	if err != nil {
		return err
	}
	defer flushTraces(traces, logger)

	maxConns := int32(cfg.Workers + 2)
	if f.cleanupInterval > 0 {
		maxConns++ // the cleanup job's connection
	}
	if ops != nil {
		maxConns++ // scrapes and readiness probes
	}
	pool, err := f.db.openPool(ctx, maxConns)
	if err != nil {
		return err
	}
	defer closePool(pool, logger)
	cctx, cancel := context.WithTimeout(ctx, f.db.connectTimeout)
	defer cancel()
	// A missing privilege fails here, naming each one, instead of as a claim
	// retried for ever.
	if err := migrate.CheckPrivileges(cctx, pool, cfg.Schema, migrate.RoleRelay, false); err != nil {
		return err
	}
	if err := checkMigrated(cctx, pool, cfg.Schema); err != nil {
		return err
	}

	pub, closeBroker, err := openPublisher(ctx, target, traces, logger)
	if err != nil {
		return err
	}
	defer closeBroker()

	r, err := relay.New(pool, pub, &cfg)
	if err != nil {
		return err
	}
	if ops != nil {
		srv, err := ops.serve(pool, r, cfg.Schema, logger)
		if err != nil {
			return err
		}
		defer func() {
			sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			_ = srv.Stop(sctx)
		}()
	}
	if err := r.Start(context.WithoutCancel(ctx)); err != nil {
		return err
	}
	if f.cleanupInterval > 0 {
		cc := admin.CleanerConfig{Interval: f.cleanupInterval, Logger: logger,
			Cleanup: admin.CleanupConfig{Schema: cfg.Schema, Retention: f.retention}}
		if ops != nil {
			cc.Done = func(res admin.CleanupResult, _ error) {
				ops.metrics.CleanupDeleted("outbox_events", res.Deleted+res.DroppedRows)
				ops.metrics.CleanupDeleted("processed_events", res.InboxDeleted)
			}
		}
		cleaner, err := admin.NewCleaner(pool, &cc)
		if err != nil {
			return usageError{err}
		}
		if err := cleaner.Start(context.WithoutCancel(ctx)); err != nil {
			return err
		}
		// Deferred: stopped before the pool closes, after the relay stopped.
		defer func() {
			sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			_ = cleaner.Stop(sctx)
		}()
	}
	<-ctx.Done() // SIGTERM or SIGINT
	logger.Info("stopping: finishing in-flight publishes", slog.Duration("shutdown_timeout", f.stopMax))
	sctx, scancel := context.WithTimeout(context.Background(), f.stopMax)
	defer scancel()
	if err := r.Stop(sctx); err != nil {
		return fmt.Errorf("relay did not stop within --shutdown-timeout %s; unreleased leases expire after --lease", f.stopMax)
	}
	return nil
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

// rejectZero refuses an explicit zero for flags whose zero would silently mean
// "the default" in relay.Config.
func rejectZero(fs *pflag.FlagSet, names ...string) error {
	for _, n := range names {
		if f := fs.Lookup(n); f != nil && f.Changed && (f.Value.String() == "0" || f.Value.String() == "0s") {
			return usagef("--%s must be positive, got %s", n, f.Value.String())
		}
	}
	return nil
}

// checkMigrated fails with advice when the schema lacks the outbox migrations.
func checkMigrated(ctx context.Context, pool migrate.Querier, schema string) error {
	if err := checkCompatible(ctx, pool, schema, migrate.LineOutbox); err != nil {
		return err
	}
	st, err := migrate.State(ctx, pool, &migrate.Config{Schema: schema, Lines: []migrate.Line{migrate.LineOutbox}})
	if err != nil {
		return err
	}
	for _, s := range st {
		if !s.Applied {
			return fmt.Errorf("schema %s lacks migration %s/%d %s: run 'pgoutbox migrate --schema %s' first", schema, s.Line, s.Version, s.Name, schema)
		}
	}
	return nil
}

// flagNames rewrites relay.Config field names in err as the flags that set them.
func flagNames(err error) error {
	r := strings.NewReplacer(
		"Config.BatchSize", "--batch-size", "Config.RunLength", "--run-length", "Config.Workers", "--workers",
		"Config.Lease", "--lease", "Config.PublishTimeout", "--publish-timeout", "Config.PollInterval", "--poll-interval",
		"Config.MaxAttempts", "--max-attempts", "Config.BackoffBase", "--backoff-base", "Config.BackoffMax", "--backoff-max",
		"Config.StatementTimeout", "--statement-timeout", "Config.LockTimeout", "--lock-timeout",
		"Config.ID", "--id", "Config.Schema", "--schema", "\n", "; ")
	return errors.New(r.Replace(err.Error()))
}

// logFlags choose the log format and level of long-running verbs.
type logFlags struct {
	format, level string
}

func (l *logFlags) register(fs interface {
	StringVar(p *string, name, value, usage string)
}) {
	fs.StringVar(&l.format, "log-format", "text", "log format: text or json (env PGOUTBOX_LOG_FORMAT)")
	fs.StringVar(&l.level, "log-level", "info", "log level: debug, info, warn or error (env PGOUTBOX_LOG_LEVEL)")
}

func (l *logFlags) logger(w io.Writer) (*slog.Logger, error) {
	var level slog.Level
	if err := level.UnmarshalText([]byte(l.level)); err != nil {
		return nil, usagef("--log-level %q: want debug, info, warn or error", l.level)
	}
	opts := &slog.HandlerOptions{Level: level}
	switch l.format {
	case "text":
		return slog.New(slog.NewTextHandler(w, opts)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	default:
		return nil, usagef("--log-format %q: want text or json", l.format)
	}
}
