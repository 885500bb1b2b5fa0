package bench

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

// peerBench is an enqueue bench in a schema of its own on the test database,
// with peerBin as Config.EnqueuePeerBin; both are gone when t ends.
func peerBench(t *testing.T, peerBin string) *enqueueBench {
	t.Helper()
	c, err := (&Config{DatabaseURL: pgtest.URL(), Scenarios: []string{ScenarioEnqueue}, Duration: 2 * time.Second, EnqueueRounds: 2,
		PayloadBytes: 256, EnqueuePeerBin: peerBin}).withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	r := &Runner{cfg: c, admin: pgtest.Pool(t, pgtest.URL(), 4), prog: newProgress(nil, false)}
	s, err := r.newSchema(context.Background(), "enqueuepeer")
	pgtest.Must(t, err, "schema")
	t.Cleanup(func() { r.dropSchema(s) })
	e, err := r.newEnqueueBench(context.Background(), s)
	pgtest.Must(t, err, "enqueue bench")
	t.Cleanup(e.close)
	return e
}

// With the peer binary, its cells run interleaved with the bench's own, round
// by round, and the table, the ratios and their CPU show them; every business
// row of the peer's transactions has its watermill-sql message.
func TestEnqueuePeerCell(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the peer binary")
	}
	bin := filepath.Join(t.TempDir(), "watermillsql")
	build := exec.Command("go", "build", "-o", bin, "github.com/pgoutbox/pgoutbox/bench/peers/watermillsql")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	e := peerBench(t, bin)
	r, s := e.r, e.s
	var specs []enqueueSpec
	for _, sp := range e.specs() {
		if sp.producers == 1 && (!sp.outbox && !sp.floor && !sp.watermill || sp.outbox && sp.notify && !sp.batched || sp.peer) {
			specs = append(specs, sp) // no outbox, EnqueueTx, the peer: enough to compare
		}
	}
	if len(specs) != 3 || !specs[2].peer || e.res.PeerNotRun != "" {
		t.Fatalf("specs %+v, not run %q", specs, e.res.PeerNotRun)
	}
	pgtest.Must(t, e.phase(ctx, specs, nil), "phase")
	e.res.Ratios = e.res.ratios()
	cl := e.res.cell(enqueueSpec{producers: 1, peer: true, notify: true})
	if cl == nil || cl.Commits <= 0 || len(cl.RoundCommitsPerSec) != 2 || cl.P50Ms <= 0 {
		t.Fatalf("peer cell %+v", cl)
	}
	if len(e.backends) > 0 && (cl.CPUUsPerCommit <= 0 || len(cl.RoundCPUUsPerCommit) != 2) {
		t.Errorf("the peer cell's CPU was not read: %+v", cl)
	}
	rt := e.res.Ratios
	if rt.WatermillSQLTimeRatio1 <= 0 || rt.EnqueueVsWatermillSQL1 <= 0 {
		t.Errorf("ratios %+v", rt)
	}
	// The last round's messages and the peer's business rows (ids after the
	// bench's own cells') pair up.
	var business, messages int64
	pgtest.Must(t, r.admin.QueryRow(ctx, "SELECT count(*) FROM "+pgx.Identifier{s.name, "watermill_outbox"}.Sanitize()).Scan(&messages), "count messages")
	pgtest.Must(t, r.admin.QueryRow(ctx, "SELECT count(*) FROM "+e.orders+" WHERE id > (SELECT max(id) FROM "+e.orders+") - $1", messages).Scan(&business), "count")
	if messages == 0 || business != messages {
		t.Errorf("%d messages, %d business rows", messages, business)
	}
	var out bytes.Buffer
	(&Result{Enqueue: e.res}).WriteText(&out)
	for _, want := range []string{"watermill-sql", peerName + " ", "EnqueueTx / it"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("text lacks %q:\n%s", want, out.String())
		}
	}
	if len(e.backends) > 0 && !strings.Contains(out.String(), peerName+" (its process + its backends)") {
		t.Errorf("text lacks the peer's CPU:\n%s", out.String())
	}
	t.Log(out.String())
}

// Without the peer binary its cells are not run, and the result says so and
// how to build it; a peer binary that is not there is refused before anything
// runs.
func TestEnqueuePeerMissing(t *testing.T) {
	e := peerBench(t, "")
	for _, sp := range e.specs() {
		if sp.peer {
			t.Errorf("a peer cell without a peer binary: %+v", sp)
		}
	}
	var out bytes.Buffer
	(&Result{Enqueue: e.res}).WriteText(&out)
	if !strings.Contains(out.String(), "not run: no --enqueue-peer-bin") || !strings.Contains(out.String(), PeerBuildHint) {
		t.Errorf("text does not name the missing peer binary:\n%s", out.String())
	}
	missing := filepath.Join(t.TempDir(), "watermillsql")
	c := Config{DatabaseURL: "postgres://x", Scenarios: []string{ScenarioEnqueue}, EnqueuePeerBin: missing}
	if _, err := c.withDefaults(); err == nil || !strings.Contains(err.Error(), "--enqueue-peer-bin") || !strings.Contains(err.Error(), PeerBuildHint) {
		t.Errorf("a missing peer binary: %v", err)
	}
	pgtest.Must(t, os.WriteFile(missing, []byte("not a program"), 0o644), "write")
	if _, err := c.withDefaults(); err == nil || !strings.Contains(err.Error(), "not an executable") {
		t.Errorf("a peer binary that cannot run: %v", err)
	}
}
