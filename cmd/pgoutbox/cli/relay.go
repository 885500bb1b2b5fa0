package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"runtime/debug"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/pgoutbox/pgoutbox/admin"
	"github.com/pgoutbox/pgoutbox/broker"
	"github.com/pgoutbox/pgoutbox/health"
	"github.com/pgoutbox/pgoutbox/migrate"
	"github.com/pgoutbox/pgoutbox/relay"
	"github.com/pgoutbox/pgoutbox/relay/relayprom"
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

	destinationsFile string            // --destinations-file (destinations_file.go)
	dests            *destinationsFile // read by runDaemon, before anything starts
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

` + cdcHelp + "\n\n" + tenantsHelp + "\n\n" + destinationsHelp + "\n\n" + brokerHelp + "\n\n" + boundsHelp + "\n\n" + metricsHelp + "\n\n" + tracingHelp,
		Example: `  DATABASE_URL=postgres://app@db/app pgoutbox relay --broker nats://nats:4222
  PGOUTBOX_BROKER=kafka://kafka:9092 pgoutbox relay
  pgoutbox relay --broker embedded --embedded-dir /var/lib/pgoutbox/nats --embedded-port 4222   # trying it out only
  pgoutbox relay --broker 'nats://a:4222,nats://b:4222' --topic-template 'events.{aggregate_type}' --nats-stream EVENTS
  pgoutbox relay --broker nats://nats:4222 --tenants 'tenant_*'          # every tenant_* outbox schema, found as they come
  pgoutbox relay --broker kafka://kafka:9092 --tenants-file /etc/pgoutbox/tenants.yaml
  ANALYTICS_BROKER_URL=kafka://kafka:9092 pgoutbox relay --destinations-file /etc/pgoutbox/destinations.yaml`,
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
			case f.destinationsFile != "":
				if err := checkDestinationsAlone(cmd.Flags(), isCDC, f.tenants.enabled()); err != nil {
					return err
				}
				tuneGC()
				return runDaemon(cmd.Context(), &f, cmd.ErrOrStderr(), &singleRelay{f: &f})
			case isCDC && f.tenants.enabled():
				return usagef("--source cdc serves one schema per replication slot: run a CDC relay per tenant, or poll with --tenants (docs/operations.md, \"Many tenants\")")
			case f.tenants.enabled():
				tuneGC()
				return runDaemon(cmd.Context(), &f, cmd.ErrOrStderr(), &tenantsRelay{f: &f, flags: cmd.Flags()})
			case isCDC:
				return runDaemon(cmd.Context(), &f, cmd.ErrOrStderr(), &cdcRelay{f: &f})
			}
			tuneGC() // the polling relay only: the CDC source holds more memory, for no gain measured
			return runDaemon(cmd.Context(), &f, cmd.ErrOrStderr(), &singleRelay{f: &f})
		},
	}
	fs := cmd.Flags()
	f.db.register(fs)
	f.broker.register(fs)
	f.log.register(fs)
	f.cdc.register(fs)
	f.tenants.register(fs)
	fs.StringVar(&f.destinationsFile, "destinations-file", "", "publish to the named destinations of this YAML file instead of --broker: each its broker, settings, routing rules and progress (env PGOUTBOX_DESTINATIONS_FILE) (docs/operations.md, \"Destinations\")")
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

// singleRelay is the relay of one outbox (relay.Relay), with its cleanup job.
type singleRelay struct {
	f        *relayFlags
	cfg      relay.Config
	logger   *slog.Logger
	observer *relayprom.Metrics // nil without --metrics-addr
	pool     *pgxpool.Pool
	relay    *relay.Relay
}

func (m *singleRelay) check(_ context.Context, logger *slog.Logger) error {
	f := m.f
	if f.cleanupInterval < 0 || f.retention <= 0 {
		return usagef("--cleanup-interval must not be negative and --retention must be positive, got %s and %s", f.cleanupInterval, f.retention)
	}
	m.logger = logger
	m.cfg = f.cfg
	m.cfg.Schema = f.db.schema
	m.cfg.Logger = logger
	if err := m.cfg.Validate(); err != nil {
		return usageError{flagNames(err)}
	}
	_, err := f.db.parse() // a bad URL fails before anything starts
	return err
}

func (m *singleRelay) useBroker(_ *brokerTarget, brokerLog *slog.Logger) error {
	// Every line of the relay, "relay starting" first, names where events go.
	m.cfg.Logger = brokerLog
	return nil
}

func (m *singleRelay) metrics(reg *prometheus.Registry) (err error) {
	m.observer, err = relayprom.New(reg)
	m.cfg.Observer = m.observer
	return err
}

func (m *singleRelay) connect(ctx context.Context) (func(), error) {
	maxConns := int32(m.cfg.Workers + 2)
	if m.f.dests != nil {
		// Each destination claims and publishes on workers of its own.
		maxConns = int32(m.cfg.Workers*len(m.f.dests.destinations) + 2)
	}
	if m.f.cleanupInterval > 0 {
		maxConns++ // the cleanup job's connection
	}
	if m.f.metricsAddr != "" {
		maxConns++ // scrapes and readiness probes
	}
	pool, err := m.f.db.openPool(ctx, maxConns)
	if err != nil {
		return nil, err
	}
	closeDB := func() { closePool(pool, m.logger) }
	cctx, cancel := context.WithTimeout(ctx, m.f.db.connectTimeout)
	defer cancel()
	// A missing privilege fails here, naming each one, instead of as a claim
	// retried for ever.
	if err := migrate.CheckPrivileges(cctx, pool, m.cfg.Schema, migrate.RoleRelay, false); err != nil {
		closeDB()
		return nil, err
	}
	if err := checkMigrated(cctx, pool, m.cfg.Schema); err != nil {
		closeDB()
		return nil, err
	}
	warnAhead(cctx, pool, m.cfg.Schema, m.logger)
	m.pool = pool
	return closeDB, nil
}

func (m *singleRelay) service(pub broker.Publisher, dests []relay.Destination) (service, error) {
	m.cfg.Destinations = dests // with --destinations-file, instead of pub
	r, err := relay.New(m.pool, pub, &m.cfg)
	if err != nil {
		return nil, err
	}
	m.relay = r
	return r, nil
}

// health adds the backlog collector of the outbox; /readyz checks the
// database and the relay.
func (m *singleRelay) health(reg *prometheus.Registry) (http.Handler, string, error) {
	backlog, err := relayprom.NewOutbox(m.pool, &relayprom.OutboxConfig{Schema: m.cfg.Schema, Health: m.relay.Healthy, Logger: m.logger})
	if err != nil {
		return nil, "", err
	}
	if err := reg.Register(backlog); err != nil {
		return nil, "", fmt.Errorf("register outbox metrics: %w", err)
	}
	h, err := health.Handler(&health.Config{
		Gatherer: reg,
		Checks: []health.Check{
			{Name: "database", Func: m.pool.Ping},
			{Name: "relay", Func: health.Status(m.relay.Healthy)},
		},
		Logger: m.logger,
	})
	return h, healthEndpoints, err
}

// started starts the cleanup job of --cleanup-interval.
func (m *singleRelay) started(ctx context.Context) (func(), error) {
	if m.f.cleanupInterval == 0 {
		return func() {}, nil
	}
	cc := admin.CleanerConfig{Interval: m.f.cleanupInterval, Logger: m.logger,
		Cleanup: admin.CleanupConfig{Schema: m.cfg.Schema, Retention: m.f.retention}}
	if m.observer != nil {
		cc.Done = func(res admin.CleanupResult, _ error) {
			m.observer.CleanupDeleted("outbox_events", res.Deleted+res.DroppedRows)
			m.observer.CleanupDeleted("processed_events", res.InboxDeleted)
		}
	}
	cleaner, err := admin.NewCleaner(m.pool, &cc)
	if err != nil {
		return nil, usageError{err}
	}
	if err := cleaner.Start(context.WithoutCancel(ctx)); err != nil {
		return nil, err
	}
	// Stopped before the pool closes, after the relay stopped.
	return func() {
		sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = cleaner.Stop(sctx)
	}, nil
}

func (m *singleRelay) stopping() (string, error) { return stoppingRelay(m.f) }

// stoppingRelay is the stop of a polling relay, one outbox or many.
func stoppingRelay(f *relayFlags) (string, error) {
	return "stopping: finishing in-flight publishes",
		fmt.Errorf("relay did not stop within --shutdown-timeout %s; unreleased leases expire after --lease", f.stopMax)
}

// healthEndpoints are what health.Handler serves.
const healthEndpoints = "/metrics /healthz /readyz"

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

// checkMigrated is migrate.CheckMigrated, the one outbox check, with version
// skew made a configuration error (exit 2, see checkCompatible).
func checkMigrated(ctx context.Context, q migrate.Querier, schema string) error {
	return usageOnSkew(migrate.CheckMigrated(ctx, q, schema))
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
