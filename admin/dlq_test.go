package admin_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgoutbox/pgoutbox"
	"github.com/pgoutbox/pgoutbox/admin"
	"github.com/pgoutbox/pgoutbox/broker"
	"github.com/pgoutbox/pgoutbox/broker/brokertest"
	"github.com/pgoutbox/pgoutbox/internal/pgtest"
	"github.com/pgoutbox/pgoutbox/internal/wait"
	"github.com/pgoutbox/pgoutbox/relay"
)

// dlqEnv is a migrated schema of one test's own with an Admin on it.
type dlqEnv struct {
	t      *testing.T
	pool   *pgxpool.Pool
	schema string
	admin  *admin.Admin
}

func newDLQEnv(t *testing.T) *dlqEnv {
	t.Helper()
	pool, schema := pgtest.Migrated(t, 8)
	a, err := admin.New(pool, &admin.Config{Schema: schema})
	pgtest.Must(t, err, "admin")
	return &dlqEnv{t: t, pool: pool, schema: schema, admin: a}
}

func (e *dlqEnv) table(name string) string { return quoted(e.schema, name) }

// enqueue writes one event per (aggregate id, count) pair, n events to each
// aggregate in sequence order, and returns the ids per aggregate.
func (e *dlqEnv) enqueue(aggType string, perAgg int, aggIDs ...string) map[string][]pgoutbox.UUID {
	e.t.Helper()
	p, err := pgoutbox.NewProducer(&pgoutbox.Config{Schema: e.schema})
	pgtest.Must(e.t, err, "producer")
	out := map[string][]pgoutbox.UUID{}
	for _, id := range aggIDs {
		for s := range perAgg {
			res, err := p.EnqueueTx(context.Background(), e.pool, pgoutbox.Event{AggregateType: aggType, AggregateID: id,
				EventType: aggType + ".changed", Payload: map[string]any{"agg": id, "n": s + 1},
				Headers: map[string]string{"origin": "test"}})
			pgtest.Must(e.t, err, "enqueue")
			out[id] = append(out[id], res[0].EventID)
		}
	}
	return out
}

// quarantine marks an event as the relay does when it gives up on it.
func (e *dlqEnv) quarantine(id pgoutbox.UUID, lastErr string) {
	e.t.Helper()
	_, err := e.pool.Exec(context.Background(), "UPDATE "+e.table("outbox_events")+
		" SET quarantined_at = now(), attempt_count = 10, last_error = $2, available_at = now() + interval '1 hour' WHERE event_id = $1", id, lastErr)
	pgtest.Must(e.t, err, "quarantine")
}

func (e *dlqEnv) count(table, where string) int {
	e.t.Helper()
	var n int
	pgtest.Must(e.t, e.pool.QueryRow(context.Background(), "SELECT count(*) FROM "+e.table(table)+" WHERE "+where).Scan(&n), "count")
	return n
}

func ids(evs []admin.Event) []pgoutbox.UUID {
	var out []pgoutbox.UUID
	for _, e := range evs {
		out = append(out, e.ID)
	}
	return out
}

func sameIDs(got, want []pgoutbox.UUID) bool {
	if len(got) != len(want) {
		return false
	}
	set := map[pgoutbox.UUID]bool{}
	for _, id := range want {
		set[id] = true
	}
	for _, id := range got {
		if !set[id] {
			return false
		}
	}
	return true
}

func TestListQuarantinedFiltersAndGet(t *testing.T) {
	t.Parallel()
	e := newDLQEnv(t)
	ctx := context.Background()
	orders := e.enqueue("order", 2, "o1", "o2", "o3")
	users := e.enqueue("user", 1, "u1")
	e.quarantine(orders["o1"][0], "nats: invalid subject")
	e.quarantine(orders["o2"][0], "Schema Registry says NO")
	e.quarantine(users["u1"][0], "invalid subject too")

	cases := []struct {
		name string
		f    admin.Filter
		want []pgoutbox.UUID
	}{
		{"all", admin.Filter{}, []pgoutbox.UUID{orders["o1"][0], orders["o2"][0], users["u1"][0]}},
		{"aggregate type", admin.Filter{AggregateType: "order"}, []pgoutbox.UUID{orders["o1"][0], orders["o2"][0]}},
		{"aggregate id", admin.Filter{AggregateType: "order", AggregateID: "o2"}, []pgoutbox.UUID{orders["o2"][0]}},
		{"event type", admin.Filter{EventType: "user.changed"}, []pgoutbox.UUID{users["u1"][0]}},
		{"error text, any case", admin.Filter{ErrorContains: "schema registry"}, []pgoutbox.UUID{orders["o2"][0]}},
		{"error text with LIKE characters", admin.Filter{ErrorContains: "%"}, nil},
		{"limit", admin.Filter{ErrorContains: "INVALID SUBJECT", Limit: 1}, []pgoutbox.UUID{orders["o1"][0]}},
	}
	for _, c := range cases {
		got, err := e.admin.ListQuarantined(ctx, c.f)
		pgtest.Must(t, err, "list %s", c.name)
		if !sameIDs(ids(got), c.want) {
			t.Errorf("%s: got %v, want %v", c.name, ids(got), c.want)
		}
		for _, ev := range got {
			if ev.State != admin.StateQuarantined || ev.QuarantinedAt == nil || ev.AttemptCount != 10 || ev.Payload != nil {
				t.Errorf("%s: listed %+v", c.name, ev)
			}
		}
	}

	ev, err := e.admin.Get(ctx, orders["o2"][0])
	pgtest.Must(t, err, "get")
	var payload map[string]any
	pgtest.Must(t, json.Unmarshal(ev.Payload, &payload), "payload")
	if ev.AggregateID != "o2" || ev.AggregateSequence != 1 || payload["agg"] != "o2" || ev.Headers["origin"] != "test" ||
		ev.LastError != "Schema Registry says NO" || ev.State != admin.StateQuarantined || ev.Skip != nil {
		t.Fatalf("get: %+v (payload %s)", ev, ev.Payload)
	}
	ev, err = e.admin.Get(ctx, orders["o2"][1])
	pgtest.Must(t, err, "get pending")
	if ev.State != admin.StatePending || ev.QuarantinedAt != nil {
		t.Fatalf("pending event: %+v", ev)
	}
	if _, err := e.admin.Get(ctx, pgoutbox.NewEventID()); !errors.Is(err, admin.ErrNotFound) {
		t.Fatalf("get unknown: %v, want ErrNotFound", err)
	}
}

func TestSkipRefusesAndChangesNothing(t *testing.T) {
	t.Parallel()
	e := newDLQEnv(t)
	ctx := context.Background()
	evs := e.enqueue("order", 2, "o1")
	e.quarantine(evs["o1"][0], "boom")

	for _, c := range []struct {
		name string
		req  admin.SkipRequest
		want error
	}{
		{"no ids", admin.SkipRequest{Reason: "x"}, admin.ErrNoEvents},
		{"no reason", admin.SkipRequest{IDs: evs["o1"][:1]}, admin.ErrNoReason},
		{"blank reason", admin.SkipRequest{IDs: evs["o1"][:1], Reason: " \t"}, admin.ErrNoReason},
		{"a pending event among them", admin.SkipRequest{IDs: evs["o1"], Reason: "x"}, admin.ErrNotQuarantined},
		{"an unknown id among them", admin.SkipRequest{IDs: []pgoutbox.UUID{evs["o1"][0], pgoutbox.NewEventID()}, Reason: "x"}, admin.ErrNotFound},
	} {
		if _, err := e.admin.Skip(ctx, c.req); !errors.Is(err, c.want) {
			t.Errorf("%s: %v, want %v", c.name, err, c.want)
		}
	}
	if n := e.count("outbox_events", "quarantined_at IS NOT NULL AND published_at IS NULL"); n != 1 {
		t.Fatalf("%d quarantined events after refused skips, want 1", n)
	}
	if n := e.count("outbox_skipped_events", "true"); n != 0 {
		t.Fatalf("%d audit rows after refused skips", n)
	}

	// Once skipped, the event is published; skipping it again is refused.
	_, err := e.admin.Skip(ctx, admin.SkipRequest{IDs: evs["o1"][:1], Reason: "known bad payload", Actor: "alice"})
	pgtest.Must(t, err, "skip")
	if _, err := e.admin.Skip(ctx, admin.SkipRequest{IDs: evs["o1"][:1], Reason: "again"}); !errors.Is(err, admin.ErrNotQuarantined) {
		t.Fatalf("second skip: %v, want ErrNotQuarantined", err)
	}
}

func TestDefaultActor(t *testing.T) {
	t.Setenv("PGOUTBOX_ACTOR", "ops-bot")
	if got := admin.DefaultActor(); got != "ops-bot" {
		t.Fatalf("DefaultActor() = %q with PGOUTBOX_ACTOR set", got)
	}
	t.Setenv("PGOUTBOX_ACTOR", "")
	if got := admin.DefaultActor(); len(got) < 3 || got[0] == '@' || got[len(got)-1] == '@' {
		t.Fatalf("DefaultActor() = %q, want user@host", got)
	}
}

// startRelay runs a relay that polls only once a minute: within a test, it only
// claims because a NOTIFY woke it (a commit, a retry, a skip).
func startRelay(t *testing.T, e *dlqEnv, pub broker.Publisher) {
	t.Helper()
	r, err := relay.New(e.pool, pub, &relay.Config{Schema: e.schema, PollInterval: time.Minute,
		Logger: quietLog})
	pgtest.Must(t, err, "relay")
	pgtest.Must(t, r.Start(context.Background()), "start relay")
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := r.Stop(ctx); err != nil {
			t.Errorf("stop relay: %v", err)
		}
	})
}

func equal(a, b []int64) bool { return fmt.Sprint(a) == fmt.Sprint(b) }

// Acceptance: skipping a quarantined event moves its lane on at once (the relay is
// woken by the skip, not by polling), the skipped event never reaches the broker,
// and the audit table says who skipped it, when and why.
func TestSkipMovesTheLaneOnWithARelay(t *testing.T) {
	t.Parallel()
	e := newDLQEnv(t)
	ctx := context.Background()
	evs := e.enqueue("order", 3, "o1")
	bad := evs["o1"][1]
	rec := &brokertest.Recorder{}
	rec.Refuse(bad)
	startRelay(t, e, rec)

	wait.For(t, 20*time.Second, "sequence 2 to be quarantined", func() bool {
		return e.count("outbox_events", "quarantined_at IS NOT NULL") == 1
	})
	if got := rec.Sequences("o1"); !equal(got, []int64{1}) {
		t.Fatalf("broker got %v before the skip, want [1]", got)
	}
	before := time.Now()
	skipped, err := e.admin.Skip(ctx, admin.SkipRequest{IDs: []pgoutbox.UUID{bad}, Reason: "payload refers to a deleted tenant", Actor: "alice@laptop"})
	pgtest.Must(t, err, "skip")
	if len(skipped) != 1 || skipped[0].EventID != bad || skipped[0].Reason != "payload refers to a deleted tenant" ||
		skipped[0].SkippedBy != "alice@laptop" || skipped[0].DBUser == "" || skipped[0].AggregateSequence != 2 ||
		skipped[0].AttemptCount != 1 || skipped[0].LastError != "brokertest: refused o1" {
		t.Fatalf("skip returned %+v", skipped)
	}
	wait.For(t, 20*time.Second, "the lane's next event to be published", func() bool {
		return e.count("outbox_events", "published_at IS NULL") == 0
	})
	if got := rec.Sequences("o1"); !equal(got, []int64{1, 3}) {
		t.Fatalf("broker got %v, want [1 3]: the skipped event must never be sent", got)
	}

	var reason, by, dbUser, lastErr string
	var at time.Time
	pgtest.Must(t, e.pool.QueryRow(ctx, "SELECT reason, skipped_by, db_user, skipped_at, last_error FROM "+e.table("outbox_skipped_events")+
		" WHERE event_id = $1", bad).Scan(&reason, &by, &dbUser, &at, &lastErr), "audit row")
	if reason != "payload refers to a deleted tenant" || by != "alice@laptop" || dbUser != "postgres" ||
		at.Before(before.Add(-time.Minute)) || at.After(time.Now().Add(time.Minute)) || lastErr != "brokertest: refused o1" {
		t.Fatalf("audit row: reason %q, by %q, db user %q, at %s, last error %q", reason, by, dbUser, at, lastErr)
	}
	ev, err := e.admin.Get(ctx, bad)
	pgtest.Must(t, err, "get skipped")
	if ev.State != admin.StateSkipped || ev.Skip == nil || ev.Skip.Reason != reason || ev.PublishedAt == nil ||
		ev.QuarantinedAt != nil || ev.ClaimedBy != "" || ev.LastError != "brokertest: refused o1" {
		t.Fatalf("skipped event: %+v", ev)
	}
}

// Retrying by filter releases only the matching lane heads; each lane is then
// published in sequence order, and RetryAll releases the rest.
func TestRetryReleasesLanesInOrder(t *testing.T) {
	t.Parallel()
	e := newDLQEnv(t)
	ctx := context.Background()
	evs := e.enqueue("order", 4, "o1", "o2", "o3")
	rec := &brokertest.Recorder{}
	rec.Refuse(evs["o1"][0], evs["o2"][0])
	startRelay(t, e, rec)

	wait.For(t, 20*time.Second, "two lane heads quarantined and the third lane published", func() bool {
		return e.count("outbox_events", "quarantined_at IS NOT NULL") == 2 && e.count("outbox_events", "published_at IS NOT NULL") == 4
	})
	if _, err := e.admin.RetryWhere(ctx, admin.Filter{Limit: 5}); !errors.Is(err, admin.ErrNoFilter) {
		t.Fatalf("RetryWhere without criteria: %v, want ErrNoFilter", err)
	}

	rec.Cure(evs["o1"][0])
	rec.Cure(evs["o2"][0])
	got, err := e.admin.RetryWhere(ctx, admin.Filter{AggregateID: "o1", ErrorContains: "REFUSED"})
	pgtest.Must(t, err, "retry o1")
	if !sameIDs(got, evs["o1"][:1]) {
		t.Fatalf("retried %v, want o1's head", got)
	}
	wait.For(t, 20*time.Second, "o1's lane to be published", func() bool {
		return e.count("outbox_events", "aggregate_id = 'o1' AND published_at IS NULL") == 0
	})
	if s := rec.Sequences("o1"); !equal(s, []int64{1, 2, 3, 4}) {
		t.Fatalf("o1 reached the broker as %v", s)
	}
	if n := e.count("outbox_events", "aggregate_id = 'o2' AND published_at IS NOT NULL"); n != 0 {
		t.Fatalf("%d events of o2 published although its head is still quarantined", n)
	}

	got, err = e.admin.RetryAll(ctx)
	pgtest.Must(t, err, "retry all")
	if !sameIDs(got, evs["o2"][:1]) {
		t.Fatalf("RetryAll retried %v, want o2's head", got)
	}
	wait.For(t, 20*time.Second, "everything to be published", func() bool {
		return e.count("outbox_events", "published_at IS NULL") == 0
	})
	if s := rec.Sequences("o2"); !equal(s, []int64{1, 2, 3, 4}) {
		t.Fatalf("o2 reached the broker as %v", s)
	}
	if n := e.count("outbox_events", "attempt_count <> 1"); n != 0 {
		t.Fatalf("%d events with attempt_count <> 1: retry did not reset the attempts", n)
	}
}
