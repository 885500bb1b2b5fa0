// Package bench measures pgoutbox on the machine at hand: how fast relays drain a
// backlog (beside a raw-SQL ceiling measured in the same run), the commit→broker
// latency at a fixed offered rate, what the outbox adds to a business transaction,
// the queries an idle relay sends, and whether a large published history slows the
// claim. `pgoutbox bench` is its command line; docs/performance.md explains every
// figure.
//
// Relays run as real `pgoutbox relay` subprocesses (Config.Executable), so that each
// one's peak resident memory is measured on its own. Every scenario works in a schema
// (or database) of its own that it creates and drops.
package bench

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"log/slog"
	"os"
	"runtime"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgoutbox/pgoutbox/internal/config"
	"github.com/pgoutbox/pgoutbox/internal/redact"
	"github.com/pgoutbox/pgoutbox/migrate"
)

// Scenario names, in the order Run runs them.
const (
	ScenarioDrain   = "drain"
	ScenarioEnqueue = "enqueue"
	ScenarioLatency = "latency"
	ScenarioIdle    = "idle"
	ScenarioHistory = "history"
	ScenarioTenants = "tenants"
	// ScenarioDestinations drains one backlog to 1, 2 and 3 destinations and
	// times the producer's write with 3 destinations registered against none.
	ScenarioDestinations = "destinations"
)

// Scenarios lists every scenario in run order.
var Scenarios = []string{ScenarioDrain, ScenarioEnqueue, ScenarioLatency, ScenarioIdle, ScenarioHistory, ScenarioTenants, ScenarioDestinations}

// Relay sources drain and latency compare: the polling relay and the CDC source
// (`pgoutbox relay --source cdc`, logical replication).
const (
	SourcePoll = "poll"
	SourceCDC  = "cdc"
)

// Sources lists every relay source.
var Sources = []string{SourcePoll, SourceCDC}

// DefaultBrokers are the brokers drain publishes to unless Config.Brokers says.
var DefaultBrokers = []string{"null", "nats"}

// Config says what to measure and where. Zero fields take the documented defaults.
type Config struct {
	// DatabaseURL is the PostgreSQL server to measure. Required. Scenarios create
	// (and drop) schemas in its database; idle creates a database of its own.
	DatabaseURL string

	// Executable is the pgoutbox binary run as `relay` subprocesses. Required for
	// every scenario but enqueue.
	Executable string

	// Scenarios to run. Defaults to all of them.
	Scenarios []string

	// Events is the drain backlog. Defaults to 100,000.
	Events int
	// Aggregates the backlog is spread over (round-robin). Defaults to 1,000.
	Aggregates int
	// PayloadBytes is the approximate size of each event's JSON payload. Defaults to 256.
	PayloadBytes int
	// BatchSize is the relays' --batch-size and the ceiling's batch. Defaults to 500.
	BatchSize int
	// Relays are the relay counts drain is timed with. Defaults to 1, 2, 4.
	Relays []int
	// Brokers drain publishes to: "null", "nats" (nats://127.0.0.1:4222 when
	// reachable, else an in-process server), "embedded" (in-process NATS JetStream),
	// a nats:// URL, or any other --broker URL the relay takes. Defaults to null, nats.
	Brokers []string

	// Rate is latency's offered load in events/s. Defaults to 1,000.
	Rate int
	// Duration is how long latency offers load and each enqueue cell runs.
	// Defaults to 10s.
	Duration time.Duration
	// PollInterval is the relays' --poll-interval (latency's polling-only run
	// depends on it). Defaults to 2s, the relay's default.
	PollInterval time.Duration
	// IdleDuration is how long idle watches an idle relay. Defaults to 30s.
	IdleDuration time.Duration
	// HistoryRows is the published history history keeps in the table. Defaults
	// to 5,000,000.
	HistoryRows int
	// HistoryTrials is how many fresh batches history times per phase. Defaults to 40.
	HistoryTrials int
	// EnqueueRounds is how many interleaved rounds enqueue splits each cell's
	// Duration into: every round runs every cell for Duration / EnqueueRounds, so
	// a drift of the machine's speed hits all cells alike. Defaults to 5.
	EnqueueRounds int
	// EnqueuePeerBin is the peer binary (bench/peers/watermillsql, built with
	// PeerBuildHint) enqueue runs as its real watermill-sql cells, interleaved
	// with its own. Empty: those cells are not run, and
	// EnqueueResult.PeerNotRun says so and how to build it.
	EnqueuePeerBin string

	// TenantCounts are the numbers of outboxes (tenants) of one database the
	// tenants scenario serves from one relay process; the largest is also split
	// over two databases, and is the fairness run's tenant count. Defaults to
	// 1, 10, 100.
	TenantCounts []int
	// TenantRate is the fairness run's trickle: events/s committed to each
	// quiet tenant. Defaults to 2.
	TenantRate float64

	// Sources are the relay sources drain and latency measure: SourcePoll and
	// SourceCDC. CDC runs one relay (one source per schema). Defaults to both when
	// the server has wal_level = logical and the role may replicate, else to poll
	// alone (with a note in Context.Notes).
	Sources []string

	// RelayArgs are extra flags for every relay subprocess, e.g. --workers 3.
	RelayArgs []string

	// RelayEnv returns what a relay subprocess publishing to broker (a Brokers
	// value) needs in its environment beyond PGOUTBOX_BROKER and DATABASE_URL:
	// the broker kind's own settings and secrets as the bench was given them,
	// and the ones that must differ between relays (MQTT's client id), for the
	// relay with the id relayID. The environment, not the command line, which
	// ps shows. Nil: nothing more.
	RelayEnv func(broker, relayID string) []string

	// Secrets are more values to hide wherever they would appear (the
	// brokers' secrets from the environment), beside the credentials of the
	// URLs.
	Secrets []string

	// Progress receives a progress display; nil shows none. ProgressTTY draws it
	// as one line redrawn with a carriage return, else as a line every few seconds.
	Progress    io.Writer
	ProgressTTY bool

	// Logger receives diagnostics. Defaults to discarding them.
	Logger *slog.Logger
}

// minEnqueueSlice is the shortest slice of an enqueue cell worth timing.
const minEnqueueSlice = 100 * time.Millisecond

// The bench's defaults, used for the zero fields of Config.
const (
	defaultEvents        = 100_000
	defaultAggregates    = 1_000
	defaultPayloadBytes  = 256
	defaultBatchSize     = 500
	defaultRate          = 1_000
	defaultHistoryRows   = 5_000_000
	defaultHistoryTrials = 40
	defaultEnqueueRounds = 5
	defaultDuration      = 10 * time.Second
	defaultPollInterval  = 2 * time.Second
	defaultIdleDuration  = 30 * time.Second
	defaultTenantRate    = 2
)

func (c *Config) withDefaults() (Config, error) {
	return config.Resolve("bench", c, configDefaults, checkConfig)
}

func configDefaults(c *Config) {
	if len(c.Scenarios) == 0 {
		c.Scenarios = Scenarios
	}
	config.Default(&c.Events, defaultEvents)
	config.Default(&c.Aggregates, defaultAggregates)
	config.Default(&c.PayloadBytes, defaultPayloadBytes)
	config.Default(&c.BatchSize, defaultBatchSize)
	config.Default(&c.Rate, defaultRate)
	config.Default(&c.HistoryRows, defaultHistoryRows)
	config.Default(&c.HistoryTrials, defaultHistoryTrials)
	config.Default(&c.EnqueueRounds, defaultEnqueueRounds)
	config.Default(&c.Duration, defaultDuration)
	config.Default(&c.PollInterval, defaultPollInterval)
	config.Default(&c.IdleDuration, defaultIdleDuration)
	if len(c.Relays) == 0 {
		c.Relays = []int{1, 2, 4}
	}
	if len(c.Brokers) == 0 {
		c.Brokers = slices.Clone(DefaultBrokers)
	}
	if len(c.TenantCounts) == 0 {
		c.TenantCounts = []int{1, 10, 100}
	}
	config.Default(&c.TenantRate, defaultTenantRate)
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
}

// checkConfig validates a config whose defaults are filled in.
func checkConfig(c *Config, p *config.Problems) {
	p.Check(c.DatabaseURL != "", "Config.DatabaseURL is required")
	for _, s := range c.Scenarios {
		p.Check(slices.Contains(Scenarios, s), "unknown scenario %q (want %s or all)", s, strings.Join(Scenarios, ", "))
	}
	p.Check(c.Events >= 1 && c.Aggregates >= 1 && c.Aggregates <= c.Events,
		"want 1 <= aggregates (%d) <= events (%d)", c.Aggregates, c.Events)
	p.Check(c.PayloadBytes >= 0 && c.BatchSize >= 1 && c.Rate >= 1 && c.HistoryRows >= 0 && c.HistoryTrials >= 1 && c.EnqueueRounds >= 1,
		"payload bytes, batch size, rate, history rows and trials, enqueue rounds must be positive")
	p.Check(c.Duration >= 0 && c.PollInterval >= 0 && c.IdleDuration >= 0, "durations must be positive")
	if c.EnqueueRounds >= 1 && slices.Contains(c.Scenarios, ScenarioEnqueue) {
		slice := c.Duration / time.Duration(c.EnqueueRounds)
		p.Check(slice >= minEnqueueSlice, "enqueue: duration %s in %d rounds leaves %s per cell and round, want at least %s",
			c.Duration, c.EnqueueRounds, slice, minEnqueueSlice)
		if c.EnqueuePeerBin != "" {
			if err := checkPeerBin(c.EnqueuePeerBin); err != nil {
				p.Check(false, "%v", err)
			}
		}
	}
	for _, n := range c.Relays {
		p.Check(n >= 1 && n <= 64, "relay count %d: want 1..64", n)
	}
	for _, n := range c.TenantCounts {
		p.Check(n >= 1 && n <= maxTenants, "tenant count %d: want 1..%d", n, maxTenants)
	}
	if slices.Contains(c.Scenarios, ScenarioTenants) {
		p.Check(slices.Max(c.TenantCounts) >= 2, "tenants: the largest tenant count must be 2 or more (a hot tenant and quiet ones)")
		p.Check(c.TenantRate > 0 && c.TenantRate <= 1000, "tenant rate %g: want more than 0 and at most 1000 events/s per tenant", c.TenantRate)
	}
	for _, s := range c.Sources {
		p.Check(slices.Contains(Sources, s), "unknown source %q (want %s)", s, strings.Join(Sources, ", "))
	}
	p.Check(c.Executable != "" || !slices.ContainsFunc(c.Scenarios, func(s string) bool { return s != ScenarioEnqueue }),
		"Config.Executable (the pgoutbox binary) is required to run relays")
}

// Result holds every figure of one run; it is what --json writes.
type Result struct {
	Context Context        `json:"context"`
	Drain   *DrainResult   `json:"drain,omitempty"`
	Enqueue *EnqueueResult `json:"enqueue,omitempty"`
	Latency *LatencyResult `json:"latency,omitempty"`
	Idle    *IdleResult    `json:"idle,omitempty"`
	History *HistoryResult `json:"history,omitempty"`
	Tenants *TenantsResult `json:"tenants,omitempty"`
	// Destinations is the destinations scenario's figures.
	Destinations *DestinationsResult `json:"destinations,omitempty"`
	Errors       []ScenarioError     `json:"errors,omitempty"`
	Targets      []Target            `json:"targets,omitempty"`
	// ScenarioSeconds is how long each scenario took, setup included.
	ScenarioSeconds map[string]float64 `json:"scenario_seconds"`
	// ScenarioCPU is how the machine's CPU time went while each scenario ran
	// (Linux only): how busy it was, and how much the host took (steal).
	ScenarioCPU map[string]CPUShare `json:"scenario_cpu,omitempty"`
	Settings    SettingsSnapshot    `json:"settings"`
}

// ScenarioError records a scenario that failed; the others still run.
type ScenarioError struct {
	Scenario string `json:"scenario"`
	Error    string `json:"error"`
}

// SettingsSnapshot is the Config a run used, as recorded in the JSON.
type SettingsSnapshot struct {
	Scenarios      []string `json:"scenarios"`
	Events         int      `json:"events"`
	Aggregates     int      `json:"aggregates"`
	PayloadBytes   int      `json:"payload_bytes"`
	BatchSize      int      `json:"batch_size"`
	Relays         []int    `json:"relays"`
	Brokers        []string `json:"brokers"`
	Rate           int      `json:"rate"`
	DurationS      float64  `json:"duration_s"`
	PollIntervalS  float64  `json:"poll_interval_s"`
	IdleDurationS  float64  `json:"idle_duration_s"`
	HistoryRows    int      `json:"history_rows"`
	HistoryTrials  int      `json:"history_trials"`
	EnqueueRounds  int      `json:"enqueue_rounds,omitempty"`
	EnqueuePeerBin string   `json:"enqueue_peer_bin,omitempty"`
	TenantCounts   []int    `json:"tenant_counts,omitempty"`
	TenantRate     float64  `json:"tenant_rate,omitempty"`
	Sources        []string `json:"sources,omitempty"`
	RelayArgs      []string `json:"relay_args,omitempty"`
	RelayBinary    string   `json:"relay_binary,omitempty"`
	DatabaseServer string   `json:"database_server"`
}

// Context describes the machine and servers the figures were measured on.
type Context struct {
	Started        time.Time         `json:"started"`
	Finished       time.Time         `json:"finished"`
	Hostname       string            `json:"hostname"`
	CPUs           int               `json:"cpus"`
	CPUModel       string            `json:"cpu_model,omitempty"`
	MemoryBytes    int64             `json:"memory_bytes,omitempty"`
	GoVersion      string            `json:"go_version"`
	OS             string            `json:"os"`
	PostgreSQL     string            `json:"postgresql"`
	PostgreSQLConf map[string]string `json:"postgresql_settings"`
	NATSServer     string            `json:"nats_server,omitempty"`
	Notes          []string          `json:"notes,omitempty"`
}

// Run measures the configured scenarios. A scenario that fails is recorded in
// Result.Errors and the next one runs; the error returned is the first such
// failure, or a context or connection error that ended the run.
func Run(ctx context.Context, cfg *Config) (*Result, error) {
	c, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	pcfg, err := pgxpool.ParseConfig(c.DatabaseURL)
	if err != nil {
		return nil, fmt.Errorf("bench: %w", redact.ConnStringError("database URL", err))
	}
	pcfg.MaxConns = 20
	dbErr := func(err error) error {
		return scrubbed{msg: redact.Text("bench: connect to database: "+err.Error(), c.secrets(pcfg.ConnConfig.Password)...), err: err}
	}
	admin, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return nil, dbErr(err)
	}
	defer admin.Close()
	if err := admin.Ping(ctx); err != nil {
		return nil, dbErr(err)
	}
	r := &Runner{cfg: c, admin: admin, prog: newProgress(c.Progress, c.ProgressTTY)}
	r.secrets = c.secrets(pcfg.ConnConfig.Password)
	r.prog.secrets = r.secrets
	res := &Result{}
	res.Context = r.context(ctx)
	note, err := r.resolveSources(ctx)
	if err != nil {
		return nil, err
	}
	if note != "" {
		res.Context.Notes = append(res.Context.Notes, note)
	}
	c = r.cfg
	res.Settings = c.snapshot(pcfg.ConnConfig)
	defer r.closeBrokers()
	var first error
	for _, s := range Scenarios { // fixed order, whatever order they were asked in
		if !slices.Contains(c.Scenarios, s) {
			continue
		}
		var err error
		began := time.Now()
		cpu0, cpuOK := readCPUTimes()
		switch s {
		case ScenarioDrain:
			res.Drain, err = r.drain(ctx)
		case ScenarioEnqueue:
			res.Enqueue, err = r.enqueue(ctx)
		case ScenarioLatency:
			res.Latency, err = r.latency(ctx)
		case ScenarioIdle:
			res.Idle, err = r.idle(ctx)
		case ScenarioHistory:
			res.History, err = r.history(ctx)
		case ScenarioTenants:
			res.Tenants, err = r.tenants(ctx)
		case ScenarioDestinations:
			res.Destinations, err = r.destinations(ctx)
		}
		r.prog.done()
		if res.ScenarioSeconds == nil {
			res.ScenarioSeconds = map[string]float64{}
		}
		res.ScenarioSeconds[s] = round3(time.Since(began).Seconds())
		if cpu1, ok := readCPUTimes(); ok && cpuOK {
			if sh, ok := share(cpu0, cpu1); ok {
				if res.ScenarioCPU == nil {
					res.ScenarioCPU = map[string]CPUShare{}
				}
				res.ScenarioCPU[s] = sh
			}
		}
		if err != nil {
			res.Errors = append(res.Errors, ScenarioError{Scenario: s, Error: r.scrub(err.Error())})
			if first == nil {
				first = scrubbed{msg: r.scrub(fmt.Sprintf("bench %s: %v", s, err)), err: err}
			}
			if ctx.Err() != nil {
				break
			}
		}
	}
	if v := r.natsVersion(); v != "" {
		res.Context.NATSServer = v
	}
	res.Context.Finished = time.Now().UTC()
	res.Targets = res.targets()
	res.Redact(r.secrets...)
	return res, first
}

// Redact hides credentials in everything res shows (broker URLs, relay flags,
// error texts, notes): URLs and DSNs through internal/redact, and each of
// secrets wherever it appears. Run calls it; call it on a Result read from a
// file before showing it.
func (res *Result) Redact(secrets ...string) {
	t := func(s string) string { return redact.Text(s, secrets...) }
	for i := range res.Settings.Brokers {
		res.Settings.Brokers[i] = redact.URL(res.Settings.Brokers[i])
	}
	res.Settings.RelayArgs = redact.Args(res.Settings.RelayArgs)
	for i := range res.Errors {
		res.Errors[i].Error = t(res.Errors[i].Error)
	}
	for i := range res.Context.Notes {
		res.Context.Notes[i] = t(res.Context.Notes[i])
	}
	if res.Drain != nil {
		for i := range res.Drain.Runs {
			res.Drain.Runs[i].Broker = redact.URL(res.Drain.Runs[i].Broker)
		}
	}
	if res.Latency != nil {
		res.Latency.Broker = redact.URL(res.Latency.Broker)
	}
}

// secrets are the credentials of the run's URLs, hidden wherever they appear.
func (c *Config) secrets(dbPassword string) []string {
	s := redact.Secrets(append([]string{c.DatabaseURL}, c.Brokers...)...)
	if dbPassword != "" {
		s = append(s, dbPassword)
	}
	s = append(s, redactArgsSecrets(c.RelayArgs)...)
	s = append(s, c.Secrets...)
	if v := os.Getenv("PGPASSWORD"); v != "" {
		s = append(s, v)
	}
	return s
}

// redactArgsSecrets returns the values of secret flags among args.
func redactArgsSecrets(args []string) []string {
	var out []string
	for i, a := range args {
		name, v, ok := strings.Cut(strings.TrimLeft(a, "-"), "=")
		if !strings.HasPrefix(a, "-") || !redact.IsSecretName(name) {
			continue
		}
		if !ok && i+1 < len(args) {
			v = args[i+1]
		}
		out = append(out, v)
		out = append(out, redact.Secrets(v)...)
	}
	return out
}

// scrub hides the run's credentials in s.
func (r *Runner) scrub(s string) string { return redact.Text(s, r.secrets...) }

// scrubbed is an error whose text had the run's credentials removed; it still
// wraps the original for errors.Is.
type scrubbed struct {
	msg string
	err error
}

func (e scrubbed) Error() string { return e.msg }
func (e scrubbed) Unwrap() error { return e.err }

func (c *Config) snapshot(cc *pgx.ConnConfig) SettingsSnapshot {
	return SettingsSnapshot{
		Scenarios: c.Scenarios, Events: c.Events, Aggregates: c.Aggregates, PayloadBytes: c.PayloadBytes,
		BatchSize: c.BatchSize, Relays: c.Relays, Brokers: redactAll(c.Brokers), Rate: c.Rate,
		DurationS: c.Duration.Seconds(), PollIntervalS: c.PollInterval.Seconds(), IdleDurationS: c.IdleDuration.Seconds(),
		HistoryRows: c.HistoryRows, HistoryTrials: c.HistoryTrials, EnqueueRounds: c.EnqueueRounds, EnqueuePeerBin: c.EnqueuePeerBin,
		TenantCounts: c.TenantCounts, TenantRate: c.TenantRate, Sources: c.Sources, RelayArgs: redact.Args(c.RelayArgs), RelayBinary: c.Executable,
		DatabaseServer: fmt.Sprintf("%s:%d/%s", cc.Host, cc.Port, cc.Database),
	}
}

// redactAll returns URLs without their credentials.
func redactAll(urls []string) []string {
	out := make([]string, len(urls))
	for i, u := range urls {
		out[i] = redact.URL(u)
	}
	return out
}

// Runner carries what the scenarios share.
type Runner struct {
	cfg     Config
	admin   *pgxpool.Pool
	prog    *progress
	brokers map[string]*brokerEnv
	secrets []string // the credentials of the run's URLs and flags: never shown
}

func (r *Runner) context(ctx context.Context) Context {
	c := Context{Started: time.Now().UTC(), CPUs: runtime.NumCPU(), GoVersion: runtime.Version(),
		OS: runtime.GOOS + "/" + runtime.GOARCH, PostgreSQLConf: map[string]string{}}
	c.Hostname, _ = os.Hostname()
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if k, v, ok := strings.Cut(l, ":"); ok && strings.TrimSpace(k) == "model name" {
				c.CPUModel = strings.TrimSpace(v)
				break
			}
		}
	}
	if b, err := os.ReadFile("/proc/meminfo"); err == nil {
		var kb int64
		if _, err := fmt.Sscanf(string(b), "MemTotal: %d kB", &kb); err == nil {
			c.MemoryBytes = kb * 1024
		}
	}
	_ = r.admin.QueryRow(ctx, "SELECT version()").Scan(&c.PostgreSQL)
	for _, s := range []string{"server_version", "shared_buffers", "synchronous_commit", "fsync", "wal_level",
		"max_wal_size", "checkpoint_timeout", "work_mem", "max_connections", "autovacuum", "shared_preload_libraries"} {
		var v string
		if err := r.admin.QueryRow(ctx, "SELECT current_setting($1)", s).Scan(&v); err == nil {
			c.PostgreSQLConf[s] = v
		}
	}
	c.Notes = append(c.Notes, "PostgreSQL, the broker, the relays and this harness share the machine's CPUs")
	return c
}

func randHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// outboxSchema is a migrated schema of one scenario's own.
type outboxSchema struct {
	name   string
	events string // quoted table names
	seqs   string
}

// newSchema creates and migrates a fresh schema; drop removes it.
func (r *Runner) newSchema(ctx context.Context, prefix string) (*outboxSchema, error) {
	name := "bench_" + prefix + "_" + randHex(4)
	if _, err := migrate.Up(ctx, r.admin, &migrate.Config{Schema: name, Lines: []migrate.Line{migrate.LineOutbox}}); err != nil {
		return nil, fmt.Errorf("migrate schema %s: %w", name, err)
	}
	return &outboxSchema{name: name, events: pgx.Identifier{name, "outbox_events"}.Sanitize(),
		seqs: pgx.Identifier{name, "outbox_aggregate_sequences"}.Sanitize()}, nil
}

func (r *Runner) dropSchema(s *outboxSchema) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := r.admin.Exec(ctx, "DROP SCHEMA IF EXISTS "+pgx.Identifier{s.name}.Sanitize()+" CASCADE"); err != nil {
		r.cfg.Logger.Warn("could not drop benchmark schema", slog.String("schema", s.name), slog.Any("error", err))
	}
}

func (s *outboxSchema) count(ctx context.Context, q interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}, where string) (int64, error) {
	var n int64
	err := q.QueryRow(ctx, "SELECT count(*) FROM "+s.events+" WHERE "+where).Scan(&n)
	return n, err
}

// loadBacklog fills an empty outbox with n unpublished events spread round-robin
// over aggregates (event i belongs to aggregate i mod aggregates, sequence
// i / aggregates + 1) and their sequence counters, straight from generate_series in
// one transaction: the same rows EnqueueTx would write, at a fraction of the time.
// The table is analysed in the same transaction, so the relays' first claim is
// planned on statistics that see the backlog, and a NOTIFY on the relays' channel
// wakes them at commit. It returns the server's clock right
// after the commit, when the backlog became visible.
func (r *Runner) loadBacklog(ctx context.Context, s *outboxSchema, n, aggregates, payload int, aggPrefix string, published bool) (time.Time, error) {
	err := pgx.BeginFunc(ctx, r.admin, func(tx pgx.Tx) error {
		return backlogTx(ctx, tx, s, n, aggregates, payload, aggPrefix, published)
	})
	if err != nil {
		return time.Time{}, err
	}
	var t time.Time
	err = r.admin.QueryRow(ctx, "SELECT clock_timestamp()").Scan(&t)
	return t, err
}

// backlogTx writes loadBacklog's rows (and its ANALYZE and NOTIFY) in tx, which
// the caller commits: the backlogs of several outboxes written in one
// transaction become visible together.
func backlogTx(ctx context.Context, tx pgx.Tx, s *outboxSchema, n, aggregates, payload int, aggPrefix string, published bool) error {
	pad := max(payload-24, 0) // {"i": 12345, "pad": "…"} is ~24 bytes besides the padding
	pub := "NULL"
	if published {
		pub = "now()"
	}
	// UUIDv7-shaped ids: a millisecond prefix rising with i (as ids minted over time
	// would), version 7, variant 8, random tail.
	q := fmt.Sprintf(`
INSERT INTO %[1]s (event_id, aggregate_type, aggregate_id, aggregate_sequence, event_type, payload, published_at)
SELECT (lpad(to_hex($1::bigint + i / 64), 12, '0') || '7' || substr(h, 1, 3) || '8' || substr(h, 4, 15))::uuid,
       'bench', $2::text || lpad((i %% $3::bigint)::text, 6, '0'), i / $3::bigint + 1, 'bench.event',
       jsonb_build_object('i', i, 'pad', repeat('x', $4::int)), %[2]s
  FROM generate_series(0::bigint, $5::bigint - 1) AS i, LATERAL (SELECT md5(random()::text || i::text) AS h) AS r`, s.events, pub)
	seq := fmt.Sprintf(`
INSERT INTO %[1]s AS s (aggregate_type, aggregate_id, last_sequence)
SELECT aggregate_type, aggregate_id, max(aggregate_sequence) FROM %[2]s GROUP BY 1, 2
ON CONFLICT (aggregate_type, aggregate_id) DO UPDATE SET last_sequence = excluded.last_sequence`, s.seqs, s.events)
	if _, err := tx.Exec(ctx, q, time.Now().UnixMilli(), aggPrefix, aggregates, pad, n); err != nil {
		return fmt.Errorf("load events: %w", err)
	}
	if _, err := tx.Exec(ctx, seq); err != nil {
		return fmt.Errorf("load sequences: %w", err)
	}
	if _, err := tx.Exec(ctx, "ANALYZE "+s.events); err != nil {
		return fmt.Errorf("analyze: %w", err)
	}
	if published {
		return nil
	}
	// Rows written behind the producer API's back wake no relay by themselves
	// (whether producers notify is the outbox's business); wake them as a
	// producer would, at commit.
	if _, err := tx.Exec(ctx, "SELECT pg_notify($1, '')", migrate.NotifyChannel(s.name)); err != nil {
		return fmt.Errorf("notify: %w", err)
	}
	return nil
}

// truncate empties a schema's outbox between runs.
func (r *Runner) truncate(ctx context.Context, s *outboxSchema) error {
	_, err := r.admin.Exec(ctx, "TRUNCATE "+s.events+", "+s.seqs)
	if err != nil {
		return fmt.Errorf("truncate outbox: %w", err)
	}
	return nil
}
