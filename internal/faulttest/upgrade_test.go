package faulttest

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/pgoutbox/internal/pgtest"
	"github.com/pgoutbox/pgoutbox/internal/wait"
	"github.com/pgoutbox/pgoutbox/migrate"
)

// nextReleaseTag builds the "new" binaries of TestRollingUpgrade: this tree
// plus one expand migration (migrate/next_release.go), which stands in for the
// next release's until a tagged release with the compatibility window exists
// to build the "old" binaries from instead of this tree.
const nextReleaseTag = "pgoutbox_next_release"

// upgradeWithin bounds each wait of the upgrade test.
const upgradeWithin = 60 * time.Second

// TestRollingUpgrade follows docs/operations.md "Rolling upgrades" step by
// step with two builds: the old binaries (this tree) and the new ones (this
// tree with nextReleaseTag, one expand migration more). Under load from an old
// producer, with two old relays and an old consumer running: (1) the new
// binary migrates; the old relay, producer and consumer, restarted after it,
// start and work (within their window) and the old relay logs that it is one
// to upgrade; (2) a new relay runs beside an old one on the same outbox, and
// is rolled back to an old one; (3) new producer and consumer take over. The
// checker then finds nothing lost and every aggregate in order. Last, the same
// migration recorded as a contract step makes an old relay refuse to start
// (exit 2), as a release's contract migration would.
func TestRollingUpgrade(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	build := exec.Command("go", "build", "-tags", nextReleaseTag, "-o", dir+string(os.PathSeparator),
		"github.com/pgoutbox/pgoutbox/cmd/pgoutbox",
		"github.com/pgoutbox/pgoutbox/internal/faulttest/cmd/producer",
		"github.com/pgoutbox/pgoutbox/internal/faulttest/cmd/consumer")
	out, err := build.CombinedOutput()
	pgtest.Must(t, err, "build the new binaries: %s", out)
	next := struct{ pgoutbox, producer, consumer string }{
		filepath.Join(dir, "pgoutbox"), filepath.Join(dir, "producer"), filepath.Join(dir, "consumer")}

	e := newEnv(t, envConfig{})
	ctx := context.Background()
	published := func() int { return e.count("outbox_events", "published_at IS NOT NULL") }
	progress := func(what string) {
		t.Helper()
		from := published()
		wait.For(t, upgradeWithin, what, func() bool { e.failOnCrash(); return published() >= from+20 })
	}
	load := producerOpts{txs: 0, aggregates: 15, rollbackPercent: 10, pause: 10 * time.Millisecond}

	// Before: everything old.
	consumer := e.consumer("old", nil)
	producer := e.producer("old", nil, load)
	relayA := e.relay("old-a", nil)
	relayB := e.relay("old-b", nil)
	progress("the old pipeline to publish")

	// 1. Migrate with the new binary, the old processes running.
	migrated := e.start("migrate (new)", nil, next.pgoutbox, "migrate", "--database-url", e.dbURL("faulttest-migrate"), "--schema", e.schema)
	migrated.wait(t, upgradeWithin)
	if migrated.err != nil {
		t.Fatalf("new migrate: %v\n%s", migrated.err, migrated.out.String())
	}
	table := pgx.Identifier{e.schema, migrate.Table}.Sanitize()
	var compat string
	pgtest.Must(t, e.pool.QueryRow(ctx, "SELECT compat FROM "+table+" WHERE name = 'next_release_expand'").Scan(&compat), "the new migration's row")
	if compat != string(migrate.CompatExpand) {
		t.Fatalf("the new migration was recorded as %q", compat)
	}
	// The old processes, restarted after the migration, start and work.
	relayA.kill(t)
	relayA = e.relay("old-a-restarted", nil)
	relayA.waitLine(t, "all expand steps within this binary's window")
	producer.kill(t)
	producer = e.producer("old-restarted", nil, load)
	consumer.kill(t)
	consumer = e.consumer("old-restarted", nil)
	progress("the restarted old pipeline to publish")

	// 2. Roll the relays: a new relay beside an old one, then rolled back.
	relayB.term(t)
	relayC := e.relayOn(relayHost{binary: next.pgoutbox}, "new-c", nil)
	relayC.waitLine(t, "relay starting")
	progress("old and new relays to publish together")
	relayA.term(t)
	progress("the new relay alone to publish")
	relayC.term(t) // rolled back
	relayA = e.relay("old-a-rolled-back", nil)
	progress("the rolled-back old relay to publish")
	if strings.Contains(relayC.out.String(), "within this binary's window") {
		t.Errorf("the new relay says it is behind the database:\n%s", tail(relayC.out.String(), 20))
	}

	// 3. Roll producers and consumers.
	producer.term(t)
	newLoad := load
	newLoad.binary = next.producer
	producer = e.producer("new", nil, newLoad)
	consumer.term(t)
	e.consumerOf(next.consumer, "new", nil)
	progress("the new producer and consumer to work")
	producer.term(t)
	e.waitDrained(upgradeWithin)
	mustHold(t, e.verdict())
	t.Logf("the old relay said, restarted after the migration:\n%s", grepLines(relayA.out.String(), "window"))

	// A contract step instead: old binaries refuse it, naming it.
	_, err = e.pool.Exec(ctx, "UPDATE "+table+" SET compat = 'contract' WHERE name = 'next_release_expand'")
	pgtest.Must(t, err, "record the migration as a contract step")
	args, env := urlsToEnv([]string{"relay", "--database-url", e.dbURL("faulttest-old-relay"), "--schema", e.schema,
		"--broker", "null://", "--id", "old-refused"})
	cmd := exec.Command(bin.pgoutbox, args...)
	cmd.Env = append(os.Environ(), env...)
	out, err = cmd.CombinedOutput()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 2 || !strings.Contains(string(out), "next_release_expand (contract)") {
		t.Fatalf("an old relay against a contract migration: %v\n%s", err, out)
	}
	e.stopAll()
}

// grepLines returns the lines of s holding sub.
func grepLines(s, sub string) string {
	var b strings.Builder
	for l := range strings.Lines(s) {
		if strings.Contains(l, sub) {
			b.WriteString(l)
		}
	}
	return b.String()
}
