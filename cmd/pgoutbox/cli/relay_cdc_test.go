package cli

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/pgoutbox"
	"github.com/pgoutbox/pgoutbox/broker/brokertest"
	"github.com/pgoutbox/pgoutbox/cdc"
	"github.com/pgoutbox/pgoutbox/internal/failpoint"
	"github.com/pgoutbox/pgoutbox/internal/natstest"
	"github.com/pgoutbox/pgoutbox/internal/pgtest"
	"github.com/pgoutbox/pgoutbox/internal/wait"
	"github.com/pgoutbox/pgoutbox/migrate"
)

// startCDCRelay runs `pgoutbox relay --source cdc` with extra environment.
func (e *relayEnv) startCDCRelay(env []string, extra ...string) *relayProc {
	e.t.Helper()
	args := append([]string{"relay", "--source", "cdc", "--database-url", e.dbURL, "--schema", e.schema,
		"--broker", natstest.URL(), "--nats-stream", e.target.Stream, "--topic-template", e.target.Template}, extra...)
	return startRelayProc(e.t, "cdc relay", env, args)
}

// newCDCRelayEnv is newRelayEnv in a database of its own on the test binary's
// throwaway logical cluster. Logical decoding reads every change of its database, and a table that a parallel test creates while
// the slot builds its snapshot can make the slot's decoding fail for good ("could
// not map filenode ... to relation OID"); changes of other databases are skipped
// before that lookup.
func newCDCRelayEnv(t *testing.T) *relayEnv {
	t.Helper()
	dbURL := pgtest.DatabaseOn(t, pgtest.Logical(t))
	pool := pgtest.Pool(t, dbURL, 8)
	schema := pgtest.SchemaName(t, pool, "t")
	_, err := migrate.Up(context.Background(), pool, &migrate.Config{Schema: schema})
	pgtest.Must(t, err, "migrate")
	return &relayEnv{t: t, pool: pool, schema: schema, dbURL: dbURL, target: natstest.New(t, natstest.URL())}
}

// dropCDC removes the schema's slot and publication when the test ends, even
// after a failure: a slot left behind retains WAL forever.
func (e *relayEnv) dropCDC() string {
	slot := cdc.DefaultSlot(e.schema)
	e.t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		for {
			_, _ = e.pool.Exec(ctx, "SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE slot_name = $1 AND active", slot)
			_, err := e.pool.Exec(ctx, "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = $1", slot)
			if err == nil || ctx.Err() != nil {
				break
			}
			time.Sleep(50 * time.Millisecond)
		}
		_, _ = e.pool.Exec(ctx, "DROP PUBLICATION IF EXISTS "+pgx.Identifier{slot}.Sanitize())
	})
	return slot
}

// Acceptance: a CDC relay process is SIGKILLed after the broker acknowledged a
// batch, before marking it or confirming the slot position. The restarted relay
// re-publishes at most the batches out at the crash (published or being marked:
// --workers, cdc.DefaultWorkers), a bounded tail of duplicates. It loses
// nothing and keeps each aggregate's order. Then, with the relay stopped, the slot is dropped
// and `pgoutbox cdc recover` publishes every event committed meanwhile.
func TestCDCRelaySIGKILLAfterAckThenRecover(t *testing.T) {
	t.Parallel()
	e := newCDCRelayEnv(t)
	slot := e.dropCDC()
	const batch = 100
	const unmarked = cdc.DefaultWorkers * batch // the batches out at the crash
	victim := e.startCDCRelay([]string{failpoint.EnvVar + "=" + failpoint.CDCAfterPublish + "=3*crash"}, "--batch-size", "100")
	ids := e.enqueue(100, 30) // 3,000 events in transactions of 1,000, written while the victim streams
	select {
	case <-victim.done:
	case <-time.After(60 * time.Second):
		t.Fatalf("the victim did not crash at the failpoint:\n%s", victim.stderr.String())
	}
	if ws, ok := victim.cmd.ProcessState.Sys().(syscall.WaitStatus); !ok || ws.Signal() != syscall.SIGKILL {
		t.Fatalf("victim ended with %v, want SIGKILL:\n%s", victim.cmd.ProcessState, victim.stderr.String())
	}
	marked := e.count("published_at IS NOT NULL")
	onStream := len(e.target.Read(t))
	if onStream-marked <= 0 || onStream-marked > unmarked {
		t.Fatalf("at the crash %d events were on the stream and %d marked: want acknowledged, unmarked events, at most %d", onStream, marked, unmarked)
	}

	p := e.startCDCRelay(nil, "--batch-size", "100")
	wait.For(t, 60*time.Second, "the rest to be published", func() bool { return e.count("published_at IS NULL") == 0 })
	p.stopClean(t, "relay")
	dups := brokertest.CheckStream(t, e.target.Read(t), ids)
	if dups > unmarked {
		t.Fatalf("%d duplicates after the crash, want at most %d", dups, unmarked)
	}

	// Slot lost while stopped, events committed meanwhile.
	more := e.enqueue(100, 5)
	_, err := e.pool.Exec(context.Background(), "SELECT pg_drop_replication_slot($1)", slot)
	pgtest.Must(t, err, "drop slot")
	// Producers keep writing while recover runs: what they commit after the
	// new slot's snapshot comes through the slot, and is no failure.
	stop := make(chan struct{})
	type produced struct {
		ids []pgoutbox.UUID
		err error
	}
	live := make(chan produced, 1)
	go func() {
		var r produced
		defer func() { live <- r }()
		p, err := pgoutbox.NewProducer(&pgoutbox.Config{Schema: e.schema})
		if r.err = err; err != nil {
			return
		}
		pace := time.NewTicker(time.Millisecond) // a steady trickle, through the whole run
		defer pace.Stop()
		for len(r.ids) < 20000 {
			select {
			case <-stop:
				return
			case <-pace.C:
			}
			res, err := p.EnqueueTx(context.Background(), e.pool, pgoutbox.Event{AggregateType: "acct",
				AggregateID: fmt.Sprintf("live%02d", len(r.ids)%10), EventType: "changed", Payload: len(r.ids)})
			if r.err = err; err != nil {
				return
			}
			r.ids = append(r.ids, res[0].EventID)
		}
	}()
	out, errOut, code := run(t, "cdc", "recover", "--database-url", e.dbURL, "--schema", e.schema,
		"--broker", natstest.URL(), "--nats-stream", e.target.Stream, "--topic-template", e.target.Template)
	close(stop)
	r := <-live
	pgtest.Must(t, r.err, "produce while recover runs")
	if code != 0 || !strings.Contains(out, "aggregates from the table") {
		t.Fatalf("cdc recover while producers write: code %d, stdout %q, stderr %q", code, out, errOut)
	}
	// Everything committed before recover started is published by it. What the
	// live producer committed may be left for the slot: counted and reported by
	// recover when committed before its count, or committed after it (between
	// recover's count and the producer's stop), which no output can report.
	if n := e.count("published_at IS NULL AND aggregate_id NOT LIKE 'live%'"); n > 0 {
		t.Fatalf("%d events committed before recover ran are unpublished after it: %q", n, out)
	}
	p = e.startCDCRelay(nil)
	wait.For(t, 60*time.Second, "the events committed during recover to be published", func() bool { return e.count("published_at IS NULL") == 0 })
	p.stopClean(t, "relay")
	brokertest.CheckStream(t, e.target.Read(t), slices.Concat(ids, more, r.ids))
	t.Logf("crash left %d acked-unmarked events; %d duplicates after restart; recover: %s", onStream-marked, dups, strings.TrimSpace(out))
}

func TestCDCFlagErrors(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{
		{"relay", "--source", "kafka"},
		{"relay", "--source", "cdc", "--slot", "Bad-Name", "--database-url", "postgres://x@127.0.0.1/x"},
		{"cdc", "recover", "--publication", "no spaces please", "--database-url", "postgres://x@127.0.0.1/x"},
		{"relay", "--source", "cdc", "--standby-url", "postgres://u:hunter2@127.0.0.1:notaport/x", "--database-url", "postgres://x@127.0.0.1/x"},
	} {
		_, errOut, code := run(t, args...)
		if code != exitUsage || strings.Count(strings.TrimSpace(errOut), "\n") != 0 {
			t.Errorf("%v: code %d, stderr %q; want one usage line, exit 2", args, code, errOut)
		}
		if strings.Contains(errOut, "hunter2") {
			t.Errorf("%v: stderr %q echoes the standby URL's password", args, errOut)
		}
	}
}
