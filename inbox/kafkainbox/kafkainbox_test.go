package kafkainbox_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/pgoutbox/pgoutbox/broker"
	"github.com/pgoutbox/pgoutbox/broker/kafka"
	"github.com/pgoutbox/pgoutbox/inbox"
	"github.com/pgoutbox/pgoutbox/inbox/kafkainbox"
	"github.com/pgoutbox/pgoutbox/internal/inboxtest"
	"github.com/pgoutbox/pgoutbox/internal/pgtest"
	"github.com/pgoutbox/pgoutbox/internal/wait"
	"github.com/pgoutbox/pgoutbox/wire"
)

// Acceptance: two instances in one group consume 2,000 events over 40 aggregates
// from an 8-partition topic, every event on it twice (the relay re-publishing a
// batch after a crash, so each copy lands behind later events of its aggregate).
// The second instance joins mid-stream, so partitions move while records are
// processed. Each aggregate is applied exactly once, 1..N in order, and the
// committed offsets reach the end of every partition.
func TestTwoInstancesApplyEveryEventOnceInOrder(t *testing.T) {
	t.Parallel()
	const aggregates, perAggregate, partitions, batch = 40, 50, 8, 100
	e := newEnv(t, 16, partitions)

	// Per aggregate, sequence order (what the relay guarantees); aggregates
	// interleaved at random.
	rng := rand.New(rand.NewPCG(3, 9))
	lanes := make([][]broker.Message, aggregates)
	live := make([]int, aggregates)
	for a := range lanes {
		lanes[a] = inboxtest.Lane(fmt.Sprintf("agg-%02d", a), perAggregate)
		live[a] = a
	}
	next := make([]int, aggregates)
	var events []broker.Message
	for len(live) > 0 {
		k := rng.IntN(len(live))
		a := live[k]
		events = append(events, lanes[a][next[a]])
		if next[a]++; next[a] == perAggregate {
			live = slices.Delete(live, k, k+1)
		}
	}
	var batches [][]broker.Message
	for b := range slices.Chunk(events, batch) {
		batches = append(batches, b)
	}
	// Each batch, then the previous one again: every event twice.
	publishFrom := func(from, to int) {
		for i := from; i < to; i++ {
			e.publish(t, batches[i])
			if i > 0 {
				e.publish(t, batches[i-1])
			}
		}
		if to == len(batches) {
			e.publish(t, batches[to-1])
		}
	}

	start := time.Now()
	consumers := []*inbox.Consumer[pgx.Tx]{e.Consumer(t, inbox.Config{}, nil), e.Consumer(t, inbox.Config{}, nil)}
	subs := []*kafkainbox.Subscriber{e.subscribe(t, consumers[0], kafkainbox.Config{Concurrency: 4})}
	publishFrom(0, len(batches)/2)
	subs = append(subs, e.subscribe(t, consumers[1], kafkainbox.Config{Concurrency: 4}))
	publishFrom(len(batches)/2, len(batches))
	wait.For(t, 3*time.Minute, "every event to be applied and every offset committed", func() bool {
		return e.Count(t, "effects", "true") == aggregates*perAggregate && e.lag(t, "billing") == 0
	})
	elapsed := time.Since(start)

	e.CheckInOrder(t, "agg-%02d", aggregates, perAggregate)
	total, per := inboxtest.SumStats(consumers)
	if total.Applied != aggregates*perAggregate || total.Duplicates < aggregates*perAggregate || total.Failed != 0 || total.Undecodable != 0 {
		t.Fatalf("inbox stats %+v; want %d applied, at least as many duplicates, no failures", total, aggregates*perAggregate)
	}
	for i, n := range per {
		if n == 0 {
			t.Errorf("instance %d applied nothing (per instance: %v)", i, per)
		}
	}
	var acked, retried int64
	for _, s := range subs {
		st := s.Stats()
		acked += st.Acked
		retried += st.Retried
		if st.Partitions == 0 {
			t.Errorf("an instance holds no partition at the end: %+v", st)
		}
	}
	if acked < 2*aggregates*perAggregate {
		t.Errorf("%d records acked, want at least %d", acked, 2*aggregates*perAggregate)
	}
	t.Logf("%d records in %s (%.0f/s, publishing included); applied per instance %v; %d duplicates, %d gap rejections, %d retries",
		2*len(events), elapsed.Round(time.Millisecond), float64(2*len(events))/elapsed.Seconds(), per, total.Duplicates, total.Gaps, retried)
}

// Acceptance: a handler fails for one event the first two times. Each failure rolls
// back and leaves nothing; the record is processed again in place and applied
// once. The records behind it in its partition wait, while the other partitions
// are worked off meanwhile.
func TestHandlerErrorRetriesInPlace(t *testing.T) {
	t.Parallel()
	const partitions = 4
	e := newEnv(t, 10, partitions)
	blocked := idsIn(0, partitions, 3) // the failing event's aggregate and two neighbours
	var others []string
	for p := int32(1); p < partitions; p++ {
		others = append(others, idsIn(p, partitions, 2)...)
	}
	var msgs []broker.Message
	for _, id := range append(slices.Clone(blocked), others...) {
		msgs = append(msgs, inboxtest.Lane(id, 5)...)
	}
	target := msgs[1] // blocked[0], sequence 2
	e.publish(t, msgs)

	var calls atomic.Int32
	var flowed atomic.Bool
	var mu sync.Mutex
	var rowsSeen []int // committed rows of the event when each attempt runs: what failures left behind
	c := e.Consumer(t, inbox.Config{RetryDelay: 20 * time.Millisecond, MaxRetryDelay: 50 * time.Millisecond},
		func(ctx context.Context, tx pgx.Tx, ev inbox.Event) error {
			if err := e.Record(ctx, tx, ev); err != nil || ev.EventID != target.EventID {
				return err
			}
			var n int
			err := e.pool.QueryRow(ctx, "SELECT (SELECT count(*) FROM "+e.Table("processed_events")+" WHERE event_id = $1) + "+
				"(SELECT count(*) FROM "+e.Table("effects")+" WHERE event_id = $1)", ev.EventID.String()).Scan(&n)
			mu.Lock()
			rowsSeen = append(rowsSeen, n)
			mu.Unlock()
			if err != nil {
				return err
			}
			switch calls.Add(1) {
			case 1:
				return errors.New("payment service down")
			case 2:
				// While this partition waits, the others are worked off.
				othersDone := func() bool {
					var n int
					err := e.pool.QueryRow(ctx, "SELECT count(*) FROM "+e.Table("effects")+" WHERE aggregate_id = ANY($1)", others).Scan(&n)
					return err == nil && n == len(others)*5
				}
				for deadline := time.Now().Add(30 * time.Second); !othersDone() && time.Now().Before(deadline); {
					time.Sleep(20 * time.Millisecond) // polling interval, not synchronisation
				}
				flowed.Store(othersDone())
				return errors.New("payment service still down")
			}
			return nil
		})
	s := e.subscribe(t, c, kafkainbox.Config{Concurrency: 4})
	wait.For(t, time.Minute, "every event to be applied and committed", func() bool {
		return e.Count(t, "effects", "true") == len(msgs) && e.lag(t, "billing") == 0
	})

	mu.Lock()
	if calls.Load() != 3 || !slices.Equal(rowsSeen, []int{0, 0, 0}) {
		t.Fatalf("%d handler calls for the event; its committed rows at each: %v (want 3 calls, nothing left by the failures)", calls.Load(), rowsSeen)
	}
	mu.Unlock()
	if !flowed.Load() {
		t.Fatal("the other partitions were not worked off while the failing record's partition waited")
	}
	if st := c.Stats(); st.Failed != 2 || st.Applied != int64(len(msgs)) || st.Duplicates != 0 {
		t.Fatalf("inbox stats %+v", st)
	}
	if st := s.Stats(); st.Retried != 2 || st.Acked != int64(len(msgs)) {
		t.Fatalf("subscriber stats %+v, want 2 retries", st)
	}
	// In its partition, everything before the event was applied before it and
	// everything behind it after it.
	applied := e.applied(t)
	at := applied[target.EventID.String()]
	var targetOffset int64 = -1
	recs := e.records(t)
	for _, r := range recs {
		if r.Partition == 0 && header(r, wire.HeaderEventID) == target.EventID.String() {
			targetOffset = r.Offset
		}
	}
	if targetOffset < 0 {
		t.Fatal("the event is not in partition 0")
	}
	for _, r := range recs {
		if r.Partition != 0 {
			continue
		}
		n := applied[header(r, wire.HeaderEventID)]
		if (r.Offset < targetOffset && n > at) || (r.Offset > targetOffset && n < at) {
			t.Errorf("offset %d of the partition applied as #%d, the retried event at offset %d as #%d", r.Offset, n, targetOffset, at)
		}
	}
}

// Acceptance: a subscriber stopped mid-stream commits what it finished; a new one
// in the same group resumes right there: no record is read twice, no event is
// applied twice, every aggregate is applied in order. Small per-partition buffers
// make fetching pause and resume throughout.
func TestRestartResumesFromCommittedOffsets(t *testing.T) {
	t.Parallel()
	const aggregates, perAggregate = 20, 20
	e := newEnv(t, 6, 4)
	var msgs []broker.Message
	for a := range aggregates {
		msgs = append(msgs, inboxtest.Lane(fmt.Sprintf("agg-%02d", a), perAggregate)...)
	}
	e.publish(t, msgs)
	cfg := kafkainbox.Config{Concurrency: 2, MaxBufferedRecords: 4, CommitInterval: time.Hour}

	first := e.Consumer(t, inbox.Config{}, nil)
	s := e.newSubscriber(t, first, cfg)
	pgtest.Must(t, s.Start(context.Background()), "Start")
	wait.For(t, 30*time.Second, "a third of the events to be applied", func() bool {
		return e.Count(t, "effects", "true") >= len(msgs)/3
	})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pgtest.Must(t, s.Stop(ctx), "Stop")
	done := s.Stats().Acked
	committed, _ := e.offsets(t, "billing")
	var sum int64
	for _, o := range committed {
		sum += o
	}
	if applied := first.Stats().Applied; sum != done || applied != done || int64(e.Count(t, "effects", "true")) != done {
		t.Fatalf("after Stop: %d records acked, %d applied, %d committed (%v); want all equal", done, applied, sum, committed)
	}
	if done == int64(len(msgs)) {
		t.Fatal("the first subscriber finished everything before it was stopped")
	}

	second := e.Consumer(t, inbox.Config{}, nil)
	cfg.CommitInterval = 0 // the default
	e.subscribe(t, second, cfg)
	wait.For(t, time.Minute, "the rest to be applied and committed", func() bool {
		return e.Count(t, "effects", "true") == len(msgs) && e.lag(t, "billing") == 0
	})
	if st := second.Stats(); st.Duplicates != 0 || st.Applied != int64(len(msgs))-done {
		t.Fatalf("second consumer %+v: want %d applied and no record read again", st, int64(len(msgs))-done)
	}
	for a := range aggregates {
		want := make([]int64, perAggregate)
		for i := range want {
			want[i] = int64(i + 1)
		}
		if got := e.Sequences(t, fmt.Sprintf("agg-%02d", a)); !slices.Equal(got, want) {
			t.Fatalf("aggregate %d applied %v", a, got)
		}
	}
}

// Acceptance: the consumer transactions commit, but the client goes away before
// the offsets are committed (the cluster refuses the final commit, as if the
// process had died). A new subscriber reads the records again: duplicates, no
// second effect.
func TestCrashAfterCommitBeforeOffsetCommit(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 4, 2)
	var msgs []broker.Message
	for a := range 4 {
		msgs = append(msgs, inboxtest.Lane(fmt.Sprint(a), 3)...)
	}
	e.publish(t, msgs)

	c := e.Consumer(t, inbox.Config{}, nil)
	var returned atomic.Int32
	// Process commits the consumer transaction and returns; the subscriber would
	// commit the offsets an hour later.
	wrapper := inboxtest.Processor{Consumer: c.Name(), Fn: func(ctx context.Context, d inbox.Delivery) inbox.Outcome {
		o := c.Process(ctx, d)
		returned.Add(1)
		return o
	}}
	s := e.newSubscriber(t, wrapper, kafkainbox.Config{CommitInterval: time.Hour})
	pgtest.Must(t, s.Start(context.Background()), "Start")
	wait.For(t, 30*time.Second, "every event to be applied", func() bool {
		return e.Count(t, "effects", "true") == len(msgs) && returned.Load() == int32(len(msgs))
	})
	refuse := e.cluster.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.OffsetCommit}, Err: kerr.GroupAuthorizationFailed, Count: -1})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pgtest.Must(t, s.Stop(ctx), "Stop")
	refuse.Remove()
	if st := s.Stats(); st.Commits != 0 || st.CommitErrors == 0 {
		t.Fatalf("subscriber stats %+v: want the offset commit to have failed", st)
	}
	if lag := e.lag(t, "billing"); lag != int64(len(msgs)) {
		t.Fatalf("%d records beyond the committed offsets, want %d (none committed)", lag, len(msgs))
	}

	again := e.Consumer(t, inbox.Config{}, nil)
	e.subscribe(t, again, kafkainbox.Config{})
	wait.For(t, 30*time.Second, "the records to be read again and committed", func() bool { return e.lag(t, "billing") == 0 })
	if n := e.Count(t, "effects", "true"); n != len(msgs) {
		t.Fatalf("%d effects, want %d", n, len(msgs))
	}
	if st := again.Stats(); st.Duplicates != int64(len(msgs)) || st.Applied != 0 {
		t.Fatalf("stats %+v, want every record seen as a duplicate", st)
	}
}

// Acceptance: a consumer process commits and dies (SIGKILL of itself) before the
// offset is committed. After its session times out, a new member gets the
// partition, reads the record again, finds it applied and commits past it: one
// effect.
func TestCrashKillsProcessAfterCommit(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 4, 2)
	msgs := inboxtest.Lane("1", 3)
	e.publish(t, msgs)

	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestHelperProcess$", "-test.count=1")
	cmd.Env = append(os.Environ(), helperEnv+"=crash-after-commit", "HELPER_SCHEMA="+e.schema,
		"HELPER_BROKERS="+strings.Join(e.addrs, ","))
	out, err := cmd.CombinedOutput()
	if err == nil || cmd.ProcessState == nil || !strings.Contains(cmd.ProcessState.String(), "killed") {
		t.Fatalf("helper ended with %v (%v), want killed; output:\n%s", err, cmd.ProcessState, out)
	}
	if n := e.Count(t, "effects", "true"); n != 1 {
		t.Fatalf("%d effects after the crash, want 1 (the helper committed)", n)
	}
	if lag := e.lag(t, "billing"); lag != int64(len(msgs)) {
		t.Fatalf("%d records beyond the committed offsets after the crash, want %d", lag, len(msgs))
	}

	c := e.Consumer(t, inbox.Config{}, nil)
	e.subscribe(t, c, kafkainbox.Config{})
	wait.For(t, 30*time.Second, "the records to be processed and committed", func() bool { return e.lag(t, "billing") == 0 })
	if got := e.Sequences(t, "1"); !slices.Equal(got, []int64{1, 2, 3}) {
		t.Fatalf("applied %v, want [1 2 3]", got)
	}
	if st := c.Stats(); st.Duplicates != 1 || st.Applied != 2 {
		t.Fatalf("stats %+v, want the re-read record seen as a duplicate", st)
	}
}

const helperEnv = "PGOUTBOX_KAFKAINBOX_HELPER"

// TestHelperProcess is the consumer process of TestCrashKillsProcessAfterCommit,
// run as a child: it applies the first event and kills itself after the commit,
// before the subscriber can commit the offset.
func TestHelperProcess(t *testing.T) {
	if os.Getenv(helperEnv) != "crash-after-commit" {
		return
	}
	e := &env{schema: os.Getenv("HELPER_SCHEMA"), kcluster: &kcluster{addrs: strings.Split(os.Getenv("HELPER_BROKERS"), ",")}}
	e.pool = pgtest.Pool(t, pgtest.URL(), 2)
	e.Effects = &inboxtest.Effects{Pool: e.pool, Schema: e.schema} // the parent test created the table
	c := e.Consumer(t, inbox.Config{}, nil)
	crash := inboxtest.KillAfterApply(c) // SIGKILL after the commit: no offset commit, no leaving the group
	// A short session, so that the group drops the dead member quickly.
	s := e.newSubscriber(t, crash, kafkainbox.Config{ProcessTimeout: 5 * time.Second, CommitInterval: 10 * time.Millisecond},
		kgo.SessionTimeout(time.Second), kgo.RebalanceTimeout(10*time.Second))
	pgtest.Must(t, s.Start(context.Background()), "Start")
	<-time.After(60 * time.Second) // a timeout: the crash comes first
	t.Fatal("helper: no record within 60s")
}

// When a partition moves to another member, the member giving it up commits the
// records it finished — and not the record it was retrying, which the new owner
// then processes. The first member commits only at revocation here (the interval
// is an hour), so the new owner re-reading nothing shows that commit happened.
func TestRevocationCommitsFinishedRecordsOnly(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 6, 2)
	var msgs []broker.Message
	ids := []string{idsIn(0, 2, 1)[0], idsIn(1, 2, 1)[0]}
	for _, id := range ids {
		msgs = append(msgs, inboxtest.Lane(id, 2)...)
	}
	e.publish(t, msgs)

	var failing atomic.Bool
	failing.Store(true)
	var failures [2]atomic.Int32
	first := e.Consumer(t, inbox.Config{RetryDelay: 10 * time.Millisecond, MaxRetryDelay: 20 * time.Millisecond},
		func(ctx context.Context, tx pgx.Tx, ev inbox.Event) error {
			if ev.AggregateSequence == 2 && failing.Load() {
				failures[slices.Index(ids, ev.AggregateID)].Add(1)
				return errors.New("downstream unavailable")
			}
			return e.Record(ctx, tx, ev)
		})
	a := e.subscribe(t, first, kafkainbox.Config{CommitInterval: time.Hour})
	wait.For(t, 30*time.Second, "both partitions to retry their second record", func() bool {
		return e.Count(t, "effects", "true") == 2 && failures[0].Load() > 0 && failures[1].Load() > 0
	})
	if lag := e.lag(t, "billing"); lag != 4 {
		t.Fatalf("%d records beyond the committed offsets before the rebalance, want 4 (nothing committed)", lag)
	}

	second := e.Consumer(t, inbox.Config{}, nil)
	b := e.subscribe(t, second, kafkainbox.Config{})
	// The consumer counts an outcome after its transaction commits: wait for the
	// count too, not only for the effect row.
	wait.For(t, 30*time.Second, "one partition to move and its retried record to be applied by the new owner", func() bool {
		return a.Stats().Partitions == 1 && b.Stats().Partitions == 1 && e.Count(t, "effects", "true") == 3 &&
			second.Stats().Applied >= 1
	})
	if st := second.Stats(); st.Applied != 1 || st.Duplicates != 0 {
		t.Fatalf("new owner %+v: want the retried record applied and the finished one not read again", st)
	}
	failing.Store(false)
	wait.For(t, 30*time.Second, "the other partition's record to be applied", func() bool {
		return e.Count(t, "effects", "true") == 4
	})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pgtest.Must(t, a.Stop(ctx), "Stop") // the first member commits on leaving
	wait.For(t, 30*time.Second, "every offset to be committed", func() bool { return e.lag(t, "billing") == 0 })
	for _, id := range ids {
		if got := e.Sequences(t, id); !slices.Equal(got, []int64{1, 2}) {
			t.Fatalf("aggregate %s applied %v", id, got)
		}
	}
}

// With MaxAttempts, a record that keeps failing is skipped and committed past, and
// its partition goes on.
func TestMaxAttemptsSkips(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 4, 1)
	e.publish(t, []broker.Message{inboxtest.Event("poison", 1)})
	e.publish(t, []broker.Message{inboxtest.Event("fine", 1)})
	c := e.Consumer(t, inbox.Config{RetryDelay: time.Millisecond, MaxRetryDelay: 5 * time.Millisecond},
		func(ctx context.Context, tx pgx.Tx, ev inbox.Event) error {
			if ev.AggregateID == "poison" {
				return errors.New("bug")
			}
			return e.Record(ctx, tx, ev)
		})
	s := e.subscribe(t, c, kafkainbox.Config{MaxAttempts: 3})
	wait.For(t, 30*time.Second, "both records to be committed", func() bool { return e.lag(t, "billing") == 0 })
	if st := s.Stats(); st.Skipped != 1 || st.Retried != 2 || st.Acked != 1 {
		t.Fatalf("subscriber stats %+v", st)
	}
	if got := e.Sequences(t, "fine"); !slices.Equal(got, []int64{1}) {
		t.Fatalf("the record behind the skipped one: applied %v", got)
	}
}

func TestConfigValidation(t *testing.T) {
	t.Parallel()
	proc := inboxtest.Processor{Consumer: "billing"}
	unreachable := []kgo.Opt{kgo.SeedBrokers("127.0.0.1:1"), kgo.ConsumeTopics(topic)}
	for name, tc := range map[string]struct {
		cfg  kafkainbox.Config
		want string
	}{
		"concurrency":     {kafkainbox.Config{Concurrency: -1}, "Config.Concurrency"},
		"buffer":          {kafkainbox.Config{MaxBufferedRecords: 1}, "Config.MaxBufferedRecords"},
		"max attempts":    {kafkainbox.Config{MaxAttempts: -2}, "Config.MaxAttempts"},
		"process timeout": {kafkainbox.Config{ProcessTimeout: -time.Second}, "Config.ProcessTimeout"},
		"commit interval": {kafkainbox.Config{CommitInterval: time.Millisecond}, "Config.CommitInterval"},
	} {
		if _, err := kafkainbox.New(unreachable, proc, &tc.cfg); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: New = %v, want an error naming %s", name, err, tc.want)
		}
	}
	if _, err := kafkainbox.New(unreachable, nil, nil); err == nil {
		t.Error("New without a processor accepted")
	}
	if _, err := kafkainbox.Dial(nil, "", []string{topic}, proc, nil); err == nil {
		t.Error("Dial without brokers accepted")
	}

	// Client options are checked by Start, which builds the client.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for name, tc := range map[string]struct {
		opts []kgo.Opt
		cfg  kafkainbox.Config
		want string
	}{
		"no topics":         {[]kgo.Opt{kgo.SeedBrokers("127.0.0.1:1")}, kafkainbox.Config{}, "kgo.ConsumeTopics"},
		"rebalance timeout": {append(slices.Clone(unreachable), kgo.RebalanceTimeout(10*time.Second)), kafkainbox.Config{}, "Config.ProcessTimeout"},
		"unreachable":       {unreachable, kafkainbox.Config{}, "no broker answered"},
	} {
		tc.cfg.Logger = quiet
		s, err := kafkainbox.New(tc.opts, proc, &tc.cfg)
		pgtest.Must(t, err, "%s: New", name)
		if err := s.Start(ctx); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: Start = %v, want an error naming %s", name, err, tc.want)
		}
		pgtest.Must(t, s.Stop(ctx), "%s: Stop after a failed Start", name)
	}

	// Stop before Start is allowed, and makes Start fail.
	s, err := kafkainbox.Dial([]string{"127.0.0.1:1"}, "", []string{topic}, proc, &kafkainbox.Config{Logger: quiet})
	pgtest.Must(t, err, "Dial")
	pgtest.Must(t, s.Stop(ctx), "Stop before Start")
	if err := s.Start(ctx); err == nil {
		t.Error("Start after Stop succeeded")
	}
}

func header(r *kgo.Record, name string) string {
	for _, h := range r.Headers {
		if h.Key == name {
			return string(h.Value)
		}
	}
	return ""
}

// TestCloudEventsFormat: the relay's Kafka adapter publishes in the CloudEvents
// format (and once in the default format); the subscriber's consumer applies
// each event once, as with the default format.
func TestCloudEventsFormat(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 4, 2)
	publish := func(t *testing.T, enc wire.Encoding) broker.Publisher {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		p, err := kafka.Dial(ctx, "kafka://"+strings.Join(e.addrs, ","), &kafka.Config{Logger: quiet, Encoding: enc})
		pgtest.Must(t, err, "kafka.Dial")
		return p
	}
	inboxtest.CloudEvents(t, e.Effects, publish, func(t *testing.T, proc inbox.Processor) {
		e.subscribe(t, proc, kafkainbox.Config{})
	})
}
