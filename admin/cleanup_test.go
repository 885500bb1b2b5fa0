package admin_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pgoutbox/pgoutbox"
	"github.com/pgoutbox/pgoutbox/admin"
	"github.com/pgoutbox/pgoutbox/broker"
	"github.com/pgoutbox/pgoutbox/inbox"
	"github.com/pgoutbox/pgoutbox/internal/failpoint"
	"github.com/pgoutbox/pgoutbox/internal/pgtest"
	"github.com/pgoutbox/pgoutbox/internal/wait"
	"github.com/pgoutbox/pgoutbox/relay"
)

// Cleanup deletes only published rows past the retention, in batches, and leaves
// unpublished, quarantined and recent rows, counters and the skip audit alone;
// the inbox's old dedup rows go too.
func TestCleanupKeepsWhatItMust(t *testing.T) {
	t.Parallel()
	pool, schema := pgtest.Migrated(t, 4)
	ctx := context.Background()
	ids := opsEnqueue(t, pool, schema, "acct", 3, 10) // 30 events
	table := quoted(schema, "outbox_events")
	exec := func(q string, args ...any) {
		t.Helper()
		_, err := pool.Exec(ctx, q, args...)
		pgtest.Must(t, err, "%s", q)
	}
	old := "now() - interval '8 days'"
	exec("UPDATE "+table+" SET occurred_at = "+old+", published_at = "+old+" WHERE event_id = ANY($1)", ids[:20])
	exec("UPDATE "+table+" SET occurred_at = "+old+", published_at = now() - interval '1 day' WHERE event_id = ANY($1)", ids[20:23])
	exec("UPDATE "+table+" SET occurred_at = "+old+" WHERE event_id = ANY($1)", ids[23:26])                                                  // unpublished
	exec("UPDATE "+table+" SET occurred_at = "+old+", quarantined_at = "+old+", last_error = 'poison' WHERE event_id = ANY($1)", ids[26:28]) // quarantined
	// A dead letter skipped long ago: published_at set, quarantine lifted, audited.
	exec("UPDATE "+table+" SET occurred_at = "+old+", published_at = "+old+" WHERE event_id = $1", ids[28])
	skipped := quoted(schema, "outbox_skipped_events")
	exec("INSERT INTO "+skipped+" (event_id, aggregate_type, aggregate_id, aggregate_sequence, event_type, attempt_count, reason, skipped_by)"+
		" SELECT event_id, aggregate_type, aggregate_id, aggregate_sequence, event_type, attempt_count, 'poison', 'test' FROM "+table+" WHERE event_id = $1", ids[28])
	processed := quoted(schema, "processed_events")
	exec("INSERT INTO " + processed + " (consumer_name, event_id, processed_at) SELECT 'c', gen_random_uuid(), now() - interval '11 days' FROM generate_series(1, 5)")
	exec("INSERT INTO " + processed + " (consumer_name, event_id, processed_at) SELECT 'c', gen_random_uuid(), now() - interval '1 day' FROM generate_series(1, 2)")
	counters := countRows(t, pool, quoted(schema, "outbox_aggregate_sequences"), "true")

	// The inbox's rows must outlive the replay horizon, at least the outbox's retention.
	_, err := admin.Cleanup(ctx, pool, admin.CleanupConfig{Schema: schema, InboxRetention: 24 * time.Hour})
	if !errors.Is(err, inbox.ErrRetentionTooShort) {
		t.Fatalf("inbox retention below the outbox's: %v", err)
	}

	var progress []admin.CleanupProgress
	res, err := admin.Cleanup(ctx, pool, admin.CleanupConfig{Schema: schema, BatchSize: 4, InboxRetention: 10 * 24 * time.Hour,
		Progress: func(p admin.CleanupProgress) { progress = append(progress, p) }})
	pgtest.Must(t, err, "cleanup")
	// 30 rows walked 4 at a time, then one empty batch ends the walk.
	if res.Deleted != 21 || res.Batches != 9 || len(progress) != 9 || progress[8].Deleted != 21 || res.InboxDeleted != 5 {
		t.Fatalf("cleanup = %+v, progress %v", res, progress)
	}
	if time.Since(res.Cutoff) < 7*24*time.Hour-time.Minute || len(res.DroppedPartitions) != 0 {
		t.Fatalf("cutoff %s, dropped %v", res.Cutoff, res.DroppedPartitions)
	}
	for what, where := range map[string]string{
		"recently published": "published_at > now() - interval '2 days'",
		"unpublished":        "published_at IS NULL AND quarantined_at IS NULL",
		"quarantined":        "quarantined_at IS NOT NULL",
	} {
		if n := countRows(t, pool, table, where); n != map[string]int64{"recently published": 3, "unpublished": 4, "quarantined": 2}[what] {
			t.Errorf("%d %s rows left", n, what)
		}
	}
	if n := countRows(t, pool, table, "true"); n != 9 {
		t.Errorf("%d rows left, want 9", n)
	}
	if n := countRows(t, pool, skipped, "true"); n != 1 {
		t.Errorf("the skip audit lost its row")
	}
	if n := countRows(t, pool, quoted(schema, "outbox_aggregate_sequences"), "true"); n != counters {
		t.Errorf("sequence counters went from %d to %d", counters, n)
	}
	if n := countRows(t, pool, processed, "true"); n != 2 {
		t.Errorf("%d dedup rows left, want 2", n)
	}
}

// A fault between batches stops the run with what it deleted so far; the next run
// finishes the job. Not parallel: failpoints are process-wide.
func TestCleanupFailpointMidBatch(t *testing.T) {
	pool, schema := pgtest.Migrated(t, 4)
	ctx := context.Background()
	opsEnqueue(t, pool, schema, "acct", 4, 5)
	table := quoted(schema, "outbox_events")
	_, err := pool.Exec(ctx, "UPDATE "+table+" SET published_at = now() - interval '30 days'")
	pgtest.Must(t, err, "publish")

	pgtest.Must(t, failpoint.Enable(failpoint.CleanupMidBatch, "2*error"), "enable")
	defer failpoint.Disable(failpoint.CleanupMidBatch)
	res, err := admin.Cleanup(ctx, pool, admin.CleanupConfig{Schema: schema, BatchSize: 5})
	if !errors.Is(err, failpoint.ErrInjected) || res.Deleted != 10 || res.Batches != 2 {
		t.Fatalf("cleanup with a fault before batch 3 = %+v, %v", res, err)
	}
	res, err = admin.Cleanup(ctx, pool, admin.CleanupConfig{Schema: schema, BatchSize: 5})
	if err != nil || res.Deleted != 10 || countRows(t, pool, table, "true") != 0 {
		t.Fatalf("second cleanup = %+v, %v", res, err)
	}
}

// timedRecorder acknowledges at once and notes when each message was published.
type timedRecorder struct {
	mu sync.Mutex
	at map[pgoutbox.UUID]time.Time
}

func (r *timedRecorder) Publish(ctx context.Context, msgs []broker.Message) []error {
	now := time.Now()
	r.mu.Lock()
	for _, m := range msgs {
		if _, ok := r.at[m.EventID]; !ok {
			r.at[m.EventID] = now
		}
	}
	r.mu.Unlock()
	return make([]error, len(msgs))
}

func (r *timedRecorder) Close() error { return nil }

func (r *timedRecorder) publishedAt(id pgoutbox.UUID) (time.Time, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	at, ok := r.at[id]
	return at, ok
}

// Acceptance: cleaning 200,000 published rows runs in batches while a relay keeps
// publishing new events: no event enqueued during the cleanup waits long, and
// unpublished and quarantined rows survive.
func TestCleanupWhileRelayPublishes(t *testing.T) {
	t.Parallel()
	pool, schema := pgtest.Migrated(t, 10)
	ctx := context.Background()
	table := quoted(schema, "outbox_events")
	load := time.Now()
	// Loaded as a replica would, so that the notify trigger does not queue 200,000
	// deferred events, and in key order, so that the indexes grow at their ends.
	tx, err := pool.Begin(ctx)
	pgtest.Must(t, err, "begin")
	defer tx.Rollback(ctx)
	_, err = tx.Exec(ctx, "SET LOCAL session_replication_role = replica")
	pgtest.Must(t, err, "replica role")
	_, err = tx.Exec(ctx, "INSERT INTO "+table+` (event_id, aggregate_type, aggregate_id, aggregate_sequence, event_type, payload, occurred_at, published_at, attempt_count)
SELECT ('00000000-0000-7000-8000-' || lpad(to_hex(i), 12, '0'))::uuid, 'old', 'o' || lpad((i / 200)::text, 4, '0'), i % 200 + 1,
       'old.done', '{"n": 1}', now() - interval '9 days', now() - interval '8 days', 1
  FROM generate_series(0, 199999) AS i`)
	pgtest.Must(t, err, "load 200k rows")
	pgtest.Must(t, tx.Commit(ctx), "commit the load")
	// Old rows that must survive: unpublished (backing off for a day, so the relay
	// leaves them be) and quarantined.
	_, err = pool.Exec(ctx, "INSERT INTO "+table+` (event_id, aggregate_type, aggregate_id, aggregate_sequence, event_type, payload, occurred_at, available_at, quarantined_at)
SELECT gen_random_uuid(), 'stuck', 's' || i, 1, 'stuck.e', '{}', now() - interval '9 days', now() + interval '1 day',
       CASE WHEN i % 2 = 0 THEN now() - interval '9 days' END
  FROM generate_series(1, 10) AS i`)
	pgtest.Must(t, err, "load stuck rows")
	_, err = pool.Exec(ctx, "ANALYZE "+table)
	pgtest.Must(t, err, "analyze")
	t.Logf("loaded 200,010 rows in %s", time.Since(load).Round(time.Millisecond))

	rec := &timedRecorder{at: map[pgoutbox.UUID]time.Time{}}
	r, err := relay.New(pool, rec, &relay.Config{Schema: schema, Logger: quietLog, PollInterval: 500 * time.Millisecond})
	pgtest.Must(t, err, "relay")
	pgtest.Must(t, r.Start(ctx), "start relay")
	defer func() {
		sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		pgtest.Must(t, r.Stop(sctx), "stop relay")
	}()

	// A producer enqueues one event every 5ms for as long as the cleanup runs.
	prod, err := pgoutbox.NewProducer(&pgoutbox.Config{Schema: schema})
	pgtest.Must(t, err, "producer")
	type enq struct {
		id pgoutbox.UUID
		at time.Time
	}
	var live []enq
	stop := make(chan struct{})
	produced := make(chan error, 1)
	go func() {
		tick := time.NewTicker(5 * time.Millisecond)
		defer tick.Stop()
		for i := 0; ; i++ {
			select {
			case <-stop:
				produced <- nil
				return
			case <-tick.C:
			}
			res, err := prod.EnqueueTx(ctx, pool, pgoutbox.Event{AggregateType: "live", AggregateID: fmt.Sprint("l", i%5), EventType: "live.e"})
			if err != nil {
				produced <- err
				return
			}
			live = append(live, enq{res[0].EventID, time.Now()})
		}
	}()

	start := time.Now()
	res, err := admin.Cleanup(ctx, pool, admin.CleanupConfig{Schema: schema, Retention: 7 * 24 * time.Hour, BatchSize: 5000})
	took := time.Since(start)
	close(stop)
	pgtest.Must(t, <-produced, "produce")
	pgtest.Must(t, err, "cleanup")
	if res.Deleted != 200000 || res.Batches < 40 {
		t.Fatalf("cleanup = %+v", res)
	}
	if n := countRows(t, pool, table, "aggregate_type = 'stuck'"); n != 10 {
		t.Fatalf("%d of 10 unpublished and quarantined rows survived", n)
	}

	// Every event enqueued during the cleanup is published, none after a stall.
	var maxWait time.Duration
	for _, e := range live {
		wait.Forf(t, 30*time.Second, func() string { return fmt.Sprintf("event %s enqueued during the cleanup to be published", e.id) }, func() bool {
			_, ok := rec.publishedAt(e.id)
			return ok
		})
		at, _ := rec.publishedAt(e.id)
		maxWait = max(maxWait, at.Sub(e.at))
	}
	// The longest gap between two publishes while the cleanup ran.
	var times []time.Time
	for _, e := range live {
		at, _ := rec.publishedAt(e.id)
		times = append(times, at)
	}
	var maxGap time.Duration
	for i := 1; i < len(times); i++ {
		maxGap = max(maxGap, times[i].Sub(times[i-1]))
	}
	t.Logf("cleanup deleted %d rows in %d batches in %s; %d events enqueued meanwhile, longest enqueue→publish %s, longest gap between publishes %s",
		res.Deleted, res.Batches, took.Round(time.Millisecond), len(live), maxWait.Round(time.Millisecond), maxGap.Round(time.Millisecond))
	if len(live) < 10 {
		t.Fatalf("only %d events enqueued during the cleanup", len(live))
	}
	// With one-statement batches the relay never waits on the cleanup; a stall
	// would show as a wait of a batch's duration or more. Generous for -race.
	if maxWait > 2*time.Second {
		t.Fatalf("an event waited %s to be published during the cleanup", maxWait)
	}
}

// Of several cleaners of one outbox (one per relay), one runs at a time; the
// others skip the round. Stop is safe twice.
func TestCleanerOneAtATime(t *testing.T) {
	t.Parallel()
	pool, schema := pgtest.Migrated(t, 6)
	ctx := context.Background()
	opsEnqueue(t, pool, schema, "acct", 2, 5)
	table := quoted(schema, "outbox_events")
	_, err := pool.Exec(ctx, "UPDATE "+table+" SET published_at = now() - interval '2 hours'")
	pgtest.Must(t, err, "publish")

	inside, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	first, err := admin.NewCleaner(pool, &admin.CleanerConfig{Interval: time.Hour, Logger: quietLog,
		Cleanup: admin.CleanupConfig{Schema: schema, Retention: time.Hour, BatchSize: 4,
			Progress: func(admin.CleanupProgress) { once.Do(func() { close(inside); <-release }) }}})
	pgtest.Must(t, err, "first cleaner")
	second, err := admin.NewCleaner(pool, &admin.CleanerConfig{Interval: time.Hour, Logger: quietLog,
		Cleanup: admin.CleanupConfig{Schema: schema, Retention: time.Hour}})
	pgtest.Must(t, err, "second cleaner")

	pgtest.Must(t, first.Start(ctx), "start")
	<-inside // the first cleaner holds the lock, mid-run
	if _, ran, err := second.RunOnce(ctx); err != nil || ran {
		t.Fatalf("second cleaner ran = %v, %v while the first was running", ran, err)
	}
	close(release)
	wait.For(t, 30*time.Second, "the first cleaner to finish", func() bool { return countRows(t, pool, table, "true") == 0 })
	pgtest.Must(t, first.Stop(ctx), "stop")
	pgtest.Must(t, first.Stop(ctx), "stop again")
	// The lock is free again. A run that Stop cancelled mid-query may have lost its
	// connection, whose session (and lock) ends when its backend exits: soon after.
	wait.For(t, 10*time.Second, "the lock to be free after the first cleaner stopped", func() bool {
		_, ran, err := second.RunOnce(ctx)
		pgtest.Must(t, err, "second cleaner after the first stopped")
		return ran
	})
}

func TestCleanerConfigValidate(t *testing.T) {
	t.Parallel()
	pool, _ := pgtest.Migrated(t, 1)
	var nilCfg *admin.CleanerConfig
	if err := nilCfg.Validate(); err != nil {
		t.Fatalf("nil config: %v", err)
	}
	if _, err := admin.NewCleaner(pool, nil); err != nil {
		t.Fatalf("NewCleaner with the defaults: %v", err)
	}
	bad := &admin.CleanerConfig{Interval: -time.Second, Cleanup: admin.CleanupConfig{BatchSize: -1}}
	err := bad.Validate()
	for _, field := range []string{"CleanerConfig.Interval", "CleanupConfig.BatchSize"} {
		if err == nil || !strings.Contains(err.Error(), field) {
			t.Errorf("Validate of %+v: %v, want an error naming %s", bad, err, field)
		}
	}
	if _, err := admin.NewCleaner(pool, bad); err == nil {
		t.Fatal("NewCleaner accepted a negative interval")
	}
}
