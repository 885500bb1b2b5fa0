package cli

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/pgoutbox/pgoutbox/examples/orders/audit"
	"github.com/pgoutbox/pgoutbox/examples/orders/fakepay"
	"github.com/pgoutbox/pgoutbox/examples/orders/ordersvc"
	"github.com/pgoutbox/pgoutbox/internal/pgtest"
	"github.com/pgoutbox/pgoutbox/internal/wait"
)

var (
	verdictPass = regexp.MustCompile(`(?m)^verdict: PASS — every order was reserved and charged exactly once: (\d+) orders \((\d+) cancelled\), (\d+) events: (\d+) reserved once, (\d+) released once, (\d+) charged once \((\d+) charges at the payment API, 0 double, \d+ repeated calls absorbed by the key\); .*; (\d+) processes killed$`)
	removedLine = regexp.MustCompile(`(?m)^removed stream DEMO_[0-9A-F]{6} and schema (pgoutbox_demo_[0-9a-f]{6})$`)
)

// demoCmd runs the pgoutbox binary's demo against the test database.
func demoCmd(args ...string) (*exec.Cmd, *bytes.Buffer, *syncWriter) {
	cmd := exec.Command(binary, append([]string{"demo"}, args...)...)
	cmd.Env = append(os.Environ(), "DATABASE_URL="+pgtest.URL())
	var stdout bytes.Buffer
	stderr := &syncWriter{}
	cmd.Stdout, cmd.Stderr = &stdout, stderr
	return cmd, &stdout, stderr
}

type syncWriter struct{ b syncBuffer }

func (w *syncWriter) Write(p []byte) (int, error) {
	w.b.mu.Lock()
	defer w.b.mu.Unlock()
	return w.b.b.Write(p)
}
func (w *syncWriter) String() string { return w.b.String() }

func schemaExists(t *testing.T, name string) bool {
	t.Helper()
	pool := pgtest.Pool(t, pgtest.URL(), 1)
	var ok bool
	pgtest.Must(t, pool.QueryRow(context.Background(), "SELECT EXISTS (SELECT FROM pg_namespace WHERE nspname = $1)", name).Scan(&ok), "schema")
	return ok
}

// Acceptance: the demo under chaos (relays and consumers SIGKILLed and restarted
// at random) ends with the verdict that every order was reserved and charged
// exactly once, exit status 0, and leaves nothing behind.
func TestDemoChaosVerdict(t *testing.T) {
	t.Parallel()
	cmd, stdout, stderr := demoCmd("--duration", "20s", "--chaos")
	done := make(chan error, 1)
	pgtest.Must(t, cmd.Start(), "start demo")
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("demo: %v\nstdout:\n%s\nstderr:\n%s", err, stdout, stderr)
		}
	case <-time.After(4 * time.Minute):
		_ = cmd.Process.Kill()
		<-done
		t.Fatalf("demo did not finish within 4m\nstdout:\n%s\nstderr:\n%s", stdout, stderr)
	}
	out := stdout.String()
	m := verdictPass.FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("no passing verdict line:\n%s\nstderr:\n%s", out, stderr)
	}
	n := func(i int) int { v, _ := strconv.Atoi(m[i]); return v }
	orders, cancelled, events, reserved, released, charged, charges, killed := n(1), n(2), n(3), n(4), n(5), n(6), n(7), n(8)
	if orders < 50 || events != orders+cancelled || reserved != orders || released != cancelled || charged != orders || charges != orders {
		t.Fatalf("verdict figures do not add up: %s", m[0])
	}
	if killed < 3 {
		t.Fatalf("chaos killed only %d processes in 20s:\n%s", killed, out)
	}
	if strings.Count(out, "placing orders") < 10 {
		t.Fatalf("want a progress line per second on a pipe:\n%s", out)
	}
	if strings.Contains(out, "\x1b") {
		t.Fatalf("terminal escapes written to a pipe:\n%q", out)
	}
	rm := removedLine.FindStringSubmatch(out)
	if rm == nil {
		t.Fatalf("no clean-up line:\n%s", out)
	}
	if schemaExists(t, rm[1]) {
		t.Fatalf("schema %s left behind", rm[1])
	}
}

// Ctrl-C stops the demo promptly, says there is no verdict, exits non-zero, and
// removes the schema it created.
func TestDemoInterruptCleansUp(t *testing.T) {
	t.Parallel()
	cmd, _, stderr := demoCmd("--duration", "5m", "--replicas", "1")
	var out syncWriter
	cmd.Stdout = &out
	pgtest.Must(t, cmd.Start(), "start demo")
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	wait.For(t, time.Minute, "the first progress lines", func() bool { return strings.Count(out.String(), "placing orders") >= 2 })
	// The workers get the URLs in their environment: none on a command line (ps).
	workers := childCmdlines(cmd.Process.Pid)
	for _, cl := range workers {
		if strings.Contains(cl, "postgres") || strings.Contains(cl, "nats://") || strings.Contains(cl, "--database-url") || strings.Contains(cl, "--nats-url") {
			t.Errorf("a worker's command line holds a database or NATS URL: %s", cl)
		}
	}
	if len(workers) == 0 {
		t.Errorf("no worker process found")
	}
	pgtest.Must(t, cmd.Process.Signal(syscall.SIGINT), "interrupt")
	select {
	case err := <-done:
		if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 1 {
			t.Fatalf("after SIGINT: %v, want exit status 1\n%s\n%s", err, out.String(), stderr)
		}
	case <-time.After(time.Minute):
		_ = cmd.Process.Kill()
		t.Fatalf("demo did not stop within 1m of SIGINT:\n%s", out.String())
	}
	got := out.String()
	rm := removedLine.FindStringSubmatch(got)
	if !strings.Contains(got, "interrupted after") || rm == nil || !strings.Contains(stderr.String(), "demo interrupted before its verdict") {
		t.Fatalf("stdout:\n%s\nstderr:\n%s", got, stderr)
	}
	if schemaExists(t, rm[1]) {
		t.Fatalf("schema %s left behind", rm[1])
	}
}

func TestDemoUsageErrors(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--duration", "0s"}, "--duration must be positive"},
		{[]string{"--replicas", "0"}, "--replicas 0"},
		{[]string{"--payment-timeout-rate", "0.6"}, "--payment-timeout-rate"},
		{[]string{"--schema", "public"}, "schema public exists"},
	} {
		_, errOut, code := run(t, append([]string{"demo", "--database-url", pgtest.URL()}, tc.args...)...)
		if code != exitUsage || !strings.Contains(errOut, tc.want) || strings.Count(errOut, "\n") != 1 {
			t.Errorf("demo %v: exit %d, stderr %q; want 2 and %q", tc.args, code, errOut, tc.want)
		}
	}
}

// On a terminal the live view redraws its block in place; on a pipe it writes a
// line per tick.
func TestDemoViewRedrawsOnATerminal(t *testing.T) {
	t.Parallel()
	svc, err := ordersvc.New(nil, nil)
	pgtest.Must(t, err, "service")
	d := &demo{f: &demoFlags{duration: time.Minute}, procs: []*demoProc{{name: "relay-1", role: "relay", running: true}}}
	var out bytes.Buffer
	v := &demoView{out: &out, tty: true, d: d, svc: svc, pay: fakepay.New(nil)}
	p := audit.Progress{Events: 10, Unpublished: 2, OldestPendingSeconds: 0.5}
	for range 3 {
		v.draw("placing orders", time.Second, p)
	}
	got := out.String()
	lines := v.lines
	if lines < 5 || strings.Count(got, "\x1b["+strconv.Itoa(lines)+"A") != 2 || strings.Count(got, "\r\x1b[K") != 3*lines ||
		!strings.Contains(got, "oldest pending") || !strings.Contains(got, "duplicates absorbed") {
		t.Fatalf("terminal output:\n%q", got)
	}
	out.Reset()
	v.tty = false
	v.draw("draining", 2*time.Second, p)
	if got := out.String(); strings.Count(got, "\n") != 1 || strings.Contains(got, "\x1b") || !strings.Contains(got, "draining: orders/s") {
		t.Fatalf("pipe output: %q", got)
	}
}

// The verdict can fail: payment workers that leave out the idempotency key turn the
// API's timeouts into double charges, and the demo says so and exits 1.
func TestDemoVerdictFailsWithoutIdempotencyKey(t *testing.T) {
	t.Parallel()
	cmd, stdout, stderr := demoCmd("--duration", "3s", "--replicas", "1", "--no-idempotency-key",
		"--payment-timeout-rate", "0.4", "--payment-fail-rate", "0")
	err := cmd.Run()
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 1 {
		t.Fatalf("demo: %v, want exit status 1\n%s\n%s", err, stdout, stderr)
	}
	out := stdout.String()
	if !regexp.MustCompile(`(?m)^verdict: FAIL — \d+ problems: .*\(\d+ charges at the payment API, [1-9]\d* double`).MatchString(out) ||
		!regexp.MustCompile(`charged [2-9] times by the payment API`).MatchString(out) || removedLine.FindStringSubmatch(out) == nil {
		t.Fatalf("stdout:\n%s\nstderr:\n%s", out, stderr)
	}
}
