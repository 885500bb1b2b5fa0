// Package systool finds the system programs some tests drive (pgbouncer, promtool,
// chromium) and installs the Debian package that holds one when it is missing, so
// the README's test command passes on a fresh machine of the kind the project runs
// on. It is for tests only.
//
// An install runs apt-get as root, one at a time across all test processes of the
// machine (a file lock), and runs apt-get update first only when the package is
// unknown to the package lists. A machine where the program is missing and cannot
// be installed (not root, no apt-get, no package) fails the test with the reason
// and the command a person would run; it never skips.
//
// Node packages (the SQS/SNS and Kinesis emulators, verifier libraries) come the
// same way through [NeedNPM]: pinned versions, installed with npm into a folder
// of the user's cache, one install at a time across the machine.
package systool

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
)

// A Tool is a program and the Debian package that installs it.
type Tool struct {
	// Program is the executable's name, looked up in PATH and in /usr/sbin and
	// /usr/lib/postgresql/*/bin, where Debian puts programs PATH may lack.
	Program string
	// Package is the Debian package that installs Program.
	Package string
}

// The tools the test suite uses.
var (
	PgBouncer = Tool{Program: "pgbouncer", Package: "pgbouncer"}
	Promtool  = Tool{Program: "promtool", Package: "prometheus"}
	Chromium  = Tool{Program: "chromium", Package: "chromium"}
)

// lockPath serialises installs across the test binaries go test runs in parallel.
const lockPath = "/tmp/pgoutbox-systool.lock"

var mu sync.Mutex // serialises installs within one process

// Need returns the path of t's program, installing its package first when the
// program is missing; it fails tb when it cannot.
func Need(tb testing.TB, t Tool) string {
	tb.Helper()
	path, err := Ensure(t)
	if err != nil {
		tb.Fatalf("%v", err)
	}
	return path
}

// Ensure is Need for code that has no testing.TB (a TestMain, a command).
func Ensure(t Tool) (string, error) {
	if p, ok := find(t.Program); ok {
		return p, nil
	}
	mu.Lock()
	defer mu.Unlock()
	unlock, err := lockFile()
	if err != nil {
		return "", fmt.Errorf("systool: %s is missing and the install lock failed: %w", t.Program, err)
	}
	defer unlock()
	if p, ok := find(t.Program); ok { // another process installed it meanwhile
		return p, nil
	}
	if err := install(t.Package); err != nil {
		return "", fmt.Errorf("systool: %s is missing and installing the Debian package %s failed (run: apt-get update && apt-get install -y %s): %w",
			t.Program, t.Package, t.Package, err)
	}
	p, ok := find(t.Program)
	if !ok {
		return "", fmt.Errorf("systool: the Debian package %s installed, but %s is still not found", t.Package, t.Program)
	}
	return p, nil
}

func find(program string) (string, bool) {
	if p, err := exec.LookPath(program); err == nil {
		return p, true
	}
	dirs := []string{"/usr/sbin", "/sbin", "/usr/local/sbin"}
	pg, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	for _, d := range append(dirs, pg...) {
		p := filepath.Join(d, program)
		if fi, err := os.Stat(p); err == nil && !fi.IsDir() && fi.Mode()&0o111 != 0 {
			return p, true
		}
	}
	return "", false
}

func lockFile() (func(), error) {
	f, err := os.OpenFile(lockPath, os.O_CREATE|os.O_RDWR, 0o666)
	if err != nil {
		return nil, err
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		f.Close()
		return nil, err
	}
	return func() {
		_ = syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
		f.Close()
	}, nil
}

func install(pkg string) error {
	if os.Geteuid() != 0 {
		return fmt.Errorf("not root")
	}
	if _, err := exec.LookPath("apt-get"); err != nil {
		return fmt.Errorf("no apt-get on this machine")
	}
	if err := aptGet("install", "-y", "-q", "--no-install-recommends", pkg); err == nil {
		return nil
	}
	// The package lists may be empty or stale on a fresh machine.
	if err := aptGet("update", "-q"); err != nil {
		return err
	}
	return aptGet("install", "-y", "-q", "--no-install-recommends", pkg)
}

func aptGet(args ...string) error {
	cmd := exec.Command("apt-get", append([]string{"-o", "DPkg::Lock::Timeout=600"}, args...)...)
	cmd.Env = append(os.Environ(), "DEBIAN_FRONTEND=noninteractive")
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("apt-get %s: %w: %s", strings.Join(args, " "), err, tail(out.String(), 800))
	}
	return nil
}

func tail(s string, n int) string {
	s = strings.TrimSpace(s)
	if len(s) > n {
		return "…" + s[len(s)-n:]
	}
	return s
}
