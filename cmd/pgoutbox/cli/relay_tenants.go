package cli

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/pflag"

	"github.com/pgoutbox/pgoutbox/broker"
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
	name, prefix string
	schemas      migrate.Selector
	conn         *pgx.ConnConfig
	maxConns     int
	trust        migrate.Trust
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
		sel, err := parseSelector("--tenants", t.selector)
		if err != nil {
			return nil, usageError{err}
		}
		conn, err := f.db.parse()
		if err != nil {
			return nil, err
		}
		return []tenantDatabase{{name: conn.Database, schemas: sel, conn: conn, maxConns: t.maxConns, trust: trust}}, nil
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

// tenantsRelay is the relay of many outboxes (relay.Group, --tenants or
// --tenants-file).
type tenantsRelay struct {
	f       *relayFlags
	flags   *pflag.FlagSet
	cfg     relay.GroupConfig
	logger  *slog.Logger
	dbs     []tenantDatabase
	tenants *relayprom.Tenants // nil without --metrics-addr
	group   *relay.Group
}

func (m *tenantsRelay) check(ctx context.Context, logger *slog.Logger) error {
	f := m.f
	switch {
	case m.flags.Changed("schema"):
		return usagef("--schema names one outbox: with --tenants or --tenants-file, select the schemas there")
	case f.cleanupInterval != 0:
		return usagef("--cleanup-interval runs inside a single-outbox relay only: with many tenants, schedule 'pgoutbox cleanup' per tenant")
	case f.tenants.discover <= 0:
		return usagef("--discover-interval must be positive, got %s", f.tenants.discover)
	case f.tenants.metrics != "per-tenant" && f.tenants.metrics != "aggregate":
		return usagef("--tenant-metrics %q: want per-tenant or aggregate", f.tenants.metrics)
	case f.tenants.metricsMax <= 0:
		return usagef("--tenant-metrics-max must be positive, got %d", f.tenants.metricsMax)
	}
	m.logger = logger
	m.cfg = relay.GroupConfig{Config: f.cfg, DiscoverInterval: f.tenants.discover}
	m.cfg.Config.Logger = logger
	one := m.cfg.Config
	one.Schema = migrate.DefaultSchema
	if err := one.Validate(); err != nil {
		return usageError{flagNames(err)}
	}
	var err error
	m.dbs, err = f.tenantDatabases(ctx)
	return err
}

func (m *tenantsRelay) useBroker(t *brokerTarget, brokerLog *slog.Logger) error {
	if err := t.forTenants(); err != nil {
		return err
	}
	// Every line of the relays names where events go.
	m.cfg.Config.Logger = brokerLog
	return nil
}

func (m *tenantsRelay) metrics(reg *prometheus.Registry) (err error) {
	m.tenants, err = relayprom.NewTenants(reg, &relayprom.TenantsConfig{MaxTenants: m.f.tenants.metricsMax,
		Aggregate: m.f.tenants.metrics == "aggregate", Logger: m.logger})
	m.cfg.Config.Observer = m.tenants
	return err
}

func (m *tenantsRelay) connect(ctx context.Context) (func(), error) {
	var pools []*pgxpool.Pool
	closeDB := func() {
		for _, p := range slices.Backward(pools) {
			closePool(p, m.logger)
		}
	}
	for _, d := range m.dbs {
		// Not pinged: a database that is down is reported, and the others served.
		pool, err := newPool(ctx, d.conn, int32(d.maxConns))
		if err != nil {
			closeDB()
			return nil, fmt.Errorf("database %s: %w", d.name, err)
		}
		pools = append(pools, pool)
		m.cfg.Databases = append(m.cfg.Databases, relay.Database{Name: d.name, Pool: pool, Schemas: d.schemas, TenantPrefix: d.prefix, Trust: d.trust})
	}
	return closeDB, nil
}

func (m *tenantsRelay) service(pub broker.Publisher, _ []relay.Destination) (service, error) {
	g, err := relay.NewGroup(pub, &m.cfg)
	if err != nil {
		return nil, usageError{flagNames(err)}
	}
	m.group = g
	return g, nil
}

// health watches the Group's tenants; /readyz checks them.
func (m *tenantsRelay) health(reg *prometheus.Registry) (http.Handler, string, error) {
	if err := m.tenants.Watch(m.group); err != nil {
		return nil, "", err
	}
	h, err := health.Handler(&health.Config{Gatherer: reg, Logger: m.logger,
		Checks: []health.Check{{Name: "tenants", Func: health.Status(m.group.Healthy)}}})
	return h, healthEndpoints, err
}

func (m *tenantsRelay) started(context.Context) (func(), error) { return func() {}, nil }

func (m *tenantsRelay) stopping() (string, error) { return stoppingRelay(m.f) }
