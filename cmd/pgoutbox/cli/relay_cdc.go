package cli

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/pgoutbox/pgoutbox/broker"
	"github.com/pgoutbox/pgoutbox/cdc"
	"github.com/pgoutbox/pgoutbox/cdc/cdcprom"
	"github.com/pgoutbox/pgoutbox/migrate"
	"github.com/pgoutbox/pgoutbox/relay"
)

// cdcFlags choose the relay's source and name the CDC source's slot.
type cdcFlags struct {
	source      string
	slot        string
	publication string
	standbyURL  string
}

func (c *cdcFlags) register(fs *pflag.FlagSet) {
	fs.StringVar(&c.source, "source", "poll", "where events come from: poll (claim from the table) or cdc (logical replication slot) (env PGOUTBOX_SOURCE)")
	c.registerNames(fs)
	fs.StringVar(&c.standbyURL, "standby-url", "",
		"CDC, PostgreSQL 17+: connection string of the physical standby that synchronises the failover slot; the source checks its copy is sync-ready (pgoutbox_cdc_failover_slot_ready); a password comes from PGPASSWORD or a .pgpass file as for --database-url (env PGOUTBOX_CDC_STANDBY_URL)")
}

func (c *cdcFlags) registerNames(fs *pflag.FlagSet) {
	fs.StringVar(&c.slot, "slot", "", "CDC: replication slot name (env PGOUTBOX_CDC_SLOT) (default pgoutbox_<schema>)")
	fs.StringVar(&c.publication, "publication", "", "CDC: publication name (env PGOUTBOX_CDC_PUBLICATION) (default pgoutbox_<schema>)")
}

// isCDC reports whether --source asks for the CDC source, and rejects unknown sources.
func (c *cdcFlags) isCDC() (bool, error) {
	switch c.source {
	case "poll", "":
		return false, nil
	case "cdc":
		return true, nil
	default:
		return false, usagef("--source %q: want poll or cdc", c.source)
	}
}

const cdcHelp = `CDC source (--source cdc): follow the outbox table through a logical
replication slot (pgoutput) instead of polling it. Needs wal_level = logical and a role
with REPLICATION; creates the publication --publication (inserts into the outbox table
only) and the slot --slot if missing. One CDC relay per schema, and no polling relay
beside it: the CDC source owns every unpublished event. --batch-size, --workers (batches
published at once, sharing no aggregate), --run-length, --max-attempts, --backoff-base,
--backoff-max, --poll-interval (how often failed lanes are looked at; default 1s for cdc)
and --publish-timeout apply. If the slot is lost,
run 'pgoutbox cdc recover'; 'pgoutbox cdc disable' hands the schema back to polling.
On PostgreSQL 17+ the slot is a failover slot: a standby with sync_replication_slots
keeps a copy, and after its promotion the source resumes from it (no recover); the
source warns when synchronized_standby_slots names no active physical slot, and
--standby-url checks the standby's copy is sync-ready.`

// cdcRelay is the relay with the CDC source (cdc.Source, --source cdc).
type cdcRelay struct {
	f      *relayFlags
	cfg    cdc.Config
	logger *slog.Logger
	broker string // the broker, described for "relay starting"
	pool   *pgxpool.Pool
	src    *cdc.Source
}

func (m *cdcRelay) check(_ context.Context, logger *slog.Logger) (err error) {
	m.logger = logger
	m.cfg, err = m.f.cdcConfig(logger)
	return err
}

func (m *cdcRelay) useBroker(t *brokerTarget, _ *slog.Logger) error {
	m.broker = t.describe()
	return nil
}

func (m *cdcRelay) metrics(reg *prometheus.Registry) error {
	o, err := cdcprom.New(reg)
	if err != nil {
		return err
	}
	m.cfg.Observer = o
	return nil
}

func (m *cdcRelay) connect(ctx context.Context) (func(), error) {
	pool, err := openCDCPool(ctx, &m.f.db)
	if err != nil {
		return nil, err
	}
	if err := migrate.CheckPrivileges(ctx, pool, m.f.db.schema, migrate.RoleCDC, false); err != nil {
		closePool(pool, m.logger)
		return nil, err
	}
	warnAhead(ctx, pool, m.f.db.schema, m.logger)
	m.pool = pool
	return func() { closePool(pool, m.logger) }, nil
}

func (m *cdcRelay) service(pub broker.Publisher, _ []relay.Destination) (service, error) {
	src, err := cdc.New(m.pool, pub, &m.cfg)
	if err != nil {
		return nil, usageError{err}
	}
	m.src = src
	return src, nil
}

// health serves cdcprom's metrics beside the source's collector, and a
// /healthz that answers 503 while the source is unhealthy (docs/operations.md:
// a readiness probe, not a liveness one).
func (m *cdcRelay) health(reg *prometheus.Registry) (http.Handler, string, error) {
	if err := reg.Register(m.src.Collector()); err != nil {
		return nil, "", err
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		if err := m.src.Healthy(); err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ok")
	})
	return mux, "/metrics /healthz", nil
}

func (m *cdcRelay) started(context.Context) (func(), error) {
	m.logger.Info("relay starting", slog.String("source", "cdc"), slog.String("schema", m.cfg.Schema), slog.String("broker", m.broker))
	return func() {}, nil
}

func (m *cdcRelay) stopping() (string, error) {
	return "stopping: finishing the batch in flight",
		fmt.Errorf("cdc relay did not stop within --shutdown-timeout %s; the restart publishes the batch again", m.f.stopMax)
}

// cdcConfig builds the CDC source's configuration from the relay's flags.
func (f *relayFlags) cdcConfig(logger *slog.Logger) (cdc.Config, error) {
	cfg := cdc.Config{
		Schema: f.db.schema, Slot: f.cdc.slot, Publication: f.cdc.publication,
		BatchSize: f.cfg.BatchSize, Workers: f.cfg.Workers, RunLength: f.cfg.RunLength, MaxAttempts: f.cfg.MaxAttempts,
		BackoffBase: f.cfg.BackoffBase, BackoffMax: f.cfg.BackoffMax, PublishTimeout: f.cfg.PublishTimeout,
		Logger: logger,
	}
	if f.cfg.PollInterval != 2*time.Second { // the polling relay's default; cdc's is 1s
		cfg.PollInterval = f.cfg.PollInterval
	}
	if strings.TrimSpace(f.cdc.standbyURL) != "" {
		// Checked here, where the error names the flag and never the value.
		if _, err := parseConnString("--standby-url (PGOUTBOX_CDC_STANDBY_URL)", f.cdc.standbyURL); err != nil {
			return cfg, err
		}
		cfg.StandbyURL = f.cdc.standbyURL
	}
	if err := cfg.Validate(); err != nil {
		return cfg, usageError{cdcFlagNames(err)}
	}
	return cfg, nil
}

func cdcFlagNames(err error) error {
	r := strings.NewReplacer("Config.BatchSize", "--batch-size", "Config.Workers", "--workers", "Config.RunLength", "--run-length",
		"Config.MaxAttempts", "--max-attempts", "Config.BackoffBase", "--backoff-base", "Config.BackoffMax", "--backoff-max",
		"Config.PublishTimeout", "--publish-timeout", "Config.PollInterval", "--poll-interval",
		"Config.Slot", "--slot", "Config.StandbyURL", "--standby-url", "Config.Publication", "--publication", "Config.Schema", "--schema", "\n", "; ")
	return errors.New(r.Replace(err.Error()))
}

// openCDCPool opens the CDC verbs' pool on a migrated outbox.
func openCDCPool(ctx context.Context, db *dbFlags) (*pgxpool.Pool, error) {
	pool, err := db.openPool(ctx, 6)
	if err != nil {
		return nil, err
	}
	cctx, cancel := context.WithTimeout(ctx, db.connectTimeout)
	defer cancel()
	if err := checkMigrated(cctx, pool, db.schema); err != nil {
		pool.Close()
		return nil, err
	}
	return pool, nil
}

// newCDCCmd is `pgoutbox cdc`: operator actions on the CDC source's slot.
func newCDCCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "cdc",
		Short: "Manage the CDC source's replication slot (recover, disable)",
		RunE: func(c *cobra.Command, _ []string) error {
			return c.Help()
		},
	}
	cmd.AddCommand(newCDCRecoverCmd(), newCDCDisableCmd())
	return cmd
}

func newCDCRecoverCmd() *cobra.Command {
	var (
		db     dbFlags
		names  cdcFlags
		brk    brokerFlags
		lf     logFlags
		force  bool
		relayF relayFlags
	)
	cmd := &cobra.Command{
		Use:   "recover",
		Short: "Recreate a lost replication slot and publish every unpublished event from the table",
		Long: `Recover the CDC source after its slot was lost (dropped, or invalidated by
max_slot_wal_keep_size): create the slot again, then publish from the outbox table,
each aggregate in sequence order, every unpublished event the new slot will not send.
Run it while no CDC relay runs on the schema; start the relay (--source cdc) after.
Events that fail are recorded with backoff or quarantined as by the relay; they stay
in the table and the relay publishes them when it starts. Producers may keep writing:
what they commit after the new slot's snapshot comes through the slot when the relay
starts. Exit status 1 when events failed (quarantined, or backing off after a failed
attempt); events never tried do not count.

` + brokerHelp,
		Example: `  pgoutbox cdc recover --schema app --broker nats://nats:4222`,
		RunE: func(c *cobra.Command, _ []string) error {
			logger, err := lf.logger(c.ErrOrStderr())
			if err != nil {
				return err
			}
			relayF.db, relayF.cdc = db, names
			relayF.cfg.PollInterval = 2 * time.Second
			cfg, err := relayF.cdcConfig(logger)
			if err != nil {
				return err
			}
			target, err := brk.parse()
			if err != nil {
				return err
			}
			pool, err := openCDCPool(c.Context(), &db)
			if err != nil {
				return err
			}
			defer pool.Close()
			pub, closeBroker, err := target.open(c.Context(), logger)
			if err != nil {
				return err
			}
			defer closeBroker()
			res, err := cdc.Recover(c.Context(), pool, pub, &cfg, cdc.RecoverOptions{Force: force})
			if errors.Is(err, cdc.ErrSlotHealthy) {
				return fmt.Errorf("%w: pass --force to recreate it anyway", err)
			}
			if err != nil {
				return err
			}
			fmt.Fprintf(c.OutOrStdout(), "slot %s recreated at %s; published %d events of %d aggregates from the table\n",
				res.Slot, res.ConsistentPoint, res.Published, res.Lanes)
			if n := res.Flowing(); n > 0 {
				fmt.Fprintf(c.OutOrStdout(), "%d events committed meanwhile come through the new slot when the CDC relay starts\n", n)
			}
			if failing := res.Quarantined + res.Failing; failing > 0 {
				return fmt.Errorf("%d events failed (%d quarantined, see pgoutbox dlq; %d backing off, retried by the CDC relay when it starts)",
					failing, res.Quarantined, res.Failing)
			}
			return nil
		},
	}
	fs := cmd.Flags()
	db.register(fs)
	names.registerNames(fs)
	brk.register(fs)
	lf.register(fs)
	fs.IntVar(&relayF.cfg.BatchSize, "batch-size", 500, "most events published at once (env PGOUTBOX_BATCH_SIZE)")
	fs.IntVar(&relayF.cfg.RunLength, "run-length", 10, "most events of one aggregate per round (env PGOUTBOX_RUN_LENGTH)")
	fs.IntVar(&relayF.cfg.MaxAttempts, "max-attempts", 10, "failed publishes before an event is quarantined (env PGOUTBOX_MAX_ATTEMPTS)")
	fs.BoolVar(&force, "force", false, "recreate the slot even if it is healthy (env PGOUTBOX_CDC_FORCE)")
	return cmd
}

func newCDCDisableCmd() *cobra.Command {
	var (
		db    dbFlags
		names cdcFlags
	)
	cmd := &cobra.Command{
		Use:   "disable",
		Short: "Drop the slot and publication and hand unpublished events back to polling relays",
		Long: `Turn the CDC source off for a schema: drop its replication slot (which must not
be in use: stop the CDC relay first) and publication, stop new events from being born
owned by the CDC source, and release its unpublished events so that polling relays
('pgoutbox relay', --source poll) claim them.`,
		RunE: func(c *cobra.Command, _ []string) error {
			cfg := cdc.Config{Schema: db.schema, Slot: names.slot, Publication: names.publication}
			if err := cfg.Validate(); err != nil {
				return usageError{cdcFlagNames(err)}
			}
			conn, err := openCDCPool(c.Context(), &db)
			if err != nil {
				return err
			}
			defer conn.Close()
			if err := cdc.Disable(c.Context(), conn, &cfg); err != nil {
				return err
			}
			fmt.Fprintf(c.OutOrStdout(), "CDC source disabled for schema %s; polling relays may run\n", db.schema)
			return nil
		},
	}
	db.register(cmd.Flags())
	names.registerNames(cmd.Flags())
	return cmd
}
