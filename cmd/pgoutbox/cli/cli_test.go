package cli

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/spf13/cobra"
	"go.uber.org/goleak"

	"github.com/pgoutbox/pgoutbox/internal/pgtest"
	"github.com/pgoutbox/pgoutbox/migrate"
)

// binary is the pgoutbox command built once for tests that need real processes.
var binary string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "pgoutbox-cli-test")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	binary = filepath.Join(dir, "pgoutbox")
	build := exec.Command("go", "build", "-o", binary, "github.com/pgoutbox/pgoutbox/cmd/pgoutbox")
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "build pgoutbox:", err)
		os.Exit(1)
	}
	code := pgtest.Main(m).Run() // stops the throwaway clusters the tests started
	if code == 0 {
		// OpenCensus, which the Pub/Sub client links, starts its stats worker
		// in an init function: it runs for the life of the process.
		if err := goleak.Find(goleak.IgnoreTopFunction("go.opencensus.io/stats/view.(*worker).start")); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	_ = os.RemoveAll(dir)
	os.Exit(code)
}

// run executes the CLI in-process.
func run(t *testing.T, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	var out, errb bytes.Buffer
	code = Run(context.Background(), args, &out, &errb)
	return out.String(), errb.String(), code
}

func TestMigrateTwiceOnFreshDatabase(t *testing.T) {
	t.Parallel()
	url := pgtest.Database(t)
	out, errOut, code := run(t, "migrate", "--database-url", url)
	if code != 0 || !strings.Contains(out, "applied outbox/0001_outbox_events") || !strings.Contains(out, "applied inbox/0001_processed_events") {
		t.Fatalf("first migrate: code %d, stdout %q, stderr %q", code, out, errOut)
	}
	out, errOut, code = run(t, "migrate", "--database-url", url)
	if code != 0 || strings.TrimSpace(out) != "schema public is up to date" {
		t.Fatalf("second migrate: code %d, stdout %q, stderr %q", code, out, errOut)
	}
	out, _, code = run(t, "migrate", "status", "--database-url", url)
	if all, _ := migrate.All(); code != 0 || strings.Count(out, "applied") != len(all) || strings.Contains(out, "pending") {
		t.Fatalf("status: code %d:\n%s", code, out)
	}
}

// Four real processes migrating one fresh database at the same moment all succeed.
func TestMigrateConcurrentProcesses(t *testing.T) {
	t.Parallel()
	url := pgtest.Database(t)
	const procs = 4
	var wg sync.WaitGroup
	outs := make([]string, procs)
	errs := make([]error, procs)
	for i := range procs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cmd := exec.Command(binary, "migrate")
			cmd.Env = append(os.Environ(), "DATABASE_URL="+url, "PGOUTBOX_SCHEMA=app_outbox")
			b, err := cmd.CombinedOutput()
			outs[i], errs[i] = string(b), err
		}()
	}
	wg.Wait()
	applied := 0
	for i := range procs {
		if errs[i] != nil {
			t.Fatalf("process %d: %v: %s", i, errs[i], outs[i])
		}
		applied += strings.Count(outs[i], "applied ")
	}
	all, _ := migrate.All()
	if applied != len(all) {
		t.Fatalf("processes applied %d migrations in all, want %d:\n%s", applied, len(all), strings.Join(outs, "\n"))
	}
	pool := pgtest.Pool(t, url, 1)
	var n int
	pgtest.Must(t, pool.QueryRow(context.Background(), "SELECT count(*) FROM app_outbox.pgoutbox_migrations").Scan(&n), "bookkeeping")
	if n != len(all) {
		t.Fatalf("bookkeeping has %d rows", n)
	}
}

// Bad configuration exits non-zero with exactly one clear line and no stack trace,
// from the real binary.
func TestBadDatabaseConfigExitsWithOneLine(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name string
		env  []string
		args []string
		code int
		want string
	}{
		{"missing", []string{"DATABASE_URL="}, []string{"migrate"}, 2, "no database: set --database-url or DATABASE_URL"},
		{"malformed", nil, []string{"migrate", "--database-url", "postgres://u:hunter2@host:notaport/db"}, 2, "invalid database URL"},
		{"unreachable", nil, []string{"migrate", "--database-url", "postgres://postgres@127.0.0.1:1/db?sslmode=disable"}, 1, "connect to database"},
		{"bad env URL", []string{"DATABASE_URL=::::"}, []string{"migrate", "status"}, 2, "invalid database URL"},
		{"bad timeout", []string{"PGOUTBOX_CONNECT_TIMEOUT=soon"}, []string{"migrate", "--database-url", "postgres://x@127.0.0.1/db"}, 2, "PGOUTBOX_CONNECT_TIMEOUT"},
		{"bad schema", nil, []string{"migrate", "print", "--schema", strings.Repeat("s", 64)}, 2, "--schema"},
		{"bad lines", nil, []string{"migrate", "print", "--lines", "outbox,dlq"}, 2, `unknown migration line "dlq"`},
		{"unknown flag", nil, []string{"migrate", "--nope"}, 2, "unknown flag: --nope"},
		{"unknown verb", nil, []string{"frobnicate"}, 2, `unknown command "frobnicate"`},
		{"stray argument", nil, []string{"version", "extra"}, 2, "takes no arguments"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			cmd := exec.Command(binary, tc.args...)
			cmd.Env = append(os.Environ(), tc.env...)
			var stdout, stderr bytes.Buffer
			cmd.Stdout, cmd.Stderr = &stdout, &stderr
			err := cmd.Run()
			code := 0
			if ee, ok := err.(*exec.ExitError); ok {
				code = ee.ExitCode()
			} else if err != nil {
				t.Fatal(err)
			}
			msg := stderr.String()
			if code != tc.code || strings.Count(msg, "\n") != 1 || !strings.HasPrefix(msg, "pgoutbox: ") || !strings.Contains(msg, tc.want) {
				t.Fatalf("exit %d (want %d), stderr %q (want one line with %q)", code, tc.code, msg, tc.want)
			}
			if strings.Contains(msg, "hunter2") || strings.Contains(msg, "goroutine ") {
				t.Fatalf("stderr leaks a password or a stack: %q", msg)
			}
		})
	}
}

// Every verb, down to subcommands, answers --help.
func TestHelpOnEveryVerb(t *testing.T) {
	t.Parallel()
	var paths [][]string
	var walk func(c *cobra.Command, path []string)
	walk = func(c *cobra.Command, path []string) {
		paths = append(paths, path)
		for _, sub := range c.Commands() {
			if sub.Name() != "help" {
				walk(sub, append(append([]string{}, path...), sub.Name()))
			}
		}
	}
	walk(newRoot(nil, nil), nil)
	if len(paths) < 5 {
		t.Fatalf("found only %v", paths)
	}
	for _, p := range paths {
		out, errOut, code := run(t, append(p, "--help")...)
		if code != 0 || !strings.Contains(out, "Usage:") || errOut != "" {
			t.Errorf("%v --help: code %d, stderr %q, stdout %q", p, code, errOut, out)
		}
	}
}

func TestMigratePrintAndEnv(t *testing.T) {
	t.Setenv("PGOUTBOX_SCHEMA", "from_env")
	out, _, code := run(t, "migrate", "print", "--lines", "inbox")
	if code != 0 || !strings.Contains(out, `CREATE TABLE IF NOT EXISTS "from_env".processed_events`) || strings.Contains(out, "outbox_events") {
		t.Fatalf("code %d:\n%s", code, out)
	}
	// A flag beats the environment.
	out, _, _ = run(t, "migrate", "print", "--schema", "from_flag")
	if !strings.Contains(out, `"from_flag".outbox_events`) {
		t.Fatalf("flag did not override env:\n%.300s", out)
	}
}

func TestVersion(t *testing.T) {
	t.Parallel()
	out, _, code := run(t, "version")
	if code != 0 || !strings.HasPrefix(out, "pgoutbox ") || !strings.Contains(out, "schema   outbox v") || !strings.Contains(out, "schema   inbox v") {
		t.Fatalf("code %d:\n%s", code, out)
	}
}
