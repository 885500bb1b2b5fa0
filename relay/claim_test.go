package relay

import (
	"context"
	"fmt"
	"slices"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgoutbox/pgoutbox"
	"github.com/pgoutbox/pgoutbox/internal/pgtest"
)

// claimFixture is one lane-rule scenario: an outbox with lanes a/1..a/n, b/..., and
// a function running the claim statement as a given relay.
type claimFixture struct {
	t     *testing.T
	q     queries
	pool  *pgxpool.Pool
	table string
	exec  func(sql string, args ...any)
	claim func(relayID string, batch, run int) []string // "agg/seq" claimed
}

func newClaimFixture(t *testing.T, lanes map[string]int) *claimFixture {
	t.Helper()
	pool, schema := pgtest.Migrated(t, 4)
	p, err := pgoutbox.NewProducer(&pgoutbox.Config{Schema: schema})
	pgtest.Must(t, err, "producer")
	ctx := context.Background()
	names := make([]string, 0, len(lanes))
	for name := range lanes {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		for range lanes[name] {
			_, err := p.EnqueueTx(ctx, pool, pgoutbox.Event{AggregateType: "t", AggregateID: name, EventType: "e"})
			pgtest.Must(t, err, "enqueue")
		}
	}
	table := pgx.Identifier{schema, "outbox_events"}.Sanitize()
	f := &claimFixture{t: t, q: newQueries(schema), pool: pool, table: table}
	f.exec = func(sql string, args ...any) {
		t.Helper()
		_, err := pool.Exec(ctx, fmt.Sprintf(sql, table), args...)
		pgtest.Must(t, err, "exec %s", sql)
	}
	f.claim = func(relayID string, batch, run int) []string {
		t.Helper()
		rows, err := pool.Query(ctx, f.q.claim, relayID, 30000, "", "", batch, run)
		pgtest.Must(t, err, "claim")
		var got []string
		for rows.Next() {
			vals, err := rows.Values()
			pgtest.Must(t, err, "scan")
			got = append(got, fmt.Sprintf("%s/%d", vals[2], vals[3]))
		}
		pgtest.Must(t, rows.Err(), "claim rows")
		slices.Sort(got)
		return got
	}
	return f
}

// strings queries the outbox (table as %s) for one text column.
func (f *claimFixture) strings(sql string, args ...any) []string {
	f.t.Helper()
	rows, err := f.pool.Query(context.Background(), fmt.Sprintf(sql, f.table), args...)
	pgtest.Must(f.t, err, "query %s", sql)
	got, err := pgx.CollectRows(rows, pgx.RowTo[string])
	pgtest.Must(f.t, err, "query %s", sql)
	return got
}

// leased lists "agg/seq=relay" for every event with a lease.
func (f *claimFixture) leased() []string {
	return f.strings("SELECT aggregate_id || '/' || aggregate_sequence || '=' || claimed_by FROM %s WHERE claim_until IS NOT NULL ORDER BY 1")
}

// ids returns a lane's event ids in sequence order.
func (f *claimFixture) ids(lane string) []pgoutbox.UUID {
	f.t.Helper()
	rows, err := f.pool.Query(context.Background(), fmt.Sprintf("SELECT event_id FROM %s WHERE aggregate_id = $1 ORDER BY aggregate_sequence", f.table), lane)
	pgtest.Must(f.t, err, "ids")
	ids, err := pgx.CollectRows(rows, pgx.RowTo[pgoutbox.UUID])
	pgtest.Must(f.t, err, "ids")
	return ids
}

// state describes a lane's events: published (by whom), backing off, or pending.
func (f *claimFixture) state(lane string) []string {
	return f.strings(`SELECT aggregate_id || '/' || aggregate_sequence || CASE
	    WHEN published_at IS NOT NULL THEN ' published by ' || claimed_by
	    WHEN available_at > now() THEN ' attempt ' || attempt_count || ' backing off'
	    ELSE ' pending' END
	  FROM %s WHERE aggregate_id = $1 ORDER BY aggregate_sequence`, lane)
}

func TestClaimTakesLanePrefixesOnly(t *testing.T) {
	t.Parallel()
	f := newClaimFixture(t, map[string]int{"a": 5, "b": 2})
	// Runs of at most 2, head first.
	if got := f.claim("A", 100, 2); !slices.Equal(got, []string{"a/1", "a/2", "b/1", "b/2"}) {
		t.Fatalf("first claim = %v", got)
	}
	// a/3 is next in line, but a/1 and a/2 are in flight: nothing to claim.
	if got := f.claim("B", 100, 2); len(got) != 0 {
		t.Fatalf("claimed %v while the lanes' heads are leased", got)
	}
	// Once a/1 and a/2 are published, a/3.. follow.
	f.exec("UPDATE %s SET published_at = now() WHERE aggregate_id = 'a' AND aggregate_sequence <= 2")
	if got := f.claim("B", 100, 2); !slices.Equal(got, []string{"a/3", "a/4"}) {
		t.Fatalf("claim after publishing the head = %v", got)
	}
}

func TestClaimStopsAtBlockedEvents(t *testing.T) {
	t.Parallel()
	f := newClaimFixture(t, map[string]int{"a": 3, "b": 3, "c": 3})
	f.exec("UPDATE %s SET quarantined_at = now() WHERE aggregate_id = 'a' AND aggregate_sequence = 1")
	f.exec("UPDATE %s SET available_at = now() + interval '1 hour' WHERE aggregate_id = 'b' AND aggregate_sequence = 2")
	f.exec("UPDATE %s SET claimed_by = 'other', claim_until = now() + interval '1 hour' WHERE aggregate_id = 'c' AND aggregate_sequence = 3")
	// a: head quarantined → nothing. b: 1 only (2 backs off). c: 1, 2 (3 is leased).
	if got := f.claim("A", 100, 10); !slices.Equal(got, []string{"b/1", "c/1", "c/2"}) {
		t.Fatalf("claim = %v", got)
	}
}

func TestClaimBatchLimitCutsLanesAtAPrefix(t *testing.T) {
	t.Parallel()
	f := newClaimFixture(t, map[string]int{"a": 4, "b": 4})
	got := f.claim("A", 5, 4)
	if !slices.Equal(got, []string{"a/1", "a/2", "a/3", "a/4", "b/1"}) {
		t.Fatalf("claim = %v", got)
	}
	if got := f.claim("B", 5, 4); len(got) != 0 {
		t.Fatalf("second relay claimed %v behind b/1", got)
	}
}

// The race the NOT EXISTS guard exists for: another relay has locked a lane's head
// but not yet committed its lease, so our snapshot still shows the head claimable.
// SKIP LOCKED skips the head; the rest of the run must not be claimed without it.
func TestClaimDoesNotOvertakeAnUncommittedClaim(t *testing.T) {
	t.Parallel()
	pool, schema := pgtest.Migrated(t, 4)
	p, err := pgoutbox.NewProducer(&pgoutbox.Config{Schema: schema})
	pgtest.Must(t, err, "producer")
	ctx := context.Background()
	for range 3 {
		_, err := p.EnqueueTx(ctx, pool, pgoutbox.Event{AggregateType: "t", AggregateID: "a", EventType: "e"})
		pgtest.Must(t, err, "enqueue")
	}
	other, err := pool.Begin(ctx)
	pgtest.Must(t, err, "begin")
	defer other.Rollback(ctx)
	_, err = other.Exec(ctx, "SELECT 1 FROM "+pgx.Identifier{schema, "outbox_events"}.Sanitize()+
		" WHERE aggregate_sequence = 1 FOR UPDATE")
	pgtest.Must(t, err, "lock the head")

	rows, err := pool.Query(ctx, newQueries(schema).claim, "B", 30000, "", "", 100, 10)
	pgtest.Must(t, err, "claim")
	n := 0
	for rows.Next() {
		n++
	}
	pgtest.Must(t, rows.Err(), "claim")
	if n != 0 {
		t.Fatalf("claimed %d events of a lane whose head another relay holds", n)
	}
}

// A claim writes its lease on each run's head only; the rest of the run is taken
// through the head, and no other claim gets any of it.
func TestClaimLeasesRunsThroughTheirHeads(t *testing.T) {
	t.Parallel()
	f := newClaimFixture(t, map[string]int{"a": 3, "b": 2})
	if got := f.claim("A", 100, 10); !slices.Equal(got, []string{"a/1", "a/2", "a/3", "b/1", "b/2"}) {
		t.Fatalf("claim = %v", got)
	}
	if got := f.leased(); !slices.Equal(got, []string{"a/1=A", "b/1=A"}) {
		t.Fatalf("leases on %v, want the heads only", got)
	}
	if got := f.claim("B", 100, 10); len(got) != 0 {
		t.Fatalf("claimed %v of runs leased through their heads", got)
	}
}

// settle runs the relay's settle statements as relayID in one implicit
// transaction: acked events marked, failed ones recorded with their run's head.
func (f *claimFixture) settle(relayID string, acked []pgoutbox.UUID, failed, heads []pgoutbox.UUID) {
	f.t.Helper()
	b := &pgx.Batch{}
	if len(acked) > 0 {
		b.Queue(f.q.mark, uuids(acked), relayID)
	}
	if len(failed) > 0 {
		errs, delays, quarantine := make([]string, len(failed)), make([]int64, len(failed)), make([]bool, len(failed))
		for i := range failed {
			errs[i], delays[i] = "nack", 3600_000
		}
		b.Queue(f.q.fail, uuids(failed), errs, delays, quarantine, relayID, uuids(heads))
	}
	pgtest.Must(f.t, f.pool.SendBatch(context.Background(), b).Close(), "settle")
}

// A relay settling a run it still holds records the failure of an event behind the
// head it marked published in the same transaction; a relay whose lease expired and
// was taken over records nothing, so it cannot overwrite its successor's state.
func TestFailNeedsTheRunsLease(t *testing.T) {
	t.Parallel()
	f := newClaimFixture(t, map[string]int{"a": 3, "b": 3})
	f.claim("A", 100, 10)
	a, b := f.ids("a"), f.ids("b")

	// a: A still holds the run. a/1 acked, a/2 failed (a/3 released).
	f.settle("A", a[:1], a[1:2], a[:1])
	if got := f.state("a"); !slices.Equal(got, []string{"a/1 published by A", "a/2 attempt 1 backing off", "a/3 pending"}) {
		t.Fatalf("after the holder's settle: %v", got)
	}

	// b: A stalls past its lease and B takes the run over.
	f.exec("UPDATE %s SET claim_until = now() - interval '1 second' WHERE aggregate_id = 'b' AND aggregate_sequence = 1")
	if got := f.claim("B", 100, 10); !slices.Equal(got, []string{"b/1", "b/2", "b/3"}) {
		t.Fatalf("takeover claim = %v", got)
	}
	// A wakes up: b/1 was acked (a true fact, marked), b/2 failed (ignored).
	f.settle("A", b[:1], b[1:2], b[:1])
	if got := f.state("b"); !slices.Equal(got, []string{"b/1 published by B", "b/2 pending", "b/3 pending"}) {
		t.Fatalf("after the stale relay's settle: %v", got)
	}
	// B's own failure of b/2 counts.
	f.settle("B", nil, b[1:2], b[:1])
	if got := f.state("b"); !slices.Equal(got, []string{"b/1 published by B", "b/2 attempt 1 backing off", "b/3 pending"}) {
		t.Fatalf("after the successor's settle: %v", got)
	}
}
