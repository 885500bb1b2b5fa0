package cdc_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/pgoutbox/pgoutbox"
	"github.com/pgoutbox/pgoutbox/broker"
	"github.com/pgoutbox/pgoutbox/broker/brokertest"
	"github.com/pgoutbox/pgoutbox/cdc"
	"github.com/pgoutbox/pgoutbox/internal/pgtest"
	"github.com/pgoutbox/pgoutbox/internal/wait"
)

// PostgreSQL 15 does not carry logical slots to a standby. After the primary of
// a synchronous pair crashes and the standby is promoted, the source (on a
// multi-host URL) reaches the new primary, finds no slot there and says so
// (Healthy matches ErrSlotMissing); Recover recreates the slot and publishes
// from the table what the lost slot had not delivered, and a new source goes
// on from there: every committed event reaches the stream, in order per
// aggregate.
func TestFailoverLosesTheSlotAndRecoverBringsDeliveryBack(t *testing.T) {
	t.Parallel()
	primary, standby, e := failoverPair(t)
	pool := e.pool
	rec := &brokertest.Recorder{}
	src, err := cdc.New(pool, rec, &e.cfg)
	pgtest.Must(t, err, "new source")
	pgtest.Must(t, src.Start(context.Background()), "start")
	stopped := false
	t.Cleanup(func() {
		if !stopped {
			_ = src.Stop(context.Background())
		}
	})
	first := e.enqueue(t, 10, 3, 10)
	wait.For(t, 30*time.Second, "the first events published", func() bool { return e.count(t, "published_at IS NULL") == 0 })
	// Committed (and on the synchronous standby) an instant before the crash:
	// some may not have been decoded and published yet.
	second := e.enqueue(t, 20, 5, 20)

	pgtest.Must(t, primary.Crash(), "crash the primary")
	ctx := context.Background()
	pgtest.Must(t, standby.Promote(ctx), "promote the standby")
	promoted := time.Now()
	wait.For(t, 60*time.Second, "Healthy to say the slot is gone", func() bool {
		h := src.Healthy()
		return errors.Is(h, cdc.ErrStreamDown) && errors.Is(h, cdc.ErrSlotMissing)
	})
	detected := time.Since(promoted)
	// Producers go on writing to the new primary, where no slot sees them.
	pool.Reset() // the producers' pool: no connection of the old primary's left
	during := e.enqueue(t, 15, 4, 15)
	stopCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	pgtest.Must(t, src.Stop(stopCtx), "stop the source")
	stopped = true

	res, err := cdc.Recover(ctx, pool, rec, &e.cfg, cdc.RecoverOptions{})
	pgtest.Must(t, err, "recover on the new primary")
	resumed := time.Since(promoted) // the events written since the promote are published
	if res.Quarantined+res.Failing != 0 || res.Published < int64(len(during)) {
		t.Fatalf("recover: %+v: want at least the %d events written after the failover published, none failed", res, len(during))
	}
	e.start(t, rec, e.cfg)
	third := e.enqueue(t, 20, 2, 20)
	wait.For(t, 60*time.Second, "every event published after the recovery", func() bool { return e.count(t, "published_at IS NULL") == 0 })
	dups := brokertest.CheckStream(t, rec.Messages(), slices.Concat(first, second, during, third))
	t.Logf("slot loss reported %s after the promote; delivery resumed (recover done) %s after it; recover %+v; %d duplicates",
		detected.Round(time.Millisecond), resumed.Round(time.Millisecond), res, dups)
}

// failoverPair starts a primary with a synchronous streaming standby and
// returns them with an env migrated through the multi-host URL an application
// is given (multiHostEnv).
func failoverPair(t *testing.T) (primary, standby *pgtest.Cluster, e *env) {
	t.Helper()
	primary, standby = syncClusters(t)
	return primary, standby, multiHostEnv(t, primary, standby)
}

// multiHostEnv returns an env migrated through the multi-host URL of primary
// and standby (the primary first, the new primary after a failover).
func multiHostEnv(t *testing.T, primary, standby *pgtest.Cluster) *env {
	t.Helper()
	return envOn(t, fmt.Sprintf("postgres://postgres@127.0.0.1:%d,127.0.0.1:%d/test?sslmode=disable&target_session_attrs=read-write&connect_timeout=5",
		primary.Port, standby.Port))
}

// envOn returns an env migrated on the database at url (a cluster of the
// test's own: stopping it drops the slot).
func envOn(t *testing.T, url string) *env {
	t.Helper()
	pool, schema := pgtest.MigratedOn(t, url, 16)
	prod, err := pgoutbox.NewProducer(&pgoutbox.Config{Schema: schema})
	pgtest.Must(t, err, "producer")
	return &env{pool: pool, schema: schema, prod: prod, cfg: cdc.Config{Schema: schema, Slot: cdc.DefaultSlot(schema),
		Publication: cdc.DefaultSlot(schema), Logger: quietLogger(), PollInterval: 50 * time.Millisecond, StatusInterval: time.Second}}
}

// The synchronous standby's WAL receiver stalls: the producer's COMMIT waits
// for it, and the source, which decoded the transaction on the primary, holds
// it. The primary crashes, the standby loses the WAL it had not read (its
// receiver dies with it) and is promoted: the promoted database lacks the
// transaction, and has no synchronous standby of its own. The source, still
// running on the multi-host URL, reaches the promoted server, where Recover
// recreates the slot; producers write again to the same aggregates (the
// promoted database gives out the forgotten transaction's sequences again).
// Nothing the promoted database lacks may reach the stream (the held
// transaction must not be released by the promoted server's settings, nor
// survive the reconnect), no (aggregate, sequence) may carry two event ids,
// and every event the promoted database has is delivered (the new slot's
// positions, on a new timeline, are below the old primary's: none of its
// transactions may be taken for one already received).
func TestFailoverPublishesNothingThePromotedDatabaseLacks(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	primary, standby, e := failoverPair(t)
	rec := &brokertest.Recorder{}
	src := e.start(t, rec, e.cfg)
	first := e.enqueue(t, 5, 2, 5)
	wait.For(t, 60*time.Second, "the first events published and marked", func() bool {
		return len(rec.Messages()) == len(first) && e.count(t, "published_at IS NULL") == 0
	})

	stalled, err := standby.StallWALReceiver(ctx)
	pgtest.Must(t, err, "stall the standby's WAL receiver")
	t.Cleanup(func() { _ = stalled.Resume() })
	// One transaction, the next sequence of each aggregate: its COMMIT waits for
	// the stalled standby until the primary crashes.
	committed := make(chan error, 1)
	go func() {
		var events []pgoutbox.Event
		for a := range 5 {
			events = append(events, pgoutbox.Event{AggregateType: "acct", AggregateID: fmt.Sprintf("a%04d", a),
				EventType: "acct.changed", Payload: map[string]string{"phantom": "yes"}})
		}
		_, err := e.prod.EnqueueTx(ctx, e.pool, events...)
		committed <- err
	}()
	wait.For(t, 60*time.Second, "the source to hold the transaction the standby lacks", func() bool {
		return src.StandbyWait().HeldEvents == 5
	})
	if n := len(rec.Messages()); n != len(first) {
		t.Fatalf("%d messages on the stream while the synchronous standby lacks the last transaction, want %d", n, len(first))
	}

	pgtest.Must(t, primary.Crash(), "crash the primary")
	if err := <-committed; err == nil {
		t.Fatal("the COMMIT waiting for the stalled standby succeeded; the primary had crashed")
	}
	pgtest.Must(t, stalled.Lose(), "lose the standby's unflushed WAL")
	pgtest.Must(t, standby.Promote(ctx), "promote the standby")
	e.pool.Reset() // no connection of the old primary's left
	if n := e.count(t, "true"); n != len(first) {
		t.Fatalf("the promoted database has %d events, want the %d committed before the stall only (the scenario needs it to lack the last transaction)", n, len(first))
	}
	wait.For(t, 60*time.Second, "the source to reach the promoted server and find no slot", func() bool {
		return errors.Is(src.Healthy(), cdc.ErrSlotMissing)
	})

	// The slot is recreated while the source runs: the source's stream takes
	// it up on the promoted server.
	res, err := cdc.Recover(ctx, e.pool, rec, &e.cfg, cdc.RecoverOptions{})
	pgtest.Must(t, err, "recover on the promoted server")
	after := e.enqueue(t, 5, 3, 5)
	wait.For(t, 60*time.Second, "every event of the promoted database published", func() bool {
		return e.count(t, "published_at IS NULL") == 0 && len(rec.Messages()) >= len(first)+len(after)
	})

	got := rec.Messages()
	inDB := checkAgainstDatabase(t, e, got)
	dups := brokertest.CheckStream(t, got, slices.Concat(first, after))
	t.Logf("recover %+v; %d messages, %d duplicates; %d events in the promoted database", res, len(got), dups, inDB)
}

// checkAgainstDatabase checks the stream got against the events of e's
// database (the promoted one after a failover): nothing on the stream the
// database lacks (no phantom), no (aggregate, sequence) with two event ids,
// and every event of the database delivered. It returns how many events the
// database has.
func checkAgainstDatabase(t *testing.T, e *env, got []broker.Message) int {
	t.Helper()
	ctx := context.Background()
	rows, err := e.pool.Query(ctx, "SELECT event_id, aggregate_type, aggregate_id, aggregate_sequence FROM "+e.table())
	pgtest.Must(t, err, "read the promoted database's events")
	type position struct {
		lane     pgoutbox.Lane
		sequence int64
	}
	has := map[pgoutbox.UUID]position{}
	for rows.Next() {
		var id pgoutbox.UUID
		var typ, agg string
		var seq int64
		pgtest.Must(t, rows.Scan(&id, &typ, &agg, &seq), "scan")
		has[id] = position{pgoutbox.LaneOf(typ, agg), seq}
	}
	pgtest.Must(t, rows.Err(), "read the promoted database's events")
	ids := map[position]map[pgoutbox.UUID]bool{}
	delivered := map[pgoutbox.UUID]bool{}
	for _, m := range got {
		p := position{pgoutbox.LaneOf(m.AggregateType, m.AggregateID), m.AggregateSequence}
		if _, ok := has[m.EventID]; !ok {
			t.Errorf("event %s (%s #%d) is on the stream and not in the promoted database", m.EventID, p.lane, p.sequence)
		}
		if ids[p] == nil {
			ids[p] = map[pgoutbox.UUID]bool{}
		}
		ids[p][m.EventID] = true
		delivered[m.EventID] = true
	}
	for p, set := range ids {
		if len(set) > 1 {
			t.Errorf("%s #%d: %d different events on the stream", p.lane, p.sequence, len(set))
		}
	}
	for id, p := range has {
		if !delivered[id] {
			t.Errorf("event %s (%s #%d) of the promoted database never reached the stream", id, p.lane, p.sequence)
		}
	}
	return len(has)
}
