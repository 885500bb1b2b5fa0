package faulttest

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/goleak"

	"github.com/pgoutbox/pgoutbox/checker"
	"github.com/pgoutbox/pgoutbox/internal/failpoint"
	"github.com/pgoutbox/pgoutbox/internal/natstest"
	"github.com/pgoutbox/pgoutbox/internal/netns"
	"github.com/pgoutbox/pgoutbox/internal/pgtest"
	"github.com/pgoutbox/pgoutbox/internal/wait"
)

// The binaries the tests run, built once by TestMain.
var bin struct{ pgoutbox, producer, consumer string }

func TestMain(m *testing.M) {
	flagsParse()
	// These tests mostly wait on processes they started: run more of them at once
	// than there are cores, unless -parallel was given. Not many more: each holds
	// up to ~20 connections (relays, consumer, producer, its own pool), and the
	// whole suite, with another package's tests beside it, fits in PostgreSQL's
	// default 100 (alone, 12 at once peaked at 88 connections, 8 at 74, 6 at 53).
	parallelSet := false
	flag.Visit(func(f *flag.Flag) { parallelSet = parallelSet || f.Name == "test.parallel" })
	if !parallelSet {
		_ = flag.Set("test.parallel", "6")
	}
	started := time.Now()
	dir, err := os.MkdirTemp("", "pgoutbox-faulttest")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	build := exec.Command("go", "build", "-o", dir+string(os.PathSeparator),
		"github.com/pgoutbox/pgoutbox/cmd/pgoutbox",
		"github.com/pgoutbox/pgoutbox/internal/faulttest/cmd/producer",
		"github.com/pgoutbox/pgoutbox/internal/faulttest/cmd/consumer")
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "build:", err)
		os.Exit(1)
	}
	fmt.Fprintf(os.Stderr, "faulttest: built the binaries in %s\n", time.Since(started).Round(time.Millisecond))
	bin.pgoutbox = filepath.Join(dir, "pgoutbox")
	bin.producer = filepath.Join(dir, "producer")
	bin.consumer = filepath.Join(dir, "consumer")
	code := m.Run()
	if code == 0 {
		if err := goleak.Find(goleak.IgnoreAnyFunction("github.com/nats-io/nats-server/v2/server.(*Server).startGoRoutine.func1")); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	_ = os.RemoveAll(dir)
	os.Exit(code)
}

const consumerName = "billing"

// env is one test's world: a migrated schema with a business table and an effects
// table, a JetStream stream and durable consumer of its own, and the processes the
// test runs against them.
type env struct {
	t        *testing.T
	pool     *pgxpool.Pool
	schema   string
	natsURL  string
	stream   string
	template string
	js       jetstream.JetStream
	dir      string
	dbServer string // the database URL the processes are given, before their application_name
	via      string // when set, the URL the producers and consumers are given instead (a pooler)
	// durable keeps the server's synchronous_commit (a test of a server's own);
	// on the shared server, commits do not wait for the flush (see dbURL).
	durable bool
	// For one tenant of relays serving many (tenants_test.go), whose stream
	// holds every tenant's events: inbox is the consumer's inbox and durable
	// name (empty: consumerName), and subject the filter of the tenant's
	// subjects, which alone the checker reads (empty: the whole stream).
	inbox, subject string

	mu       sync.Mutex
	journals []string
	procs    []*proc
}

type envConfig struct {
	// dbServer is the database; defaults to the shared test server (pgtest.URL).
	// A multi-host URL makes every process follow a failover.
	dbServer string
	// natsURL is the server; defaults to the shared test server.
	natsURL string
	// via, when set, is the database URL (a connection pooler in front of
	// dbServer) given to the producers and the consumers; relays get dbServer
	// unless a test passes via to relayOn. The test's own queries go to
	// dbServer. PgBouncer refuses the options startup parameter, so the
	// processes keep the server's synchronous_commit.
	via string
	// dedup is the stream's duplicate window. Defaults to 1s, shorter than the
	// relays' 2s lease, so that a re-publish after a takeover is stored again and
	// the consumer's deduplication is exercised.
	dedup time.Duration
}

func newEnv(t *testing.T, cfg envConfig) *env {
	t.Helper()
	if cfg.natsURL == "" {
		cfg.natsURL = natstest.URL()
	}
	if cfg.dedup == 0 {
		cfg.dedup = time.Second
	}
	durable := cfg.dbServer != "" || cfg.via != ""
	if cfg.dbServer == "" {
		cfg.dbServer = pgtest.URL()
	}
	pool, schema := pgtest.MigratedOn(t, cfg.dbServer, 4) // the test's own queries, one at a time
	var target natstest.Target
	if cfg.natsURL == natstest.URL() {
		target = natstest.New(t, cfg.natsURL)
	} else {
		target = natstest.OnOwnServer(t, cfg.natsURL)
	}
	e := &env{t: t, pool: pool, schema: schema, natsURL: cfg.natsURL, stream: target.Stream,
		template: target.Template, js: target.JS, dir: t.TempDir(), dbServer: cfg.dbServer, via: cfg.via, durable: durable}
	e.createTables()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, err := e.js.CreateStream(ctx, jetstream.StreamConfig{Name: e.stream, Subjects: target.Subjects(),
		Storage: jetstream.FileStorage, Duplicates: cfg.dedup})
	pgtest.Must(t, err, "create stream")
	e.createDurable("")
	e.logOnFailure()
	return e
}

// createTables creates the business and effects tables in the env's schema.
func (e *env) createTables() {
	e.t.Helper()
	_, err := e.pool.Exec(context.Background(), `
		CREATE TABLE `+e.table("business")+` (
			key          text PRIMARY KEY,
			event_id     uuid NOT NULL,
			aggregate_id text NOT NULL);
		CREATE TABLE `+e.table("effects")+` (
			n              bigserial PRIMARY KEY,
			consumer       text   NOT NULL,
			event_id       uuid   NOT NULL,
			aggregate_type text   NOT NULL,
			aggregate_id   text   NOT NULL,
			sequence       bigint NOT NULL,
			applied_at     timestamptz NOT NULL DEFAULT clock_timestamp())`)
	pgtest.Must(e.t, err, "create business and effects tables")
}

// createDurable creates the consumer's durable (inboxName) on the env's
// stream, restricted to the subject filter when one is given.
func (e *env) createDurable(filter string) {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, err := e.js.CreateConsumer(ctx, e.stream, jetstream.ConsumerConfig{Durable: e.inboxName(), FilterSubject: filter,
		AckPolicy: jetstream.AckExplicitPolicy, AckWait: 2 * time.Second, MaxAckPending: 1000, MaxDeliver: -1})
	pgtest.Must(e.t, err, "create durable consumer")
}

// logOnFailure prints the output of the env's processes when the test fails.
func (e *env) logOnFailure() {
	t := e.t
	t.Cleanup(func() {
		if !t.Failed() {
			return
		}
		e.mu.Lock()
		defer e.mu.Unlock()
		for _, p := range e.procs {
			t.Logf("---- output of %s (%s):\n%s", p.name, p.status(), tail(p.out.String(), 60))
		}
	})
}

// inboxName is the consumer's inbox name, which is also its durable's.
func (e *env) inboxName() string {
	if e.inbox != "" {
		return e.inbox
	}
	return consumerName
}

func (e *env) table(name string) string { return pgx.Identifier{e.schema, name}.Sanitize() }

// count returns the number of rows of a table of the schema matching where.
func (e *env) count(table, where string, args ...any) int {
	e.t.Helper()
	var n int
	err := e.pool.QueryRow(context.Background(), "SELECT count(*) FROM "+e.table(table)+" WHERE "+where, args...).Scan(&n)
	pgtest.Must(e.t, err, "count %s", table)
	return n
}

// dbURL is the test database's URL with an application_name, by which
// pg_stat_activity identifies the process's connections.
//
// On the shared server, commits do not wait for the WAL flush
// (synchronous_commit=off): the suite kills clients, never that server, and a
// committed transaction is visible to every session and survives any client's
// death either way. It spares the shared disk one fsync per consumer
// transaction. A test's own server (envConfig.dbServer) keeps its setting.
func (e *env) dbURL(appName string) string {
	if e.via != "" {
		return e.dbURLOf(e.via, appName)
	}
	return e.dbURLOf(e.dbServer, appName)
}

// dbURLOf is dbURL for another address of the test's database server (a relay
// on a host of its own reaches it at its end of the host's link).
func (e *env) dbURLOf(server, appName string) string {
	t := e.t
	u, err := url.Parse(server)
	pgtest.Must(t, err, "parse database URL")
	q := u.Query()
	q.Set("application_name", appName)
	if !e.durable {
		q.Set("options", "-c synchronous_commit=off")
	}
	u.RawQuery = strings.ReplaceAll(q.Encode(), "+", "%20") // pgx reads '+' literally
	return u.String()
}

// urlsToEnv moves --database-url and --broker values, which may hold credentials,
// from the command line (ps shows it to every local user) to the environment
// variables every program here reads them from.
func urlsToEnv(args []string) (rest, env []string) {
	vars := map[string]string{"--database-url": "DATABASE_URL", "--broker": "PGOUTBOX_BROKER"}
	for i := 0; i < len(args); i++ {
		if v, ok := vars[args[i]]; ok && i+1 < len(args) {
			env = append(env, v+"="+args[i+1])
			i++
			continue
		}
		rest = append(rest, args[i])
	}
	return rest, env
}

// proc is a process a test started.
type proc struct {
	name string
	cmd  *exec.Cmd
	out  *syncBuffer
	done chan struct{} // closed once it exited and its output is read
	err  error         // Wait's error, once done
}

// start runs a binary with extra environment (e.g. a failpoint), its output kept.
func (e *env) start(name string, extraEnv []string, binary string, args ...string) *proc {
	e.t.Helper()
	return e.startIn(nil, name, extraEnv, binary, args...)
}

// startIn is start inside a host of the test's own (nil: this machine's network,
// as start). The process's pid is the program's (ip netns exec execs it).
func (e *env) startIn(host *netns.Host, name string, extraEnv []string, binary string, args ...string) *proc {
	e.t.Helper()
	args, urlEnv := urlsToEnv(args)
	cmd := exec.Command(binary, args...)
	if host != nil {
		cmd = host.Command(binary, args...)
	}
	cmd.Env = append(append(os.Environ(), urlEnv...), extraEnv...)
	if !hasFailpoint(extraEnv) {
		cmd.Env = append(cmd.Env, failpoint.EnvVar+"=")
	}
	p := &proc{name: name, cmd: cmd, out: &syncBuffer{}, done: make(chan struct{})}
	pr, pw := io.Pipe()
	cmd.Stdout, cmd.Stderr = pw, pw
	pgtest.Must(e.t, cmd.Start(), "start %s", name)
	copied := make(chan struct{})
	go func() {
		defer close(copied)
		sc := bufio.NewScanner(pr)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			p.out.WriteLine(sc.Text())
		}
		_, _ = io.Copy(io.Discard, pr)
	}()
	go func() {
		p.err = cmd.Wait()
		pw.Close()
		<-copied
		close(p.done)
	}()
	e.mu.Lock()
	e.procs = append(e.procs, p)
	e.mu.Unlock()
	e.t.Cleanup(func() {
		if !p.exited() {
			_ = cmd.Process.Signal(syscall.SIGCONT)
			if e.t.Failed() {
				// A Go process prints every goroutine's stack on SIGQUIT: the output
				// printed below then shows where a stuck process was.
				_ = cmd.Process.Signal(syscall.SIGQUIT)
				select {
				case <-p.done:
				case <-time.After(5 * time.Second):
				}
			}
			_ = cmd.Process.Kill()
			<-p.done
		}
	})
	return p
}

func hasFailpoint(env []string) bool {
	for _, kv := range env {
		if strings.HasPrefix(kv, failpoint.EnvVar+"=") {
			return true
		}
	}
	return false
}

// failpointEnv enables one point in a process.
func failpointEnv(point, action string) []string {
	return []string{failpoint.EnvVar + "=" + point + "=" + action}
}

func (p *proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// status describes how the process ended, or that it runs.
func (p *proc) status() string {
	if !p.exited() {
		return "running"
	}
	if p.err == nil {
		return "exit 0"
	}
	return p.err.Error()
}

// wait waits for the process to exit by itself.
func (p *proc) wait(t *testing.T, within time.Duration) {
	t.Helper()
	select {
	case <-p.done:
	case <-time.After(within):
		t.Fatalf("%s still running after %s:\n%s", p.name, within, tail(p.out.String(), 40))
	}
}

// waitLine waits until the process printed a line containing s.
func (p *proc) waitLine(t *testing.T, s string) {
	t.Helper()
	wait.Forf(t, 30*time.Second, func() string { return fmt.Sprintf("%s to print %q:\n%s", p.name, s, tail(p.out.String(), 20)) },
		func() bool {
			if p.exited() {
				t.Fatalf("%s exited (%s) before printing %q:\n%s", p.name, p.status(), s, tail(p.out.String(), 20))
			}
			return strings.Contains(p.out.String(), s)
		})
}

// killedBySIGKILL reports whether the exited process died of SIGKILL.
func (p *proc) killedBySIGKILL() bool {
	var ee *exec.ExitError
	if !errors.As(p.err, &ee) {
		return false
	}
	ws, ok := ee.Sys().(syscall.WaitStatus)
	return ok && ws.Signaled() && ws.Signal() == syscall.SIGKILL
}

// kill sends SIGKILL and waits for the process to be gone.
func (p *proc) kill(t *testing.T) {
	t.Helper()
	if p.exited() {
		return
	}
	_ = p.cmd.Process.Kill()
	p.wait(t, 30*time.Second)
}

// term stops the process gracefully and checks it exited 0.
func (p *proc) term(t *testing.T) {
	t.Helper()
	if p.exited() {
		return
	}
	// Producers and consumers handle SIGTERM once they say "started"; a process
	// restarted a moment ago by the chaos loop may not be there yet.
	if strings.HasPrefix(p.name, "producer ") || strings.HasPrefix(p.name, "consumer ") {
		wait.Forf(t, 30*time.Second, func() string { return fmt.Sprintf("%s to start:\n%s", p.name, tail(p.out.String(), 40)) },
			func() bool { return strings.Contains(p.out.String(), " started") || p.exited() })
		if p.exited() {
			return
		}
	}
	pgtest.Must(t, p.cmd.Process.Signal(syscall.SIGTERM), "SIGTERM %s", p.name)
	p.wait(t, 60*time.Second)
	if p.err != nil {
		t.Fatalf("%s: %v after SIGTERM:\n%s", p.name, p.err, tail(p.out.String(), 40))
	}
}

func (p *proc) signal(t *testing.T, sig syscall.Signal) {
	t.Helper()
	pgtest.Must(t, p.cmd.Process.Signal(sig), "%v %s", sig, p.name)
}

// relay starts `pgoutbox relay` with id, a 2s lease and fast polling.
func (e *env) relay(id string, extraEnv []string, extraArgs ...string) *proc {
	e.t.Helper()
	return e.relayOn(relayHost{}, id, extraEnv, extraArgs...)
}

// relayHost is where a relay runs: on this machine (the zero value), or on a
// host of the test's own, reaching the database and the broker at the given
// URLs (the root namespace's ends of the host's links). Without a host, a
// dbServer is another way to the test's database (a connection pooler).
type relayHost struct {
	host              *netns.Host
	dbServer, natsURL string
	// binary is the pgoutbox binary to run; empty: this tree's (bin.pgoutbox).
	binary string
}

// relayOn is relay, run where on says.
func (e *env) relayOn(on relayHost, id string, extraEnv []string, extraArgs ...string) *proc {
	e.t.Helper()
	dbServer, natsURL := e.dbServer, e.natsURL
	if on.dbServer != "" {
		dbServer = on.dbServer
	}
	if on.natsURL != "" {
		natsURL = on.natsURL
	}
	args := append([]string{"relay", "--database-url", e.dbURLOf(dbServer, "faulttest-"+e.schema+"-"+id), "--schema", e.schema,
		"--id", id, "--broker", natsURL, "--nats-stream", e.stream, "--topic-template", e.template,
		"--lease", "2s", "--poll-interval", "200ms", "--backoff-base", "100ms", "--backoff-max", "1s",
		"--batch-size", "50", "--ack-timeout", "1s", "--log-level", "info"}, extraArgs...)
	binary := bin.pgoutbox
	if on.binary != "" {
		binary = on.binary
	}
	return e.startIn(on.host, "relay "+id, extraEnv, binary, args...)
}

// producerOpts shape one producer run.
type producerOpts struct {
	txs, aggregates, maxEvents, rollbackPercent int
	pause                                       time.Duration
	binary                                      string // empty: this tree's (bin.producer)
	// aggregateTypes and eventTypes, comma-separated, are drawn from at
	// random; empty: the producer's defaults.
	aggregateTypes, eventTypes string
}

// producer starts the producer program; its journal joins the env's journals.
func (e *env) producer(name string, extraEnv []string, o producerOpts) *proc {
	e.t.Helper()
	journal := filepath.Join(e.dir, name+".journal")
	// Created empty here, before the process starts: a producer killed before it
	// opened its journal attempted nothing, and its journal says so, instead of
	// being missing when the checker reads the journals.
	f, err := os.OpenFile(journal, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	pgtest.Must(e.t, err, "create journal")
	pgtest.Must(e.t, f.Close(), "create journal")
	e.mu.Lock()
	e.journals = append(e.journals, journal)
	e.mu.Unlock()
	if o.aggregates == 0 {
		o.aggregates = 10
	}
	if o.maxEvents == 0 {
		o.maxEvents = 3
	}
	binary := bin.producer
	if o.binary != "" {
		binary = o.binary
	}
	args := []string{"--database-url", e.dbURL("faulttest-producer"),
		"--schema", e.schema, "--journal", journal, "--name", name, "--txs", fmt.Sprint(o.txs),
		"--aggregates", fmt.Sprint(o.aggregates), "--max-events", fmt.Sprint(o.maxEvents),
		"--rollback-percent", fmt.Sprint(o.rollbackPercent), "--pause", o.pause.String()}
	if o.aggregateTypes != "" {
		args = append(args, "--aggregate-types", o.aggregateTypes)
	}
	if o.eventTypes != "" {
		args = append(args, "--event-types", o.eventTypes)
	}
	return e.start("producer "+name, extraEnv, binary, args...)
}

// consumer starts the consumer program on the env's durable.
func (e *env) consumer(name string, extraEnv []string) *proc {
	e.t.Helper()
	return e.consumerOf(bin.consumer, name, extraEnv)
}

// consumerOf is consumer, running the given build of the consumer program.
func (e *env) consumerOf(binary, name string, extraEnv []string) *proc {
	e.t.Helper()
	return e.start("consumer "+name, extraEnv, binary, "--database-url", e.dbURL("faulttest-consumer"),
		"--schema", e.schema, "--nats", e.natsURL, "--stream", e.stream, "--name", e.inboxName(), "--log-level", "info")
}

// backlog reports what is left to do: unpublished outbox rows, outbox rows the
// consumer has not applied, and messages the durable has not had acked.
func (e *env) backlog() (unpublished, unapplied, unacked int, err error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err = e.pool.QueryRow(ctx, `SELECT
		(SELECT count(*) FROM `+e.table("outbox_events")+` WHERE published_at IS NULL),
		(SELECT count(*) FROM `+e.table("outbox_events")+` o
		  WHERE NOT EXISTS (SELECT 1 FROM `+e.table("effects")+` f WHERE f.event_id = o.event_id))`).Scan(&unpublished, &unapplied)
	if err != nil {
		return 0, 0, 0, err
	}
	c, err := e.js.Consumer(ctx, e.stream, e.inboxName())
	if err != nil {
		return 0, 0, 0, err
	}
	info, err := c.Info(ctx)
	if err != nil {
		return 0, 0, 0, err
	}
	return unpublished, unapplied, int(info.NumPending) + info.NumAckPending, nil
}

// waitDrained waits until every outbox row is published and applied and the
// durable has nothing pending; producers must have stopped.
func (e *env) waitDrained(within time.Duration) {
	e.t.Helper()
	var u, a, k int
	var err error
	if wait.Until(within, func() bool {
		e.failOnCrash()
		u, a, k, err = e.backlog()
		return err == nil && u == 0 && a == 0 && k == 0
	}) {
		return
	}
	// Say where it is stuck: what each process said last, and what the checker
	// makes of the sources as they are.
	e.mu.Lock()
	procs := append([]*proc(nil), e.procs...)
	e.mu.Unlock()
	for _, p := range procs {
		e.t.Logf("%s (%s), last lines:\n%s", p.name, p.status(), tail(p.out.String(), 15))
	}
	e.t.Logf("the checker, now:\n%s", e.verdict())
	e.t.Fatalf("timed out after %s waiting for the pipeline to drain (unpublished %d, unapplied %d, unacked %d, err %v)",
		within, u, a, k, err)
}

// failOnCrash fails the test at once if a process exited with an error of its
// own (not a SIGKILL, which the tests send or a crash point sends).
func (e *env) failOnCrash() {
	e.t.Helper()
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, p := range e.procs {
		if p.exited() && p.err != nil && !p.killedBySIGKILL() {
			e.t.Fatalf("%s failed: %s\n%s", p.name, p.status(), tail(p.out.String(), 30))
		}
	}
}

// verdict reads every source and runs the checker; adjust, when given, changes
// the input before the check.
func (e *env) verdict(adjust ...func(*checker.Input)) *checker.Verdict {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var in checker.Input
	var err error
	in.Journal, err = checker.ReadJournalFiles(e.journals...)
	pgtest.Must(e.t, err, "read journals")
	in.Outbox, err = checker.ReadOutbox(ctx, e.pool, e.schema)
	pgtest.Must(e.t, err, "read outbox")
	in.Business, err = checker.ReadBusiness(ctx, e.pool, "SELECT key, event_id FROM "+e.table("business"))
	pgtest.Must(e.t, err, "read business rows")
	in.Effects, err = checker.ReadEffects(ctx, e.pool, "SELECT consumer, event_id, aggregate_type, aggregate_id, sequence FROM "+e.table("effects")+" ORDER BY n")
	pgtest.Must(e.t, err, "read effects")
	if e.subject != "" {
		in.Broker, err = readSubject(ctx, e.js, e.stream, e.subject)
	} else {
		in.Broker, err = checker.ReadJetStream(ctx, e.js, e.stream)
	}
	pgtest.Must(e.t, err, "read stream")
	in.Consumers = []string{e.inboxName()}
	for _, f := range adjust {
		f(&in)
	}
	return checker.Check(in)
}

// mustHold fails the test unless the verdict is clean and something was checked.
func mustHold(t *testing.T, v *checker.Verdict) {
	t.Helper()
	if !v.OK() {
		t.Fatal(v.String())
	}
	if v.Committed == 0 {
		t.Fatalf("nothing was committed; the test proves nothing:\n%s", v)
	}
	t.Log(v.String())
}

// stopAll stops every running process gracefully.
func (e *env) stopAll() {
	e.t.Helper()
	e.mu.Lock()
	procs := append([]*proc(nil), e.procs...)
	e.mu.Unlock()
	for _, p := range procs {
		p.term(e.t)
	}
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) WriteLine(l string) { s.mu.Lock(); s.b.WriteString(l + "\n"); s.mu.Unlock() }
func (s *syncBuffer) String() string     { s.mu.Lock(); defer s.mu.Unlock(); return s.b.String() }

// warnLogger logs warnings and errors into b, a line at a time.
func warnLogger(b *syncBuffer) *slog.Logger {
	return slog.New(slog.NewTextHandler(lineWriter{b}, &slog.HandlerOptions{Level: slog.LevelWarn}))
}

// lineWriter feeds a syncBuffer line by line (slog writes one line per call).
type lineWriter struct{ b *syncBuffer }

func (w lineWriter) Write(p []byte) (int, error) {
	w.b.WriteLine(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

func tail(s string, lines int) string {
	all := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(all) > lines {
		all = append([]string{fmt.Sprintf("… %d lines before", len(all)-lines)}, all[len(all)-lines:]...)
	}
	return strings.Join(all, "\n")
}
