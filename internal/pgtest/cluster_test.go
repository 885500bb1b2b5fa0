package pgtest

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/pgoutbox/internal/wait"
)

func TestMain(m *testing.M) {
	if os.Getenv("PGTEST_CHILD_CLUSTER") != "" {
		childCluster()
		return
	}
	os.Exit(Main(m).Run())
}

// The logical cluster has logical decoding: a pgoutput slot can be made, as a
// non-superuser with REPLICATION too.
func TestLogicalCluster(t *testing.T) {
	t.Parallel()
	url := Logical(t)
	if again := Logical(t); again != url {
		t.Fatalf("second Logical call: %s, want the same cluster %s", again, url)
	}
	pool := Pool(t, url, 2)
	ctx := context.Background()
	for name, want := range map[string]string{"wal_level": "logical", "fsync": "off", "max_connections": strconv.Itoa(DefaultClusterMaxConnections)} {
		var got string
		Must(t, pool.QueryRow(ctx, "SHOW "+name).Scan(&got), "show %s", name)
		if got != want {
			t.Errorf("%s = %s, want %s", name, got, want)
		}
	}
	slot := Name("slot")
	_, err := pool.Exec(ctx, "SELECT pg_create_logical_replication_slot($1, 'pgoutput')", slot)
	Must(t, err, "create slot")
	_, err = pool.Exec(ctx, "SELECT pg_drop_replication_slot($1)", slot)
	Must(t, err, "drop slot")

	db := DatabaseOn(t, url)
	if !strings.Contains(db, strings.TrimSuffix(strings.TrimPrefix(url, "postgres://postgres@"), "/test?sslmode=disable")) {
		t.Errorf("DatabaseOn(%s) = %s: not on that server", url, db)
	}
	Must(t, Pool(t, db, 1).Ping(ctx), "ping the new database")
}

// Stop shuts the server down and removes its files; a second Stop is harmless.
func TestClusterStop(t *testing.T) {
	t.Parallel()
	c, err := StartCluster(&ClusterConfig{MaxConnections: 20})
	Must(t, err, "start")
	conn, err := pgx.Connect(context.Background(), c.URL)
	Must(t, err, "connect")
	defer conn.Close(context.Background())
	var n string
	Must(t, conn.QueryRow(context.Background(), "SHOW max_connections").Scan(&n), "show")
	if n != "20" {
		t.Errorf("max_connections %s, want 20", n)
	}
	Must(t, c.Stop(), "stop")
	Must(t, c.Stop(), "second stop")
	if _, err := os.Stat(c.dir); !os.IsNotExist(err) {
		t.Errorf("cluster directory %s after Stop: %v", c.dir, err)
	}
	if !processGone(c.Pid()) {
		t.Errorf("postmaster %d still running after Stop", c.Pid())
	}
}

func TestClusterConfigInvalid(t *testing.T) {
	t.Parallel()
	if _, err := StartCluster(&ClusterConfig{MaxConnections: -1}); err == nil || !strings.Contains(err.Error(), "MaxConnections (-1)") {
		t.Fatalf("StartCluster with MaxConnections -1: %v", err)
	}
}

// A test process that is killed (SIGKILL: no cleanup runs) takes its cluster
// down with it.
func TestClusterDiesWithTheTestProcess(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("the parent-death signal is Linux's")
	}
	t.Parallel()
	child := exec.Command(os.Args[0], "-test.run=^$")
	child.Env = append(os.Environ(), "PGTEST_CHILD_CLUSTER=1")
	out, err := child.StdoutPipe()
	Must(t, err, "pipe")
	child.Stderr = os.Stderr
	Must(t, child.Start(), "start the child")
	var pid, port int
	var dir string
	line, err := bufio.NewReader(out).ReadString('\n')
	if _, serr := fmt.Sscan(line, &pid, &port, &dir); err != nil || serr != nil {
		_ = child.Process.Kill()
		_ = child.Wait()
		t.Fatalf("child: %q: %v %v", line, err, serr)
	}
	t.Cleanup(func() {
		if !processGone(pid) { // the test failed: do not leak the server
			_ = syscall.Kill(pid, syscall.SIGQUIT)
		}
		_ = os.RemoveAll(dir)
	})
	if processGone(pid) {
		t.Fatalf("postmaster %d not running before the kill", pid)
	}
	Must(t, child.Process.Kill(), "kill the child")
	_ = child.Wait()
	wait.For(t, time.Minute, "the postmaster to exit after its test process was killed", func() bool { return processGone(pid) })
	wait.For(t, 30*time.Second, "the port to close", func() bool {
		c, err := net.DialTimeout("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), time.Second)
		if err == nil {
			c.Close()
		}
		return err != nil
	})
}

// childCluster is the child of TestClusterDiesWithTheTestProcess: it starts a
// cluster, prints its postmaster's pid, port and directory, and waits to be
// killed.
func childCluster() {
	c, err := StartCluster(nil)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	port := strings.TrimPrefix(c.URL, "postgres://postgres@127.0.0.1:")
	port = port[:strings.IndexByte(port, '/')]
	fmt.Printf("%d %s %s\n", c.Pid(), port, c.dir)
	select {}
}

// processGone reports whether pid is gone or a zombie nobody reaped.
func processGone(pid int) bool {
	if err := syscall.Kill(pid, 0); err != nil {
		return true
	}
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return runtime.GOOS == "linux"
	}
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
	return len(f) > 0 && f[0] == "Z"
}

// ClusterConfig.HBA lines are appended to pg_hba.conf, after initdb's.
func TestClusterHBA(t *testing.T) {
	t.Parallel()
	line := "host all all 198.51.100.7/32 trust"
	c, err := StartCluster(&ClusterConfig{HBA: []string{line}})
	Must(t, err, "start cluster")
	t.Cleanup(func() { _ = c.Stop() })
	pool := Pool(t, c.URL, 1)
	var n int
	Must(t, pool.QueryRow(context.Background(),
		"SELECT count(*) FROM pg_hba_file_rules WHERE address = '198.51.100.7' AND auth_method = 'trust' AND error IS NULL").Scan(&n), "read pg_hba rules")
	if n != 1 {
		t.Fatalf("pg_hba.conf has %d rules for %q, want 1", n, line)
	}
}
