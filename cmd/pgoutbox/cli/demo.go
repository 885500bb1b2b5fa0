package cli

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	mrand "math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	natsgo "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/spf13/cobra"

	"github.com/pgoutbox/pgoutbox/broker/nats/natsembed"
	"github.com/pgoutbox/pgoutbox/examples/orders"
	"github.com/pgoutbox/pgoutbox/examples/orders/audit"
	"github.com/pgoutbox/pgoutbox/examples/orders/fakepay"
	"github.com/pgoutbox/pgoutbox/examples/orders/inventory"
	"github.com/pgoutbox/pgoutbox/examples/orders/loadgen"
	"github.com/pgoutbox/pgoutbox/examples/orders/ordersvc"
	"github.com/pgoutbox/pgoutbox/examples/orders/payments"
	"github.com/pgoutbox/pgoutbox/internal/redact"
	"github.com/pgoutbox/pgoutbox/migrate"
)

// demoDatabaseURL is used when neither --database-url nor DATABASE_URL is set: a
// local PostgreSQL with trust authentication, as on a developer machine.
const demoDatabaseURL = "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"

// Settings of the demo's relays and consumers: short leases and ack waits, so that
// the work of a killed process is taken over within seconds.
const (
	demoLease      = 2 * time.Second
	demoAckWait    = 3 * time.Second
	demoPayTimeout = time.Second
	demoDrainMax   = 2 * time.Minute
)

type demoFlags struct {
	db          dbFlags
	duration    time.Duration
	chaos       bool
	keep        bool
	rate        float64
	natsURL     string
	replicas    int
	timeoutRate float64
	failRate    float64
	noKey       bool
}

func newDemoCmd() *cobra.Command {
	var f demoFlags
	cmd := &cobra.Command{
		Use:   "demo",
		Short: "Run the order example end to end and check that every order was reserved and charged exactly once",
		Long: `Run the whole pattern on this machine: the order service of examples/orders
writes orders and their events in one transaction, relays publish them to an
embedded NATS JetStream server, an inventory consumer reserves stock through the
inbox, and a payment worker charges a fake payment API with the event id as the
idempotency key. A load generator places orders (retrying some requests with the
same Idempotency-Key, cancelling some orders) for --duration, while a live view
shows orders/s, events published/s, the age of the oldest pending event and the
duplicates absorbed. The relays and consumers are separate processes; --chaos
kills them with SIGKILL at random and restarts them.

At the end the demo waits until every event is published and consumed, then
checks the database and the payment API's records and prints a verdict line:
every order reserved (and, if cancelled, released) exactly once and charged
exactly once. The exit status is 0 only if the verdict holds.

Everything lives in a new schema (pgoutbox_demo_<random>) and a stream of its own,
both removed at the end — also on Ctrl-C — unless --keep. Without --database-url
or DATABASE_URL it uses ` + demoDatabaseURL + `.`,
		Example: `  pgoutbox demo
  pgoutbox demo --duration 1m --chaos
  DATABASE_URL=postgres://app@db:5432/app pgoutbox demo --keep
  pgoutbox demo --no-idempotency-key --payment-timeout-rate 0.2   # watch the verdict fail`,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := f.validate(); err != nil {
				return err
			}
			return runDemo(cmd.Context(), &f, cmd.OutOrStdout(), cmd.ErrOrStderr())
		},
	}
	fs := cmd.Flags()
	f.db.register(fs)
	schema := fs.Lookup("schema")
	schema.DefValue, schema.Usage = "", "schema to create for the demo; must not exist yet (env PGOUTBOX_DEMO_SCHEMA) (default pgoutbox_demo_<random>)"
	f.db.schema = ""
	fs.DurationVar(&f.duration, "duration", 30*time.Second, "how long to place orders (env PGOUTBOX_DEMO_DURATION)")
	fs.BoolVar(&f.chaos, "chaos", false, "SIGKILL relays and consumers at random while it runs, and restart them (env PGOUTBOX_DEMO_CHAOS)")
	fs.BoolVar(&f.keep, "keep", false, "keep the schema and the stream afterwards, for inspection (env PGOUTBOX_DEMO_KEEP)")
	fs.Float64Var(&f.rate, "rate", 40, "orders placed per second (env PGOUTBOX_DEMO_RATE)")
	fs.StringVar(&f.natsURL, "nats-url", embeddedBroker, "NATS JetStream server, or embedded for an in-process one (env PGOUTBOX_DEMO_NATS_URL)")
	fs.IntVar(&f.replicas, "replicas", 2, "processes of each kind: relays, inventory consumers, payment workers (env PGOUTBOX_DEMO_REPLICAS)")
	fs.Float64Var(&f.timeoutRate, "payment-timeout-rate", 0.05, "share of charge requests the fake payment API records and then leaves unanswered (env PGOUTBOX_DEMO_PAYMENT_TIMEOUT_RATE)")
	fs.Float64Var(&f.failRate, "payment-fail-rate", 0.05, "share of charge requests the fake payment API fails with 503 (env PGOUTBOX_DEMO_PAYMENT_FAIL_RATE)")
	fs.BoolVar(&f.noKey, "no-idempotency-key", false, "payment workers charge without the idempotency key: retries double-charge and the verdict fails (env PGOUTBOX_DEMO_NO_IDEMPOTENCY_KEY)")
	cmd.AddCommand(newDemoWorkerCmd())
	return cmd
}

func (f *demoFlags) validate() error {
	switch {
	case f.duration <= 0:
		return usagef("--duration must be positive, got %s", f.duration)
	case f.rate <= 0 || f.rate > 10000:
		return usagef("--rate %g: want more than 0 and at most 10000 orders per second", f.rate)
	case f.replicas < 1 || f.replicas > 8:
		return usagef("--replicas %d: want 1..8", f.replicas)
	case f.timeoutRate < 0 || f.failRate < 0 || f.timeoutRate+f.failRate > 0.5:
		return usagef("--payment-timeout-rate %g and --payment-fail-rate %g: want each ≥ 0, together at most 0.5", f.timeoutRate, f.failRate)
	case strings.TrimSpace(f.natsURL) == "":
		return usagef("--nats-url must not be empty (embedded for an in-process server)")
	}
	if f.db.url == "" {
		f.db.url = demoDatabaseURL
	}
	if f.db.schema != "" {
		if err := migrate.ValidateSchema(f.db.schema); err != nil {
			return usagef("--schema: %v", err)
		}
	}
	return nil
}

// demo is one run of the demo.
type demo struct {
	f       *demoFlags
	out     io.Writer
	errOut  io.Writer
	log     *slog.Logger // in-process services: errors only
	id      string
	schema  string
	stream  string
	prefix  string // subjects: prefix.>
	natsURL string
	pool    *pgxpool.Pool

	procs    []*demoProc
	kills    atomic.Int64
	cleanups []func() string // run by cleanUp, last first
}

// runDemo runs the demo in named steps: connect, make the schema, the broker
// and the in-process services, start the child processes, run the load until the
// pipeline drains, and give the verdict. Whatever happens after the schema is
// made, what was created is removed (unless --keep) when it returns.
func runDemo(ctx context.Context, f *demoFlags, out, errOut io.Writer) error {
	d := newDemo(f, out, errOut)
	dbf := f.db
	dbf.schema = d.schema
	connCfg, err := dbf.parse()
	if err != nil {
		return err
	}
	bg := context.WithoutCancel(ctx) // for set-up and clean-up that must finish after Ctrl-C
	cctx, cancel := context.WithTimeout(ctx, f.db.connectTimeout)
	defer cancel()
	if err := d.connect(cctx, connCfg); err != nil {
		return err
	}
	defer d.pool.Close()
	if err := d.checkSchemaIsNew(cctx); err != nil {
		return err
	}
	// From here on, whatever happens, remove what was created unless --keep.
	defer d.cleanUp()
	if err := d.createSchema(cctx, bg); err != nil {
		return err
	}
	brokerDesc, err := d.startBroker(cctx, bg)
	if err != nil {
		return err
	}
	svcs, err := d.startServices()
	if err != nil {
		return err
	}
	defer svcs.stop()
	d.printPlan(connCfg, brokerDesc, svcs)
	stopProcs, err := d.startProcs(svcs.payURL)
	if err != nil {
		return err
	}
	defer stopProcs()
	run := d.runLoad(ctx, svcs, stopProcs)
	if run.interrupted {
		fmt.Fprintf(out, "interrupted after %s: no verdict\n", time.Since(run.start).Round(time.Second))
		return errors.New("demo interrupted before its verdict")
	}
	return d.verdict(bg, run, svcs)
}

// newDemo names the run's schema (unless --schema), stream and subjects.
func newDemo(f *demoFlags, out, errOut io.Writer) *demo {
	d := &demo{f: f, out: out, errOut: errOut, log: slog.New(slog.NewTextHandler(errOut, &slog.HandlerOptions{Level: slog.LevelError}))}
	b := make([]byte, 3)
	_, _ = rand.Read(b)
	d.id = hex.EncodeToString(b)
	d.schema = f.db.schema
	if d.schema == "" {
		d.schema = "pgoutbox_demo_" + d.id
	}
	d.stream, d.prefix = "DEMO_"+strings.ToUpper(d.id), "demo_"+d.id
	return d
}

// connect opens the demo's pool (d.pool) on connCfg.
func (d *demo) connect(ctx context.Context, connCfg *pgx.ConnConfig) error {
	poolCfg, err := pgxpool.ParseConfig("")
	if err != nil {
		return err
	}
	poolCfg.ConnConfig = connCfg
	poolCfg.MaxConns = 16
	if d.pool, err = pgxpool.NewWithConfig(ctx, poolCfg); err == nil {
		err = d.pool.Ping(ctx)
	}
	if err != nil {
		if d.pool != nil {
			d.pool.Close()
		}
		return fmt.Errorf("connect to database: %w", err)
	}
	return nil
}

// checkSchemaIsNew refuses a schema that exists: the demo drops what it made.
func (d *demo) checkSchemaIsNew(ctx context.Context) error {
	var exists bool
	if err := d.pool.QueryRow(ctx, "SELECT EXISTS (SELECT FROM pg_namespace WHERE nspname = $1)", d.schema).Scan(&exists); err != nil {
		return fmt.Errorf("look up schema: %w", err)
	}
	if exists {
		return usagef("schema %s exists; the demo only works in a schema it creates (leave out --schema for a fresh one)", d.schema)
	}
	return nil
}

// onCleanUp registers a clean-up step; it returns what it removed (or kept),
// or "" to say nothing.
func (d *demo) onCleanUp(fn func() string) { d.cleanups = append(d.cleanups, fn) }

// cleanUp runs the clean-up steps, last first, and says what was removed or
// kept.
func (d *demo) cleanUp() {
	var kept []string
	for i := len(d.cleanups) - 1; i >= 0; i-- {
		if s := d.cleanups[i](); s != "" {
			kept = append(kept, s)
		}
	}
	if len(kept) > 0 {
		verb := "removed"
		if d.f.keep {
			verb = "kept (--keep)"
		}
		fmt.Fprintf(d.out, "%s %s\n", verb, strings.Join(kept, " and "))
	}
}

// createSchema makes the example's schema (dropped on clean-up unless --keep).
func (d *demo) createSchema(ctx, bg context.Context) error {
	d.onCleanUp(func() string {
		if d.f.keep {
			return "schema " + d.schema
		}
		if _, err := d.pool.Exec(bg, "DROP SCHEMA IF EXISTS "+pgx.Identifier{d.schema}.Sanitize()+" CASCADE"); err != nil {
			fmt.Fprintf(d.errOut, "pgoutbox: drop schema %s: %v\n", d.schema, err)
			return ""
		}
		return "schema " + d.schema
	})
	return orders.Migrate(ctx, d.pool, d.schema)
}

// startBroker starts the embedded NATS server if asked, connects to the broker
// (d.natsURL) and creates the run's stream; it returns the broker's description.
func (d *demo) startBroker(ctx, bg context.Context) (string, error) {
	brokerDesc := redact.URL(d.f.natsURL)
	d.natsURL = d.f.natsURL
	if d.f.natsURL == embeddedBroker {
		url, err := d.startEmbeddedNATS()
		if err != nil {
			return "", err
		}
		d.natsURL = url
		brokerDesc = "embedded NATS JetStream at " + d.natsURL
	}
	nc, err := natsgo.Connect(d.natsURL, natsgo.Name("pgoutbox demo"))
	if err != nil {
		return "", fmt.Errorf("connect to NATS %s: %w", redact.URL(d.natsURL), err)
	}
	d.onCleanUp(func() string { nc.Close(); return "" })
	js, err := jetstream.New(nc)
	if err != nil {
		return "", err
	}
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: d.stream, Subjects: []string{d.prefix + ".>"}, Storage: jetstream.FileStorage}); err != nil {
		return "", fmt.Errorf("create stream %s: %w", d.stream, err)
	}
	d.onCleanUp(func() string {
		if d.f.keep {
			return "stream " + d.stream
		}
		dctx, cancel := context.WithTimeout(bg, 10*time.Second)
		defer cancel()
		if err := js.DeleteStream(dctx, d.stream); err != nil {
			fmt.Fprintf(d.errOut, "pgoutbox: delete stream %s: %v\n", d.stream, err)
			return ""
		}
		return "stream " + d.stream
	})
	return brokerDesc, nil
}

// startEmbeddedNATS starts a NATS server with JetStream in a temporary store
// and returns its URL.
func (d *demo) startEmbeddedNATS() (string, error) {
	dir, err := os.MkdirTemp("", "pgoutbox-demo-nats-")
	if err != nil {
		return "", err
	}
	srv, err := natsembed.New(&natsembed.Config{StoreDir: dir, Port: -1})
	if err != nil {
		_ = os.RemoveAll(dir)
		return "", fmt.Errorf("start embedded NATS: %w", err)
	}
	d.onCleanUp(func() string {
		srv.Shutdown()
		if d.f.keep {
			return "NATS store " + dir
		}
		_ = os.RemoveAll(dir)
		return ""
	})
	return srv.URL(), nil
}

// demoServices are the in-process services: the fake payment API and the order
// service, each on a local port.
type demoServices struct {
	pay       *fakepay.Server
	svc       *ordersvc.Service
	payURL    string
	ordersURL string
	stops     []func()
}

// stop shuts the services down, the last started first.
func (s *demoServices) stop() {
	for i := len(s.stops) - 1; i >= 0; i-- {
		s.stops[i]()
	}
}

// startServices starts the in-process services.
func (d *demo) startServices() (*demoServices, error) {
	s := &demoServices{pay: fakepay.New(&fakepay.Config{TimeoutRate: d.f.timeoutRate, FailRate: d.f.failRate, Logger: d.log})}
	payURL, stopPay, err := serveDemo(s.pay)
	if err != nil {
		return nil, err
	}
	s.payURL, s.stops = payURL, append(s.stops, stopPay)
	if s.svc, err = ordersvc.New(d.pool, &ordersvc.Config{Schema: d.schema, Logger: d.log}); err != nil {
		s.stop()
		return nil, err
	}
	ordersURL, stopOrders, err := serveDemo(s.svc.Handler())
	if err != nil {
		s.stop()
		return nil, err
	}
	s.ordersURL, s.stops = ordersURL, append(s.stops, stopOrders)
	return s, nil
}

// printPlan says what the demo is about to run.
func (d *demo) printPlan(connCfg *pgx.ConnConfig, brokerDesc string, svcs *demoServices) {
	f, out := d.f, d.out
	fmt.Fprintf(out, "pgoutbox demo: the order example of examples/orders, end to end\n")
	fmt.Fprintf(out, "  database  %s:%d/%s, schema %s (new)\n", connCfg.Host, connCfg.Port, connCfg.Database, d.schema)
	fmt.Fprintf(out, "  broker    %s, stream %s\n", brokerDesc, d.stream)
	fmt.Fprintf(out, "  services  order service %s, fake payment API %s (%.0f%% timeouts, %.0f%% failures)\n",
		svcs.ordersURL, svcs.payURL, 100*f.timeoutRate, 100*f.failRate)
	chaos := "off"
	if f.chaos {
		chaos = "SIGKILL at random, then restart"
	}
	fmt.Fprintf(out, "  processes %d relays, %d inventory consumers, %d payment workers; chaos: %s\n", f.replicas, f.replicas, f.replicas, chaos)
	fmt.Fprintf(out, "  load      %g orders/s for %s; 10%% of requests sent twice with one Idempotency-Key, 20%% of orders cancelled\n\n",
		f.rate, f.duration)
}

// startProcs starts the relays and consumers as supervised child processes of
// this binary; the function it returns stops them (it may be called again).
func (d *demo) startProcs(payURL string) (stop func(), err error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("find the pgoutbox binary: %w", err)
	}
	for _, role := range []string{"relay", "inventory", "payments"} {
		for i := range d.f.replicas {
			name := fmt.Sprintf("%s-%d", role, i+1)
			// The URLs go in the environment: argv is visible to every local user (ps).
			args := []string{"demo", "worker", "--role", role, "--id", name, "--schema", d.schema,
				"--stream", d.stream, "--subject-prefix", d.prefix, "--payment-url", payURL}
			if d.f.noKey {
				args = append(args, "--no-idempotency-key")
			}
			d.procs = append(d.procs, &demoProc{name: name, role: role, exe: exe, args: args,
				env: []string{"DATABASE_URL=" + d.f.db.url, "PGOUTBOX_DEMO_WORKER_NATS_URL=" + d.natsURL}})
		}
	}
	stopProcs := make(chan struct{})
	var procsDone sync.WaitGroup
	for _, p := range d.procs {
		procsDone.Add(1)
		go func() { defer procsDone.Done(); p.supervise(stopProcs) }()
	}
	return sync.OnceFunc(func() { close(stopProcs); procsDone.Wait() }), nil
}

// demoRun is what the load phase leaves for the verdict.
type demoRun struct {
	gen         *loadgen.Generator
	view        *demoView
	start       time.Time
	drainStart  time.Time // when the load ended
	drained     bool      // everything published and consumed
	interrupted bool      // ctx ended first
	prog        audit.Progress
}

// runLoad places orders for --duration (with chaos if asked), drawing the live
// view every second, then waits for the pipeline to drain (at most
// demoDrainMax), and stops the load and the processes.
func (d *demo) runLoad(ctx context.Context, svcs *demoServices, stopProcs func()) *demoRun {
	run := &demoRun{gen: loadgen.New(loadgen.Config{BaseURL: svcs.ordersURL, Rate: d.f.rate, Logger: d.log})}
	loadCtx, stopLoad := context.WithTimeout(ctx, d.f.duration)
	defer stopLoad()
	loadDone := make(chan struct{})
	go func() { defer close(loadDone); run.gen.Run(loadCtx) }()
	chaosCtx, stopChaos := context.WithCancel(loadCtx)
	defer stopChaos()
	if d.f.chaos {
		go d.chaos(chaosCtx)
	}
	run.view = newDemoView(d.out, d, svcs.svc, svcs.pay)
	run.start = time.Now()
	loadDone = d.watch(ctx, run, loadDone)
	run.view.finish()
	stopLoad()
	<-loadDoneOrClosed(loadDone)
	stopProcs()
	return run
}

// watch draws the live view every second until the pipeline has drained after
// the load (loadDone closed), the drain takes longer than demoDrainMax, or ctx
// ends. It returns loadDone, nil once it was seen closed.
func (d *demo) watch(ctx context.Context, run *demoRun, loadDone chan struct{}) chan struct{} {
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	phase := "placing orders"
	for !run.drained {
		select {
		case <-ctx.Done():
			run.interrupted = true
		case <-loadDone:
			if run.drainStart.IsZero() {
				run.drainStart = time.Now()
				phase = "draining"
				loadDone = nil
			}
		case <-tick.C:
		}
		if run.interrupted {
			break
		}
		pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		p, err := audit.ReadProgress(pctx, d.pool, d.schema)
		cancel()
		if err == nil {
			run.prog = p
		} else if ctx.Err() == nil {
			d.log.Error("read progress", slog.Any("error", err))
		}
		run.view.draw(phase, time.Since(run.start), run.prog)
		if !run.drainStart.IsZero() {
			run.drained = err == nil && run.prog.Drained(inventory.ConsumerName, payments.ConsumerName)
			if !run.drained && time.Since(run.drainStart) > demoDrainMax {
				break
			}
		}
	}
	return loadDone
}

// verdict prints what the load did and the audit's verdict: nil on PASS.
func (d *demo) verdict(bg context.Context, run *demoRun, svcs *demoServices) error {
	out := d.out
	st := run.gen.Stats()
	fmt.Fprintf(out, "placed %d orders in %s (%d cancelled, %d requests retried with the same key); ",
		st.Created, d.f.duration, st.Cancelled, st.Retries)
	if run.drained {
		fmt.Fprintf(out, "everything published and consumed %s later\n", time.Since(run.drainStart).Round(100*time.Millisecond))
	} else {
		fmt.Fprintf(out, "NOT drained after %s: %d events unpublished, processed %v of %d\n", demoDrainMax, run.prog.Unpublished, run.prog.Processed, run.prog.Events)
	}
	actx, cancel := context.WithTimeout(bg, time.Minute)
	defer cancel()
	rep, err := audit.Check(actx, d.pool, d.schema, svcs.pay.Charges())
	if err != nil {
		return err
	}
	if st.Mismatches > 0 {
		rep.ProblemCount++
		rep.Problems = append(rep.Problems, fmt.Sprintf("%d retried order requests got a different order than the first", st.Mismatches))
	}
	if !run.drained {
		rep.ProblemCount++
		rep.Problems = append(rep.Problems, "the pipeline did not drain")
	}
	dups := run.view.duplicates()
	absorbed := fmt.Sprintf("duplicates absorbed: %d retried requests, %d redeliveries, %d repeated payment calls; %d processes killed",
		dups.requests, dups.deliveries, dups.payments, d.kills.Load())
	if rep.OK() {
		fmt.Fprintf(out, "verdict: PASS — every order was reserved and charged exactly once: %s; %s\n", rep.Summary(), absorbed)
		return nil
	}
	fmt.Fprintf(out, "verdict: FAIL — %d problems: %s; %s\n", rep.ProblemCount, rep.Summary(), absorbed)
	for _, p := range rep.Problems {
		fmt.Fprintf(out, "  - %s\n", p)
	}
	for _, p := range d.procs {
		if t := p.tail(); t != "" && !run.drained {
			fmt.Fprintf(d.errOut, "--- last log lines of %s ---\n%s", p.name, t)
		}
	}
	return errors.New("the verdict failed: not every order was reserved and charged exactly once")
}

func loadDoneOrClosed(c chan struct{}) <-chan struct{} {
	if c == nil {
		closed := make(chan struct{})
		close(closed)
		return closed
	}
	return c
}

// serveDemo serves h on a free local port.
func serveDemo(h http.Handler) (url string, stop func(), err error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", nil, fmt.Errorf("listen: %w", err)
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	done := make(chan struct{})
	go func() { defer close(done); _ = srv.Serve(ln) }()
	return "http://" + ln.Addr().String(), func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
		<-done
	}, nil
}

// chaos kills a random relay or consumer with SIGKILL every 0.5–2s until ctx ends.
func (d *demo) chaos(ctx context.Context) {
	for {
		t := time.NewTimer(500*time.Millisecond + mrand.N(1500*time.Millisecond))
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		if d.procs[mrand.IntN(len(d.procs))].kill() {
			d.kills.Add(1)
		}
	}
}

// workerStats is what a worker process reports, cumulatively, once in a while.
type workerStats struct {
	Applied    int64 `json:"applied"`
	Duplicates int64 `json:"duplicates"`
	Gaps       int64 `json:"gaps"`
	Failed     int64 `json:"failed"`
}

func (a workerStats) add(b workerStats) workerStats {
	return workerStats{a.Applied + b.Applied, a.Duplicates + b.Duplicates, a.Gaps + b.Gaps, a.Failed + b.Failed}
}

// demoProc supervises one relay or consumer process: it starts it, restarts it
// after it dies (as a process manager would), and stops it at the end.
type demoProc struct {
	name, role string
	exe        string
	args       []string
	env        []string // added to the environment: the URLs, kept out of argv

	mu      sync.Mutex
	cmd     *exec.Cmd
	running bool
	done    workerStats // sum of the finished incarnations' last reports
	cur     workerStats // the running incarnation's last report
	logTail []string
}

func (p *demoProc) supervise(stop <-chan struct{}) {
	for {
		exited, err := p.start()
		if err != nil {
			p.note(fmt.Sprintf("start: %v", err))
		} else {
			select {
			case <-exited:
			case <-stop:
				p.terminate(exited)
				return
			}
		}
		// Died (killed by chaos, or crashed): restart shortly, as a supervisor would.
		select {
		case <-stop:
			return
		case <-time.After(200*time.Millisecond + mrand.N(800*time.Millisecond)):
		}
	}
}

func (p *demoProc) start() (<-chan struct{}, error) {
	cmd := exec.Command(p.exe, p.args...)
	cmd.Env = append(os.Environ(), p.env...) // the last of duplicate keys wins
	setDemoProcAttr(cmd)
	stdin, err := cmd.StdinPipe() // closed when this process dies: the worker's cue to exit
	if err != nil {
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	p.mu.Lock()
	p.cmd, p.running, p.cur = cmd, true, workerStats{}
	p.mu.Unlock()
	var readers sync.WaitGroup
	readers.Add(2)
	go func() {
		defer readers.Done()
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			var s workerStats
			if json.Unmarshal(sc.Bytes(), &s) == nil {
				p.mu.Lock()
				p.cur = s
				p.mu.Unlock()
			}
		}
	}()
	go func() {
		defer readers.Done()
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			p.note(sc.Text())
		}
	}()
	exited := make(chan struct{})
	go func() {
		readers.Wait()
		err := cmd.Wait()
		_ = stdin.Close()
		p.mu.Lock()
		p.running = false
		p.done, p.cur = p.done.add(p.cur), workerStats{}
		p.mu.Unlock()
		if err != nil && !isKilled(err) {
			p.note(fmt.Sprintf("exited: %v", err))
		}
		close(exited)
	}()
	return exited, nil
}

// kill sends SIGKILL to the running process; it reports whether one was running.
func (p *demoProc) kill() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.running {
		return false
	}
	p.note0("killed with SIGKILL (chaos)")
	return p.cmd.Process.Kill() == nil
}

// terminate stops the process gracefully (SIGTERM), with SIGKILL after 15s.
func (p *demoProc) terminate(exited <-chan struct{}) {
	p.mu.Lock()
	cmd := p.cmd
	p.mu.Unlock()
	_ = cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-exited:
	case <-time.After(15 * time.Second):
		_ = cmd.Process.Kill()
		<-exited
	}
}

func (p *demoProc) stats() workerStats {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.done.add(p.cur)
}

func (p *demoProc) note(line string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.note0(line)
}

func (p *demoProc) note0(line string) {
	p.logTail = append(p.logTail, line)
	if len(p.logTail) > 20 {
		p.logTail = p.logTail[len(p.logTail)-20:]
	}
}

func (p *demoProc) tail() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.logTail) == 0 {
		return ""
	}
	return strings.Join(p.logTail, "\n") + "\n"
}

func isKilled(err error) bool {
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			return true
		}
	}
	return false
}

// demoView is the live terminal view: redrawn in place on a terminal, a line per
// second otherwise.
type demoView struct {
	out      io.Writer
	tty      bool
	d        *demo
	svc      *ordersvc.Service
	pay      *fakepay.Server
	lines    int // lines drawn last time (tty)
	lastAt   time.Time
	lastOrd  int64
	lastPub  int64
	lastSeen bool
}

func newDemoView(out io.Writer, d *demo, svc *ordersvc.Service, pay *fakepay.Server) *demoView {
	v := &demoView{out: out, d: d, svc: svc, pay: pay, lastAt: time.Now(), lastSeen: true}
	if f, ok := out.(*os.File); ok {
		if fi, err := f.Stat(); err == nil && fi.Mode()&os.ModeCharDevice != 0 && os.Getenv("TERM") != "dumb" {
			v.tty = true
		}
	}
	return v
}

type demoDuplicates struct{ requests, deliveries, payments int64 }

func (d demoDuplicates) total() int64 { return d.requests + d.deliveries + d.payments }

func (v *demoView) duplicates() demoDuplicates {
	var deliveries int64
	for _, p := range v.d.procs {
		deliveries += p.stats().Duplicates
	}
	return demoDuplicates{requests: v.svc.Stats().Replayed, deliveries: deliveries, payments: v.pay.Stats().Replays}
}

func (v *demoView) draw(phase string, elapsed time.Duration, p audit.Progress) {
	now := time.Now()
	created := v.svc.Stats().Created
	published := p.Events - p.Unpublished
	var ordRate, pubRate float64
	if v.lastSeen {
		secs := now.Sub(v.lastAt).Seconds()
		ordRate, pubRate = float64(created-v.lastOrd)/secs, float64(published-v.lastPub)/secs
	}
	v.lastAt, v.lastOrd, v.lastPub, v.lastSeen = now, created, published, true
	dups := v.duplicates()
	pending := "none"
	if p.Unpublished > 0 {
		pending = fmt.Sprintf("%d, oldest %.1fs", p.Unpublished, p.OldestPendingSeconds)
	}
	el := elapsed.Round(time.Second)
	if !v.tty {
		fmt.Fprintf(v.out, "[%4s] %s: orders/s %5.1f  events published/s %5.1f  oldest pending %4.1fs  duplicates absorbed %d  killed %d\n",
			el, phase, ordRate, pubRate, p.OldestPendingSeconds, dups.total(), v.d.kills.Load())
		return
	}
	var inv, pay workerStats
	for _, pr := range v.d.procs {
		switch pr.role {
		case inventory.ConsumerName:
			inv = inv.add(pr.stats())
		case payments.ConsumerName:
			pay = pay.add(pr.stats())
		}
	}
	head := fmt.Sprintf("  %-20s %s of %s", phase, el, v.d.f.duration)
	if el > v.d.f.duration {
		head = fmt.Sprintf("  %-20s %s after %s of orders", phase, el-v.d.f.duration, v.d.f.duration)
	}
	lines := []string{
		head,
		fmt.Sprintf("  %-20s %7.1f   %d orders so far", "orders/s", ordRate, created),
		fmt.Sprintf("  %-20s %7.1f   %d of %d events published", "events published/s", pubRate, published, p.Events),
		fmt.Sprintf("  %-20s %7.1fs  pending: %s", "oldest pending", p.OldestPendingSeconds, pending),
		fmt.Sprintf("  %-20s %7d   %d retried requests, %d redeliveries, %d repeated payment calls", "duplicates absorbed",
			dups.total(), dups.requests, dups.deliveries, dups.payments),
		fmt.Sprintf("  %-20s %7s   inventory %d applied · payments %d applied, %d failed and retried", "consumers", "",
			inv.Applied, pay.Applied, pay.Failed),
		fmt.Sprintf("  %-20s %7d   %s", "processes killed", v.d.kills.Load(), v.running()),
	}
	if v.lines > 0 {
		fmt.Fprintf(v.out, "\x1b[%dA", v.lines)
	}
	for _, l := range lines {
		fmt.Fprintf(v.out, "\r\x1b[K%s\n", l)
	}
	v.lines = len(lines)
}

// running lists the processes that are down right now.
func (v *demoView) running() string {
	var down []string
	for _, p := range v.d.procs {
		p.mu.Lock()
		if !p.running {
			down = append(down, p.name)
		}
		p.mu.Unlock()
	}
	if len(down) == 0 {
		return "all processes up"
	}
	return "down, restarting: " + strings.Join(down, " ")
}

func (v *demoView) finish() {
	if v.tty && v.lines > 0 {
		fmt.Fprintln(v.out)
	}
}
