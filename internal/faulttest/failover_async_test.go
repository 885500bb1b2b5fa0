package faulttest

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/pgoutbox"
	"github.com/pgoutbox/pgoutbox/broker"
	"github.com/pgoutbox/pgoutbox/checker"
	"github.com/pgoutbox/pgoutbox/inbox"
	"github.com/pgoutbox/pgoutbox/internal/pgtest"
	"github.com/pgoutbox/pgoutbox/internal/wait"
)

// The primary of an ASYNCHRONOUS pair fails after transactions the standby
// never received were committed and published, and the standby is promoted.
// The database loses those transactions whole — business rows and events
// together, never one without the other — and the relays do not wedge: they
// publish what the new primary commits, though it allocates the lost events'
// aggregate sequences again, to other events. The checker holds for everything
// the new primary has. What a consumer on a database of its own then sees is
// checked by replaying the stream into one: every event whose sequence was
// allocated again is reported (inbox Outcome.ByPosition), none is applied over
// the forgotten one silently.
func TestAsynchronousFailover(t *testing.T) {
	t.Parallel()
	// A commit returns once the primary flushed it, not once the standby has it.
	ha := newHAPair(t, false)
	primary, standby := ha.primary, ha.standby
	e := newEnv(t, envConfig{dbServer: ha.url})
	t.Cleanup(func() {
		if !t.Failed() {
			return
		}
		rows, err := e.pool.Query(context.Background(), `SELECT o.aggregate_id, o.aggregate_sequence, o.event_id::text,
			p.last_sequence, EXISTS (SELECT 1 FROM `+e.table("processed_events")+` x WHERE x.event_id = o.event_id)
			FROM `+e.table("outbox_events")+` o LEFT JOIN `+e.table("consumer_positions")+` p
			ON p.aggregate_type = o.aggregate_type AND p.aggregate_id = o.aggregate_id
			WHERE NOT EXISTS (SELECT 1 FROM `+e.table("effects")+` f WHERE f.event_id = o.event_id)
			ORDER BY 1, 2 LIMIT 40`)
		if err != nil {
			t.Logf("diagnose: %v", err)
			return
		}
		defer rows.Close()
		for rows.Next() {
			var agg, id string
			var seq int64
			var pos *int64
			var known bool
			_ = rows.Scan(&agg, &seq, &id, &pos, &known)
			t.Logf("unapplied %s #%d %s position %v processed %v", agg, seq, id, deref64(pos), known)
		}
	})
	f := newFleet(e, 2, 1)
	for _, r := range f.relays {
		r.waitLine(t, "relay starting")
	}
	opts := producerOpts{txs: 150, aggregates: 10, rollbackPercent: 15, pause: 10 * time.Millisecond}
	ctx := context.Background()
	// Each phase ends drained: every event published and applied, every message
	// acknowledged. The consumer's inbox is in this database, so what the
	// standby lacks — events, their published marks, their applications — is
	// lost together. (A cut in mid-flow also loses applications of events the
	// standby kept, while the broker keeps their acks: see operations.md.)
	phase := func(name string) {
		p := e.producer(name, nil, opts)
		p.wait(t, 2*time.Minute)
		if p.err != nil {
			t.Fatalf("producer %s: %v", name, p.err)
		}
		e.waitDrained(2 * time.Minute)
	}
	phase("p0")
	pgtest.Must(t, primary.WaitStandbysReplayed(ctx), "the standby to replay everything before the cut")
	// The standby stops receiving: what the primary commits from now on is its
	// alone, and the relays publish it.
	pgtest.Must(t, primary.CutReplication(ctx), "cut replication")
	phase("p1")

	pgtest.Must(t, primary.Crash(), "crash the primary")
	for _, r := range f.relays {
		r.waitLine(t, "database unreachable")
	}
	pgtest.Must(t, standby.Promote(ctx), "promote the standby")
	promoted := time.Now()
	marker := e.commitOn(standby.URL, "marker")
	wait.For(t, 60*time.Second, "a relay to publish on the new primary", func() bool { return e.published(marker) })
	resumed := time.Now()
	phase("p2")
	e.stopAll()

	var forgotten forgottenSet
	v := e.verdict(forgotten.remove(t))
	mustHold(t, v)
	if forgotten.txs == 0 || len(forgotten.published) == 0 {
		t.Fatalf("the failover lost %d transactions, %d of their events published: the test did not lose what it means to",
			forgotten.txs, len(forgotten.published))
	}

	// A consumer on a database of its own read the whole stream, forgotten
	// events included, in stream order.
	reused, byPosition := replayElsewhere(t, e, forgotten.published)
	if reused == 0 {
		t.Fatal("no sequence of a forgotten event was allocated again: the test proves nothing about consumers")
	}
	if byPosition != reused {
		t.Fatalf("a consumer elsewhere reported %d events by position, want the %d whose sequence was allocated again", byPosition, reused)
	}
	t.Logf("publishing again %s after the promote; lost with the primary: %d committed transactions, %d of their events already published; "+
		"%d later events got a forgotten event's sequence, each reported by a consumer elsewhere; %d broker duplicates",
		resumed.Sub(promoted).Round(time.Millisecond), forgotten.txs, len(forgotten.published), reused, v.Duplicates)
}

// forgottenSet is what an asynchronous failover lost: transactions the
// producers saw commit that the new primary does not have, and the events of
// those that reached the broker.
type forgottenSet struct {
	txs       int
	published []checker.Message
}

// remove drops from the checker's input the transactions the database lost
// whole, and their messages on the broker, after checking that none was lost
// in part (an event without its business row or the reverse stays in the input,
// for the checker to report).
func (fs *forgottenSet) remove(t *testing.T) func(*checker.Input) {
	return func(in *checker.Input) {
		have := map[pgoutbox.UUID]bool{}
		for _, r := range in.Outbox {
			have[r.EventID] = true
		}
		for _, b := range in.Business {
			have[b.EventID] = true
		}
		gone := map[pgoutbox.UUID]bool{}
		kept := in.Journal[:0]
		for _, a := range in.Journal {
			whole := a.Outcome == checker.Committed && len(a.Intents) > 0
			for _, it := range a.Intents {
				whole = whole && !have[it.EventID]
			}
			if !whole {
				kept = append(kept, a)
				continue
			}
			fs.txs++
			for _, it := range a.Intents {
				gone[it.EventID] = true
			}
		}
		in.Journal = kept
		msgs := in.Broker[:0]
		seen := map[pgoutbox.UUID]bool{}
		for _, m := range in.Broker {
			if !gone[m.EventID] {
				msgs = append(msgs, m)
				continue
			}
			if !seen[m.EventID] {
				seen[m.EventID] = true
				fs.published = append(fs.published, m)
			}
		}
		in.Broker = msgs
	}
}

// replayElsewhere feeds the env's stream, in order, to a consumer (GapReject,
// the default) whose inbox is in a database of its own, and returns how many
// events of the new primary carry the sequence of a forgotten published event,
// and how many events the consumer reported as duplicates by position.
func replayElsewhere(t *testing.T, e *env, forgotten []checker.Message) (reused, byPosition int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	type agg struct{ typ, id string }
	lo, hi := map[agg]int64{}, map[agg]int64{}
	for _, m := range forgotten {
		a := agg{m.AggregateType, m.AggregateID}
		if s, ok := lo[a]; !ok || m.Sequence < s {
			lo[a] = m.Sequence
		}
		hi[a] = max(hi[a], m.Sequence)
	}
	rows, err := checker.ReadOutbox(ctx, e.pool, e.schema)
	pgtest.Must(t, err, "read outbox")
	for _, r := range rows {
		a := agg{r.AggregateType, r.AggregateID}
		if s, ok := lo[a]; ok && r.Sequence >= s && r.Sequence <= hi[a] {
			reused++
		}
	}

	pool, schema := pgtest.Migrated(t, 2) // the shared server: not the pair
	c, err := inbox.New(inbox.Pgx(pool), func(context.Context, pgx.Tx, inbox.Event) error { return nil },
		&inbox.Config{Name: "elsewhere", Schema: schema, Logger: slog.New(slog.DiscardHandler)})
	pgtest.Must(t, err, "inbox.New")
	stream, err := checker.ReadJetStream(ctx, e.js, e.stream)
	pgtest.Must(t, err, "read stream")
	reported := map[pgoutbox.UUID]bool{} // by event: the stream may hold an event twice
	for _, m := range stream {
		o := c.Process(ctx, inbox.DeliveryOf(broker.Message{EventID: m.EventID, AggregateType: m.AggregateType,
			AggregateID: m.AggregateID, AggregateSequence: m.Sequence, EventType: "changed", SchemaVersion: 1,
			OccurredAt: time.Now(), Payload: []byte(`{}`)}))
		switch {
		case o.Status == inbox.StatusDuplicate && o.ByPosition:
			reported[m.EventID] = true
		case o.Status != inbox.StatusApplied && o.Status != inbox.StatusDuplicate:
			t.Fatalf("replaying the stream elsewhere: %s/%s #%d: %s (%v)", m.AggregateType, m.AggregateID, m.Sequence, o.Status, o.Err)
		}
	}
	return reused, len(reported)
}

func deref64(p *int64) any {
	if p == nil {
		return nil
	}
	return *p
}
