package relay_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/goleak"

	"github.com/pgoutbox/pgoutbox"
	"github.com/pgoutbox/pgoutbox/admin"
	"github.com/pgoutbox/pgoutbox/broker"
	"github.com/pgoutbox/pgoutbox/broker/brokertest"
	"github.com/pgoutbox/pgoutbox/internal/pgtest"
	"github.com/pgoutbox/pgoutbox/internal/wait"
	"github.com/pgoutbox/pgoutbox/relay"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// outbox is a migrated schema of its own for one test.
type outbox struct {
	pool   *pgxpool.Pool
	schema string
	prod   *pgoutbox.Producer
}

func newOutbox(t testing.TB, maxConns int32) *outbox {
	t.Helper()
	pool, schema := pgtest.Migrated(t, maxConns)
	p, err := pgoutbox.NewProducer(&pgoutbox.Config{Schema: schema})
	pgtest.Must(t, err, "producer")
	return &outbox{pool: pool, schema: schema, prod: p}
}

func (o *outbox) table() string { return pgx.Identifier{o.schema, "outbox_events"}.Sanitize() }

// enqueue writes perAgg events to each of aggregates aggregates, interleaved
// (round-robin over aggregates), in transactions of up to 1,000 events, and
// returns all events' ids.
func (o *outbox) enqueue(t testing.TB, aggregates, perAgg int) []pgoutbox.UUID {
	t.Helper()
	return pgtest.EnqueueInterleaved(t, o.pool, o.prod, aggregates, perAgg, 1000)
}

// count returns how many events match the SQL condition.
func (o *outbox) count(t testing.TB, where string) int {
	t.Helper()
	var n int
	pgtest.Must(t, o.pool.QueryRow(context.Background(), "SELECT count(*) FROM "+o.table()+" WHERE "+where).Scan(&n), "count")
	return n
}

func quietLogger() *slog.Logger { return slog.New(slog.DiscardHandler) }

// startRelay starts a relay and stops it (gracefully) when the test ends.
func startRelay(t testing.TB, o *outbox, pub broker.Publisher, cfg relay.Config) *relay.Relay {
	t.Helper()
	return startRelayVia(t, o.pool, o, pub, cfg)
}

// startRelayVia is startRelay on another pool of o's database (e.g. through a
// connection pooler).
func startRelayVia(t testing.TB, pool *pgxpool.Pool, o *outbox, pub broker.Publisher, cfg relay.Config) *relay.Relay {
	t.Helper()
	cfg.Schema = o.schema
	if cfg.Logger == nil {
		cfg.Logger = quietLogger()
	}
	r, err := relay.New(pool, pub, &cfg)
	pgtest.Must(t, err, "relay.New")
	pgtest.Must(t, r.Start(context.Background()), "start")
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := r.Stop(ctx); err != nil {
			t.Errorf("stop relay %s: %v", r.ID(), err)
		}
	})
	return r
}

// Several relays, each with two workers, race over the same lanes: every event is
// published and each aggregate's first appearances are in sequence order.
func TestRelaysRacingKeepLaneOrder(t *testing.T) {
	t.Parallel()
	o := newOutbox(t, 16)
	ids := o.enqueue(t, 60, 40)
	rec := &brokertest.Recorder{Jitter: 200 * time.Microsecond}
	for i := range 4 {
		startRelay(t, o, rec, relay.Config{ID: fmt.Sprintf("r%d", i), BatchSize: 37, RunLength: 3})
	}
	wait.For(t, 60*time.Second, "the backlog to drain", func() bool { return o.count(t, "published_at IS NULL") == 0 })
	dups := brokertest.CheckStream(t, rec.Messages(), ids)
	t.Logf("%d events, %d duplicates", len(ids), dups)
	if n := o.count(t, "claim_until IS NOT NULL OR attempt_count <> 1"); n != 0 {
		t.Fatalf("%d published events still leased or with attempt_count <> 1", n)
	}
}

// A poison event is quarantined after MaxAttempts; its aggregate's later events
// wait while other aggregates flow; retrying it through the admin API releases the
// lane in order.
func TestPoisonEventQuarantinedAndRetried(t *testing.T) {
	t.Parallel()
	o := newOutbox(t, 8)
	ids := o.enqueue(t, 5, 4) // a0000..a0004, sequences 1..4
	var poisonID pgoutbox.UUID
	pgtest.Must(t, o.pool.QueryRow(context.Background(), "SELECT event_id FROM "+o.table()+
		" WHERE aggregate_id = 'a0002' AND aggregate_sequence = 2").Scan(&poisonID), "poison id")

	var mu sync.Mutex
	poisoned := true
	rec := &brokertest.Recorder{Fail: func(m *broker.Message) error {
		mu.Lock()
		defer mu.Unlock()
		if poisoned && m.EventID == poisonID {
			return errors.New("schema registry says no")
		}
		return nil
	}}
	r := startRelay(t, o, rec, relay.Config{MaxAttempts: 3, BackoffBase: 5 * time.Millisecond, BackoffMax: 20 * time.Millisecond,
		PollInterval: 50 * time.Millisecond})

	wait.For(t, 30*time.Second, "the poison event's quarantine", func() bool {
		return o.count(t, "quarantined_at IS NOT NULL") == 1
	})
	wait.For(t, 30*time.Second, "the other aggregates to drain", func() bool {
		return o.count(t, "published_at IS NULL") == 3 // the poison event and the two after it
	})
	var attempts int
	var lastErr string
	pgtest.Must(t, o.pool.QueryRow(context.Background(), "SELECT attempt_count, last_error FROM "+o.table()+" WHERE event_id = $1",
		poisonID).Scan(&attempts, &lastErr), "read poison")
	if attempts != 3 || lastErr != "schema registry says no" {
		t.Fatalf("poison event: attempt_count %d, last_error %q", attempts, lastErr)
	}
	if n := o.count(t, "aggregate_id = 'a0002' AND aggregate_sequence > 2 AND published_at IS NOT NULL"); n != 0 {
		t.Fatalf("%d events behind the quarantined one were published", n)
	}
	if s := r.Stats(); s.Quarantined != 1 || s.Failed != 3 {
		t.Fatalf("stats %+v, want 1 quarantined after 3 failures", s)
	}

	mu.Lock()
	poisoned = false
	mu.Unlock()
	a, err := admin.New(o.pool, &admin.Config{Schema: o.schema})
	pgtest.Must(t, err, "admin")
	retried, err := a.Retry(context.Background(), poisonID, ids[0])
	pgtest.Must(t, err, "retry")
	if len(retried) != 1 || retried[0] != poisonID {
		t.Fatalf("retried %v, want only the quarantined event", retried)
	}
	wait.For(t, 30*time.Second, "the lane to drain after the retry", func() bool { return o.count(t, "published_at IS NULL") == 0 })
	brokertest.CheckStream(t, rec.Messages(), ids)
}

// A permanent refusal quarantines at once; the broker being unreachable never
// quarantines, however often it happens.
func TestErrorClassesDecideQuarantine(t *testing.T) {
	t.Parallel()
	o := newOutbox(t, 8)
	o.enqueue(t, 2, 1) // a0000 and a0001, one event each
	rec := &brokertest.Recorder{Fail: func(m *broker.Message) error {
		if m.AggregateID == "a0000" {
			return broker.Permanent(errors.New("invalid subject"))
		}
		return broker.Unavailable(errors.New("no responders"))
	}}
	startRelay(t, o, rec, relay.Config{MaxAttempts: 2, BackoffBase: time.Millisecond, BackoffMax: 2 * time.Millisecond,
		PollInterval: 20 * time.Millisecond})
	wait.For(t, 30*time.Second, "several unavailable attempts", func() bool {
		return o.count(t, "aggregate_id = 'a0001' AND attempt_count >= 5") == 1
	})
	if n := o.count(t, "aggregate_id = 'a0000' AND quarantined_at IS NOT NULL AND attempt_count = 1"); n != 1 {
		t.Fatal("the permanently refused event was not quarantined after its first attempt")
	}
	if n := o.count(t, "aggregate_id = 'a0001' AND quarantined_at IS NOT NULL"); n != 0 {
		t.Fatal("an event was quarantined because the broker was unreachable")
	}
}

// With polling every 30s, a commit is still published within a second: the NOTIFY
// wake-up works. An event whose notification was lost (NOTIFY turned off for the
// producer) is found by the next poll.
func TestNotifyWakesRelayAndPollingCatchesLostNotifications(t *testing.T) {
	t.Parallel()
	o := newOutbox(t, 8)
	rec := &brokertest.Recorder{}
	startRelay(t, o, rec, relay.Config{PollInterval: 30 * time.Second})
	// Wait until the relay is idle and holds its idle lock (idle.go): from then on
	// a commit notifies, and nothing but that notification wakes the relay before
	// its next poll, 30s away. Seeing LISTEN in pg_stat_activity is not enough: a
	// commit before the guard holds the lock does not notify (the guard's grant
	// then makes the relay claim once more), and on a loaded machine that took
	// over a second.
	wait.For(t, 10*time.Second, "the relay to listen", func() bool { return listening(t, o) })
	wait.For(t, 10*time.Second, "the relay to hold its idle lock", func() bool { return idleLock(t, o, true) == 1 })

	ids := o.enqueue(t, 1, 1)
	wait.For(t, 10*time.Second, "the event to be published before the 30s poll (NOTIFY wakes the relay)",
		func() bool { return len(rec.Messages()) == 1 })
	brokertest.CheckStream(t, rec.Messages(), ids)

	// Lost notification: a second relay polls every 200ms, the producer's NOTIFY is off.
	o2 := newOutbox(t, 8)
	rec2 := &brokertest.Recorder{}
	startRelay(t, o2, rec2, relay.Config{PollInterval: 200 * time.Millisecond, DisableNotify: true})
	ctx := context.Background()
	err := pgx.BeginFunc(ctx, o2.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "SET LOCAL pgoutbox.notify = 'off'"); err != nil {
			return err
		}
		_, err := o2.prod.EnqueueTx(ctx, tx, pgoutbox.Event{AggregateType: "a", AggregateID: "1", EventType: "e"})
		return err
	})
	pgtest.Must(t, err, "enqueue without notify")
	wait.For(t, 5*time.Second, "the poll to find the event", func() bool { return len(rec2.Messages()) == 1 })
}

// listening reports whether some session LISTENs on the schema's channel.
func listening(t testing.TB, o *outbox) bool {
	var n int
	pgtest.Must(t, o.pool.QueryRow(context.Background(),
		"SELECT count(*) FROM pg_stat_activity WHERE query LIKE 'LISTEN %' AND query LIKE '%' || $1 || '%'", o.schema).Scan(&n), "activity")
	return n > 0
}

// Stop with events in flight: in-flight publishes finish and are marked, nothing
// stays leased, and nothing is lost.
func TestGracefulStopLeavesNoLease(t *testing.T) {
	t.Parallel()
	o := newOutbox(t, 8)
	ids := o.enqueue(t, 50, 20)
	gate := make(chan struct{})
	var once sync.Once
	started := make(chan struct{})
	rec := &brokertest.Recorder{Fail: func(m *broker.Message) error {
		once.Do(func() { close(started) })
		<-gate // hold the publish until the test has asked the relay to stop
		return nil
	}}
	r, err := relay.New(o.pool, rec, &relay.Config{Schema: o.schema, Logger: quietLogger(), BatchSize: 100})
	pgtest.Must(t, err, "relay")
	pgtest.Must(t, r.Start(context.Background()), "start")
	<-started
	stopped := make(chan error)
	go func() { stopped <- r.Stop(context.Background()) }()
	close(gate)
	pgtest.Must(t, <-stopped, "stop")
	if n := o.count(t, "published_at IS NULL AND claim_until IS NOT NULL"); n != 0 {
		t.Fatalf("%d events still leased after a graceful stop", n)
	}
	published := o.count(t, "published_at IS NOT NULL")
	if published == 0 || published == len(ids) {
		t.Fatalf("%d of %d published: expected the in-flight batches only", published, len(ids))
	}
	// Another relay finishes the job.
	startRelay(t, o, &brokertest.Recorder{}, relay.Config{})
	wait.For(t, 30*time.Second, "the rest to drain", func() bool { return o.count(t, "published_at IS NULL") == 0 })
}

// A relay that died holding leases (here: one whose leases we forge as if it had
// been killed) is taken over once the leases expire.
func TestExpiredLeasesAreTakenOver(t *testing.T) {
	t.Parallel()
	o := newOutbox(t, 8)
	ids := o.enqueue(t, 10, 3)
	ctx := context.Background()
	_, err := o.pool.Exec(ctx, "UPDATE "+o.table()+" SET claimed_by = 'dead-relay', claim_until = now() + interval '300 milliseconds' WHERE aggregate_sequence = 1")
	pgtest.Must(t, err, "forge leases")
	rec := &brokertest.Recorder{}
	r := startRelay(t, o, rec, relay.Config{PollInterval: 50 * time.Millisecond})
	wait.For(t, 30*time.Second, "the takeover", func() bool { return o.count(t, "published_at IS NULL") == 0 })
	brokertest.CheckStream(t, rec.Messages(), ids)
	if s := r.Stats(); s.TakenOver != 10 {
		t.Fatalf("stats %+v, want 10 leases taken over", s)
	}
}

func TestConfigValidation(t *testing.T) {
	t.Parallel()
	o := newOutbox(t, 1)
	for _, cfg := range []relay.Config{
		{BatchSize: -1}, {Workers: 100}, {Lease: time.Millisecond}, {Lease: time.Second, PublishTimeout: 2 * time.Second},
		{MaxAttempts: -3}, {BackoffBase: time.Minute, BackoffMax: time.Second}, {Schema: string(make([]byte, 70))},
		{StatementTimeout: -time.Second}, {Lease: time.Second, StatementTimeout: 300 * time.Millisecond},
		{LockTimeout: -time.Second}, {StatementTimeout: time.Second, LockTimeout: 2 * time.Second},
		{StatementTimeout: time.Microsecond}, {LockTimeout: time.Microsecond},
	} {
		if _, err := relay.New(o.pool, &brokertest.Recorder{}, &cfg); err == nil {
			t.Errorf("config %+v accepted", cfg)
		}
	}
	if _, err := relay.New(o.pool, nil, nil); err == nil {
		t.Error("nil publisher accepted")
	}
	var defaults *relay.Config
	if err := defaults.Validate(); err != nil {
		t.Errorf("nil config: %v", err)
	}
	// The bounds' defaults follow a short lease: valid whatever Lease is.
	for _, lease := range []time.Duration{100 * time.Millisecond, time.Second, time.Hour} {
		if err := (&relay.Config{Lease: lease}).Validate(); err != nil {
			t.Errorf("Lease %s with the default bounds: %v", lease, err)
		}
	}
	err := (&relay.Config{BatchSize: -1, Workers: 100, Lease: time.Second, StatementTimeout: time.Second, LockTimeout: 2 * time.Second}).Validate()
	for _, want := range []string{"relay: Config.BatchSize (-1)", "relay: Config.Workers (100)",
		"Config.StatementTimeout (1s) must be at least 1ms and at most Config.Lease/4 (250ms)",
		"Config.LockTimeout (2s) must be at least 1ms and at most Config.StatementTimeout (1s)"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Validate: %v, want an error naming %q", err, want)
		}
	}
}

// The database drops the relay's connections mid-run (pg_terminate_backend, as a
// failover or an admin would): the relay reports itself unhealthy, retries, and
// finishes the job with nothing lost and order held.
func TestDatabaseConnectionsKilledMidRun(t *testing.T) {
	t.Parallel()
	o := newOutbox(t, 4)
	ids := o.enqueue(t, 100, 30)
	app := pgtest.Name("relay")
	cfg, err := pgxpool.ParseConfig(pgtest.URL())
	pgtest.Must(t, err, "parse")
	cfg.ConnConfig.RuntimeParams["application_name"] = app
	relayPool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	pgtest.Must(t, err, "pool")
	t.Cleanup(relayPool.Close)

	var once sync.Once
	killed := make(chan struct{})
	rec := &brokertest.Recorder{Fail: func(*broker.Message) error {
		once.Do(func() {
			// Kill every connection of the relay while it is publishing its first batch:
			// with one worker, the settle of that batch meets a dead connection.
			_, err := o.pool.Exec(context.Background(), "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = $1", app)
			if err != nil {
				t.Errorf("terminate: %v", err)
			}
			close(killed)
		})
		return nil
	}}
	r, err := relay.New(relayPool, rec, &relay.Config{Schema: o.schema, Logger: quietLogger(), Workers: 1, BatchSize: 200, PollInterval: 100 * time.Millisecond})
	pgtest.Must(t, err, "relay")
	pgtest.Must(t, r.Start(context.Background()), "start")
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		pgtest.Must(t, r.Stop(ctx), "stop")
	}()
	<-killed
	wait.For(t, time.Minute, "the backlog to drain after the connections were killed", func() bool {
		return o.count(t, "published_at IS NULL") == 0
	})
	dups := brokertest.CheckStream(t, rec.Messages(), ids)
	wait.For(t, 10*time.Second, "the relay to report healthy", func() bool { return r.Healthy() == nil })
	t.Logf("%d events, %d duplicates after the connections were killed", len(ids), dups)
}
