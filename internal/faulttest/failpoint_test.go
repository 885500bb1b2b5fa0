package faulttest

import (
	"context"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/pgoutbox/pgoutbox/checker"
	"github.com/pgoutbox/pgoutbox/internal/failpoint"
	"github.com/pgoutbox/pgoutbox/internal/pgtest"
	"github.com/pgoutbox/pgoutbox/internal/wait"
)

// crashCase is one crash boundary: which process dies there, at which hit, and
// what must be true afterwards beyond the checker's verdict (evidence that the
// crash happened where it was meant to).
type crashCase struct {
	point  string
	victim string // "producer", "relay" or "consumer"
	nth    int
	// before runs right after the victim died, before it is restarted.
	before func(t *testing.T, e *env)
	// after checks the run, with the restarted victim's output.
	after func(t *testing.T, e *env, v *checker.Verdict, restarted *proc)
}

// One test per failpoint: the victim dies of SIGKILL at the point, is restarted
// without it, the pipeline drains, and the checker finds nothing lost, nothing
// from a rollback, no effect applied twice, order held.
func TestCrashAtFailpoint(t *testing.T) {
	t.Parallel()
	cases := []crashCase{
		{point: failpoint.ProducerBeforeCommit, victim: "producer", nth: 10,
			after: func(t *testing.T, e *env, v *checker.Verdict, _ *proc) {
				if v.UnknownRolledBack != 1 || v.UnknownCommitted != 0 {
					t.Fatalf("want the one transaction cut before its commit found rolled back:\n%s", v)
				}
			}},
		{point: failpoint.ProducerAfterCommit, victim: "producer", nth: 10,
			after: func(t *testing.T, e *env, v *checker.Verdict, _ *proc) {
				if v.UnknownCommitted != 1 || v.UnknownRolledBack != 0 {
					t.Fatalf("want the one transaction cut after its commit found committed:\n%s", v)
				}
			}},
		{point: failpoint.RelayClaim, victim: "relay", nth: 3,
			before: func(t *testing.T, e *env) {
				t.Logf("the victim died holding %d leases", e.count("outbox_events", "claimed_by = 'victim' AND published_at IS NULL"))
			}},
		{point: failpoint.RelayBeforePublish, victim: "relay", nth: 2,
			before: func(t *testing.T, e *env) {
				if n := e.count("outbox_events", "claimed_by = 'victim' AND published_at IS NULL"); n == 0 {
					t.Fatal("the victim died before publishing, yet holds no lease")
				}
			}},
		{point: failpoint.RelayAfterPublish, victim: "relay", nth: 2,
			before: func(t *testing.T, e *env) {
				if n := e.count("outbox_events", "claimed_by = 'victim' AND published_at IS NULL"); n == 0 {
					t.Fatal("the victim died between the broker's ack and the mark, yet holds no lease")
				}
			},
			after: func(t *testing.T, e *env, v *checker.Verdict, _ *proc) {
				// The successor published the acked-but-unmarked batch again after the
				// lease (2s), past the stream's 1s duplicate window: stored twice, and
				// the consumer must have applied each once.
				if v.Duplicates == 0 {
					t.Fatalf("no duplicate on the broker: the re-publish after the crash did not happen\n%s", v)
				}
			}},
		{point: failpoint.RelayMark, victim: "relay", nth: 2},
		{point: failpoint.ConsumerAfterCommit, victim: "consumer", nth: 10,
			after: func(t *testing.T, e *env, v *checker.Verdict, restarted *proc) {
				// The effect committed but the ack never went: JetStream redelivered
				// it after AckWait and the inbox found it applied.
				if d := counter(restarted.out.String(), "duplicates"); d < 1 {
					t.Fatalf("the restarted consumer saw %d duplicates, want the unacked message redelivered:\n%s", d, restarted.out.String())
				}
			}},
	}
	for _, c := range cases {
		t.Run(strings.ReplaceAll(c.point, "/", "-"), func(t *testing.T) {
			t.Parallel()
			runCrashCase(t, c)
		})
	}
}

func runCrashCase(t *testing.T, c crashCase) {
	e := newEnv(t, envConfig{})
	fp := failpointEnv(c.point, fmt.Sprintf("%d*crash", c.nth))
	envFor := func(who string) []string {
		if who == c.victim {
			return fp
		}
		return nil
	}
	const txs = 60
	popts := producerOpts{txs: txs, rollbackPercent: 20, pause: 5 * time.Millisecond}

	cons := e.consumer("c1", envFor("consumer"))
	prod := e.producer("p1", envFor("producer"), popts)
	// Let a backlog build so that the relay's early claims find work.
	wait.For(t, 30*time.Second, "a first backlog", func() bool { return prod.exited() || e.count("outbox_events", "true") >= 20 })
	relayID := "r1"
	if c.victim == "relay" {
		relayID = "victim"
	}
	rel := e.relay(relayID, envFor("relay"))

	victim := map[string]*proc{"producer": prod, "relay": rel, "consumer": cons}[c.victim]
	victim.wait(t, 60*time.Second)
	if !victim.killedBySIGKILL() || !strings.Contains(victim.out.String(), "failpoint "+c.point+": crash") {
		t.Fatalf("%s did not die at %s: %s\n%s", victim.name, c.point, victim.status(), tail(victim.out.String(), 30))
	}
	if c.before != nil {
		c.before(t, e)
	}
	var restarted *proc
	switch c.victim {
	case "producer":
		// The rest of the work, under a new name (transaction names are unique).
		restarted = e.producer("p2", nil, producerOpts{txs: txs - c.nth, rollbackPercent: 20, pause: 5 * time.Millisecond})
	case "relay":
		restarted = e.relay("successor", nil)
	case "consumer":
		restarted = e.consumer("c2", nil)
	}
	for _, p := range []*proc{prod, restarted} {
		if strings.HasPrefix(p.name, "producer") {
			p.wait(t, 90*time.Second)
			if p != victim && p.err != nil {
				t.Fatalf("%s: %v\n%s", p.name, p.err, tail(p.out.String(), 20))
			}
		}
	}
	e.waitDrained(60 * time.Second)
	e.stopAll()
	v := e.verdict()
	mustHold(t, v)
	if v.RolledBack == 0 {
		t.Fatalf("no transaction rolled back; guarantee 2 was not exercised:\n%s", v)
	}
	if c.after != nil {
		c.after(t, e, v, restarted)
	}
}

// counter reads name=N from a process's closing line.
func counter(out, name string) int {
	m := regexp.MustCompile(`\b`+name+`=(\d+)`).FindAllStringSubmatch(out, -1)
	if len(m) == 0 {
		return -1
	}
	n, _ := strconv.Atoi(m[len(m)-1][1])
	return n
}

// `pgoutbox cleanup` killed between two of its batches while relays publish and
// producers write, then run again to the end: it deleted only published rows (an
// unpublished one deleted would never reach the broker: lost), and nothing else
// was disturbed.
func TestCrashAtCleanupMidBatch(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envConfig{})
	e.relay("r1", nil)
	e.consumer("c1", nil)
	prod := e.producer("p1", nil, producerOpts{txs: 200, rollbackPercent: 15, pause: 10 * time.Millisecond})
	wait.For(t, 60*time.Second, "published rows for cleanup", func() bool {
		return e.count("outbox_events", "published_at IS NOT NULL") >= 100
	})
	cleanup := func(name string, env []string) *proc {
		return e.start(name, env, bin.pgoutbox, "cleanup", "--database-url", e.dbURL("faulttest-cleanup"),
			"--schema", e.schema, "--retention", "1ms", "--force", "--batch-size", "10")
	}
	victim := cleanup("cleanup victim", failpointEnv(failpoint.CleanupMidBatch, "3*crash"))
	victim.wait(t, 60*time.Second)
	if !victim.killedBySIGKILL() || !strings.Contains(victim.out.String(), "failpoint "+failpoint.CleanupMidBatch+": crash") {
		t.Fatalf("cleanup did not die at %s: %s\n%s", failpoint.CleanupMidBatch, victim.status(), victim.out.String())
	}
	// Every committed event has a business row: the outbox's shortfall is what
	// cleanup deleted.
	var deleted int
	pgtest.Must(t, e.pool.QueryRow(context.Background(), "SELECT (SELECT count(*) FROM "+e.table("business")+
		") - (SELECT count(*) FROM "+e.table("outbox_events")+")").Scan(&deleted), "count deleted rows")
	if deleted <= 0 {
		t.Fatal("the killed cleanup deleted nothing before dying; the test proves little")
	}
	again := cleanup("cleanup again", nil)
	again.wait(t, 60*time.Second)
	if again.err != nil {
		t.Fatalf("cleanup after the crash: %v\n%s", again.err, again.out.String())
	}
	prod.wait(t, 90*time.Second)
	if prod.err != nil {
		t.Fatalf("producer: %v", prod.err)
	}
	e.waitDrained(60 * time.Second)
	e.stopAll()
	v := e.verdict(func(in *checker.Input) { in.Retention = true })
	mustHold(t, v)
	t.Logf("the killed cleanup had deleted %d published rows; the outbox keeps %d of %d committed events",
		deleted, e.count("outbox_events", "true"), v.Committed)
}
