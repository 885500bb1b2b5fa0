package relay

import (
	"context"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/pgoutbox"
	"github.com/pgoutbox/pgoutbox/internal/pgtest"
	"github.com/pgoutbox/pgoutbox/migrate"
)

// probeStub is a hub member that is only an outbox table, for probeSQL.
type probeStub struct {
	member
	table string
}

func (p probeStub) outboxTable() string { return p.table }

// TestProbeSeesWhatTheClaimTakes runs the claim statement and the hub's probe
// on outboxes of one event each (so the lane rule plays no part) in every
// state the claim rule knows: the probe must answer yes exactly when the claim
// takes the event. Were the claim's rule changed and the probe's not, an idle
// relay would sleep until the next poll, or be woken for nothing at each one.
func TestProbeSeesWhatTheClaimTakes(t *testing.T) {
	t.Parallel()
	pool, _ := pgtest.Schema(t, 4)
	ctx := context.Background()
	for _, c := range []struct {
		state     string
		set       string // an UPDATE of the one event's columns, or ""
		claimable bool
	}{
		{"pending", "", true},
		{"lease expired", "claimed_by = 'gone', claim_until = now() - interval '1 second'", true},
		{"backoff over", "attempt_count = 1, available_at = now() - interval '1 second'", true},
		{"leased", "claimed_by = 'other', claim_until = now() + interval '1 hour'", false},
		{"backing off", "attempt_count = 1, available_at = now() + interval '1 hour'", false},
		{"quarantined", "attempt_count = 5, quarantined_at = now()", false},
		{"published", "published_at = now()", false},
	} {
		t.Run(c.state, func(t *testing.T) {
			t.Parallel()
			schema := pgtest.SchemaName(t, pool, "wake")
			_, err := migrate.Up(ctx, pool, &migrate.Config{Schema: schema})
			pgtest.Must(t, err, "migrate")
			p, err := pgoutbox.NewProducer(&pgoutbox.Config{Schema: schema})
			pgtest.Must(t, err, "producer")
			_, err = p.EnqueueTx(ctx, pool, pgoutbox.Event{AggregateType: "t", AggregateID: "a", EventType: "e"})
			pgtest.Must(t, err, "enqueue")
			q := newQueries(schema)
			if c.set != "" {
				_, err := pool.Exec(ctx, fmt.Sprintf("UPDATE %s SET %s", q.table, c.set))
				pgtest.Must(t, err, "set %s", c.state)
			}
			var due []int32
			rows, err := pool.Query(ctx, probeSQL([]member{probeStub{table: q.table}}))
			pgtest.Must(t, err, "probe")
			due, err = pgx.CollectRows(rows, pgx.RowTo[int32])
			pgtest.Must(t, err, "probe")
			rows, err = pool.Query(ctx, q.claim, "A", 30000, "", "", 100, 10)
			pgtest.Must(t, err, "claim")
			claimed := 0
			for rows.Next() {
				claimed++
			}
			pgtest.Must(t, rows.Err(), "claim")
			if probed := len(due) == 1; probed != c.claimable || (claimed == 1) != c.claimable {
				t.Fatalf("%s: probe says %v, claim took %d event(s); want both to say %v", c.state, probed, claimed, c.claimable)
			}
		})
	}
}
