package cli

import (
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/pgoutbox/pgoutbox/cmd/pgoutbox/internal/bench"
)

type benchFlags struct {
	url       string
	scenarios []string
	sources   []string
	jsonFile  string
	report    string
	render    string
	cfg       bench.Config
}

func newBenchCmd() *cobra.Command {
	var f benchFlags
	cmd := &cobra.Command{
		Use:   "bench",
		Short: "Measure throughput, latency, enqueue overhead, idle load and history cost on this machine",
		Long: `Measure pgoutbox on the machine at hand, each scenario in a schema (or database)
of its own that it creates and drops:

  drain    a backlog (--events over --aggregates) drained by 1, 2, 4 (--relays) relay
           processes to each --broker, beside the raw-SQL ceiling (one UPDATE … SKIP
           LOCKED per batch, no publishing) on the same backlog: events/s and the ratio
  enqueue  commits/s of a business transaction without and with one outbox event,
           1 and 16 producers, NOTIFY on and off (--duration per cell), beside
           the real watermill-sql publisher when --enqueue-peer-bin is given
  latency  commit → seen-on-the-stream latency at --rate events/s (open loop), with
           NOTIFY wake-up and with polling only; needs NATS
  idle     queries per second an idle relay sends (--idle-duration)
  history  time for a relay to pick up and publish fresh events with 0 and with
           --history-rows published rows kept in the table
  tenants  one relay process serving --tenant-counts outboxes of one database (and
           the largest count over two databases): idle queries/s, drain throughput
           (--events spread over the tenants), relay memory per tenant, and the
           quiet tenants' latency (--tenant-rate each) with and without one tenant
           holding an --events backlog; needs NATS

--sources poll,cdc adds rows for the CDC source ('relay --source cdc', one relay) to
drain and latency; it needs wal_level = logical and a role with REPLICATION, and each
run's slot and publication are dropped after it ('pgoutbox cdc disable').

Relays run as subprocesses of this binary ('pgoutbox relay'); each one's peak RSS is
reported. Brokers: null (acks at once), nats (nats://127.0.0.1:4222 if reachable,
else an in-process server), embedded, or any --broker URL of 'pgoutbox relay'; the
relays get its kind's settings and secrets from this environment
(PGOUTBOX_MQTT_PASSWORD, …), and each MQTT relay a client id of its own.
Tables go to stdout, progress to stderr; --json and --report keep every figure.
docs/performance.md explains each figure and what bounds it.`,
		Example: `  pgoutbox bench --database-url postgres://postgres@127.0.0.1/test --scenario drain --relays 1 --broker nats
  pgoutbox bench --scenario drain,latency --sources poll,cdc --broker nats
  pgoutbox bench --scenario all --json bench.json --report bench.html`,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runBench(cmd, &f)
		},
	}
	fs := cmd.Flags()
	fs.StringVar(&f.url, "database-url", "", "PostgreSQL connection string, URL or key=value form (env DATABASE_URL)")
	fs.StringSliceVar(&f.scenarios, "scenario", []string{"all"}, "scenarios to run: "+strings.Join(bench.Scenarios, ",")+" or all (env PGOUTBOX_BENCH_SCENARIO)")
	fs.StringVar(&f.jsonFile, "json", "", "write every figure and the machine's description to this JSON file (env PGOUTBOX_BENCH_JSON)")
	fs.StringVar(&f.report, "report", "", "write a self-contained HTML report with charts to this file (env PGOUTBOX_BENCH_REPORT)")
	fs.StringVar(&f.render, "from-json", "", "run nothing: print the tables (and write --report) of a JSON file an earlier run wrote (env PGOUTBOX_BENCH_FROM_JSON)")
	fs.StringSliceVar(&f.sources, "sources", nil, "drain, latency: relay sources to measure: poll, cdc (env PGOUTBOX_BENCH_SOURCES) (default poll,cdc when the server has wal_level=logical, else poll)")
	fs.IntVar(&f.cfg.Events, "events", 100_000, "drain: events in the backlog (env PGOUTBOX_BENCH_EVENTS)")
	fs.IntVar(&f.cfg.Aggregates, "aggregates", 1_000, "drain: aggregates the backlog is spread over (env PGOUTBOX_BENCH_AGGREGATES)")
	fs.IntVar(&f.cfg.PayloadBytes, "payload-bytes", 256, "approximate JSON payload size (env PGOUTBOX_BENCH_PAYLOAD_BYTES)")
	fs.IntVar(&f.cfg.BatchSize, "batch-size", 500, "relays' --batch-size and the SQL ceiling's batch (env PGOUTBOX_BENCH_BATCH_SIZE)")
	fs.IntSliceVar(&f.cfg.Relays, "relays", []int{1, 2, 4}, "drain: relay counts to time (env PGOUTBOX_BENCH_RELAYS)")
	fs.StringSliceVar(&f.cfg.Brokers, "broker", slices.Clone(bench.DefaultBrokers), "drain: brokers: null, nats, embedded or a relay --broker URL (env PGOUTBOX_BENCH_BROKER)")
	fs.IntVar(&f.cfg.Rate, "rate", 1_000, "latency: offered events/s (env PGOUTBOX_BENCH_RATE)")
	fs.DurationVar(&f.cfg.Duration, "duration", 10*time.Second, "latency: how long load is offered; enqueue: time per cell (env PGOUTBOX_BENCH_DURATION)")
	fs.DurationVar(&f.cfg.PollInterval, "poll-interval", 2*time.Second, "relays' --poll-interval (latency's polling-only run depends on it) (env PGOUTBOX_BENCH_POLL_INTERVAL)")
	fs.DurationVar(&f.cfg.IdleDuration, "idle-duration", 30*time.Second, "idle: how long to watch an idle relay (env PGOUTBOX_BENCH_IDLE_DURATION)")
	fs.IntVar(&f.cfg.HistoryRows, "history-rows", 5_000_000, "history: published rows kept in the table (env PGOUTBOX_BENCH_HISTORY_ROWS)")
	fs.IntVar(&f.cfg.HistoryTrials, "history-trials", 40, "history: fresh batches timed per phase (env PGOUTBOX_BENCH_HISTORY_TRIALS)")
	fs.IntVar(&f.cfg.EnqueueRounds, "enqueue-rounds", 5, "enqueue: interleaved rounds each cell's --duration is split into (env PGOUTBOX_BENCH_ENQUEUE_ROUNDS)")
	fs.StringVar(&f.cfg.EnqueuePeerBin, "enqueue-peer-bin", "", "enqueue: the real watermill-sql peer's binary, run beside the bench's own cells (build: "+bench.PeerBuildHint+") (env PGOUTBOX_BENCH_ENQUEUE_PEER_BIN)")
	fs.IntSliceVar(&f.cfg.TenantCounts, "tenant-counts", []int{1, 10, 100}, "tenants: outboxes of one database one relay serves (env PGOUTBOX_BENCH_TENANT_COUNTS)")
	fs.Float64Var(&f.cfg.TenantRate, "tenant-rate", 2, "tenants: events/s committed to each quiet tenant in the fairness run (env PGOUTBOX_BENCH_TENANT_RATE)")
	fs.StringArrayVar(&f.cfg.RelayArgs, "relay-arg", nil, "extra flag for every relay process, repeatable, e.g. --relay-arg=--workers=3 (env PGOUTBOX_BENCH_RELAY_ARG)")
	return cmd
}

func runBench(cmd *cobra.Command, f *benchFlags) error {
	if err := rejectZero(cmd.Flags(), "events", "aggregates", "batch-size", "rate", "duration", "poll-interval",
		"idle-duration", "history-trials", "enqueue-rounds", "tenant-rate"); err != nil {
		return err
	}
	if f.render != "" {
		raw, err := os.ReadFile(f.render)
		if err != nil {
			return usagef("--from-json: %v", err)
		}
		var res bench.Result
		if err := json.Unmarshal(raw, &res); err != nil {
			return usagef("--from-json %s: %v", f.render, err)
		}
		res.Redact() // a file an older version wrote may hold credentials
		return f.output(cmd, &res)
	}
	if strings.TrimSpace(f.url) == "" {
		return usagef("no database: set --database-url or DATABASE_URL (e.g. postgres://user@localhost:5432/app)")
	}
	cfg := f.cfg
	cfg.DatabaseURL = f.url
	for _, s := range f.scenarios {
		s = strings.TrimSpace(s)
		switch {
		case s == "all":
			cfg.Scenarios = append(cfg.Scenarios, bench.Scenarios...)
		case slices.Contains(bench.Scenarios, s):
			cfg.Scenarios = append(cfg.Scenarios, s)
		default:
			return usagef("--scenario %q: want %s or all", s, strings.Join(bench.Scenarios, ","))
		}
	}
	for _, s := range f.sources {
		s = strings.TrimSpace(s)
		if !slices.Contains(bench.Sources, s) {
			return usagef("--sources %q: want %s", s, strings.Join(bench.Sources, ","))
		}
		if !slices.Contains(cfg.Sources, s) {
			cfg.Sources = append(cfg.Sources, s)
		}
	}
	for _, n := range cfg.Relays {
		if n < 1 || n > 64 {
			return usagef("--relays %d: want 1..64", n)
		}
	}
	for _, n := range cfg.TenantCounts {
		if n < 1 || n > 1000 {
			return usagef("--tenant-counts %d: want 1..1000", n)
		}
	}
	switch {
	case cfg.Events < 1 || cfg.Aggregates < 1 || cfg.Aggregates > cfg.Events:
		return usagef("--aggregates %d: want 1..--events (%d)", cfg.Aggregates, cfg.Events)
	case cfg.TenantRate < 0 || cfg.TenantRate > 1000:
		return usagef("--tenant-rate %g: want more than 0 and at most 1000", cfg.TenantRate)
	case cfg.PayloadBytes < 0 || cfg.HistoryRows < 0 || cfg.Rate < 0 || cfg.Duration < 0 || cfg.IdleDuration < 0 || cfg.PollInterval < 0:
		return usagef("sizes, rates and durations must not be negative")
	}
	exe, err := os.Executable()
	if err != nil {
		return fmt.Errorf("find the pgoutbox binary to run relays: %w", err)
	}
	cfg.Executable = exe
	cfg.RelayEnv, cfg.Secrets = benchRelayEnv, benchSecrets()
	stderr := cmd.ErrOrStderr()
	cfg.Progress = stderr
	if fi, ok := stderr.(*os.File); ok {
		if st, err := fi.Stat(); err == nil && st.Mode()&os.ModeCharDevice != 0 {
			cfg.ProgressTTY = true
		}
	}
	res, runErr := bench.Run(cmd.Context(), &cfg)
	if res == nil {
		return runErr
	}
	if err := f.output(cmd, res); err != nil {
		return err
	}
	return runErr
}

// output prints the tables and writes --json and --report.
func (f *benchFlags) output(cmd *cobra.Command, res *bench.Result) error {
	res.WriteText(cmd.OutOrStdout())
	if f.jsonFile != "" {
		b, err := json.MarshalIndent(res, "", "  ")
		if err != nil {
			return fmt.Errorf("encode JSON: %w", err)
		}
		if err := os.WriteFile(f.jsonFile, append(b, '\n'), 0o644); err != nil {
			return fmt.Errorf("write --json: %w", err)
		}
	}
	if f.report != "" {
		out, err := os.Create(f.report)
		if err != nil {
			return fmt.Errorf("write --report: %w", err)
		}
		if err := bench.WriteReport(out, res); err != nil {
			out.Close()
			return fmt.Errorf("write --report: %w", err)
		}
		if err := out.Close(); err != nil {
			return fmt.Errorf("write --report: %w", err)
		}
	}
	return nil
}
