package cdc_test

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/pgoutbox/pgoutbox"
	"github.com/pgoutbox/pgoutbox/broker"
	natsbroker "github.com/pgoutbox/pgoutbox/broker/nats"
	"github.com/pgoutbox/pgoutbox/broker/null"
	"github.com/pgoutbox/pgoutbox/cdc"
	"github.com/pgoutbox/pgoutbox/cdc/cdcprom"
	"github.com/pgoutbox/pgoutbox/internal/logtest"
	"github.com/pgoutbox/pgoutbox/internal/natstest"
	"github.com/pgoutbox/pgoutbox/internal/pgtest"
	"github.com/pgoutbox/pgoutbox/internal/promtest"
	"github.com/pgoutbox/pgoutbox/internal/wait"
)

var standbyLatency = flag.Int("cdc.standby-latency", 0,
	"measure commit→publish latency on a synchronous pair with and without the standby hold, over this many events each (0: skip)")

// syncPair starts a primary with a synchronous streaming standby (commits wait
// for its flush) and returns a migrated schema on the primary.
func syncPair(t *testing.T) (primary, standby *pgtest.Cluster, pool *pgxpool.Pool, schema string) {
	t.Helper()
	primary, standby = syncClusters(t)
	pool, schema = pgtest.MigratedOn(t, primary.URL, 16)
	return primary, standby, pool, schema
}

// syncClusters starts a primary for logical decoding with a synchronous
// streaming standby, both stopped when the test ends.
func syncClusters(t *testing.T) (primary, standby *pgtest.Cluster) {
	t.Helper()
	settings := maps.Clone(pgtest.LogicalSettings)
	settings["synchronous_commit"] = "on"
	primary, err := pgtest.StartCluster(&pgtest.ClusterConfig{MaxConnections: 50, Settings: settings})
	pgtest.Must(t, err, "start primary")
	t.Cleanup(func() { _ = primary.Stop() })
	standby, err = primary.StartStandby(true)
	pgtest.Must(t, err, "start standby")
	t.Cleanup(func() { _ = standby.Stop() })
	return primary, standby
}

func natsTarget(t *testing.T) (natstest.Target, broker.Publisher) {
	t.Helper()
	target := natstest.New(t, natstest.URL())
	pub, err := natsbroker.Dial(context.Background(), natstest.URL(), &natsbroker.Config{
		Stream: target.Stream, StreamSubjects: target.Subjects(), Subject: broker.MustParseTemplate(target.Template),
		AckTimeout: 5 * time.Second, Logger: quietLogger()})
	pgtest.Must(t, err, "dial NATS")
	t.Cleanup(func() { _ = pub.Close() })
	return target, pub
}

// PostgreSQL 15's logical decoding sends a transaction once it is committed
// locally, while the producer's COMMIT still waits for the synchronous
// standby. With the standby frozen (connected, answering nothing), the source
// holds the decoded transaction: it says so (StandbyWait, the cdcprom gauge,
// then Healthy with ErrSyncStandbyBehind) and the broker gets nothing; once the
// standby is thawed, the commit returns and the event is published. Once the
// standby is gone, Healthy reports ErrSyncStandbyMissing, until a reload
// without synchronous_standby_names. With the
// hold disabled, the event reaches the broker while the standby lacks it, and
// this test fails.
func TestTransactionsWaitForTheSynchronousStandby(t *testing.T) {
	t.Parallel()
	_, standby, pool, schema := syncPair(t)
	prod, err := pgoutbox.NewProducer(&pgoutbox.Config{Schema: schema})
	pgtest.Must(t, err, "producer")
	e := &env{pool: pool, schema: schema, prod: prod, cfg: cdc.Config{Schema: schema, Logger: quietLogger(),
		PollInterval: 50 * time.Millisecond, StatusInterval: time.Second}}
	reg := prometheus.NewRegistry()
	metrics, err := cdcprom.New(reg)
	pgtest.Must(t, err, "cdcprom")
	e.cfg.Observer = metrics
	target, pub := natsTarget(t)
	src := e.start(t, pub, e.cfg)
	gauge := func() float64 {
		v, _ := promtest.Value(t, reg, "pgoutbox_cdc_standby_held_transactions")
		return v
	}

	// With the standby in step, events go through.
	first := e.enqueue(t, 1, 1, 1)
	wait.For(t, 60*time.Second, "the first event published", func() bool { return len(target.Read(t)) == 1 })
	if w := src.StandbyWait(); w.Required != 1 || w.Connected != 1 || w.Err != nil {
		t.Fatalf("StandbyWait %+v: want 1 synchronous standby required and connected", w)
	}

	pgtest.Must(t, standby.Freeze(), "freeze the standby")
	thawed := false
	defer func() {
		if !thawed {
			_ = standby.Thaw()
		}
	}()
	committed := make(chan error, 1)
	var second []pgoutbox.Enqueued
	go func() {
		// COMMIT waits for the frozen standby's flush.
		var err error
		second, err = prod.EnqueueTx(context.Background(), pool, pgoutbox.Event{AggregateType: "acct", AggregateID: "a0000",
			EventType: "acct.changed", Payload: map[string]int{"n": 2}})
		committed <- err
	}()
	wait.For(t, 60*time.Second, "the source to hold the transaction, or to publish it", func() bool {
		return src.StandbyWait().HeldTransactions == 1 || len(target.Read(t)) > 1
	})
	held := time.Now()
	if n := len(target.Read(t)); n != 1 {
		t.Fatalf("%d messages on the stream while the synchronous standby lacks the second transaction, want 1", n)
	}
	wait.For(t, 10*time.Second, "the gauge to count the held transaction", func() bool { return gauge() == 1 })
	wait.For(t, 2*cdc.StandbyHoldReport+30*time.Second, "Healthy to report the standby behind", func() bool {
		return errors.Is(src.Healthy(), cdc.ErrSyncStandbyBehind)
	})
	select {
	case err := <-committed:
		t.Fatalf("the producer's commit returned (%v) while the synchronous standby is frozen", err)
	default:
	}
	if n := len(target.Read(t)); n != 1 {
		t.Fatalf("%d messages on the stream after %s held, want 1", n, time.Since(held).Round(time.Millisecond))
	}
	heldFor := time.Since(held)

	pgtest.Must(t, standby.Thaw(), "thaw the standby")
	thawed = true
	released := time.Now()
	select {
	case err := <-committed:
		pgtest.Must(t, err, "the producer's commit")
	case <-time.After(60 * time.Second):
		t.Fatal("the producer's commit did not return within 60s of the thaw")
	}
	wait.For(t, 60*time.Second, "the held event published", func() bool { return len(target.Read(t)) == 2 })
	publishedAfter := time.Since(released)
	got := target.Read(t)
	if got[0].EventID != first[0] || got[1].EventID != second[0].EventID {
		t.Fatalf("stream %v, %v: want %v then %v", got[0].EventID, got[1].EventID, first[0], second[0].EventID)
	}
	wait.For(t, 30*time.Second, "Healthy again, nothing held", func() bool {
		return src.Healthy() == nil && src.StandbyWait().HeldTransactions == 0 && gauge() == 0
	})
	t.Logf("held for at least %s with nothing published; published %s after the thaw", heldFor.Round(time.Millisecond),
		publishedAfter.Round(time.Millisecond))

	// No synchronous standby connected at all: the producers' commits would
	// hang; the source says so before anything is held.
	noSync := func() error {
		_, err := pool.Exec(context.Background(), "ALTER SYSTEM RESET synchronous_standby_names")
		if err == nil {
			_, err = pool.Exec(context.Background(), "SELECT pg_reload_conf()")
		}
		return err
	}
	t.Cleanup(func() { _ = noSync() }) // else the cleanup's DROP SCHEMA waits for the standby for ever
	pgtest.Must(t, standby.Stop(), "stop the standby")
	wait.For(t, 2*cdc.StandbyHoldReport+30*time.Second, "Healthy to report the synchronous standby missing", func() bool {
		return errors.Is(src.Healthy(), cdc.ErrSyncStandbyMissing) && src.StandbyWait().Connected == 0
	})
	// A reload without synchronous standbys ends the wait.
	pgtest.Must(t, noSync(), "reset synchronous_standby_names")
	wait.For(t, 2*cdc.StandbyHoldReport+30*time.Second, "the source to notice the reload", func() bool {
		return src.Healthy() == nil && src.StandbyWait().Required == 0
	})
}

// A CDC role without pg_monitor (or pg_read_all_stats) sees the standbys'
// walsenders with NULL columns: the source cannot know what they have, so it
// holds every transaction, and Healthy and the log name the grant; once
// granted, the held event is published.
func TestStandbyPositionsUnreadableWithoutPgMonitor(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	primary, _, owner, schema := syncPair(t)
	prod, err := pgoutbox.NewProducer(&pgoutbox.Config{Schema: schema})
	pgtest.Must(t, err, "producer")
	e := &env{pool: owner, schema: schema, prod: prod, cfg: cdc.Config{Schema: schema, Slot: cdc.DefaultSlot(schema),
		Publication: cdc.DefaultSlot(schema), PollInterval: 50 * time.Millisecond, StatusInterval: time.Second}}
	role := cdcRole(t, e)
	var logs logtest.Buffer
	e.cfg.Logger = logs.Logger()
	pub := &null.Publisher{}
	src := startOn(t, pgtest.Pool(t, pgtest.AsRole(t, primary.URL, role), 6), pub, e.cfg)

	e.enqueue(t, 1, 1, 1) // the standby is healthy: the commit returns
	wait.For(t, 30*time.Second, "Healthy to name the missing grant while the event is held", func() bool {
		h := src.Healthy()
		return errors.Is(h, cdc.ErrSyncStandbyUnreadable) && src.StandbyWait().HeldTransactions == 1
	})
	h := src.Healthy()
	if !errors.Is(h, cdc.ErrPermissionDenied) || !strings.Contains(h.Error(), "GRANT pg_monitor") {
		t.Fatalf("Healthy() = %v, want ErrPermissionDenied naming GRANT pg_monitor", h)
	}
	if n := pub.Published(); n != 0 {
		t.Fatalf("%d events published while the standbys' positions are unreadable", n)
	}
	if !strings.Contains(logs.String(), "level=ERROR") || !strings.Contains(logs.String(), "pg_monitor") {
		t.Fatalf("no ERROR line naming pg_monitor:\n%s", logs.String())
	}

	_, err = owner.Exec(ctx, "GRANT pg_monitor TO "+pgx.Identifier{role}.Sanitize())
	pgtest.Must(t, err, "grant pg_monitor")
	wait.For(t, 30*time.Second, "the held event published and Healthy nil", func() bool {
		return pub.Published() == 1 && e.count(t, "published_at IS NULL") == 0 && src.Healthy() == nil
	})
}

// stampingPublisher records when the broker acknowledged each event.
type stampingPublisher struct {
	broker.Publisher
	mu    sync.Mutex
	acked map[pgoutbox.UUID]time.Time
}

func (p *stampingPublisher) Publish(ctx context.Context, msgs []broker.Message) []error {
	res := p.Publisher.Publish(ctx, msgs)
	now := time.Now()
	p.mu.Lock()
	for i, err := range res {
		if err == nil {
			p.acked[msgs[i].EventID] = now
		}
	}
	p.mu.Unlock()
	return res
}

// Not a check: with -cdc.standby-latency=N, measures the time from a
// producer's commit returning to the broker's ack, for N events committed one
// at a time on a synchronous pair, with the standby hold and without it
// (Config.PublishUnreplicated). Negative figures are events published before
// their commit returned: what the hold prevents.
func TestStandbyHoldLatency(t *testing.T) {
	if *standbyLatency <= 0 {
		t.Skip("run with -cdc.standby-latency=N")
	}
	primary, _, _, _ := syncPair(t)
	for _, off := range []bool{true, false, true, false, true, false} {
		pool, s2 := pgtest.MigratedOn(t, primary.URL, 8) // each run its own schema, slot and publication
		prod, err := pgoutbox.NewProducer(&pgoutbox.Config{Schema: s2})
		pgtest.Must(t, err, "producer")
		e := &env{pool: pool, schema: s2, prod: prod, cfg: cdc.Config{Schema: s2, Logger: quietLogger(),
			PollInterval: 50 * time.Millisecond, StatusInterval: time.Second, PublishUnreplicated: off}}
		_, nats := natsTarget(t)
		pub := &stampingPublisher{Publisher: nats, acked: map[pgoutbox.UUID]time.Time{}}
		src, err := cdc.New(pool, pub, &e.cfg)
		pgtest.Must(t, err, "cdc.New")
		pgtest.Must(t, src.Start(context.Background()), "start")
		commits := map[pgoutbox.UUID]time.Time{}
		for i := range *standbyLatency {
			res, err := prod.EnqueueTx(context.Background(), pool, pgoutbox.Event{AggregateType: "acct",
				AggregateID: fmt.Sprintf("a%03d", i%20), EventType: "acct.changed", Payload: map[string]int{"n": i}})
			pgtest.Must(t, err, "enqueue")
			commits[res[0].EventID] = time.Now()
		}
		wait.For(t, 60*time.Second, "every event acknowledged", func() bool {
			pub.mu.Lock()
			defer pub.mu.Unlock()
			return len(pub.acked) >= len(commits)
		})
		var lat []time.Duration
		pub.mu.Lock()
		for id, c := range commits {
			lat = append(lat, pub.acked[id].Sub(c))
		}
		pub.mu.Unlock()
		slices.Sort(lat)
		early := 0
		for _, d := range lat {
			if d < 0 {
				early++
			}
		}
		pgtest.Must(t, src.Stop(context.Background()), "stop")
		t.Logf("hold off=%v: %d events, commit→ack p50 %s, p90 %s, p99 %s; %d acknowledged before their commit returned; %+v",
			off, len(lat), lat[len(lat)/2], lat[len(lat)*9/10], lat[len(lat)*99/100], early, src.StandbyWait())
	}
}
