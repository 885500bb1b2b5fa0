package relayprom_test

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
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"go.uber.org/goleak"

	"github.com/pgoutbox/pgoutbox"
	"github.com/pgoutbox/pgoutbox/broker"
	"github.com/pgoutbox/pgoutbox/broker/brokertest"
	"github.com/pgoutbox/pgoutbox/internal/pgtest"
	"github.com/pgoutbox/pgoutbox/internal/promtest"
	"github.com/pgoutbox/pgoutbox/internal/wait"
	"github.com/pgoutbox/pgoutbox/relay"
	"github.com/pgoutbox/pgoutbox/relay/relayprom"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func quiet() *slog.Logger { return slog.New(slog.DiscardHandler) }

// find returns the metric name{labels} from reg, or nil.
func find(t *testing.T, reg prometheus.Gatherer, name string, labels ...string) *dto.Metric {
	t.Helper()
	return promtest.Find(t, reg, name, labels...)
}

// value returns the gauge or counter name{labels}, failing when it is absent.
func value(t *testing.T, reg prometheus.Gatherer, name string, labels ...string) float64 {
	t.Helper()
	v, ok := promtest.Value(t, reg, name, labels...)
	if !ok {
		t.Fatalf("metric %s%v not exported", name, labels)
	}
	return v
}

type outbox struct {
	pool   *pgxpool.Pool
	schema string
	prod   *pgoutbox.Producer
}

func newOutbox(t *testing.T) *outbox {
	t.Helper()
	pool, schema := pgtest.Migrated(t, 6)
	p, err := pgoutbox.NewProducer(&pgoutbox.Config{Schema: schema})
	pgtest.Must(t, err, "producer")
	return &outbox{pool, schema, p}
}

func (o *outbox) table() string { return pgx.Identifier{o.schema, "outbox_events"}.Sanitize() }

func (o *outbox) enqueue(t *testing.T, aggregate string, n int) []pgoutbox.UUID {
	t.Helper()
	evs := make([]pgoutbox.Event, n)
	for i := range evs {
		evs[i] = pgoutbox.Event{AggregateType: "acct", AggregateID: aggregate, EventType: "acct.changed", Payload: i}
	}
	res, err := o.prod.EnqueueTx(context.Background(), o.pool, evs...)
	pgtest.Must(t, err, "enqueue")
	ids := make([]pgoutbox.UUID, n)
	for i, r := range res {
		ids[i] = r.EventID
	}
	return ids
}

func (o *outbox) exec(t *testing.T, sql string, args ...any) {
	t.Helper()
	_, err := o.pool.Exec(context.Background(), strings.ReplaceAll(sql, "TABLE", o.table()), args...)
	pgtest.Must(t, err, "exec %s", sql)
}

// The backlog gauges count what the rows say: published rows are ignored,
// quarantined ones counted apart, and the age is the oldest pending event's.
func TestOutboxCollectorReadsTheBacklog(t *testing.T) {
	t.Parallel()
	o := newOutbox(t)
	reg := prometheus.NewRegistry()
	backlog, err := relayprom.NewOutbox(o.pool, &relayprom.OutboxConfig{Schema: o.schema, MaxAge: time.Nanosecond})
	pgtest.Must(t, err, "NewOutbox")
	reg.MustRegister(backlog)

	if got := value(t, reg, "pgoutbox_relay_pending_events"); got != 0 {
		t.Fatalf("empty outbox: pending %v", got)
	}
	if got := value(t, reg, "pgoutbox_relay_oldest_pending_age_seconds"); got != 0 {
		t.Fatalf("empty outbox: oldest age %v", got)
	}

	a := o.enqueue(t, "a", 4)
	b := o.enqueue(t, "b", 2)
	// An hour-old published event must not count; a 90s-old pending one is the oldest;
	// a two-hour-old quarantined one is counted as quarantined only.
	o.exec(t, "UPDATE TABLE SET published_at = now(), occurred_at = now() - interval '1 hour' WHERE event_id = $1", a[0])
	o.exec(t, "UPDATE TABLE SET occurred_at = now() - interval '90 seconds' WHERE event_id = $1", a[1])
	o.exec(t, "UPDATE TABLE SET quarantined_at = now(), occurred_at = now() - interval '2 hours' WHERE event_id = $1", b[0])

	if got := value(t, reg, "pgoutbox_relay_pending_events"); got != 4 {
		t.Errorf("pending %v, want 4", got)
	}
	if got := value(t, reg, "pgoutbox_relay_quarantined_events"); got != 1 {
		t.Errorf("quarantined %v, want 1", got)
	}
	if got := value(t, reg, "pgoutbox_relay_oldest_pending_age_seconds"); got < 90 || got > 120 {
		t.Errorf("oldest pending age %vs, want about 90s", got)
	}
	if got := value(t, reg, "pgoutbox_relay_outbox_table_bytes"); got < 8192 {
		t.Errorf("table bytes %v", got)
	}
	if got := value(t, reg, "pgoutbox_relay_up", "dependency", "database"); got != 1 {
		t.Errorf("up{database} %v", got)
	}
	if find(t, reg, "pgoutbox_relay_up", "dependency", "broker") != nil {
		t.Error("up{broker} exported without a Health func")
	}
}

// Scrapes within MaxAge reuse one read, while the age keeps growing; a scrape
// after MaxAge reads again.
func TestOutboxCollectorCachesReads(t *testing.T) {
	t.Parallel()
	o := newOutbox(t)
	o.enqueue(t, "a", 1)
	o.exec(t, "UPDATE TABLE SET occurred_at = now() - interval '10 seconds'")
	backlog, err := relayprom.NewOutbox(o.pool, &relayprom.OutboxConfig{Schema: o.schema, MaxAge: time.Hour})
	pgtest.Must(t, err, "NewOutbox")
	ctx := context.Background()
	first, err := backlog.Stats(ctx)
	pgtest.Must(t, err, "stats")
	o.enqueue(t, "b", 5)
	time.Sleep(20 * time.Millisecond) // let the clock move: the age must follow it
	second, err := backlog.Stats(ctx)
	pgtest.Must(t, err, "stats")
	if second.Pending != 1 || second.ReadAt != first.ReadAt {
		t.Fatalf("second scrape within MaxAge read again: %+v after %+v", second, first)
	}
	if second.OldestPendingAge <= first.OldestPendingAge {
		t.Fatalf("age did not grow between scrapes: %s then %s", first.OldestPendingAge, second.OldestPendingAge)
	}

	fresh, err := relayprom.NewOutbox(o.pool, &relayprom.OutboxConfig{Schema: o.schema, MaxAge: time.Nanosecond})
	pgtest.Must(t, err, "NewOutbox")
	if s, err := fresh.Stats(ctx); err != nil || s.Pending != 6 {
		t.Fatalf("uncached read: %+v, %v", s, err)
	}
}

// An unreachable database turns up{database} to 0 and hides the backlog gauges;
// the relay's health report sets up{broker}.
func TestOutboxCollectorReportsDependencies(t *testing.T) {
	t.Parallel()
	pool, err := pgxpool.New(context.Background(), "postgres://postgres@127.0.0.1:1/none?sslmode=disable&connect_timeout=2")
	pgtest.Must(t, err, "pool")
	t.Cleanup(pool.Close)
	var mu sync.Mutex
	health := relay.ErrBrokerUnreachable
	backlog, err := relayprom.NewOutbox(pool, &relayprom.OutboxConfig{
		MaxAge: time.Nanosecond, Logger: quiet(),
		Health: func() error { mu.Lock(); defer mu.Unlock(); return health },
	})
	pgtest.Must(t, err, "NewOutbox")
	reg := prometheus.NewRegistry()
	reg.MustRegister(backlog)
	if got := value(t, reg, "pgoutbox_relay_up", "dependency", "database"); got != 0 {
		t.Errorf("up{database} %v with the database unreachable", got)
	}
	if got := value(t, reg, "pgoutbox_relay_up", "dependency", "broker"); got != 0 {
		t.Errorf("up{broker} %v with the relay reporting the broker down", got)
	}
	if find(t, reg, "pgoutbox_relay_pending_events") != nil {
		t.Error("pending exported without a database")
	}

	o := newOutbox(t)
	backlog, err = relayprom.NewOutbox(o.pool, &relayprom.OutboxConfig{Schema: o.schema, MaxAge: time.Nanosecond,
		Health: func() error { mu.Lock(); defer mu.Unlock(); return health }})
	pgtest.Must(t, err, "NewOutbox")
	reg = prometheus.NewRegistry()
	reg.MustRegister(backlog)
	mu.Lock()
	health = relay.ErrDatabaseUnreachable // the relay lost it even though our query works
	mu.Unlock()
	if got := value(t, reg, "pgoutbox_relay_up", "dependency", "database"); got != 0 {
		t.Errorf("up{database} %v while the relay reports it unreachable", got)
	}
	if got := value(t, reg, "pgoutbox_relay_up", "dependency", "broker"); got != 1 {
		t.Errorf("up{broker} %v", got)
	}
	mu.Lock()
	health = nil
	mu.Unlock()
	if got := value(t, reg, "pgoutbox_relay_up", "dependency", "database"); got != 1 {
		t.Errorf("up{database} %v once healthy", got)
	}

	if _, err := relayprom.NewOutbox(o.pool, &relayprom.OutboxConfig{Schema: strings.Repeat("s", 64)}); err == nil {
		t.Error("NewOutbox accepted an invalid schema")
	}
}

// scripted acks every message except: aggregate "poison" is refused for good, and
// the first attempt of every "flaky" event finds the broker unavailable.
type scripted struct {
	mu    sync.Mutex
	tried map[pgoutbox.UUID]bool
}

func (s *scripted) Publish(_ context.Context, msgs []broker.Message) []error {
	s.mu.Lock()
	defer s.mu.Unlock()
	res := make([]error, len(msgs))
	for i, m := range msgs {
		switch {
		case i > 0 && msgs[i-1].AggregateID == m.AggregateID && res[i-1] != nil:
			res[i] = broker.ErrPredecessorFailed
		case m.AggregateID == "poison":
			res[i] = broker.Permanent(errors.New("422 no such thing"))
		case m.AggregateID == "flaky" && !s.tried[m.EventID]:
			s.tried[m.EventID] = true
			res[i] = broker.Unavailable(errors.New("connection refused"))
		}
	}
	return res
}

func (s *scripted) Close() error { return nil }

// A relay with Metrics as its observer counts what it did, in agreement with its
// Stats: publishes, failures by reason, quarantines, takeovers, attempts, batches.
func TestMetricsCountTheRelaysWork(t *testing.T) {
	t.Parallel()
	o := newOutbox(t)
	o.enqueue(t, "ok", 20)
	o.enqueue(t, "flaky", 3)
	o.enqueue(t, "poison", 2)
	o.enqueue(t, "ghost", 4)
	// A dead relay's expired lease on the ghost run (an old relay leased every event of it): one lease taken over.
	o.exec(t, "UPDATE TABLE SET claimed_by = 'ghost-relay', claim_until = now() - interval '1 second' WHERE aggregate_id = 'ghost'")

	reg := prometheus.NewRegistry()
	m, err := relayprom.New(reg)
	pgtest.Must(t, err, "New")
	if again, err := relayprom.New(reg); err != nil || again == nil {
		t.Fatalf("second New on the same registry: %v", err)
	}
	r, err := relay.New(o.pool, &scripted{tried: map[pgoutbox.UUID]bool{}}, &relay.Config{
		Schema: o.schema, BatchSize: 7, Workers: 1, PollInterval: 50 * time.Millisecond,
		BackoffBase: 5 * time.Millisecond, BackoffMax: 20 * time.Millisecond, Logger: quiet(), Observer: m,
	})
	pgtest.Must(t, err, "relay")
	pgtest.Must(t, r.Start(context.Background()), "start")
	stopped := false
	stop := func() {
		if !stopped {
			stopped = true
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			pgtest.Must(t, r.Stop(ctx), "stop")
		}
	}
	t.Cleanup(stop)
	deadline := time.Now().Add(30 * time.Second)
	for s := r.Stats(); s.Published < 27 || s.Quarantined < 1; s = r.Stats() {
		if time.Now().After(deadline) {
			t.Fatalf("relay did not publish 27 and quarantine 1: %+v", s)
		}
		time.Sleep(10 * time.Millisecond)
	}
	stop()
	s := r.Stats()

	check := func(name string, want float64, labels ...string) {
		t.Helper()
		if got := value(t, reg, name, labels...); got != want {
			t.Errorf("%s%v = %v, want %v", name, labels, got, want)
		}
	}
	check("pgoutbox_relay_published_total", 27)
	check("pgoutbox_relay_quarantined_total", 1)
	check("pgoutbox_relay_leases_taken_over_total", 1)
	check("pgoutbox_relay_publish_failures_total", 1, "reason", "permanent")
	check("pgoutbox_relay_publish_failures_total", 0, "reason", "error")
	// Each flaky event fails once; the failures total agrees with the relay's.
	check("pgoutbox_relay_publish_failures_total", 3, "reason", "unavailable")
	if s.Failed != 4 || s.TakenOver != 1 {
		t.Errorf("relay stats %+v", s)
	}

	attempts := find(t, reg, "pgoutbox_relay_publish_attempts").GetHistogram()
	if attempts.GetSampleCount() != 27 || attempts.GetSampleSum() != 24+2*3 {
		t.Errorf("attempts histogram: count %d sum %v, want 27 and 30 (24 first tries, 3 second ones)",
			attempts.GetSampleCount(), attempts.GetSampleSum())
	}
	batches := find(t, reg, "pgoutbox_relay_batch_size").GetHistogram()
	// A claim may take two statements (it wraps around the lanes): Stats counts those.
	if c := int64(batches.GetSampleCount()); c == 0 || c > s.Claims || int64(batches.GetSampleSum()) != s.Claimed {
		t.Errorf("batch size histogram: count %d sum %v, relay claimed %d in %d claims",
			batches.GetSampleCount(), batches.GetSampleSum(), s.Claimed, s.Claims)
	}
	if acks := find(t, reg, "pgoutbox_relay_broker_ack_seconds").GetHistogram(); acks.GetSampleCount() == 0 {
		t.Error("no broker ack latency observed")
	}

	m.CleanupDeleted("outbox_events", 500)
	m.CleanupDeleted("outbox_events", 20)
	m.CleanupDeleted("processed_events", 0)
	check("pgoutbox_cleanup_deleted_rows_total", 520, "table", "outbox_events")
	if find(t, reg, "pgoutbox_cleanup_deleted_rows_total", "table", "processed_events") != nil {
		t.Error("zero rows created a series")
	}
}

func ExampleNewOutbox() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, "postgres://app@localhost:5432/app") // connects lazily
	if err != nil {
		panic(err)
	}
	defer pool.Close()

	reg := prometheus.NewRegistry()
	metrics, err := relayprom.New(reg) // counters: set as relay.Config.Observer
	if err != nil {
		panic(err)
	}
	_ = &relay.Config{Observer: metrics}
	backlog, err := relayprom.NewOutbox(pool, &relayprom.OutboxConfig{Schema: "public"})
	if err != nil {
		panic(err)
	}
	reg.MustRegister(backlog)
	fmt.Println("registered")
	// Output: registered
}

func TestOutboxConfigValidate(t *testing.T) {
	t.Parallel()
	var defaults *relayprom.OutboxConfig
	if err := defaults.Validate(); err != nil {
		t.Errorf("nil config: %v", err)
	}
	bad := &relayprom.OutboxConfig{MaxAge: -time.Second, QueryTimeout: -time.Second, Schema: strings.Repeat("s", 64)}
	err := bad.Validate()
	for _, field := range []string{"OutboxConfig.MaxAge", "OutboxConfig.QueryTimeout", "OutboxConfig.Schema"} {
		if err == nil || !strings.Contains(err.Error(), field) {
			t.Errorf("Validate: %v, want an error naming %s", err, field)
		}
	}
}

// A lock held on the outbox (its owner's, in a relay serving many tenants)
// makes a scrape report the database unread, and costs the pool shared with
// the relays no connection: the server ends the query (it does not wait for
// the lock, nor for the client's timeout, which would close the connection).
func TestOutboxCollectorLockedOutboxCostsNoConnection(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	o := newOutbox(t)
	o.enqueue(t, "a", 3)
	pool, closed := pgtest.PoolCountingCloses(t, pgtest.URL(), 1)
	backlog, err := relayprom.NewOutbox(pool, &relayprom.OutboxConfig{Schema: o.schema, MaxAge: time.Nanosecond, Logger: quiet()})
	pgtest.Must(t, err, "NewOutbox")
	reg := prometheus.NewRegistry()
	reg.MustRegister(backlog)
	if got := value(t, reg, "pgoutbox_relay_pending_events"); got != 3 {
		t.Fatalf("pending %v, want 3", got)
	}

	tx, err := o.pool.Begin(ctx)
	pgtest.Must(t, err, "begin")
	defer func() { _ = tx.Rollback(ctx) }()
	_, err = tx.Exec(ctx, "LOCK TABLE "+o.table()+" IN ACCESS EXCLUSIVE MODE")
	pgtest.Must(t, err, "lock")
	for range 2 {
		if got := value(t, reg, "pgoutbox_relay_up", "dependency", "database"); got != 0 {
			t.Fatalf("up{database} %v with the outbox locked", got)
		}
		if find(t, reg, "pgoutbox_relay_pending_events") != nil {
			t.Fatal("pending exported while the outbox could not be read")
		}
	}
	if _, err := backlog.Stats(ctx); !strings.Contains(fmt.Sprint(err), "55P03") {
		t.Fatalf("Stats = %v, want the server's lock timeout", err)
	}
	if n := closed.Load(); n != 0 {
		t.Fatalf("%d connections of the pool closed by scrapes of a locked outbox", n)
	}
	pgtest.Must(t, tx.Rollback(ctx), "release")
	if got := value(t, reg, "pgoutbox_relay_pending_events"); got != 3 {
		t.Fatalf("pending %v after the lock, want 3", got)
	}
}

// A relay with destinations counts each destination's outcomes under its
// destination label (and the sum in the relay's metrics); a destination's
// failures and quarantines are its own. A relay with one publisher exports
// no destination series.
func TestMetricsPerDestination(t *testing.T) {
	t.Parallel()
	o := newOutbox(t)
	o.enqueue(t, "ok", 5)
	o.enqueue(t, "poison", 2)
	reg := prometheus.NewRegistry()
	m, err := relayprom.New(reg)
	pgtest.Must(t, err, "New")
	good := &brokertest.Recorder{}
	bad := &brokertest.Recorder{Fail: func(msg *broker.Message) error {
		if msg.AggregateID == "poison" {
			return broker.Permanent(errors.New("refused"))
		}
		return nil
	}}
	all := []relay.Rule{{All: true}}
	r, err := relay.New(o.pool, nil, &relay.Config{
		Schema: o.schema, PollInterval: 50 * time.Millisecond, Logger: quiet(), Observer: m, Workers: 1,
		Destinations: []relay.Destination{
			{Name: "good", Publisher: good, Rules: all, Start: relay.StartBackfill},
			{Name: "bad", Publisher: bad, Rules: all, Start: relay.StartBackfill},
		},
	})
	pgtest.Must(t, err, "relay")
	pgtest.Must(t, r.Start(context.Background()), "start")
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		pgtest.Must(t, r.Stop(ctx), "stop")
	})
	wait.For(t, 30*time.Second, "good to have 7 and bad 5 and a quarantine", func() bool {
		v, _ := promtest.Value(t, reg, "pgoutbox_relay_destination_published_total", "destination", "good")
		w, _ := promtest.Value(t, reg, "pgoutbox_relay_destination_published_total", "destination", "bad")
		q, _ := promtest.Value(t, reg, "pgoutbox_relay_destination_quarantined_total", "destination", "bad")
		return v == 7 && w == 5 && q == 1
	})
	if got := value(t, reg, "pgoutbox_relay_destination_publish_failures_total", "destination", "bad", "reason", "permanent"); got != 1 {
		t.Errorf("bad's permanent failures %v, want 1", got)
	}
	if find(t, reg, "pgoutbox_relay_destination_quarantined_total", "destination", "good") != nil {
		t.Error("good has a quarantine series")
	}
	if got := value(t, reg, "pgoutbox_relay_published_total"); got != 12 {
		t.Errorf("published_total %v, want the 12 deliveries", got)
	}
}
