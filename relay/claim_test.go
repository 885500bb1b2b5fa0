package relay

import (
	"context"
	"fmt"
	"slices"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/pgoutbox"
	"github.com/pgoutbox/pgoutbox/internal/pgtest"
)

// claimFixture is one lane-rule scenario: an outbox with lanes a/1..a/n, b/..., and
// a function running the claim statement as a given relay.
type claimFixture struct {
	t     *testing.T
	q     queries
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
	f := &claimFixture{t: t, q: newQueries(schema)}
	table := pgx.Identifier{schema, "outbox_events"}.Sanitize()
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
	defer other.Rollback(ctx) //nolint:errcheck
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
