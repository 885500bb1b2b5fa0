package pgtest

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/pgoutbox/internal/logtest"
	"github.com/pgoutbox/pgoutbox/internal/systool"
)

// The pool modes of PgBouncer that StartBouncer accepts.
const (
	BouncerSession     = "session"
	BouncerTransaction = "transaction"
)

// Bounds of a test's PgBouncer.
const (
	// BouncerStartTimeout bounds the wait for a started PgBouncer to accept
	// connections and reach the server.
	BouncerStartTimeout = 30 * time.Second
	// bouncerStopTimeout bounds the wait for PgBouncer to exit after SIGTERM
	// (its immediate shutdown); past it, it is killed.
	bouncerStopTimeout = 10 * time.Second
	// BouncerPoolSize is the server connections PgBouncer keeps per database
	// and user: few, so that the shared server's 100 connections suffice, and
	// so that clients share server connections, as they do in production.
	BouncerPoolSize = 5
)

// StartBouncer starts a PgBouncer of the test's own in front of the test server
// (URL), with pool_mode mode (BouncerSession or BouncerTransaction), listening on
// a free port of 127.0.0.1, and returns the URL of the test database through it.
// PgBouncer is stopped and its files removed when the test ends.
//
// The URL has no query-mode setting: through transaction pooling a pgx client
// needs default_query_exec_mode=exec (or simple_protocol), since PgBouncer
// before 1.21 does not carry prepared statements across server connections
// (docs/operations.md, "Connection poolers").
//
// PgBouncer refuses to run as root: when the test runs as root, it runs as the
// OS user postgres, like the throwaway clusters.
func StartBouncer(tb testing.TB, mode string) string {
	tb.Helper()
	if mode != BouncerSession && mode != BouncerTransaction {
		tb.Fatalf("pgtest: StartBouncer: pool mode %q is neither %q nor %q", mode, BouncerSession, BouncerTransaction)
	}
	program := systool.Need(tb, systool.PgBouncer)
	server, err := url.Parse(URL())
	Must(tb, err, "parse the test server's URL")
	host, port := server.Hostname(), server.Port()
	if host == "" {
		host = "127.0.0.1"
	}
	if port == "" {
		port = "5432"
	}
	user := server.User.Username()
	if user == "" {
		user = "postgres"
	}
	cred, err := serverCredential()
	Must(tb, err, "the OS user PgBouncer runs as")
	// Not t.TempDir: its parents are private to root, and PgBouncer runs as postgres.
	dir, err := os.MkdirTemp("", "pgoutbox-bouncer-")
	Must(tb, err, "PgBouncer directory")
	tb.Cleanup(func() { _ = os.RemoveAll(dir) })
	listen, err := freePort()
	Must(tb, err, "PgBouncer port")
	authFile := filepath.Join(dir, "userlist.txt")
	ini := filepath.Join(dir, "pgbouncer.ini")
	files := map[string]string{
		// auth_type trust still needs the user in the auth file.
		authFile: fmt.Sprintf("%q \"\"\n", user),
		ini: strings.Join([]string{
			"[databases]",
			fmt.Sprintf("* = host=%s port=%s", host, port),
			"[pgbouncer]",
			"listen_addr = 127.0.0.1",
			"listen_port = " + strconv.Itoa(listen),
			"unix_socket_dir =",
			"auth_type = trust",
			"auth_file = " + authFile,
			"pool_mode = " + mode,
			"default_pool_size = " + strconv.Itoa(BouncerPoolSize),
			"max_client_conn = 200",
			"pidfile = " + filepath.Join(dir, "pgbouncer.pid"),
			"",
		}, "\n"),
	}
	for name, text := range files {
		Must(tb, os.WriteFile(name, []byte(text), 0o600), "write %s", name)
	}
	if cred != nil {
		for _, name := range []string{dir, authFile, ini} {
			Must(tb, os.Chown(name, int(cred.uid), int(cred.gid)), "chown %s", name)
		}
	}
	b := &bouncer{cmd: exec.Command(program, ini), exited: make(chan struct{})}
	b.cmd.Dir = dir
	b.cmd.Stdout, b.cmd.Stderr = &b.log, &b.log
	b.cmd.SysProcAttr = procAttr(cred, true)
	Must(tb, b.start(), "start pgbouncer")
	tb.Cleanup(b.stop)
	u := fmt.Sprintf("postgres://%s@127.0.0.1:%d%s?sslmode=disable&connect_timeout=5", url.PathEscape(user), listen, server.EscapedPath())
	ctx, cancel := context.WithTimeout(context.Background(), BouncerStartTimeout)
	defer cancel()
	for {
		err := pingThrough(ctx, u)
		if err == nil {
			return u
		}
		select {
		case <-b.exited:
			tb.Fatalf("pgtest: pgbouncer exited (%v):\n%s", b.err, b.logText())
		case <-ctx.Done():
			tb.Fatalf("pgtest: pgbouncer on port %d did not reach the server within %s: %v\n%s", listen, BouncerStartTimeout, err, b.logText())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// pingThrough connects through PgBouncer and runs a query on a server connection.
func pingThrough(ctx context.Context, u string) error {
	conn, err := pgx.Connect(ctx, u+"&default_query_exec_mode=simple_protocol")
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	_, err = conn.Exec(ctx, "SELECT 1")
	return err
}

// bouncer is a running PgBouncer.
type bouncer struct {
	cmd    *exec.Cmd
	log    logtest.Buffer
	exited chan struct{}
	err    error
}

// start runs PgBouncer from a goroutine locked to its OS thread, so that its
// parent-death signal comes only when the test process dies (see Cluster.start).
func (b *bouncer) start() error {
	started := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		if err := b.cmd.Start(); err != nil {
			started <- err
			runtime.UnlockOSThread()
			return
		}
		started <- nil
		b.err = b.cmd.Wait()
		close(b.exited)
	}()
	return <-started
}

// stop ends PgBouncer (SIGTERM: its immediate shutdown), killing it if it lingers.
func (b *bouncer) stop() {
	select {
	case <-b.exited:
		return
	default:
	}
	_ = b.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-b.exited:
	case <-time.After(bouncerStopTimeout):
		_ = b.cmd.Process.Kill()
		<-b.exited
	}
}

func (b *bouncer) logText() string {
	lines := strings.Split(strings.TrimSpace(b.log.String()), "\n")
	if len(lines) > 30 {
		lines = lines[len(lines)-30:]
	}
	return strings.Join(lines, "\n")
}
