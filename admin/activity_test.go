package admin_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/pgoutbox/pgoutbox"
	"github.com/pgoutbox/pgoutbox/admin"
	"github.com/pgoutbox/pgoutbox/internal/pgtest"
)

func TestActivityFigures(t *testing.T) {
	t.Parallel()
	e := newDLQEnv(t)
	ctx := context.Background()
	orders := e.enqueue("order", 3, "o1", "o2")
	users := e.enqueue("user", 2, "u1")
	e.enqueue("old", 1, "x1")
	skipped := e.enqueue("gone", 1, "g1")["g1"][0]
	for _, q := range []string{
		// Published by relay-a 10 minutes ago, by relay-b now; "old" before the window.
		"UPDATE %s SET published_at = now() - interval '10 minutes', claimed_by = 'relay-a' WHERE aggregate_id = 'o2'",
		"UPDATE %s SET published_at = now(), claimed_by = 'relay-b' WHERE aggregate_id = 'u1'",
		"UPDATE %s SET published_at = now() - interval '3 hours', claimed_by = 'relay-old' WHERE aggregate_type = 'old'",
		"UPDATE %s SET occurred_at = now() - interval '90 seconds' WHERE aggregate_id = 'o1' AND aggregate_sequence = 2",
	} {
		_, err := e.pool.Exec(ctx, sprintf(q, e.table("outbox_events")))
		pgtest.Must(t, err, "seed")
	}
	e.quarantine(orders["o1"][0], "boom")
	// A skip sets published_at too, but is not a publish.
	e.quarantine(skipped, "poison")
	_, err := e.admin.Skip(ctx, admin.SkipRequest{IDs: []pgoutbox.UUID{skipped}, Reason: "test", Actor: "t"})
	pgtest.Must(t, err, "skip")
	_ = users

	act, err := e.admin.Activity(ctx, time.Hour)
	pgtest.Must(t, err, "activity")
	if n := len(act.Minutes); n != 61 && n != 62 {
		t.Errorf("%d minutes, want 61 or 62", n)
	}
	var published, quarantined int64
	for _, m := range act.Minutes {
		published += m.Published
		quarantined += m.Quarantined
	}
	if published != 5 || quarantined != 1 {
		t.Errorf("window: %d published, %d quarantined; want 5 and 1", published, quarantined)
	}
	if last := act.Minutes[len(act.Minutes)-1]; last.Published != 2 || last.Quarantined != 1 {
		t.Errorf("this minute: %+v", last)
	}
	want := map[string]admin.TypeActivity{
		"order": {AggregateType: "order", Pending: 2, Quarantined: 1, Published: 3},
		"user":  {AggregateType: "user", Published: 2},
	}
	if len(act.ByAggregateType) != len(want) {
		t.Fatalf("by type: %+v", act.ByAggregateType)
	}
	for _, ta := range act.ByAggregateType {
		w := want[ta.AggregateType]
		age := ta.OldestPendingAge
		ta.OldestPendingAge = 0
		if ta != w {
			t.Errorf("type %s: %+v, want %+v", ta.AggregateType, ta, w)
		}
		if ta.AggregateType == "order" && (time.Duration(age) < 90*time.Second || time.Duration(age) > 10*time.Minute) {
			t.Errorf("order's oldest pending age %s", age)
		}
	}
	if len(act.Relays) != 2 || act.Relays[0].RelayID != "relay-a" || act.Relays[0].Published != 3 || act.Relays[1].RelayID != "relay-b" ||
		act.Relays[1].Published != 2 {
		t.Errorf("relays: %+v", act.Relays)
	}
	for _, w := range []time.Duration{0, 59 * time.Second, 25 * time.Hour} {
		if _, err := e.admin.Activity(ctx, w); err == nil {
			t.Errorf("window %s accepted", w)
		}
	}
}

func TestBlockedLanesAndLane(t *testing.T) {
	t.Parallel()
	e := newDLQEnv(t)
	ctx := context.Background()
	evs := e.enqueue("order", 4, "few", "many")
	more := e.enqueue("order", 3, "many")
	e.enqueue("order", 2, "free")
	e.quarantine(evs["few"][2], "boom") // 1 waiting behind it
	e.quarantine(evs["many"][0], "boom")
	_ = more

	lanes, err := e.admin.BlockedLanes(ctx, 10)
	pgtest.Must(t, err, "blocked lanes")
	if len(lanes) != 2 || lanes[0].Head.ID != evs["many"][0] || lanes[0].Waiting != 6 || lanes[1].Head.ID != evs["few"][2] ||
		lanes[1].Waiting != 1 || lanes[0].OldestWaiting == nil {
		t.Fatalf("lanes: %+v", lanes)
	}
	if one, _ := e.admin.BlockedLanes(ctx, 1); len(one) != 1 || one[0].Head.ID != evs["many"][0] {
		t.Errorf("limit 1: %+v", one)
	}
	for _, l := range []int{0, -1, 10001} {
		if _, err := e.admin.BlockedLanes(ctx, l); err == nil {
			t.Errorf("limit %d accepted", l)
		}
		if _, err := e.admin.Lane(ctx, "order", "few", l); err == nil {
			t.Errorf("lane limit %d accepted", l)
		}
	}
	lane, err := e.admin.Lane(ctx, "order", "few", 100)
	pgtest.Must(t, err, "lane")
	if len(lane) != 4 || lane[2].State != admin.StateQuarantined || lane[3].AggregateSequence != 4 {
		t.Fatalf("lane: %+v", lane)
	}
	// Hostile names are values, not SQL.
	if l, err := e.admin.Lane(ctx, "order' OR 1=1 --", "few", 10); err != nil || len(l) != 0 {
		t.Errorf("hostile lane: %v %v", l, err)
	}
}

func sprintf(q, table string) string { return strings.Replace(q, "%s", table, 1) }

// A week is read in hourly buckets counted by the database: an event
// published two days ago is in the week's series and its type's figures, not
// in the hour's; a skip is not a publish; the bounds on the window and the
// bucket hold; the audit's window by the database's clock.
func TestActivityOverAWeekAndAuditWithin(t *testing.T) {
	t.Parallel()
	e := newDLQEnv(t)
	ctx := context.Background()
	e.enqueue("recent", 1, "r1")
	e.enqueue("twodays", 1, "d1")
	e.enqueue("tendays", 1, "t1")
	for _, q := range []string{
		"UPDATE %s SET published_at = now(), claimed_by = 'relay-a' WHERE aggregate_type = 'recent'",
		"UPDATE %s SET published_at = now() - interval '2 days', claimed_by = 'relay-old' WHERE aggregate_type = 'twodays'",
		"UPDATE %s SET published_at = now() - interval '10 days' WHERE aggregate_type = 'tendays'",
	} {
		_, err := e.pool.Exec(ctx, sprintf(q, e.table("outbox_events")))
		pgtest.Must(t, err, "seed")
	}
	week, err := e.admin.ActivityOver(ctx, 7*24*time.Hour, time.Hour)
	pgtest.Must(t, err, "a week")
	if n := len(week.Minutes); n != 169 && n != 170 || time.Duration(week.Bucket) != time.Hour {
		t.Errorf("%d buckets of %s, want 169 or 170 of 1h", n, week.Bucket)
	}
	var total int64
	for i, m := range week.Minutes {
		total += m.Published
		if !m.At.Equal(week.Since.Add(time.Duration(i)*time.Hour)) || m.At.Truncate(time.Hour) != m.At {
			t.Fatalf("bucket %d starts %s", i, m.At)
		}
	}
	types := map[string]int64{}
	for _, ta := range week.ByAggregateType {
		types[ta.AggregateType] = ta.Published
	}
	if total != 2 || types["recent"] != 1 || types["twodays"] != 1 || types["tendays"] != 0 || len(week.Relays) != 2 {
		t.Errorf("week: %d published, types %v, relays %+v", total, types, week.Relays)
	}
	if two := week.Minutes[len(week.Minutes)-49]; two.Published+week.Minutes[len(week.Minutes)-48].Published+week.Minutes[len(week.Minutes)-50].Published != 1 {
		t.Errorf("the event of two days ago is not in its hour: %+v", week.Minutes[len(week.Minutes)-51:len(week.Minutes)-46])
	}
	hour, err := e.admin.ActivityOver(ctx, time.Hour, time.Minute)
	pgtest.Must(t, err, "an hour")
	for _, ta := range hour.ByAggregateType {
		if ta.AggregateType == "twodays" {
			t.Errorf("the hour has the event of two days ago: %+v", ta)
		}
	}
	for _, c := range []struct{ window, bucket time.Duration }{
		{7 * 24 * time.Hour, time.Minute}, // 10080 buckets
		{8 * 24 * time.Hour, time.Hour},   // past the week
		{time.Hour, 30 * time.Second},     // under a minute
		{time.Hour, time.Minute + time.Millisecond},
		{time.Hour, 0},
	} {
		if _, err := e.admin.ActivityOver(ctx, c.window, c.bucket); err == nil {
			t.Errorf("window %s in buckets of %s accepted", c.window, c.bucket)
		}
	}

	// The audit within a window, by the database's clock.
	ids := e.enqueue("audited", 2, "a1")["a1"]
	for _, id := range ids {
		e.quarantine(id, "boom")
		_, err := e.admin.RetryEvents(ctx, admin.RetryRequest{IDs: []pgoutbox.UUID{id}, Reason: "r", Actor: "t"})
		pgtest.Must(t, err, "retry")
	}
	_, err = e.pool.Exec(ctx, "UPDATE "+e.table("outbox_operator_audit")+" SET at = now() - interval '2 days' WHERE audit_id = (SELECT min(audit_id) FROM "+e.table("outbox_operator_audit")+")")
	pgtest.Must(t, err, "age an audit row")
	for _, c := range []struct {
		window time.Duration
		want   int
	}{{0, 2}, {time.Hour, 1}, {24 * time.Hour, 1}, {7 * 24 * time.Hour, 2}} {
		got, err := e.admin.AuditWithin(ctx, c.window, 10)
		pgtest.Must(t, err, "audit within")
		if len(got) != c.want {
			t.Errorf("audit within %s: %d rows, want %d", c.window, len(got), c.want)
		}
	}
	if _, err := e.admin.AuditWithin(ctx, -time.Hour, 10); err == nil {
		t.Error("a negative window accepted")
	}
}
