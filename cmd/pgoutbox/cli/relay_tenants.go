package cli

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/spf13/pflag"

	"github.com/pgoutbox/pgoutbox/health"
	"github.com/pgoutbox/pgoutbox/migrate"
	"github.com/pgoutbox/pgoutbox/relay"
	"github.com/pgoutbox/pgoutbox/relay/relayprom"
)

// relayTenantFlags choose the outboxes of a relay serving many (relay.Group).
type relayTenantFlags struct {
	selector   string // --tenants
	file       string // --tenants-file
	maxConns   int    // --db-max-conns
	discover   time.Duration
	metrics    string // --tenant-metrics
	metricsMax int    // --tenant-metrics-max
	owners     string // --tenant-owner
}

const tenantsHelp = `Many outboxes (--tenants or --tenants-file): one relay process serves every
outbox schema of the --database-url database that the selector names (names and
globs, e.g. 'tenant_*'; '*' for all), or those of several databases listed in a
YAML file. Outboxes are listed again every --discover-interval: tenants come and go
without a restart. Each outbox keeps every guarantee; per database the relay uses
one pool of --db-max-conns connections, one LISTEN session and one idle-lock
session, whatever the number of outboxes. A tenant whose schema is broken or whose
database is down is logged, named in /readyz and isolated; the others keep flowing.
Destinations must tell tenants apart: the default templates become
outbox.{tenant}.{aggregate_type}.{event_type} (NATS), outbox.{tenant}.{aggregate_type}
(Kafka), {tenant}.{aggregate_type}.{event_type} (RabbitMQ), and a --topic-template or
webhook URL without {tenant} is refused. The tenant name is the schema name (with
the database's tenant_prefix in a file). docs/operations.md, "Many tenants", has
the file's format.`

func (t *relayTenantFlags) register(fs *pflag.FlagSet) {
	fs.StringVar(&t.selector, "tenants", "", "serve every outbox schema of the database matching these names/globs, e.g. 'tenant_*' or '*' (env PGOUTBOX_TENANTS) (default: the one --schema)")
	fs.StringVar(&t.file, "tenants-file", "", "YAML file listing the databases and schemas to serve (env PGOUTBOX_TENANTS_FILE)")
	fs.IntVar(&t.maxConns, "db-max-conns", 10, "with --tenants: connections per database for all its outboxes together (env PGOUTBOX_DB_MAX_CONNS)")
	fs.DurationVar(&t.discover, "discover-interval", relay.DefaultDiscoverInterval, "with --tenants: how often to list the outboxes again (env PGOUTBOX_DISCOVER_INTERVAL)")
	fs.StringVar(&t.metrics, "tenant-metrics", "per-tenant", "with --tenants: per-tenant (a tenant label, see --tenant-metrics-max) or aggregate (env PGOUTBOX_TENANT_METRICS)")
	fs.IntVar(&t.metricsMax, "tenant-metrics-max", relayprom.DefaultMaxTenants, "with --tenant-metrics per-tenant: tenants with a label of their own; the others are counted as _other (env PGOUTBOX_TENANT_METRICS_MAX)")
	fs.StringVar(&t.owners, "tenant-owner", "", tenantOwnerHelp+", in every database (env PGOUTBOX_TENANT_OWNER)")
}

func (t *relayTenantFlags) enabled() bool { return t.selector != "" || t.file != "" }

// tenantDatabase is one database a Group serves, and how to connect to it.
type tenantDatabase struct {
	name, schemas, prefix string
	conn                  *pgx.ConnConfig
	maxConns              int
	trust                 migrate.Trust
}

// databases returns the databases of the flags or the file.
func (f *relayFlags) tenantDatabases(ctx context.Context) ([]tenantDatabase, error) {
	t := &f.tenants
	if t.selector != "" && t.file != "" {
		return nil, usagef("--tenants and --tenants-file exclude each other: list the schemas in the file")
	}
	if t.maxConns <= 0 {
		return nil, usagef("--db-max-conns must be positive, got %d", t.maxConns)
	}
	trust, err := migrate.ParseOwners(t.owners)
	if err != nil {
		return nil, usagef("--tenant-owner: %v", err)
	}
	if t.selector != "" {
		if _, err := migrate.ParseSelector(t.selector); err != nil {
			return nil, usagef("--tenants: %v", err)
		}
		conn, err := f.db.parse()
		if err != nil {
			return nil, err
		}
		return []tenantDatabase{{name: conn.Database, schemas: t.selector, conn: conn, maxConns: t.maxConns, trust: trust}}, nil
	}
	tf, err := readTenantsFile(ctx, t.file)
	if err != nil {
		return nil, err
	}
	if err := f.db.validate(); err != nil {
		return nil, err
	}
	var out []tenantDatabase
	for i, d := range tf.Databases {
		url, source := d.URL, fmt.Sprintf("--tenants-file %s: databases[%d].url", t.file, i)
		if d.URLEnv != "" {
			url, source = os.Getenv(d.URLEnv), fmt.Sprintf("--tenants-file %s: databases[%d].url_env %s", t.file, i, d.URLEnv)
		}
		conn, err := parseConnString(source, url)
		if err != nil {
			return nil, err
		}
		conn.ConnectTimeout = perHostConnectTimeout(f.db.connectTimeout, conn.Config)
		name := d.Name
		if name == "" {
			name = conn.Database
		}
		maxConns := d.MaxConns
		if maxConns == 0 {
			maxConns = t.maxConns
		}
		// This database's own trusted owners, besides --tenant-owner's.
		dbTrust := migrate.Trust{Owners: slices.Compact(slices.Sorted(slices.Values(append(slices.Clone(trust.Owners), d.TenantOwner.Owners...))))}
		if err := dbTrust.Validate(); err != nil {
			return nil, usagef("--tenants-file %s: databases[%d].tenant_owner with --tenant-owner names more than %d roles", t.file, i, migrate.MaxTrustedOwners)
		}
		out = append(out, tenantDatabase{name: name, schemas: d.Schemas, prefix: d.TenantPrefix, conn: conn, maxConns: maxConns, trust: dbTrust})
	}
	return out, nil
}

// runRelayTenants runs a relay.Group until SIGTERM/SIGINT.
func runRelayTenants(ctx context.Context, f *relayFlags, flags *pflag.FlagSet, stderr io.Writer) error {
	switch {
	case flags.Changed("schema"):
		return usagef("--schema names one outbox: with --tenants or --tenants-file, select the schemas there")
	case f.cleanupInterval != 0:
		return usagef("--cleanup-interval runs inside a single-outbox relay only: with many tenants, schedule 'pgoutbox cleanup' per tenant")
	case f.stopMax <= 0:
		return usagef("--shutdown-timeout must be positive, got %s", f.stopMax)
	case f.tenants.discover <= 0:
		return usagef("--discover-interval must be positive, got %s", f.tenants.discover)
	case f.tenants.metrics != "per-tenant" && f.tenants.metrics != "aggregate":
		return usagef("--tenant-metrics %q: want per-tenant or aggregate", f.tenants.metrics)
	case f.tenants.metricsMax <= 0:
		return usagef("--tenant-metrics-max must be positive, got %d", f.tenants.metricsMax)
	}
	logger, err := f.log.logger(stderr)
	if err != nil {
		return err
	}
	cfg := relay.GroupConfig{Config: f.cfg, DiscoverInterval: f.tenants.discover}
	cfg.Config.Logger = logger
	one := cfg.Config
	one.Schema = migrate.DefaultSchema
	if err := one.Validate(); err != nil {
		return usageError{flagNames(err)}
	}
	dbs, err := f.tenantDatabases(ctx)
	if err != nil {
		return err
	}
	target, err := f.broker.parse()
	if err != nil {
		return err
	}
	if err := target.forTenants(); err != nil {
		return err
	}
	// Every line of the relays names where events go.
	cfg.Config.Logger = logger.With(slog.String("broker", target.describe()))

	var (
		reg     *prometheus.Registry
		tenants *relayprom.Tenants
	)
	if f.metricsAddr != "" {
		if _, err := newRelayOps(f.metricsAddr); err != nil { // checks the address
			return err
		}
		reg = prometheus.NewRegistry()
		reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
		tenants, err = relayprom.NewTenants(reg, &relayprom.TenantsConfig{MaxTenants: f.tenants.metricsMax,
			Aggregate: f.tenants.metrics == "aggregate", Logger: logger})
		if err != nil {
			return err
		}
		cfg.Config.Observer = tenants
	}
	traces, err := setupTracing(ctx, f.stdout)
	if err != nil {
		return err
	}
	defer flushTraces(traces, logger)

	for _, d := range dbs {
		// Not pinged: a database that is down is reported, and the others served.
		pool, err := newPool(ctx, d.conn, int32(d.maxConns))
		if err != nil {
			return fmt.Errorf("database %s: %w", d.name, err)
		}
		defer closePool(pool, logger)
		cfg.Databases = append(cfg.Databases, relay.Database{Name: d.name, Pool: pool, Schemas: d.schemas, TenantPrefix: d.prefix, Trust: d.trust})
	}

	pub, closeBroker, err := openPublisher(ctx, target, traces, logger)
	if err != nil {
		return err
	}
	defer closeBroker()

	g, err := relay.NewGroup(pub, &cfg)
	if err != nil {
		return usageError{flagNames(err)}
	}
	if reg != nil {
		if err := tenants.Watch(g); err != nil {
			return err
		}
		h, err := health.Handler(&health.Config{Gatherer: reg, Logger: logger,
			Checks: []health.Check{{Name: "tenants", Func: health.Status(g.Healthy)}}})
		if err != nil {
			return err
		}
		srv, err := health.Start(f.metricsAddr, h, logger)
		if err != nil {
			return usagef("--metrics-addr: %v", err)
		}
		logger.Info("serving metrics and health probes", slog.String("addr", srv.Addr()), slog.String("endpoints", "/metrics /healthz /readyz"))
		defer func() {
			sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			_ = srv.Stop(sctx)
		}()
	}
	// SIGTERM or SIGINT during Start (its first listing of a database that
	// hangs) stops the Group as well: Start then returns at once.
	stopEarly := context.AfterFunc(ctx, func() {
		sctx, cancel := context.WithTimeout(context.Background(), f.stopMax)
		defer cancel()
		_ = g.Stop(sctx)
	})
	defer stopEarly()
	if err := g.Start(context.WithoutCancel(ctx)); err != nil {
		return err
	}
	<-ctx.Done() // SIGTERM or SIGINT
	logger.Info("stopping: finishing in-flight publishes", slog.Duration("shutdown_timeout", f.stopMax))
	sctx, cancel := context.WithTimeout(context.Background(), f.stopMax)
	defer cancel()
	if err := g.Stop(sctx); err != nil {
		return fmt.Errorf("relay did not stop within --shutdown-timeout %s; unreleased leases expire after --lease", f.stopMax)
	}
	return nil
}
