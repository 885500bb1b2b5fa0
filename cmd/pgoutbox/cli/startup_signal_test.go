package cli

import (
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/pgoutbox/pgoutbox/internal/pgtest"
	"github.com/pgoutbox/pgoutbox/internal/wait"
)

// silentServer accepts connections and never answers: a database or broker
// host that hangs during the handshake.
func silentServer(t *testing.T) (addr string, accepted *atomic.Int32) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	pgtest.Must(t, err, "listen")
	accepted = &atomic.Int32{}
	var mu sync.Mutex
	var conns []net.Conn
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			accepted.Add(1)
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		<-done
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
	})
	return ln.Addr().String(), accepted
}

// SIGTERM stops a command during its start-up, while it waits for a database
// that does not answer, long before --connect-timeout; and a hostile tenants
// file of the largest size accepted is refused without holding SIGTERM off
// (it is parsed within bounds).
func TestSIGTERMDuringStartUp(t *testing.T) {
	t.Parallel()
	addr, accepted := silentServer(t)
	dir := t.TempDir()
	hostile := filepath.Join(dir, "laughs.yaml")
	pgtest.Must(t, os.WriteFile(hostile, []byte(laughs(9, 9, maxTenantsFile-200)), 0o600), "write")
	silentDB := "postgres://relay@" + addr + "/app?sslmode=disable"
	for _, tc := range []struct {
		name string
		args []string
	}{
		{"relay connecting", []string{"relay", "--database-url", silentDB, "--broker", "null://", "--connect-timeout", "10m"}},
		{"status connecting", []string{"status", "--database-url", silentDB, "--connect-timeout", "10m"}},
		// The Group's first listing of the database hangs (discovery's own
		// bound is 10s); the broker hangs in the next case.
		{"relay --tenants listing", []string{"relay", "--database-url", silentDB, "--tenants", "t_*", "--broker", "null://",
			"--connect-timeout", "10m"}},
		{"relay --tenants dialing the broker", []string{"relay", "--database-url", pgtest.URL(), "--tenants", "t_*", "--broker", "nats://" + addr,
			"--connect-timeout", "10m", "--ack-timeout", "10m"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := accepted.Load()
			cmd := exec.Command(binary, tc.args...)
			var out syncBuffer
			cmd.Stdout, cmd.Stderr = &out, &out
			pgtest.Must(t, cmd.Start(), "start")
			exited := make(chan struct{})
			go func() { _ = cmd.Wait(); close(exited) }()
			t.Cleanup(func() { _ = cmd.Process.Kill(); <-exited })
			wait.For(t, time.Minute, "the command to connect to the silent server", func() bool { return accepted.Load() > before })
			pgtest.Must(t, cmd.Process.Signal(syscall.SIGTERM), "SIGTERM")
			select {
			case <-exited:
			case <-time.After(2 * time.Minute): // --connect-timeout is 10m
				t.Fatalf("still running 2 minutes after SIGTERM:\n%s", out.String())
			}
			if ws, _ := cmd.ProcessState.Sys().(syscall.WaitStatus); ws.Signaled() {
				t.Fatalf("killed by %v instead of exiting:\n%s", ws.Signal(), out.String())
			}
			t.Logf("exit %d: %s", cmd.ProcessState.ExitCode(), strings.TrimSpace(out.String()))
		})
	}
	t.Run("hostile tenants file", func(t *testing.T) {
		cmd := exec.Command(binary, "relay", "--tenants-file", hostile, "--broker", "null://")
		outb, _ := cmd.CombinedOutput()
		if code := cmd.ProcessState.ExitCode(); code != 2 || !strings.Contains(string(outb), "anchors and aliases") || len(outb) > 1024 {
			t.Fatalf("exit %d, %d bytes of output: %.300q", code, len(outb), outb)
		}
	})
}
