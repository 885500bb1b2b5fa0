package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgoutbox/pgoutbox"
	"github.com/pgoutbox/pgoutbox/migrate"
)

// maxTenants bounds Config.TenantCounts: a relay's selector holds at most
// 1,000 names.
const maxTenants = 1000

// TenantsResult is the tenants scenario: one relay process serving many
// outboxes (`pgoutbox relay --tenants`), each an outbox schema of a database of
// the run's own. Idle load, throughput, relay memory and the fairness between
// one tenant with a backlog and quiet tenants receiving a trickle.
type TenantsResult struct {
	Method string `json:"method"`
	// Broker is where the drains and the fairness run publish (the idle relays
	// publish to the null broker).
	Broker string `json:"broker"`
	// Counts are the tenant counts of one database (Config.TenantCounts).
	Counts []int `json:"tenant_counts"`

	// IdleSource says how queries were counted: pg_stat_statements calls, or
	// pg_stat_database transactions.
	IdleSource string           `json:"idle_source"`
	Idle       []TenantIdleCell `json:"idle"`
	// IdleRatio is the idle queries/s at the largest count of one database
	// over those at the smallest: 1 when the cost does not grow with tenants.
	IdleRatio float64 `json:"idle_ratio"`
	// MemoryPerTenantKiB is the slope of the idle relays' resident memory over
	// their tenant count (least squares over the cells of one database).
	MemoryPerTenantKiB float64 `json:"memory_per_tenant_kib"`

	Drains []TenantDrainRun `json:"drains"`
	// ThroughputRatio is the drain's events/s at the largest count of one
	// database over those at the smallest (the same events either way).
	ThroughputRatio float64 `json:"throughput_ratio"`

	Fairness *TenantFairness `json:"fairness,omitempty"`

	// Databases are the databases the run created and dropped.
	Databases []string `json:"databases"`
}

// TenantCell is what one relay process serves.
type TenantCell struct {
	// Mode is single (`relay --schema`, one outbox: the baseline), tenants
	// (`relay --tenants`, one database) or tenants-file (`relay
	// --tenants-file`, the tenants split over two databases).
	Mode      string `json:"mode"`
	Tenants   int    `json:"tenants"`
	Databases int    `json:"databases"`
}

// Modes of a TenantCell.
const (
	tenantModeSingle = "single"
	tenantModeGroup  = "tenants"
	tenantModeFile   = "tenants-file"
)

// Label names the cell in tables.
func (c TenantCell) Label() string {
	switch c.Mode {
	case tenantModeSingle:
		return "single outbox (--schema)"
	case tenantModeFile:
		return fmt.Sprintf("%d tenant%s in %d databases", c.Tenants, plural(c.Tenants), c.Databases)
	}
	return fmt.Sprintf("%d tenant%s", c.Tenants, plural(c.Tenants))
}

// TenantIdleCell is one relay process with nothing to do.
type TenantIdleCell struct {
	TenantCell
	Seconds float64 `json:"seconds"`
	// Queries are the statements (pg_stat_statements) or else the transactions
	// the relay ran in its databases during the window.
	Queries       int64   `json:"queries"`
	QueriesPerSec float64 `json:"queries_per_s"`
	// Transactions is the pg_stat_database xact_commit + xact_rollback delta.
	Transactions int64   `json:"transactions"`
	XactsPerSec  float64 `json:"xacts_per_s"`
	// RelayCPUMsPerSec is the relay process's CPU time (user + system) per
	// second of the window, in ms.
	RelayCPUMsPerSec float64 `json:"relay_cpu_ms_per_s"`
	// RSSMiB is the relay's resident memory at the end of the window (VmRSS);
	// PeakRSSMiB its peak since it started (VmHWM: start-up included).
	RSSMiB     float64 `json:"rss_mib"`
	PeakRSSMiB float64 `json:"peak_rss_mib"`
	// TopStatements are the most frequent statements of the window (with
	// pg_stat_statements only).
	TopStatements []StatementCalls `json:"top_statements,omitempty"`
}

// TenantDrainRun is one backlog, spread over a cell's tenants, drained by its
// relay process.
type TenantDrainRun struct {
	TenantCell
	Events       int     `json:"events"`
	Seconds      float64 `json:"seconds"`
	EventsPerSec float64 `json:"events_per_s"`
	// RatioToFewest divides EventsPerSec by the events/s of the run with the
	// fewest tenants (relay --tenants, one database).
	RatioToFewest float64 `json:"ratio_to_fewest"`
	// RelayCPUPerEventUs is the relay process's CPU time over its whole life
	// (start-up included) per event, in µs.
	RelayCPUPerEventUs float64 `json:"relay_cpu_us_per_event"`
	PeakRSSMiB         float64 `json:"peak_rss_mib"`
	// RoundEventsPerSec are the rounds' events/s; the other figures are their
	// means (peak RSS: the largest).
	RoundEventsPerSec []float64 `json:"round_events_per_s"`
	Published         int64     `json:"published"`
	BrokerMessages    int64     `json:"broker_messages"` // distinct events on the NATS stream; -1 when not observable
}

// TenantFairness is the quiet tenants' commit → broker latency without and
// with one hot tenant holding a backlog, from one relay process serving them all.
type TenantFairness struct {
	Tenants       int     `json:"tenants"`
	QuietTenants  int     `json:"quiet_tenants"`
	RatePerTenant float64 `json:"rate_per_tenant"`
	HotBacklog    int     `json:"hot_backlog"`
	// HotDrainSeconds is how long the hot backlog took to drain while the quiet
	// tenants received their trickle (seen by the harness, ±0.1 s).
	HotDrainSeconds float64 `json:"hot_drain_s"`
	// Baseline is the trickle with no backlog anywhere; Hot the trickle's events
	// committed while the hot tenant's backlog was not drained yet (those
	// committed after are left out: AfterHot counts them).
	Baseline TenantLatency `json:"baseline"`
	Hot      TenantLatency `json:"hot"`
	AfterHot int           `json:"after_hot"`
	// RatioP50 and RatioP99 divide Hot's percentiles by Baseline's.
	RatioP50   float64 `json:"ratio_p50"`
	RatioP99   float64 `json:"ratio_p99"`
	PeakRSSMiB float64 `json:"peak_rss_mib"`
	// Control is the hot run again with the hot tenant served by a relay
	// process of its own: what sharing the machine's CPUs with the drain costs
	// the quiet tenants, without sharing a process. Its ratios divide by
	// Baseline too.
	Control             TenantLatency `json:"control"`
	ControlDrainSeconds float64       `json:"control_hot_drain_s"`
	ControlRatioP50     float64       `json:"control_ratio_p50"`
	ControlRatioP99     float64       `json:"control_ratio_p99"`
}

// TenantLatency is a commit → seen-on-the-stream distribution, in ms.
type TenantLatency struct {
	Events           int     `json:"events"`
	Early            int     `json:"early"`
	AchievedRate     float64 `json:"achieved_rate"`
	MaxScheduleLagMs float64 `json:"max_schedule_lag_ms"`
	P50Ms            float64 `json:"p50_ms"`
	P90Ms            float64 `json:"p90_ms"`
	P99Ms            float64 `json:"p99_ms"`
	MaxMs            float64 `json:"max_ms"`
	MeanMs           float64 `json:"mean_ms"`
}

const tenantsMethod = "Every tenant is an outbox schema (t000, t001, …) of a database of the run's own: one " +
	"database is migrated once and copied (CREATE DATABASE … TEMPLATE) for each relay process, so that " +
	"pg_stat_database and pg_stat_statements count each process's queries apart. Cells: a relay with " +
	"--schema (one outbox, the baseline), `relay --tenants` with each tenant count in one database, and " +
	"`relay --tenants-file` with the largest count split over two databases (url_env entries: no URL on a " +
	"command line or in the file). " +
	"Idle: every cell's relay runs at once (null broker, --poll-interval as set, --db-max-conns 4; idle " +
	"cost does not depend on the pool size) against empty outboxes; once every outbox's idle lock is held " +
	"(pg_locks: the relay listens and waits) and 11 s more have passed (a server reports an idle backend's " +
	"counters up to 10 s late), the statements of each cell's databases are counted over the idle window " +
	"from pg_stat_statements, or without it from pg_stat_database xact_commit + xact_rollback, whose " +
	"deltas include every statement the relay runs outside a transaction block. Nothing else connects to " +
	"those databases. CPU from /proc/PID/stat, memory from /proc/PID/status (VmRSS at the window's end; " +
	"the slope over the tenant counts is the memory per tenant). " +
	"Drains, in two rounds (the second in the reverse order; figures are the rounds' means): the same events (--events over --aggregates, spread evenly over the cell's tenants, each " +
	"tenant's aggregates holding the same number of events) are written in one transaction per " +
	"database, committed back to back while the relay (default --db-max-conns, 10) runs and listens; " +
	"the clock runs from the first commit to the largest published_at (server clock); every event must be " +
	"published and on the NATS stream. Fairness: one relay serves the largest count in one database; the " +
	"quiet tenants (all but t000) receive a trickle of single-event transactions on an open-loop schedule " +
	"(--tenant-rate per tenant, round-robin over the tenants): for --duration right after t000's backlog of " +
	"--events events is committed, and for --duration with no backlog, in two halves before and after " +
	"(a CHECKPOINT before each run, where the role may); then, as a control, the hot run again with t000 " +
	"served by a relay process of its own beside one serving the quiet tenants. Latency = the instant an ordered JetStream " +
	"consumer (filtered to the quiet tenants' subjects) sees the event − the instant the producer's COMMIT " +
	"returned, as in the latency scenario; with the hot tenant, only events committed before the harness " +
	"saw t000 drained count."

// tenantDB is one database of the scenario, a copy of the template.
type tenantDB struct {
	name string
	url  string
}

// tenantCellDBs is a cell and the databases it runs in.
type tenantCellDBs struct {
	TenantCell
	dbs  []tenantDB
	sels []string // per database: the selector (the schema, for single)
}

func (cl tenantCellDBs) dbNames() []string {
	var out []string
	for _, d := range cl.dbs {
		out = append(out, d.name)
	}
	return out
}

// opts are the flags of the cell's relay, publishing to b.
func (tr *tenantsRun) opts(cl tenantCellDBs, b *brokerEnv, extra ...string) (relayOpts, error) {
	o := relayOpts{broker: b, dbURL: cl.dbs[0].url, extra: extra}
	switch cl.Mode {
	case tenantModeSingle:
		o.schema = cl.sels[0]
	case tenantModeGroup:
		o.tenants = cl.sels[0]
	default:
		f, env, err := tr.tenantsFile(cl.dbs, cl.sels)
		if err != nil {
			return o, err
		}
		o.tenantsFile, o.env = f, env
	}
	return o, nil
}

// tenantsRun is the scenario's state: its databases and tenant names.
type tenantsRun struct {
	r     *Runner
	names []string // t000, t001, …: the schemas of every database
	tmpl  string   // the migrated template database
	dbs   []string // every database created, dropped at the end
	dir   string   // the --tenants-file's directory
}

func tenantName(i int) string { return fmt.Sprintf("t%03d", i) }

func (r *Runner) tenants(ctx context.Context) (*TenantsResult, error) {
	c := r.cfg
	counts := slices.Clone(c.TenantCounts)
	slices.Sort(counts)
	counts = slices.Compact(counts)
	most := counts[len(counts)-1]
	tr := &tenantsRun{r: r}
	for i := range most {
		tr.names = append(tr.names, tenantName(i))
	}
	res := &TenantsResult{Method: tenantsMethod, Counts: counts}
	defer func() {
		res.Databases = tr.dbs
		tr.cleanup()
	}()

	r.prog.step("tenants: migrating %d outbox schemas", most)
	if err := tr.template(ctx); err != nil {
		return nil, err
	}
	// The cells, each in databases of its own.
	var cells []tenantCellDBs
	add := func(tc TenantCell, sels ...string) error {
		cl := tenantCellDBs{TenantCell: tc, sels: sels}
		for range sels {
			d, err := tr.clone(ctx)
			if err != nil {
				return err
			}
			cl.dbs = append(cl.dbs, d)
		}
		cells = append(cells, cl)
		return nil
	}
	r.prog.step("tenants: copying the databases")
	if err := add(TenantCell{Mode: tenantModeSingle, Tenants: 1, Databases: 1}, tr.names[0]); err != nil {
		return nil, err
	}
	for _, k := range counts {
		if err := add(TenantCell{Mode: tenantModeGroup, Tenants: k, Databases: 1}, strings.Join(tr.names[:k], ",")); err != nil {
			return nil, err
		}
	}
	half := most / 2
	if err := add(TenantCell{Mode: tenantModeFile, Tenants: most, Databases: 2},
		strings.Join(tr.names[:half], ","), strings.Join(tr.names[half:], ",")); err != nil {
		return nil, err
	}
	// Idle: every cell at once, each in its own databases.
	null, err := r.broker(ctx, "null")
	if err != nil {
		return nil, err
	}
	pgss := r.statStatements(ctx)
	res.IdleSource = "pg_stat_database"
	if pgss {
		res.IdleSource = "pg_stat_statements"
	}
	if res.Idle, err = tr.idle(ctx, cells, null, pgss); err != nil {
		return res, fmt.Errorf("idle: %w", err)
	}
	res.IdleRatio, res.MemoryPerTenantKiB = idleFigures(res.Idle)

	// Drains to NATS, in two rounds, the second in the reverse order, so that
	// a drift of the machine's speed weighs on every cell alike; each cell's
	// figures are the mean of its rounds.
	b, err := r.natsBroker(ctx)
	if err != nil {
		return res, err
	}
	res.Broker = b.name
	order := make([]int, 0, 2*len(cells))
	for i := range cells {
		order = append(order, i)
	}
	for i := range cells {
		order = append(order, len(cells)-1-i)
	}
	rounds := make([][]TenantDrainRun, len(cells))
	for _, i := range order {
		cl := cells[i]
		o, err := tr.opts(cl, b)
		if err != nil {
			return res, err
		}
		run, err := tr.drain(ctx, cl.TenantCell, cl.dbs, cl.sels, o)
		if err != nil {
			return res, fmt.Errorf("drain, %s: %w", cl.Label(), err)
		}
		rounds[i] = append(rounds[i], *run)
	}
	for _, rs := range rounds {
		res.Drains = append(res.Drains, meanDrain(rs))
	}
	res.ThroughputRatio = throughputFigures(res.Drains)

	// Fairness: the largest count of one database, in a copy of the template.
	fair, err := tr.clone(ctx)
	if err != nil {
		return res, err
	}
	o := relayOpts{broker: b, dbURL: fair.url, tenants: strings.Join(tr.names, ",")}
	if res.Fairness, err = tr.fairness(ctx, fair, o); err != nil {
		return res, fmt.Errorf("fairness: %w", err)
	}
	return res, nil
}

// idle runs every cell's relay at once (null broker) against empty outboxes
// and counts what each sends to its databases over the idle window.
func (tr *tenantsRun) idle(ctx context.Context, cells []tenantCellDBs, null *brokerEnv, pgss bool) ([]TenantIdleCell, error) {
	r, c := tr.r, tr.r.cfg
	var out []TenantIdleCell
	r.prog.step("tenants: starting %d idle relays", len(cells))
	idle := make([]*relayProc, len(cells))
	var all []*relayProc
	var allDBs []string
	want := 0
	for i, cl := range cells {
		var extra []string
		if cl.Mode != tenantModeSingle {
			extra = []string{"--db-max-conns", "4"}
		}
		o, err := tr.opts(cl, null, extra...)
		if err != nil {
			stopRelays(all)
			return nil, err
		}
		ps, err := r.startRelays(ctx, 1, o)
		if err != nil {
			stopRelays(all)
			return nil, err
		}
		idle[i] = ps[0]
		all = append(all, ps[0])
		allDBs = append(allDBs, cl.dbNames()...)
		want += cl.Tenants
	}
	defer stopRelays(all)
	if err := r.waitIdleLocks(ctx, allDBs, want, all); err != nil {
		return nil, err
	}
	settle := min(11*time.Second, c.IdleDuration)
	r.prog.step("tenants: every relay idle; settling %s", settle)
	if !sleepCtx(ctx, settle) {
		return nil, ctx.Err()
	}
	type snap struct {
		q, x  int64
		epoch string
		cpu   time.Duration
		stmts map[string]int64
	}
	take := func() ([]snap, error) {
		out := make([]snap, len(cells))
		for i, cl := range cells {
			for _, d := range cl.dbs {
				q, x, st, ep, err := r.idleSnapshot(ctx, d.name, pgss)
				if err != nil {
					return nil, err
				}
				if out[i].stmts == nil {
					out[i].stmts = map[string]int64{}
				}
				for k, v := range st {
					out[i].stmts[k] += v
				}
				out[i].q += q
				out[i].x += x
				out[i].epoch += ep
			}
			out[i].cpu = procCPU(idle[i].cmd.Process.Pid)
		}
		return out, nil
	}
	s0, err := take()
	if err != nil {
		return nil, err
	}
	start := time.Now()
	for time.Since(start) < c.IdleDuration {
		if err := sampleAll(all); err != nil {
			return nil, err
		}
		r.prog.update("tenants: watching %d idle relays, %.0fs left", len(all), (c.IdleDuration - time.Since(start)).Seconds())
		if !sleepCtx(ctx, min(250*time.Millisecond, c.IdleDuration-time.Since(start))) {
			return nil, ctx.Err()
		}
	}
	s1, err := take()
	if err != nil {
		return nil, err
	}
	el := time.Since(start)
	for i, cl := range cells {
		rss := procRSS(idle[i].cmd.Process.Pid)
		idle[i].sampleRSS()
		ic := TenantIdleCell{TenantCell: cl.TenantCell, Seconds: round3(el.Seconds()),
			Transactions: s1[i].x - s0[i].x, RSSMiB: round2(float64(rss) / (1 << 20)),
			PeakRSSMiB:       round2(float64(idle[i].peak()) / (1 << 20)),
			RelayCPUMsPerSec: round3(float64((s1[i].cpu - s0[i].cpu).Microseconds()) / 1000 / el.Seconds())}
		ic.XactsPerSec = round3(float64(ic.Transactions) / el.Seconds())
		ic.Queries = ic.Transactions
		if pgss {
			if s1[i].epoch != s0[i].epoch || s1[i].q < s0[i].q {
				return nil, errors.New("pg_stat_statements evicted or reset entries during the idle window: run again")
			}
			ic.Queries = s1[i].q - s0[i].q
			for q, n := range s1[i].stmts {
				if d := n - s0[i].stmts[q]; d > 0 {
					ic.TopStatements = append(ic.TopStatements, StatementCalls{Calls: d, Query: oneLine(q, 160)})
				}
			}
			slices.SortFunc(ic.TopStatements, func(a, b StatementCalls) int { return int(b.Calls - a.Calls) })
			ic.TopStatements = ic.TopStatements[:min(5, len(ic.TopStatements))]
		}
		ic.QueriesPerSec = round3(float64(ic.Queries) / el.Seconds())
		out = append(out, ic)
	}
	return out, stopRelays(all)
}

// template creates the template database and migrates an outbox in each of
// the tenants' schemas.
func (tr *tenantsRun) template(ctx context.Context) error {
	d, err := tr.create(ctx, "")
	if err != nil {
		return err
	}
	tr.tmpl = d.name
	p, err := pgxpool.New(ctx, d.url)
	if err != nil {
		return fmt.Errorf("connect to the template database: %w", err)
	}
	defer p.Close() // before any copy: CREATE DATABASE … TEMPLATE wants it unused
	for i, s := range tr.names {
		if _, err := migrate.Up(ctx, p, &migrate.Config{Schema: s, Lines: []migrate.Line{migrate.LineOutbox}}); err != nil {
			return fmt.Errorf("migrate schema %s: %w", s, err)
		}
		tr.r.prog.update("tenants: migrated %d/%d outbox schemas", i+1, len(tr.names))
	}
	return nil
}

// create makes a database, empty or a copy of template.
func (tr *tenantsRun) create(ctx context.Context, template string) (tenantDB, error) {
	name := "pgoutbox_bench_tenants_" + randHex(4)
	q := "CREATE DATABASE " + pgx.Identifier{name}.Sanitize()
	if template != "" {
		q += " TEMPLATE " + pgx.Identifier{template}.Sanitize()
	}
	if _, err := tr.r.admin.Exec(ctx, q); err != nil {
		return tenantDB{}, fmt.Errorf("create database: %w", err)
	}
	tr.dbs = append(tr.dbs, name)
	u, err := withDatabase(tr.r.cfg.DatabaseURL, name)
	if err != nil {
		return tenantDB{}, err
	}
	return tenantDB{name: name, url: u}, nil
}

func (tr *tenantsRun) clone(ctx context.Context) (tenantDB, error) { return tr.create(ctx, tr.tmpl) }

// cleanup drops every database of the run and the tenants files.
func (tr *tenantsRun) cleanup() {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	for _, d := range slices.Backward(tr.dbs) {
		if _, err := tr.r.admin.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{d}.Sanitize()+" WITH (FORCE)"); err != nil {
			tr.r.cfg.Logger.Warn("could not drop benchmark database", slog.String("database", d), slog.Any("error", err))
		}
	}
	if tr.dir != "" {
		_ = os.RemoveAll(tr.dir)
	}
}

// tenantsFile writes a --tenants-file serving sels[i] of dbs[i], and returns
// it with the environment holding the databases' URLs (url_env: no URL in the
// file, none on a command line).
func (tr *tenantsRun) tenantsFile(dbs []tenantDB, sels []string) (string, []string, error) {
	if tr.dir == "" {
		dir, err := os.MkdirTemp("", "pgoutbox-bench-tenants")
		if err != nil {
			return "", nil, err
		}
		tr.dir = dir
	}
	var b strings.Builder
	var env []string
	b.WriteString("databases:\n")
	for i, d := range dbs {
		v := "PGOUTBOX_BENCH_TENANTS_DB_" + strconv.Itoa(i+1)
		// Database names are randHex; selectors are tenant names and commas.
		fmt.Fprintf(&b, "  - name: %s\n    url_env: %s\n    schemas: %q\n", d.name, v, sels[i])
		env = append(env, v+"="+d.url)
	}
	f := filepath.Join(tr.dir, "tenants-"+randHex(4)+".yaml")
	if err := os.WriteFile(f, []byte(b.String()), 0o600); err != nil {
		return "", nil, err
	}
	return f, env, nil
}

// idleLocksSQL counts the idle locks held in some databases: a relay holds
// its outbox's (exclusive, session-level, advisory) once it listens and every
// worker waits for work.
const idleLocksSQL = `SELECT count(*) FROM pg_locks l JOIN pg_database d ON d.oid = l.database
 WHERE l.locktype = 'advisory' AND l.granted AND l.mode = 'ExclusiveLock' AND d.datname = ANY($1)`

// waitIdleLocks waits until the relays hold want idle locks in dbs: every
// outbox served, listened to and idle.
func (r *Runner) waitIdleLocks(ctx context.Context, dbs []string, want int, procs []*relayProc) error {
	deadline := time.Now().Add(time.Minute + time.Duration(want)*100*time.Millisecond)
	for {
		var n int
		if err := r.admin.QueryRow(ctx, idleLocksSQL, dbs).Scan(&n); err != nil {
			return fmt.Errorf("count idle locks: %w", err)
		}
		if n >= want {
			return nil
		}
		if err := sampleAll(procs); err != nil {
			return err
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%d of %d outboxes idle and listened to after %s: %s", n, want, time.Minute, tails(procs))
		}
		r.prog.update("tenants: %d/%d outboxes served and idle", n, want)
		if !sleepCtx(ctx, 50*time.Millisecond) {
			return ctx.Err()
		}
	}
}

// tenantBacklog is one tenant's share of a drain.
type tenantBacklog struct {
	s          *outboxSchema
	events     int
	aggregates int
}

// shares spreads events and aggregates evenly over schemas.
func shares(schemas []string, events, aggregates int) []tenantBacklog {
	k := len(schemas)
	out := make([]tenantBacklog, k)
	for i, s := range schemas {
		n := events / k
		if i < events%k {
			n++
		}
		out[i] = tenantBacklog{s: schemaOf(s), events: n, aggregates: max(1, min(n, aggregates/k))}
	}
	return out
}

func schemaOf(name string) *outboxSchema {
	return &outboxSchema{name: name, events: pgx.Identifier{name, "outbox_events"}.Sanitize(),
		seqs: pgx.Identifier{name, "outbox_aggregate_sequences"}.Sanitize()}
}

// drain starts the cell's relay, commits the backlog (one transaction per
// database) and waits until every event is published.
func (tr *tenantsRun) drain(ctx context.Context, cell TenantCell, dbs []tenantDB, sels []string, o relayOpts) (*TenantDrainRun, error) {
	r, c := tr.r, tr.r.cfg
	if err := o.broker.reset(ctx); err != nil {
		return nil, err
	}
	pools := make([]*pgxpool.Pool, len(dbs))
	backlogs := make([][]tenantBacklog, len(dbs))
	var all []string
	for i := range dbs {
		all = append(all, strings.Split(sels[i], ",")...)
	}
	per := shares(all, c.Events, c.Aggregates)
	k := 0
	for i, d := range dbs {
		p, err := pgxpool.New(ctx, d.url)
		if err != nil {
			return nil, fmt.Errorf("connect: %w", err)
		}
		defer p.Close()
		pools[i] = p
		n := len(strings.Split(sels[i], ","))
		backlogs[i] = per[k : k+n]
		k += n
	}
	for i, p := range pools { // empty after an earlier round
		for _, b := range backlogs[i] {
			if _, err := p.Exec(ctx, "TRUNCATE "+b.s.events+", "+b.s.seqs); err != nil {
				return nil, fmt.Errorf("empty tenant %s: %w", b.s.name, err)
			}
		}
	}
	r.prog.step("tenants: drain, %s: starting the relay", cell.Label())
	procs, err := r.startRelays(ctx, 1, o)
	if err != nil {
		return nil, err
	}
	defer stopRelays(procs)
	names := make([]string, len(dbs))
	for i, d := range dbs {
		names[i] = d.name
	}
	if err := r.waitIdleLocks(ctx, names, cell.Tenants, procs); err != nil {
		return nil, err
	}
	r.prog.step("tenants: drain, %s: loading %d events", cell.Label(), c.Events)
	t0, err := commitBacklogs(ctx, pools, backlogs, c.PayloadBytes)
	if err != nil {
		return nil, err
	}
	start := time.Now()
	deadline := start.Add(max(5*time.Minute, time.Duration(c.Events/200)*time.Second))
	// Tenants done stay done (nothing else writes): each tick probes the first
	// tenant not known to be done, and the next ones once it is.
	type pending struct {
		pool *pgxpool.Pool
		b    tenantBacklog
	}
	var left []pending
	for i := range pools {
		for _, b := range backlogs[i] {
			left = append(left, pending{pools[i], b})
		}
	}
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for len(left) > 0 {
		if err := sampleOnTick(ctx, tick.C, procs); err != nil {
			return nil, err
		}
		for len(left) > 0 {
			var done bool
			if err := left[0].pool.QueryRow(ctx, "SELECT NOT EXISTS (SELECT 1 FROM "+left[0].b.s.events+" WHERE published_at IS NULL)").Scan(&done); err != nil {
				return nil, fmt.Errorf("check unpublished: %w", err)
			}
			if !done {
				break
			}
			left = left[1:]
		}
		r.prog.update("tenants: drain, %s: %d/%d tenants drained", cell.Label(), len(per)-len(left), len(per))
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("%d tenants still hold unpublished events after %s; the relay's last lines: %s",
				len(left), time.Since(start).Round(time.Second), tails(procs))
		}
	}
	if err := stopRelays(procs); err != nil {
		return nil, err
	}
	run := &TenantDrainRun{TenantCell: cell, Events: c.Events, BrokerMessages: -1, PeakRSSMiB: maxRSSMiB(rssOf(procs)),
		RelayCPUPerEventUs: round2(float64(procs[0].cpu().Microseconds()) / float64(c.Events))}
	var end time.Time
	for i, p := range pools {
		var parts []string
		for _, b := range backlogs[i] {
			parts = append(parts, "SELECT max(published_at) AS m, count(*) FILTER (WHERE published_at IS NOT NULL) AS n FROM "+b.s.events)
		}
		var last time.Time
		var pub int64
		if err := p.QueryRow(ctx, "SELECT max(m), sum(n)::bigint FROM ("+strings.Join(parts, " UNION ALL ")+") x").Scan(&last, &pub); err != nil {
			return nil, fmt.Errorf("last publish: %w", err)
		}
		if last.After(end) {
			end = last
		}
		run.Published += pub
	}
	if run.Published != int64(c.Events) {
		return nil, fmt.Errorf("%d of %d events published", run.Published, c.Events)
	}
	el := max(end.Sub(t0), time.Millisecond)
	run.Seconds = round3(el.Seconds())
	run.EventsPerSec = round2(float64(c.Events) / el.Seconds())
	if o.broker.isNATS() {
		m, err := o.broker.messages(ctx)
		if err != nil {
			return nil, err
		}
		run.BrokerMessages = int64(m)
		if m != uint64(c.Events) {
			return nil, fmt.Errorf("stream %s holds %d distinct events, want %d", o.broker.stream, m, c.Events)
		}
	}
	return run, nil
}

// meanDrain folds a cell's rounds into one run: mean seconds, events/s and
// CPU, the largest peak RSS; every round published every event.
func meanDrain(rs []TenantDrainRun) TenantDrainRun {
	out := rs[0]
	out.Seconds, out.EventsPerSec, out.RelayCPUPerEventUs = 0, 0, 0
	for _, r := range rs {
		out.RoundEventsPerSec = append(out.RoundEventsPerSec, r.EventsPerSec)
		out.Seconds += r.Seconds / float64(len(rs))
		out.EventsPerSec += r.EventsPerSec / float64(len(rs))
		out.RelayCPUPerEventUs += r.RelayCPUPerEventUs / float64(len(rs))
		out.PeakRSSMiB = max(out.PeakRSSMiB, r.PeakRSSMiB)
	}
	out.Seconds, out.EventsPerSec, out.RelayCPUPerEventUs = round3(out.Seconds), round2(out.EventsPerSec), round2(out.RelayCPUPerEventUs)
	return out
}

// commitBacklogs writes each database's backlogs in a transaction of its own
// and commits them back to back; it returns the server's clock right after
// the first commit, when the first events became visible.
func commitBacklogs(ctx context.Context, pools []*pgxpool.Pool, backlogs [][]tenantBacklog, payload int) (time.Time, error) {
	txs := make([]pgx.Tx, len(pools))
	defer func() {
		for _, tx := range txs {
			if tx != nil {
				_ = tx.Rollback(context.Background()) // no-op once committed
			}
		}
	}()
	for i, p := range pools {
		tx, err := p.Begin(ctx)
		if err != nil {
			return time.Time{}, err
		}
		txs[i] = tx
		for _, b := range backlogs[i] {
			if err := backlogTx(ctx, tx, b.s, b.events, b.aggregates, payload, "a", false); err != nil {
				return time.Time{}, fmt.Errorf("tenant %s: %w", b.s.name, err)
			}
		}
	}
	var t0 time.Time
	for i, tx := range txs {
		if err := tx.Commit(ctx); err != nil {
			return time.Time{}, fmt.Errorf("commit the backlog: %w", err)
		}
		if i == 0 {
			if err := pools[0].QueryRow(ctx, "SELECT clock_timestamp()").Scan(&t0); err != nil {
				return time.Time{}, err
			}
		}
	}
	return t0, nil
}

// fairness measures the quiet tenants' latency without and with a hot
// tenant's backlog, from one relay serving every tenant of d.
func (tr *tenantsRun) fairness(ctx context.Context, d tenantDB, o relayOpts) (*TenantFairness, error) {
	r, c := tr.r, tr.r.cfg
	hot, quiet := schemaOf(tr.names[0]), tr.names[1:]
	f := &TenantFairness{Tenants: len(tr.names), QuietTenants: len(quiet), RatePerTenant: c.TenantRate, HotBacklog: c.Events}
	b := o.broker
	r.prog.step("tenants: fairness: starting a relay serving %d tenants", len(tr.names))
	procs, err := r.startRelays(ctx, 1, o)
	if err != nil {
		return nil, err
	}
	defer stopRelays(procs)
	if err := r.waitIdleLocks(ctx, []string{d.name}, len(tr.names), procs); err != nil {
		return nil, err
	}
	rate := c.TenantRate * float64(len(quiet))
	producers := min(64, max(8, int(rate/25)))
	pool, err := producerPoolOn(ctx, d.url, producers, true)
	if err != nil {
		return nil, err
	}
	defer pool.Close()
	prods := make([]*pgoutbox.Producer, len(quiet))
	for i, s := range quiet {
		if prods[i], err = pgoutbox.NewProducer(&pgoutbox.Config{Schema: s}); err != nil {
			return nil, err
		}
	}
	pad := strings.Repeat("x", max(0, c.PayloadBytes-40))
	payload := map[string]any{"pad": pad}
	if err := b.reset(ctx); err != nil {
		return nil, err
	}
	if err := r.warmUp(ctx, b, procs, pool, producers, prods, payload); err != nil {
		return nil, err
	}
	newProbe := func(label string, d time.Duration) *latencyProbe {
		n := max(1, int(rate*d.Seconds()))
		p := &latencyProbe{r: r, b: b, mode: "tenants", label: label, rate: rate, n: n, procs: procs,
			producers: producers, pool: pool, prods: prods, payload: payload, filter: b.prefix + ".*.order",
			ids: make([]pgoutbox.UUID, n), index: make(map[pgoutbox.UUID]int, n),
			committed: make([]atomic.Int64, n), seen: make([]atomic.Int64, n)}
		for i := range p.ids {
			p.ids[i] = pgoutbox.NewEventID()
			p.index[p.ids[i]] = i
		}
		return p
	}
	trickle := func(p *latencyProbe, during func()) (time.Duration, error) {
		if err := b.reset(ctx); err != nil {
			return 0, err
		}
		// Each run starts with no dirty buffers left by the one before (the
		// drains, the hot backlog): a checkpoint in one run and not in the
		// other would be in the ratio. Best effort: it needs a superuser or
		// pg_checkpoint.
		if _, err := r.admin.Exec(ctx, "CHECKPOINT"); err != nil {
			r.cfg.Logger.Info("tenants: no CHECKPOINT before the fairness run", slog.Any("error", err))
		}
		cc, err := p.subscribe(ctx)
		if err != nil {
			return 0, err
		}
		defer cc.Stop()
		if during != nil {
			during()
		}
		produced, err := p.offer(ctx)
		if err != nil {
			return 0, err
		}
		return produced, p.awaitAll(ctx)
	}

	// The baseline runs in two halves, before and after the hot run, so that a
	// drift of the machine's speed weighs on both sides of the ratio.
	base1 := newProbe("tenants: fairness, no backlog (1/2)", c.Duration/2)
	produced1, err := trickle(base1, nil)
	if err != nil {
		return nil, err
	}

	// The hot tenant's backlog, committed just before the trickle starts; a
	// watcher notes when the harness sees it drained.
	hotPool, err := pgxpool.New(ctx, d.url)
	if err != nil {
		return nil, err
	}
	defer hotPool.Close()
	// hotRun offers the trickle for --duration right after the hot backlog is
	// committed, and keeps the events committed before the harness saw the
	// backlog drained.
	hotRun := func(label string) (lat TenantLatency, after int, drained time.Duration, err error) {
		if _, err := hotPool.Exec(ctx, "TRUNCATE "+hot.events+", "+hot.seqs); err != nil {
			return lat, 0, 0, fmt.Errorf("empty the hot tenant: %w", err)
		}
		var w *hotWatch
		hp := newProbe(label, c.Duration)
		produced, err := trickle(hp, func() {
			r.prog.step("tenants: fairness: loading %d events into %s", c.Events, hot.name)
			w = watchHot(ctx, hotPool, hot, c.Events, c.Aggregates, c.PayloadBytes)
		})
		if werr := w.wait(ctx, max(5*time.Minute, time.Duration(c.Events/200)*time.Second)); werr != nil {
			return lat, 0, 0, fmt.Errorf("%w: %s", werr, tails(procs))
		}
		if err != nil {
			return lat, 0, 0, err
		}
		endNs := w.end.UnixNano()
		h, early := hp.histogram(func(i int) bool { return hp.committed[i].Load() < endNs })
		lat = latencyOf(h, early, hp.n, hp.lagMax.Load(), produced)
		return lat, hp.n - lat.Events, w.end.Sub(w.start), nil
	}
	hotLat, after, drained, err := hotRun("tenants: fairness, hot backlog")
	if err != nil {
		return nil, err
	}
	f.Hot, f.AfterHot, f.HotDrainSeconds = hotLat, after, round3(drained.Seconds())

	base2 := newProbe("tenants: fairness, no backlog (2/2)", c.Duration-c.Duration/2)
	produced2, err := trickle(base2, nil)
	if err != nil {
		return nil, err
	}
	h, early := base1.histogram(nil)
	h2, early2 := base2.histogram(nil)
	h.Merge(h2)
	f.Baseline = latencyOf(h, early+early2, base1.n+base2.n, max(base1.lagMax.Load(), base2.lagMax.Load()), produced1+produced2)
	if err := stopRelays(procs); err != nil {
		return nil, err
	}
	f.PeakRSSMiB = maxRSSMiB(rssOf(procs))
	f.RatioP50 = ratio(f.Hot.P50Ms, f.Baseline.P50Ms)
	f.RatioP99 = ratio(f.Hot.P99Ms, f.Baseline.P99Ms)

	// Control: the same backlog drained by a relay process of its own while
	// another serves the quiet tenants. Its ratio is what sharing the machine's
	// CPUs with the drain costs them; the difference is the shared process's.
	r.prog.step("tenants: fairness control: starting a relay for %s and one for the quiet tenants", hot.name)
	oq, oh := o, o
	oq.tenants, oh.tenants = strings.Join(quiet, ","), hot.name
	if procs, err = r.startRelays(ctx, 1, oq); err != nil {
		return nil, err
	}
	defer stopRelays(procs)
	hotProc, err := r.startRelays(ctx, 1, oh)
	if err != nil {
		return nil, err
	}
	defer stopRelays(hotProc)
	procs = append(procs, hotProc...)
	if err := r.waitIdleLocks(ctx, []string{d.name}, len(tr.names), procs); err != nil {
		return nil, err
	}
	if f.Control, _, drained, err = hotRun("tenants: fairness control, hot backlog in another process"); err != nil {
		return nil, fmt.Errorf("control: %w", err)
	}
	f.ControlDrainSeconds = round3(drained.Seconds())
	if err := stopRelays(procs); err != nil {
		return nil, err
	}
	f.ControlRatioP50 = ratio(f.Control.P50Ms, f.Baseline.P50Ms)
	f.ControlRatioP99 = ratio(f.Control.P99Ms, f.Baseline.P99Ms)
	return f, nil
}

// hotWatch is the hot backlog: committed at start, seen drained at end.
type hotWatch struct {
	start, end time.Time
	err        error
	done       chan struct{}
	stop       context.CancelFunc
}

// watchHot commits a backlog of events to hot and watches, every 100 ms, for
// it to be drained.
func watchHot(ctx context.Context, pool *pgxpool.Pool, hot *outboxSchema, events, aggregates, payload int) *hotWatch {
	w := &hotWatch{done: make(chan struct{})}
	if _, w.err = commitBacklogs(ctx, []*pgxpool.Pool{pool}, [][]tenantBacklog{{{s: hot, events: events, aggregates: aggregates}}}, payload); w.err != nil {
		close(w.done)
		return w
	}
	w.start = time.Now()
	wctx, stop := context.WithCancel(ctx)
	w.stop = stop
	go func() {
		defer close(w.done)
		for {
			var done bool
			if err := pool.QueryRow(wctx, "SELECT NOT EXISTS (SELECT 1 FROM "+hot.events+" WHERE published_at IS NULL)").Scan(&done); err != nil {
				if wctx.Err() == nil {
					w.err = fmt.Errorf("check the hot tenant: %w", err)
				}
				return
			}
			if done {
				w.end = time.Now()
				return
			}
			if !sleepCtx(wctx, 100*time.Millisecond) {
				return
			}
		}
	}()
	return w
}

// wait waits up to within for the backlog to be drained (w nil: it was never
// loaded).
func (w *hotWatch) wait(ctx context.Context, within time.Duration) error {
	if w == nil {
		return errors.New("the hot backlog was not loaded")
	}
	select {
	case <-w.done:
	case <-time.After(within):
	case <-ctx.Done():
	}
	if w.stop != nil {
		w.stop()
	}
	<-w.done
	switch {
	case ctx.Err() != nil:
		return ctx.Err()
	case w.err != nil:
		return w.err
	case w.end.IsZero():
		return fmt.Errorf("the hot tenant's backlog was not drained within %s", within)
	}
	return nil
}

// latencyOf is a TenantLatency of h (µs): offered events committed in
// produced, the worst commit lagMax ns behind its schedule.
func latencyOf(h *hdrhistogram.Histogram, early, offered int, lagMax int64, produced time.Duration) TenantLatency {
	ms := func(q float64) float64 { return round3(float64(h.ValueAtQuantile(q)) / 1000) }
	return TenantLatency{Events: int(h.TotalCount()), Early: early, AchievedRate: round2(float64(offered) / produced.Seconds()),
		MaxScheduleLagMs: round3(float64(lagMax) / 1e6),
		P50Ms:            ms(50), P90Ms: ms(90), P99Ms: ms(99), MaxMs: round3(float64(h.Max()) / 1000), MeanMs: round3(h.Mean() / 1000)}
}

// idleFigures are the idle queries/s at the most tenants of one database over
// those at the fewest, and the slope of resident memory over tenants (KiB per
// tenant, least squares) in the cells of one database.
func idleFigures(cells []TenantIdleCell) (ratioQ, kibPerTenant float64) {
	var xs, ys []float64
	var fewest, most *TenantIdleCell
	for i := range cells {
		c := &cells[i]
		if c.Mode != tenantModeGroup {
			continue
		}
		xs, ys = append(xs, float64(c.Tenants)), append(ys, c.RSSMiB*1024)
		if fewest == nil || c.Tenants < fewest.Tenants {
			fewest = c
		}
		if most == nil || c.Tenants > most.Tenants {
			most = c
		}
	}
	if fewest != nil && most != fewest {
		ratioQ = ratio(most.QueriesPerSec, fewest.QueriesPerSec)
	}
	return ratioQ, round2(slope(xs, ys))
}

// throughputFigures is the drain's events/s at the most tenants of one
// database over those at the fewest; it sets each run's RatioToFewest.
func throughputFigures(runs []TenantDrainRun) float64 {
	var fewest, most *TenantDrainRun
	for i := range runs {
		r := &runs[i]
		if r.Mode != tenantModeGroup {
			continue
		}
		if fewest == nil || r.Tenants < fewest.Tenants {
			fewest = r
		}
		if most == nil || r.Tenants > most.Tenants {
			most = r
		}
	}
	if fewest == nil {
		return 0
	}
	for i := range runs {
		runs[i].RatioToFewest = ratio(runs[i].EventsPerSec, fewest.EventsPerSec)
	}
	if most == fewest {
		return 0
	}
	return ratio(most.EventsPerSec, fewest.EventsPerSec)
}

// slope is the least-squares slope of ys over xs; 0 with fewer than two
// distinct xs.
func slope(xs, ys []float64) float64 {
	n := float64(len(xs))
	if len(xs) < 2 {
		return 0
	}
	var sx, sy, sxx, sxy float64
	for i := range xs {
		sx, sy, sxx, sxy = sx+xs[i], sy+ys[i], sxx+xs[i]*xs[i], sxy+xs[i]*ys[i]
	}
	d := n*sxx - sx*sx
	if d == 0 {
		return 0
	}
	return (n*sxy - sx*sy) / d
}

// procCPU is a process's CPU time so far (user + system, /proc/PID/stat in
// clock ticks of 10 ms, Linux's USER_HZ); 0 where there is no /proc.
func procCPU(pid int) time.Duration {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	// pid (comm) state ppid …: comm may hold spaces and parentheses.
	i := strings.LastIndexByte(string(b), ')')
	if i < 0 {
		return 0
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 13 {
		return 0
	}
	u, err1 := strconv.ParseInt(f[11], 10, 64)
	s, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0
	}
	return time.Duration(u+s) * 10 * time.Millisecond
}

// procRSS is a process's resident memory now (VmRSS), in bytes; 0 where
// there is no /proc.
func procRSS(pid int) int64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "VmRSS:"); ok {
			if f := strings.Fields(v); len(f) >= 1 {
				if kb, err := strconv.ParseInt(f[0], 10, 64); err == nil {
					return kb * 1024
				}
			}
		}
	}
	return 0
}

// writeText prints the tenants scenario's tables.
func (t *TenantsResult) writeText(w io.Writer) {
	fmt.Fprintf(w, "\ntenants: one relay process serving many outboxes\n")
	if len(t.Idle) > 0 {
		fmt.Fprintf(w, "idle (%s, %.0fs):\n", t.IdleSource, t.Idle[0].Seconds)
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintln(tw, "relay serves\tqueries/s\ttransactions/s\trelay CPU ms/s\tRSS MiB\tpeak RSS MiB\t")
		for _, c := range t.Idle {
			fmt.Fprintf(tw, "%s\t%.3f\t%.3f\t%.2f\t%.1f\t%.1f\t\n", c.Label(), c.QueriesPerSec, c.XactsPerSec, c.RelayCPUMsPerSec, c.RSSMiB, c.PeakRSSMiB)
		}
		tw.Flush()
		fmt.Fprintf(w, "idle queries/s, most / fewest tenants of one database: %.2f; memory per tenant: %.0f KiB\n", t.IdleRatio, t.MemoryPerTenantKiB)
		for _, c := range t.Idle {
			for _, s := range c.TopStatements {
				fmt.Fprintf(w, "  %s: %6d × %s\n", c.Label(), s.Calls, oneLine(s.Query, 90))
			}
		}
	}
	if len(t.Drains) > 0 {
		fmt.Fprintf(w, "drain to %s, %d events spread over the tenants:\n", t.Broker, t.Drains[0].Events)
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintln(tw, "relay serves\tseconds\tevents/s\trounds' events/s\t× fewest\trelay CPU µs/event\tpeak RSS MiB\t")
		for _, r := range t.Drains {
			var rounds []string
			for _, e := range r.RoundEventsPerSec {
				rounds = append(rounds, fmt.Sprintf("%.0f", e))
			}
			fmt.Fprintf(tw, "%s\t%.3f\t%.0f\t%s\t%.2f\t%.1f\t%.1f\t\n", r.Label(), r.Seconds, r.EventsPerSec, strings.Join(rounds, ", "), r.RatioToFewest, r.RelayCPUPerEventUs, r.PeakRSSMiB)
		}
		tw.Flush()
		fmt.Fprintf(w, "throughput, most / fewest tenants of one database: %.2f\n", t.ThroughputRatio)
	}
	if f := t.Fairness; f != nil {
		fmt.Fprintf(w, "fairness: %d quiet tenants at %g events/s each, commit → seen on the stream; hot tenant: %d-event backlog, drained in %.1fs\n",
			f.QuietTenants, f.RatePerTenant, f.HotBacklog, f.HotDrainSeconds)
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintln(tw, "quiet tenants\tevents\tp50 ms\tp90 ms\tp99 ms\tmax ms\t")
		for _, l := range []struct {
			name string
			TenantLatency
		}{{"no backlog", f.Baseline}, {"hot tenant draining", f.Hot}, {"hot tenant in another process", f.Control}} {
			fmt.Fprintf(tw, "%s\t%d\t%.2f\t%.2f\t%.2f\t%.2f\t\n", l.name, l.Events, l.P50Ms, l.P90Ms, l.P99Ms, l.MaxMs)
		}
		tw.Flush()
		fmt.Fprintf(w, "with / without the hot tenant: p50 %.2f, p99 %.2f (%d events committed after the backlog drained left out)\n",
			f.RatioP50, f.RatioP99, f.AfterHot)
		fmt.Fprintf(w, "control, the hot tenant in a relay process of its own (drained in %.1fs) / without: p50 %.2f, p99 %.2f\n",
			f.ControlDrainSeconds, f.ControlRatioP50, f.ControlRatioP99)
	}
}
