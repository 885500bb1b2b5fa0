package pgtest

import (
	"fmt"
	"os"
	"sync"
	"testing"
)

// A Runner runs a package's tests and then stops the throwaway clusters they
// started. Make one with Main in the package's TestMain:
//
//	func TestMain(m *testing.M) { os.Exit(pgtest.Main(m).Run()) }
//
// or, with goleak, goleak.VerifyTestMain(pgtest.Main(m)).
type Runner struct {
	m       *testing.M
	logical bool
}

// Main returns a Runner for m: the tests may call Logical.
func Main(m *testing.M) *Runner { return &Runner{m: m} }

// MainLogical is Main for a package whose tests all need logical replication:
// before the tests run, it starts the logical cluster and points
// PGOUTBOX_TEST_DATABASE_URL at it, so that URL, Schema, Migrated, Database and
// the programs the tests start use it.
func MainLogical(m *testing.M) *Runner { return &Runner{m: m, logical: true} }

// the binary's logical cluster, started on first use while a Runner runs.
var logical struct {
	mu      sync.Mutex
	running bool // a Runner is running the tests
	cluster *Cluster
	err     error
}

// Run runs the tests and returns their exit code (1 if a cluster would not
// start or stop).
func (r *Runner) Run() int {
	logical.mu.Lock()
	logical.running = true
	logical.mu.Unlock()
	defer stopLogical()
	if r.logical {
		url, err := logicalURL()
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		if err := os.Setenv("PGOUTBOX_TEST_DATABASE_URL", url); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
	}
	code := r.m.Run()
	if err := stopLogical(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		code = max(code, 1)
	}
	return code
}

// Logical returns the connection string of the test binary's throwaway cluster
// with wal_level = logical (its "test" database; LogicalSettings), started on
// the first call and stopped when the tests end. The package's TestMain must run
// the tests with Main or MainLogical. Without PostgreSQL's server binaries the
// test fails (it does not skip): install them.
func Logical(tb testing.TB) string {
	tb.Helper()
	url, err := logicalURL()
	if err != nil {
		tb.Fatal(err)
	}
	return url
}

func logicalURL() (string, error) {
	logical.mu.Lock()
	defer logical.mu.Unlock()
	if !logical.running {
		return "", fmt.Errorf("pgtest: Logical needs the package's TestMain to run the tests with pgtest.Main(m).Run() (which stops the cluster)")
	}
	if logical.cluster == nil && logical.err == nil {
		logical.cluster, logical.err = StartCluster(&ClusterConfig{Settings: LogicalSettings})
	}
	if logical.err != nil {
		return "", fmt.Errorf("pgtest: logical cluster: %w", logical.err)
	}
	return logical.cluster.URL, nil
}

func stopLogical() error {
	logical.mu.Lock()
	defer logical.mu.Unlock()
	logical.running = false
	if logical.cluster == nil {
		return nil
	}
	err := logical.cluster.Stop()
	logical.cluster = nil
	return err
}
