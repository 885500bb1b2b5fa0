package cdc_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/url"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/pgoutbox"
	"github.com/pgoutbox/pgoutbox/admin"
	"github.com/pgoutbox/pgoutbox/broker"
	"github.com/pgoutbox/pgoutbox/broker/brokertest"
	"github.com/pgoutbox/pgoutbox/cdc"
	"github.com/pgoutbox/pgoutbox/internal/lifecycle"
	"github.com/pgoutbox/pgoutbox/internal/pgtest"
	"github.com/pgoutbox/pgoutbox/internal/wait"
	"github.com/pgoutbox/pgoutbox/relay"
)

// Acceptance: 20,000 events over 300 aggregates, written by four concurrent
// producers while the source runs, reach the real NATS server through the slot:
// nothing lost, each aggregate's first appearances 1..N in order, all from the
// stream, and the slot's confirmed position passes the last commit.
func TestStreamsTwentyThousandEventsInOrderToNATS(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	target, pub := natsTarget(t)
	src := e.start(t, pub, e.cfg)

	start := time.Now()
	var mu sync.Mutex
	var ids []pgoutbox.UUID
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), 7))
			for range 500 {
				evs := make([]pgoutbox.Event, 10)
				for i := range evs {
					evs[i] = pgoutbox.Event{AggregateType: "acct", AggregateID: fmt.Sprintf("a%03d", rng.IntN(300)),
						EventType: "acct.changed", Payload: map[string]int{"w": w}}
				}
				res, err := e.prod.EnqueueTx(context.Background(), e.pool, evs...)
				if err != nil {
					errs <- err
					return
				}
				mu.Lock()
				for _, r := range res {
					ids = append(ids, r.EventID)
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatalf("enqueue: %v", err)
	}
	last := e.currentLSN(t)
	wait.For(t, 3*time.Minute, "every event to be published", func() bool { return e.count(t, "published_at IS NULL") == 0 })
	elapsed := time.Since(start)
	wait.For(t, 30*time.Second, "the slot to confirm the last commit", func() bool { return e.slotConfirmedAtLeast(t, last) })
	got := target.Read(t)
	dups := brokertest.CheckStream(t, got, ids)
	st := src.Stats()
	if st.FromTable != 0 || st.Failed != 0 {
		t.Fatalf("stats %+v: want every event from the stream, no failure", st)
	}
	if n := e.count(t, "published_at IS NOT NULL AND (claimed_by <> 'cdc:"+e.cfg.Slot+"' OR claim_until IS NOT NULL OR attempt_count <> 1)"); n != 0 {
		t.Fatalf("%d published events without the CDC source's bookkeeping", n)
	}
	t.Logf("%d events over 300 aggregates in %s (%.0f/s incl. enqueue); %d on the stream, %d duplicates",
		len(ids), elapsed.Round(time.Millisecond), float64(len(ids))/elapsed.Seconds(), len(got), dups)
}

// A poison event is retried with backoff and quarantined after MaxAttempts; the
// later events of its aggregate wait (the lane goes to the table path) while
// other aggregates flow through the stream; retrying it through the admin API
// publishes the lane in order and hands it back to the stream.
func TestPoisonEventHoldsItsLane(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	var mu sync.Mutex
	poisoned := true
	var poisonID pgoutbox.UUID
	rec := &brokertest.Recorder{Fail: func(m *broker.Message) error {
		mu.Lock()
		defer mu.Unlock()
		if poisoned && m.AggregateID == "a0002" && m.AggregateSequence == 2 {
			poisonID = m.EventID
			return errors.New("schema registry says no")
		}
		return nil
	}}
	cfg := e.cfg
	cfg.MaxAttempts, cfg.BackoffBase, cfg.BackoffMax = 3, 5*time.Millisecond, 20*time.Millisecond
	src := e.start(t, rec, cfg)
	ids := e.enqueue(t, 5, 4, 5) // a0000..a0004, sequences 1..4, one sequence per transaction

	wait.For(t, 30*time.Second, "the quarantine", func() bool { return e.count(t, "quarantined_at IS NOT NULL") == 1 })
	wait.For(t, 30*time.Second, "the other lanes", func() bool { return e.count(t, "published_at IS NULL") == 3 })
	var attempts int
	var lastErr string
	pgtest.Must(t, e.pool.QueryRow(context.Background(), "SELECT attempt_count, last_error FROM "+e.table()+
		" WHERE aggregate_id = 'a0002' AND aggregate_sequence = 2").Scan(&attempts, &lastErr), "read poison")
	if attempts != 3 || lastErr != "schema registry says no" {
		t.Fatalf("poison event: attempt_count %d, last_error %q", attempts, lastErr)
	}
	// Each failure has its attempt row, written by the source.
	var rows, ours int
	pgtest.Must(t, e.pool.QueryRow(context.Background(), "SELECT count(*), count(*) FILTER (WHERE relay_id = $1 AND error = $2 AND destination IS NULL) FROM "+
		pgx.Identifier{e.schema, "outbox_attempts"}.Sanitize(), cfg.Owner(), lastErr).Scan(&rows, &ours), "read attempts")
	if rows != 3 || ours != 3 {
		t.Fatalf("%d attempt rows (%d by the source with the error), want 3", rows, ours)
	}
	if n := e.count(t, "aggregate_id = 'a0002' AND aggregate_sequence > 2 AND published_at IS NOT NULL"); n != 0 {
		t.Fatalf("%d events behind the quarantined one were published", n)
	}
	if src.BlockedLanes() != 1 {
		t.Fatalf("%d lanes blocked, want 1", src.BlockedLanes())
	}
	// More events of the blocked lane and of others while it is quarantined.
	more := e.enqueue(t, 5, 1, 5)
	wait.For(t, 30*time.Second, "the other lanes' new events", func() bool { return e.count(t, "published_at IS NULL") == 4 })

	mu.Lock()
	poisoned = false
	mu.Unlock()
	a, err := admin.New(e.pool, &admin.Config{Schema: e.schema})
	pgtest.Must(t, err, "admin")
	_, err = a.Retry(context.Background(), poisonID)
	pgtest.Must(t, err, "retry")
	wait.For(t, 30*time.Second, "the lane to drain after the retry", func() bool { return e.count(t, "published_at IS NULL") == 0 })
	wait.For(t, 30*time.Second, "the lane to go back to the stream", func() bool { return src.BlockedLanes() == 0 })
	// And the stream serves it again.
	last := e.enqueue(t, 5, 1, 5)
	wait.For(t, 30*time.Second, "events after the hand-back", func() bool { return e.count(t, "published_at IS NULL") == 0 })
	brokertest.CheckStream(t, rec.Messages(), append(append(ids, more...), last...))
	if st := src.Stats(); st.Quarantined != 1 || st.Failed != 3 || st.FromTable < 3 {
		t.Fatalf("stats %+v: want 3 failures, 1 quarantine, the lane's events from the table", st)
	}
}

// Acceptance: with the broker down, nothing is quarantined, the slot's lag grows
// (bytes and seconds); when the broker is back the backlog drains in order and the
// lag falls back.
func TestBrokerOutageLagGrowsThenDrains(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	rec := &brokertest.Recorder{}
	cfg := e.cfg
	cfg.BackoffBase, cfg.BackoffMax = 20*time.Millisecond, 200*time.Millisecond
	src := e.start(t, rec, cfg)
	first := e.enqueue(t, 20, 5, 20)
	wait.For(t, 30*time.Second, "the first events", func() bool { return e.count(t, "published_at IS NULL") == 0 })

	rec.Down.Store(true)
	var second []pgoutbox.UUID
	for range 10 {
		second = append(second, e.enqueue(t, 30, 1, 30)...)
	}
	wait.For(t, 30*time.Second, "failed attempts", func() bool { return e.count(t, "attempt_count > 0 AND published_at IS NULL") > 0 })
	var peakBytes, peakSeconds float64
	wait.For(t, 30*time.Second, "the lag to grow", func() bool {
		e.enqueue(t, 30, 1, 30) // WAL keeps coming while the broker is down
		peakBytes, peakSeconds = metric(t, src, "pgoutbox_cdc_slot_lag_bytes"), metric(t, src, "pgoutbox_cdc_slot_lag_seconds")
		return peakBytes > 100_000 && peakSeconds > 0.5
	})
	if h := src.Healthy(); !errors.Is(h, cdc.ErrBrokerUnreachable) || errors.Is(h, cdc.ErrBrokerMisconfigured) {
		t.Errorf("Healthy while the broker is down = %v, want ErrBrokerUnreachable", h)
	}
	if n := e.count(t, "quarantined_at IS NOT NULL"); n != 0 {
		t.Fatalf("%d events quarantined because the broker was down", n)
	}

	rec.Down.Store(false)
	last := e.currentLSN(t)
	wait.For(t, 60*time.Second, "the backlog to drain", func() bool { return e.count(t, "published_at IS NULL") == 0 })
	wait.For(t, 30*time.Second, "the slot to catch up", func() bool { return e.slotConfirmedAtLeast(t, last) })
	wait.For(t, 30*time.Second, "the lag to fall", func() bool {
		return metric(t, src, "pgoutbox_cdc_slot_lag_seconds") == 0 && metric(t, src, "pgoutbox_cdc_slot_lag_bytes") < peakBytes
	})
	var all []pgoutbox.UUID
	rows, err := e.pool.Query(context.Background(), "SELECT event_id FROM "+e.table())
	pgtest.Must(t, err, "ids")
	for rows.Next() {
		var id pgoutbox.UUID
		pgtest.Must(t, rows.Scan(&id), "scan")
		all = append(all, id)
	}
	dups := brokertest.CheckStream(t, rec.Messages(), append(append(first, second...), all...))
	if err := src.Healthy(); err != nil {
		t.Errorf("still unhealthy after the broker came back: %v", err)
	}
	t.Logf("peak lag %.0f bytes, %.1fs; stats %+v; %d duplicates", peakBytes, peakSeconds, src.Stats(), dups)
}

// Acceptance: the slot is dropped while the source is stopped, with events
// committed meanwhile. Recover recreates it and publishes every unpublished event
// from the table, in order; the restarted source continues from the new slot.
func TestRecoverAfterSlotDropped(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	rec := &brokertest.Recorder{}
	src, err := cdc.New(e.pool, rec, &e.cfg)
	pgtest.Must(t, err, "new")
	pgtest.Must(t, src.Start(context.Background()), "start")
	first := e.enqueue(t, 10, 3, 10)
	wait.For(t, 30*time.Second, "the first events", func() bool { return e.count(t, "published_at IS NULL") == 0 })
	pgtest.Must(t, src.Stop(context.Background()), "stop")

	ctx := context.Background()
	if _, err := cdc.Recover(ctx, e.pool, rec, &e.cfg, cdc.RecoverOptions{}); !errors.Is(err, cdc.ErrSlotHealthy) {
		t.Fatalf("Recover with a healthy slot: %v, want ErrSlotHealthy", err)
	}
	second := e.enqueue(t, 40, 5, 25) // committed while stopped: only in the old slot
	_, err = e.pool.Exec(ctx, "SELECT pg_drop_replication_slot($1)", e.cfg.Slot)
	pgtest.Must(t, err, "drop slot")

	res, err := cdc.Recover(ctx, e.pool, rec, &e.cfg, cdc.RecoverOptions{})
	pgtest.Must(t, err, "recover")
	if res.Published != int64(len(second)) || res.Remaining != 0 || res.Lanes != 40 {
		t.Fatalf("recover: %+v, want %d published over 40 lanes, none remaining", res, len(second))
	}
	e.start(t, rec, e.cfg)
	third := e.enqueue(t, 40, 2, 20)
	wait.For(t, 30*time.Second, "events after the recovery", func() bool { return e.count(t, "published_at IS NULL") == 0 })
	dups := brokertest.CheckStream(t, rec.Messages(), append(append(first, second...), third...))
	t.Logf("recover: %+v; %d duplicates", res, dups)
}

// A graceful stop mid-stream and a restart lose nothing and keep order; what was
// marked published is not sent again.
func TestRestartResumesFromConfirmedPosition(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	rec := &brokertest.Recorder{Jitter: 200 * time.Microsecond}
	src, err := cdc.New(e.pool, rec, &e.cfg)
	pgtest.Must(t, err, "new")
	pgtest.Must(t, src.Start(context.Background()), "start")
	ids := e.enqueue(t, 50, 40, 100)
	wait.For(t, 30*time.Second, "publishing to begin", func() bool { return e.count(t, "published_at IS NOT NULL") > 0 })
	pgtest.Must(t, src.Stop(context.Background()), "stop")
	left := e.count(t, "published_at IS NULL")
	src2 := e.start(t, rec, e.cfg)
	wait.For(t, 60*time.Second, "the rest", func() bool { return e.count(t, "published_at IS NULL") == 0 })
	dups := brokertest.CheckStream(t, rec.Messages(), ids)
	if dups != 0 {
		t.Fatalf("%d duplicates after a graceful stop", dups)
	}
	t.Logf("%d of %d left at the stop; second run %+v", left, len(ids), src2.Stats())
}

// Polling and CDC never both own an event: a polling relay started on a schema the
// CDC source runs finds nothing to claim, for old and new events alike.
func TestPollingRelayFindsNothingToClaim(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	before := e.enqueue(t, 10, 2, 10) // written before the CDC source took over
	cdcRec, pollRec := &brokertest.Recorder{}, &brokertest.Recorder{}
	e.start(t, cdcRec, e.cfg)
	r, err := relay.New(e.pool, pollRec, &relay.Config{Schema: e.schema, ID: "poller", PollInterval: 20 * time.Millisecond, Logger: quietLogger()})
	pgtest.Must(t, err, "relay")
	pgtest.Must(t, r.Start(context.Background()), "start relay")
	t.Cleanup(func() { _ = r.Stop(context.Background()) })
	after := e.enqueue(t, 10, 20, 7)
	wait.For(t, 30*time.Second, "everything published", func() bool { return e.count(t, "published_at IS NULL") == 0 })
	if n := len(pollRec.Messages()); n != 0 || r.Stats().Claimed != 0 {
		t.Fatalf("the polling relay published %d events (claimed %d)", n, r.Stats().Claimed)
	}
	brokertest.CheckStream(t, cdcRec.Messages(), append(before, after...))
}

// Start-up checks fail with clear errors: the slot in use by another process,
// live leases of a polling relay, a role without REPLICATION.
func TestStartupChecks(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	e.start(t, &brokertest.Recorder{}, e.cfg)
	second, err := cdc.New(e.pool, &brokertest.Recorder{}, &e.cfg)
	pgtest.Must(t, err, "new")
	if err := second.Start(ctx); !errors.Is(err, cdc.ErrSlotActive) {
		t.Fatalf("second source on one slot: %v, want ErrSlotActive", err)
	}
	// A failed Start is stopped for good (package lifecycle's rule).
	if err := second.Start(ctx); !errors.Is(err, lifecycle.ErrStopped) {
		t.Fatalf("Start after a failed Start: %v, want lifecycle.ErrStopped", err)
	}

	// A schema where a polling relay holds live leases.
	e2 := newEnv(t)
	e2.enqueue(t, 3, 1, 3)
	_, err = e2.pool.Exec(ctx, "UPDATE "+e2.table()+" SET claimed_by = 'poller-1', claim_until = now() + interval '1 minute'")
	pgtest.Must(t, err, "lease")
	s2, err := cdc.New(e2.pool, &brokertest.Recorder{}, &e2.cfg)
	pgtest.Must(t, err, "new")
	if err := s2.Start(ctx); !errors.Is(err, cdc.ErrOtherOwner) {
		t.Fatalf("start beside a polling relay's leases: %v, want ErrOtherOwner", err)
	}

	role := pgtest.Name("norepl")
	_, err = e.pool.Exec(ctx, "CREATE ROLE "+role+" LOGIN")
	pgtest.Must(t, err, "create role")
	t.Cleanup(func() { _, _ = e.pool.Exec(context.Background(), "DROP ROLE IF EXISTS "+role) })
	u, err := url.Parse(pgtest.URL())
	pgtest.Must(t, err, "parse test URL")
	u.User = url.User(role)
	weak := pgtest.Pool(t, u.String(), 2)
	if err := cdc.Check(ctx, weak, &e.cfg); !errors.Is(err, cdc.ErrReplicationPrivilege) {
		t.Fatalf("Check as a role without REPLICATION: %v, want ErrReplicationPrivilege", err)
	}
}

// Healthy reports a replication stream that cannot reconnect as ErrStreamDown,
// with why: here the slot was dropped under the running source (ErrSlotMissing).
func TestHealthyReportsTheStreamDown(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	src := e.start(t, &brokertest.Recorder{}, e.cfg)
	if err := src.Healthy(); err != nil {
		t.Fatalf("Healthy after start = %v", err)
	}
	ctx := context.Background()
	wait.For(t, 30*time.Second, "the slot dropped under the source", func() bool {
		_, _ = e.pool.Exec(ctx, "SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE slot_name = $1 AND active", e.cfg.Slot)
		_, err := e.pool.Exec(ctx, "SELECT pg_drop_replication_slot($1)", e.cfg.Slot)
		return err == nil
	})
	wait.For(t, 30*time.Second, "Healthy to report the stream down for want of its slot", func() bool {
		h := src.Healthy()
		return errors.Is(h, cdc.ErrStreamDown) && errors.Is(h, cdc.ErrSlotMissing)
	})
	if h := src.Healthy(); errors.Is(h, cdc.ErrDatabaseUnreachable) || errors.Is(h, cdc.ErrBrokerUnreachable) {
		t.Errorf("Healthy = %v: only the stream is down", h)
	}
}

// What a previous run marked published and did not confirm (it died between
// the mark and the status update) comes through the stream again: it is looked
// up and not sent twice. Events committed after the start are not looked up,
// and go out.
func TestRestartSkipsEventsMarkedPastTheConfirmedPosition(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	rec := &brokertest.Recorder{}
	first, err := cdc.New(e.pool, rec, &e.cfg)
	pgtest.Must(t, err, "new")
	pgtest.Must(t, first.Start(context.Background()), "start")
	pgtest.Must(t, first.Stop(context.Background()), "stop") // the slot stays, at its position

	// The previous run's last batch: published and marked, not confirmed.
	marked := e.enqueue(t, 10, 2, 20)
	_, err = e.pool.Exec(context.Background(), "UPDATE "+e.table()+" SET published_at = now() WHERE published_at IS NULL")
	pgtest.Must(t, err, "mark")
	var last string
	pgtest.Must(t, e.pool.QueryRow(context.Background(), "SELECT pg_current_wal_insert_lsn()::text").Scan(&last), "insert position")

	src := e.start(t, rec, e.cfg)
	wait.For(t, 30*time.Second, "the stream to pass the marked events", func() bool { return src.Stats().Duplicates == int64(len(marked)) })
	fresh := e.enqueue(t, 10, 2, 20)
	wait.For(t, 30*time.Second, "the fresh events", func() bool { return e.count(t, "published_at IS NULL") == 0 })
	wait.For(t, 30*time.Second, "the slot to pass the marked events", func() bool { return e.slotConfirmedAtLeast(t, last) })
	sent := map[pgoutbox.UUID]int{}
	for _, m := range rec.Messages() {
		sent[m.EventID]++
	}
	for _, id := range fresh {
		if sent[id] != 1 {
			t.Fatalf("fresh event %s sent %d times, want once", id, sent[id])
		}
	}
	if len(sent) != len(fresh) {
		t.Fatalf("%d events sent, want the %d fresh ones", len(sent), len(fresh))
	}
	if st := src.Stats(); st.Published != int64(len(fresh)) || st.Duplicates != int64(len(marked)) {
		t.Fatalf("stats %+v: want %d published, %d not sent again", st, len(fresh), len(marked))
	}
}
