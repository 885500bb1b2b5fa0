package pgtest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"runtime"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/pgoutbox/internal/freeport"
)

// A Cluster is a throwaway PostgreSQL server of a test binary's own: initdb in a
// fresh directory under os.TempDir, postgres on a free 127.0.0.1 port with its
// socket in that directory, and every file removed by Stop. It is for tests that
// need server settings the shared server may not have (wal_level = logical); the
// shared server is never reconfigured.
//
// The server cannot outlive the test process: on Linux it is started with a
// parent-death signal (SIGQUIT, PostgreSQL's immediate shutdown), so a test binary
// that is killed or times out takes its clusters down with it.
type Cluster struct {
	// URL is the connection string of the cluster's "test" database, as the
	// superuser postgres (trusted).
	URL string

	// Port is the server's TCP port on 127.0.0.1.
	Port int

	dir      string
	bindir   string
	cred     *osUser
	settings map[string]string
	logf     *os.File
	cmd      *exec.Cmd
	exited   chan struct{} // closed when the postmaster has exited
	err      error         // the postmaster's exit status, once exited is closed

	stopOnce sync.Once
	stopErr  error
}

// ClusterConfig is a throwaway cluster's configuration; a nil *ClusterConfig
// means all defaults.
type ClusterConfig struct {
	// MaxConnections is max_connections. Zero means DefaultClusterMaxConnections.
	MaxConnections int
	// Settings are further server settings (name → value, as for postgres -c),
	// applied after the small, fast defaults (fsync off, small shared buffers) and
	// able to override them.
	Settings map[string]string
	// HBA are further pg_hba.conf lines, appended to initdb's (which trust local
	// and loopback connections only), e.g. "host all all 10.0.0.0/8 trust" for
	// clients on other addresses the server listens on (listen_addresses in
	// Settings).
	HBA []string
	// Bindir is the folder of the server binaries (initdb, postgres), e.g.
	// Bindir17(), so that one test binary can run clusters of several
	// versions. Empty means the folder found as StartCluster says.
	Bindir string
}

const (
	// DefaultClusterMaxConnections is a throwaway cluster's max_connections.
	DefaultClusterMaxConnections = 100
	// ClusterStartTimeout bounds initdb plus the server's start.
	ClusterStartTimeout = 2 * time.Minute
	// ClusterStopTimeout bounds a fast shutdown before the server is killed.
	ClusterStopTimeout = 30 * time.Second
)

// LogicalSettings are the settings of the cluster Logical starts: logical
// decoding, with wal senders and slots enough for a package's parallel tests.
var LogicalSettings = map[string]string{
	"wal_level":             "logical",
	"max_wal_senders":       "40",
	"max_replication_slots": "40",
}

// fastSettings make a cluster small and quick; durability is not tested on it.
var fastSettings = map[string]string{
	"fsync":                      "off",
	"synchronous_commit":         "off",
	"full_page_writes":           "off",
	"shared_buffers":             "32MB",
	"max_wal_size":               "256MB",
	"checkpoint_timeout":         "30min",
	"listen_addresses":           "127.0.0.1",
	"log_min_messages":           "warning",
	"log_min_error_statement":    "panic",
	"dynamic_shared_memory_type": "mmap",
	"max_prepared_transactions":  "0",
}

// StartCluster initialises and starts a throwaway cluster. Binaries come from
// ClusterConfig.Bindir, else PGOUTBOX_TEST_PG_BINDIR, else `pg_config --bindir`, else the PATH, else the
// newest /usr/lib/postgresql/*/bin; when the process runs as root they run as the
// OS user postgres (initdb refuses root). Stop it when done.
func StartCluster(cfg *ClusterConfig) (*Cluster, error) {
	var c ClusterConfig
	if cfg != nil {
		c = *cfg
	}
	if c.MaxConnections == 0 {
		c.MaxConnections = DefaultClusterMaxConnections
	}
	if c.MaxConnections < 0 {
		return nil, fmt.Errorf("pgtest: ClusterConfig.MaxConnections (%d) must be positive", c.MaxConnections)
	}
	bindir := c.Bindir
	if bindir == "" {
		var err error
		if bindir, err = pgBindir(); err != nil {
			return nil, err
		}
	}
	cred, err := serverCredential()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "pgoutbox-pg-")
	if err != nil {
		return nil, fmt.Errorf("pgtest: cluster directory: %w", err)
	}
	cl, err := startCluster(&c, bindir, dir, cred)
	if err != nil {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	return cl, nil
}

func startCluster(c *ClusterConfig, bindir, dir string, cred *osUser) (*Cluster, error) {
	ctx, cancel := context.WithTimeout(context.Background(), ClusterStartTimeout)
	defer cancel()
	if cred != nil {
		if err := os.Chown(dir, int(cred.uid), int(cred.gid)); err != nil {
			return nil, fmt.Errorf("pgtest: cluster directory: %w", err)
		}
	}
	data := filepath.Join(dir, "data")
	initdb := exec.CommandContext(ctx, filepath.Join(bindir, "initdb"), "-D", data, "-U", "postgres",
		"-A", "trust", "-E", "UTF8", "--locale=C", "--no-sync", "--no-instructions")
	initdb.Dir = dir
	initdb.SysProcAttr = procAttr(cred, false)
	if out, err := initdb.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("pgtest: initdb %s: %w\n%s", data, err, out)
	}
	if len(c.HBA) > 0 {
		f, err := os.OpenFile(filepath.Join(data, "pg_hba.conf"), os.O_APPEND|os.O_WRONLY, 0)
		if err != nil {
			return nil, fmt.Errorf("pgtest: pg_hba.conf: %w", err)
		}
		_, err = f.WriteString(strings.Join(c.HBA, "\n") + "\n")
		if err = errors.Join(err, f.Close()); err != nil {
			return nil, fmt.Errorf("pgtest: pg_hba.conf: %w", err)
		}
	}
	settings := map[string]string{}
	for _, m := range []map[string]string{fastSettings, {"max_connections": strconv.Itoa(c.MaxConnections)}, c.Settings} {
		for k, v := range m {
			settings[k] = v
		}
	}
	// A free port can be taken by someone else between choosing it and the
	// server binding it: try a few.
	var lastErr error
	for range 5 {
		port, err := freePort()
		if err != nil {
			return nil, err
		}
		cl, err := runServer(ctx, bindir, dir, data, port, settings, cred, createTestDatabase)
		if err == nil {
			return cl, nil
		}
		lastErr = err
		if ctx.Err() != nil {
			break
		}
	}
	return nil, lastErr
}

// runServer starts the postmaster on port and waits until ready, given the URL
// of its postgres database, succeeds (for a primary: the "test" database is
// created).
func runServer(ctx context.Context, bindir, dir, data string, port int, settings map[string]string, cred *osUser,
	ready func(ctx context.Context, adminURL string) error) (*Cluster, error) {
	logf, err := os.OpenFile(filepath.Join(dir, "server.log"), os.O_CREATE|os.O_TRUNC|os.O_RDWR, 0o644)
	if err != nil {
		return nil, fmt.Errorf("pgtest: server log: %w", err)
	}
	args := []string{"-D", data, "-p", strconv.Itoa(port), "-k", dir}
	names := make([]string, 0, len(settings))
	for k := range settings {
		names = append(names, k)
	}
	sort.Strings(names)
	for _, k := range names {
		args = append(args, "-c", k+"="+settings[k])
	}
	cmd := exec.Command(filepath.Join(bindir, "postgres"), args...)
	cmd.Dir = dir
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = procAttr(cred, true)
	cl := &Cluster{
		URL:      fmt.Sprintf("postgres://postgres@127.0.0.1:%d/test?sslmode=disable", port),
		Port:     port,
		dir:      dir,
		bindir:   bindir,
		cred:     cred,
		settings: settings,
		logf:     logf,
		cmd:      cmd,
		exited:   make(chan struct{}),
	}
	if err := cl.start(); err != nil {
		_ = logf.Close()
		return nil, fmt.Errorf("pgtest: start postgres: %w", err)
	}
	admin := fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable&connect_timeout=5", port)
	for {
		err := ready(ctx, admin)
		if err == nil {
			return cl, nil
		}
		select {
		case <-cl.exited:
			_ = logf.Close()
			return nil, fmt.Errorf("pgtest: postgres on port %d exited (%v):\n%s", port, cl.err, cl.logTail())
		case <-ctx.Done():
			_ = cl.Stop()
			return nil, fmt.Errorf("pgtest: postgres on port %d did not accept connections within %s: %v:\n%s", port, ClusterStartTimeout, err, cl.logTail())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// start runs the postmaster from a goroutine locked to its OS thread for as long
// as the postmaster lives: a parent-death signal is sent when the thread that
// started the child ends, and the Go runtime may otherwise end threads.
func (c *Cluster) start() error {
	started := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		if err := c.cmd.Start(); err != nil {
			started <- err
			runtime.UnlockOSThread()
			return
		}
		started <- nil
		c.err = c.cmd.Wait()
		close(c.exited)
		// The thread is left locked: it ends with this goroutine, after the
		// postmaster it guarded.
	}()
	return <-started
}

func createTestDatabase(ctx context.Context, adminURL string) error {
	conn, err := pgx.Connect(ctx, adminURL)
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	_, err = conn.Exec(ctx, "CREATE DATABASE test")
	return err
}

// Stop shuts the cluster down (a fast shutdown, then a kill after
// ClusterStopTimeout) and removes its files. It is safe to call more than once.
func (c *Cluster) Stop() error {
	c.stopOnce.Do(func() {
		c.stopErr = c.stop()
	})
	return c.stopErr
}

func (c *Cluster) stop() error {
	var errs []error
	select {
	case <-c.exited:
	default:
		_ = c.Thaw() // a frozen server cannot shut down
		if err := c.cmd.Process.Signal(os.Interrupt); err != nil && !errors.Is(err, os.ErrProcessDone) {
			errs = append(errs, fmt.Errorf("pgtest: stop postgres: %w", err))
		}
		select {
		case <-c.exited:
		case <-time.After(ClusterStopTimeout):
			_ = c.cmd.Process.Kill()
			<-c.exited
			errs = append(errs, fmt.Errorf("pgtest: postgres did not stop within %s; killed:\n%s", ClusterStopTimeout, c.logTail()))
		}
	}
	_ = c.logf.Close()
	if err := os.RemoveAll(c.dir); err != nil {
		errs = append(errs, fmt.Errorf("pgtest: remove cluster directory: %w", err))
	}
	return errors.Join(errs...)
}

// LogFile is the path of the server's log (its stderr, with the settings'
// log_min_messages), for tests that look for what the server logged. It is
// removed by Stop.
func (c *Cluster) LogFile() string { return c.logf.Name() }

// Pid is the postmaster's process id.
func (c *Cluster) Pid() int { return c.cmd.Process.Pid }

// logTail is the end of the server's log, for a failure message.
func (c *Cluster) logTail() string {
	b, err := os.ReadFile(c.logf.Name())
	if err != nil {
		return "(no server log: " + err.Error() + ")"
	}
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	if len(lines) > 30 {
		lines = lines[len(lines)-30:]
	}
	return strings.Join(lines, "\n")
}

// freePort is a port for a cluster or a pooler of a test: outside the
// ephemeral range (internal/freeport).
func freePort() (int, error) {
	port, err := freeport.Pick()
	if err != nil {
		return 0, fmt.Errorf("pgtest: find a free port: %w", err)
	}
	return port, nil
}

// errNoBinaries is returned when no PostgreSQL server binaries are found.
var errNoBinaries = errors.New("pgtest: no PostgreSQL server binaries (initdb, postgres) found: " +
	"install the PostgreSQL server package (Debian: postgresql) or set PGOUTBOX_TEST_PG_BINDIR to the directory holding initdb")

// pgBindir finds the directory holding initdb and postgres.
func pgBindir() (string, error) {
	has := func(dir string) bool {
		for _, b := range []string{"initdb", "postgres"} {
			if st, err := os.Stat(filepath.Join(dir, b)); err != nil || st.IsDir() {
				return false
			}
		}
		return true
	}
	if d := os.Getenv(BindirEnv); d != "" {
		if !has(d) {
			return "", fmt.Errorf("pgtest: PGOUTBOX_TEST_PG_BINDIR=%s holds no initdb and postgres", d)
		}
		return d, nil
	}
	if out, err := exec.Command("pg_config", "--bindir").Output(); err == nil {
		if d := strings.TrimSpace(string(out)); has(d) {
			return d, nil
		}
	}
	if p, err := exec.LookPath("initdb"); err == nil && has(filepath.Dir(p)) {
		return filepath.Dir(p), nil
	}
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	slices.SortFunc(dirs, func(a, b string) int {
		va, _ := strconv.Atoi(filepath.Base(filepath.Dir(a)))
		vb, _ := strconv.Atoi(filepath.Base(filepath.Dir(b)))
		return vb - va
	})
	for _, d := range dirs {
		if has(d) {
			return d, nil
		}
	}
	return "", errNoBinaries
}

// serverCredential is nil, or the OS user postgres when the process runs as root
// (initdb and postgres refuse to run as root).
// osUser is the OS user the server's processes run as.
type osUser struct{ uid, gid uint32 }

func serverCredential() (*osUser, error) {
	if os.Geteuid() != 0 {
		return nil, nil
	}
	u, err := user.Lookup("postgres")
	if err != nil {
		return nil, fmt.Errorf("pgtest: running as root, and initdb refuses root: need the OS user postgres: %w", err)
	}
	uid, err1 := strconv.ParseUint(u.Uid, 10, 32)
	gid, err2 := strconv.ParseUint(u.Gid, 10, 32)
	if err := errors.Join(err1, err2); err != nil {
		return nil, fmt.Errorf("pgtest: user postgres: %w", err)
	}
	return &osUser{uid: uint32(uid), gid: uint32(gid)}, nil
}
