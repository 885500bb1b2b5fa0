package pgmatrix_test

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/pgoutbox/internal/pgtest"
)

// suites are the packages the matrix runs: the producer (the root package),
// the relay, the CDC source and the inbox.
var suites = []string{".", "./relay", "./cdc", "./inbox"}

// TestSuitesOnPostgres17 runs the suites against a PostgreSQL 17 cluster of
// its own, and checks first that it is one.
func TestSuitesOnPostgres17(t *testing.T) {
	bindir, err := pgtest.Bindir17()
	if err != nil {
		t.Fatal(err)
	}
	t.Setenv(pgtest.BindirEnv, bindir)
	cluster, err := pgtest.StartCluster(&pgtest.ClusterConfig{MaxConnections: 200})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cluster.Stop() })
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, cluster.URL)
	if err != nil {
		t.Fatal(err)
	}
	var version int
	err = conn.QueryRow(ctx, "SELECT current_setting('server_version_num')::int").Scan(&version)
	conn.Close(ctx)
	if err != nil || version/10000 != 17 {
		t.Fatalf("the matrix cluster runs server_version_num %d (%v), want 17", version, err)
	}

	args := []string{"test", "-count=1", "-p=2"}
	if deadline, ok := t.Deadline(); ok {
		// The suites end before this test's deadline, so a hung test there is
		// reported with its goroutines, not cut off here.
		left := time.Until(deadline) - 30*time.Second
		if left < time.Minute {
			t.Fatalf("%v left before this test's deadline: run go test with a longer -timeout", time.Until(deadline))
		}
		args = append(args, "-timeout="+left.Round(time.Second).String())
	}
	args = append(args, suites...)
	cmd := exec.Command("go", args...)
	cmd.Dir = filepath.Join("..", "..")
	cmd.Env = append(os.Environ(), "PGOUTBOX_TEST_DATABASE_URL="+cluster.URL, pgtest.BindirEnv+"="+bindir)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	start := time.Now()
	if err := cmd.Run(); err != nil {
		t.Fatalf("go %s on PostgreSQL 17: %v after %v\n%s", strings.Join(args, " "), err, time.Since(start).Round(time.Second), tail(out.String(), 256<<10))
	}
	t.Logf("go %s on PostgreSQL 17 (server_version_num %d): ok in %v\n%s", strings.Join(args, " "), version, time.Since(start).Round(time.Second), out.String())
}

// tail returns the last n bytes of s, from a line's start.
func tail(s string, n int) string {
	if len(s) <= n {
		return s
	}
	s = s[len(s)-n:]
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		s = s[i+1:]
	}
	return "…\n" + s
}
