package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/pgoutbox/pgoutbox"
	"github.com/pgoutbox/pgoutbox/admin"
	"github.com/pgoutbox/pgoutbox/broker"
	"github.com/pgoutbox/pgoutbox/broker/brokertest"
	"github.com/pgoutbox/pgoutbox/internal/pgtest"
	"github.com/pgoutbox/pgoutbox/internal/wait"
	"github.com/pgoutbox/pgoutbox/relay"
)

func TestDLQListAndShow(t *testing.T) {
	t.Parallel()
	e := newOpsEnv(t)
	evs := e.enqueue(2, "o1", "o2", "o3")
	e.quarantine(evs["o1"][0], "webhook: 400 Bad Request: negative amount")
	e.quarantine(evs["o2"][0], "nats: invalid subject")
	e.exec("INSERT INTO "+e.table("outbox_attempts")+` (event_id, attempt, at, relay_id, destination, error) VALUES
	($1, 1, now() - interval '2 minutes', 'relay-a', NULL, 'webhook: 500 Internal Server Error'),
	($1, 2, now() - interval '1 minute', 'relay-b', 'billing', 'webhook: 400 Bad Request: negative amount')`, evs["o1"][0])

	out, errOut, code := run(t, e.args("dlq", "list", "--json")...)
	var list []admin.Event
	if code != 0 || json.Unmarshal([]byte(out), &list) != nil || len(list) != 2 ||
		list[0].ID != evs["o1"][0] || list[1].ID != evs["o2"][0] || list[0].AttemptCount != 3 || list[0].State != "quarantined" {
		t.Fatalf("dlq list --json: code %d, stderr %q:\n%s", code, errOut, out)
	}
	for _, c := range []struct {
		flags []string
		want  []pgoutbox.UUID
	}{
		{[]string{"--aggregate-id", "o2"}, evs["o2"][:1]},
		{[]string{"--error-contains", "NEGATIVE"}, evs["o1"][:1]},
		{[]string{"--event-type", "order.changed", "--aggregate-type", "order", "--limit", "1"}, evs["o1"][:1]},
		{[]string{"--aggregate-type", "user"}, nil},
	} {
		out, _, code := run(t, append(e.args("dlq", "list", "--json"), c.flags...)...)
		var got []admin.Event
		if code != 0 || json.Unmarshal([]byte(out), &got) != nil || len(got) != len(c.want) || (len(got) > 0 && got[0].ID != c.want[0]) {
			t.Errorf("dlq list %v: code %d:\n%s", c.flags, code, out)
		}
	}
	out, _, code = run(t, e.args("dlq", "list")...)
	if code != 0 || !strings.Contains(out, evs["o1"][0].String()) || !strings.Contains(out, "order/o2") ||
		!strings.Contains(out, "nats: invalid subject") || !strings.HasSuffix(out, "\n2 quarantined events\n") {
		t.Fatalf("dlq list:\n%s", out)
	}
	out, _, _ = run(t, e.args("dlq", "list", "--aggregate-type", "user")...)
	if out != "no quarantined events\n" {
		t.Fatalf("empty dlq list: %q", out)
	}

	out, errOut, code = run(t, e.args("dlq", "show", evs["o1"][0].String(), "--json")...)
	var ev admin.Event
	if code != 0 || json.Unmarshal([]byte(out), &ev) != nil || ev.ID != evs["o1"][0] || ev.LastError != "webhook: 400 Bad Request: negative amount" ||
		ev.QuarantinedAt == nil || ev.Headers["test"] != "yes" || !jsonEqual(ev.Payload, `{"agg": "o1", "n": 1}`) ||
		len(ev.Attempts) != 2 || ev.Attempts[0].Attempt != 2 || ev.Attempts[0].Destination != "billing" || ev.Attempts[1].RelayID != "relay-a" {
		t.Fatalf("dlq show --json: code %d, stderr %q:\n%s", code, errOut, out)
	}
	out, _, code = run(t, e.args("dlq", "show", evs["o1"][0].String())...)
	for _, want := range []string{"state           quarantined", "last error      webhook: 400 Bad Request: negative amount",
		"aggregate       order/o1, sequence 1", "  test: yes", "payload:\n{\n  \"n\": 1,\n  \"agg\": \"o1\"\n}\n",
		"failed attempts, newest first:\n  #2  ", " ago)  relay-b to billing: webhook: 400 Bad Request: negative amount\n  #1  ",
		" ago)  relay-a: webhook: 500 Internal Server Error\n"} {
		if code != 0 || !strings.Contains(out, want) {
			t.Errorf("dlq show lacks %q:\n%s", want, out)
		}
	}

	for _, c := range []struct {
		args []string
		code int
		msg  string
	}{
		{e.args("dlq", "show", "not-a-uuid"), 2, "is not an event id"},
		{e.args("dlq", "show"), 2, "takes one event id"},
		{e.args("dlq", "show", pgoutbox.NewEventID().String()), 1, "event not found"},
		{e.args("dlq", "list", "--limit", "-1"), 2, "--limit"},
		{[]string{"dlq", "bogus", "x"}, 2, "unknown command"},
	} {
		_, errOut, code := run(t, c.args...)
		if code != c.code || !strings.Contains(errOut, c.msg) {
			t.Errorf("%v: code %d, stderr %q; want %d, %q", c.args[:3], code, errOut, c.code, c.msg)
		}
	}
}

func TestDLQRetryChoosesEvents(t *testing.T) {
	t.Parallel()
	e := newOpsEnv(t)
	evs := e.enqueue(1, "r1", "r2", "r3")
	e.quarantine(evs["r1"][0], "timeout talking to the schema registry")
	e.quarantine(evs["r2"][0], "nats: invalid subject")
	e.quarantine(evs["r3"][0], "nats: invalid subject")

	for _, c := range []struct {
		args []string
		msg  string
	}{
		{nil, "say which events"},
		{[]string{evs["r1"][0].String(), "--all"}, "not several"},
		{[]string{"--all", "--aggregate-id", "r1"}, "not several"},
		{[]string{"--all", "--limit", "1"}, "--limit goes with a filter"},
		{[]string{"nope"}, "is not an event id"},
	} {
		_, errOut, code := run(t, append(e.args("dlq", "retry"), c.args...)...)
		if code != 2 || !strings.Contains(errOut, c.msg) {
			t.Errorf("dlq retry %v: code %d, stderr %q; want 2, %q", c.args, code, errOut, c.msg)
		}
	}
	if n := e.count("outbox_events", "quarantined_at IS NOT NULL"); n != 3 {
		t.Fatalf("refused retries changed something: %d quarantined", n)
	}

	out, errOut, code := run(t, e.args("dlq", "retry", "--error-contains", "Schema Registry")...)
	if code != 0 || out != "retried 1 event\n" {
		t.Fatalf("retry by filter: code %d, stdout %q, stderr %q", code, out, errOut)
	}
	out, _, code = run(t, e.args("dlq", "retry", evs["r1"][0].String(), evs["r2"][0].String())...)
	if code != 0 || out != "retried 1 event; not quarantined, left alone: "+evs["r1"][0].String()+"\n" {
		t.Fatalf("retry by ids: code %d, stdout %q", code, out)
	}
	out, _, code = run(t, e.args("dlq", "retry", "--all")...)
	if code != 0 || out != "retried 1 event\n" {
		t.Fatalf("retry --all: code %d, stdout %q", code, out)
	}
	if n := e.count("outbox_events", "quarantined_at IS NOT NULL OR attempt_count <> 0 OR available_at > now() OR claimed_by IS NOT NULL"); n != 0 {
		t.Fatalf("%d events not reset by retry", n)
	}
}

// startDLQRelay runs an in-process relay that polls once a minute, so that within
// a test only a NOTIFY (a commit, a retry, a skip) makes it claim.
func (e *opsEnv) startDLQRelay(pub broker.Publisher) {
	e.t.Helper()
	r, err := relay.New(e.pool, pub, &relay.Config{Schema: e.schema, PollInterval: time.Minute,
		Logger: slog.New(slog.DiscardHandler)})
	pgtest.Must(e.t, err, "relay")
	pgtest.Must(e.t, r.Start(context.Background()), "start relay")
	e.t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := r.Stop(ctx); err != nil {
			e.t.Errorf("stop relay: %v", err)
		}
	})
}

// Acceptance: dlq skip without --reason fails and changes nothing; with one, the
// next event of that aggregate is published, and the skip is recorded.
func TestDLQSkipMovesTheLaneOn(t *testing.T) {
	t.Parallel()
	e := newOpsEnv(t)
	evs := e.enqueue(3, "k1")
	bad := evs["k1"][1]
	rec := &brokertest.Recorder{}
	rec.Refuse(bad)
	e.startDLQRelay(rec)
	wait.For(t, 20*time.Second, "sequence 2 to be quarantined", func() bool {
		return e.count("outbox_events", "quarantined_at IS NOT NULL") == 1
	})

	for _, args := range [][]string{{bad.String()}, {bad.String(), "--reason", "  "}} {
		_, errOut, code := run(t, append(e.args("dlq", "skip"), args...)...)
		if code != 2 || !strings.Contains(errOut, "--reason") {
			t.Fatalf("dlq skip %v: code %d, stderr %q; want a usage error about --reason", args, code, errOut)
		}
	}
	if _, errOut, code := run(t, e.args("dlq", "skip", "--reason", "x")...); code != 2 || !strings.Contains(errOut, "needs the ids") {
		t.Fatalf("dlq skip without ids: code %d, stderr %q", code, errOut)
	}
	// Not quarantined: refused, and all or nothing.
	if _, errOut, code := run(t, e.args("dlq", "skip", bad.String(), evs["k1"][2].String(), "--reason", "x")...); code != 1 ||
		!strings.Contains(errOut, "only quarantined events can be skipped: "+evs["k1"][2].String()+" is not quarantined") {
		t.Fatalf("dlq skip of a pending event: code %d, stderr %q", code, errOut)
	}
	if n := e.count("outbox_events", "quarantined_at IS NOT NULL AND published_at IS NULL"); n != 1 || e.count("outbox_skipped_events", "true") != 0 {
		t.Fatal("a refused skip changed something")
	}
	if got := fmt.Sprint(rec.Sequences("k1")); got != "[1]" {
		t.Fatalf("broker got %s before the skip, want [1]", got)
	}

	before := time.Now()
	out, errOut, code := run(t, e.args("dlq", "skip", bad.String(), "--reason", "customer deleted, TICKET-77", "--actor", "bob")...)
	if code != 0 || out != "skipped 1 event (order/k1 #2) as bob\n" {
		t.Fatalf("dlq skip: code %d, stdout %q, stderr %q", code, out, errOut)
	}
	wait.For(t, 20*time.Second, "the lane's next event to be published", func() bool {
		return e.count("outbox_events", "published_at IS NULL") == 0
	})
	if got := fmt.Sprint(rec.Sequences("k1")); got != "[1 3]" {
		t.Fatalf("broker got %s, want [1 3]", got)
	}
	var reason, by, dbUser string
	var at time.Time
	pgtest.Must(t, e.pool.QueryRow(context.Background(), "SELECT reason, skipped_by, db_user, skipped_at FROM "+e.table("outbox_skipped_events")+
		" WHERE event_id = $1", bad).Scan(&reason, &by, &dbUser, &at), "audit row")
	if reason != "customer deleted, TICKET-77" || by != "bob" || dbUser == "" || at.Before(before.Add(-time.Minute)) || at.After(time.Now().Add(time.Minute)) {
		t.Fatalf("audit row: %q %q %q %s", reason, by, dbUser, at)
	}

	out, _, code = run(t, e.args("dlq", "show", bad.String(), "--json")...)
	var ev admin.Event
	if code != 0 || json.Unmarshal([]byte(out), &ev) != nil || ev.State != "skipped" || ev.Skip == nil || ev.Skip.Reason != reason || ev.Skip.SkippedBy != "bob" {
		t.Fatalf("dlq show of the skipped event: code %d:\n%s", code, out)
	}
	out, _, _ = run(t, e.args("dlq", "show", bad.String())...)
	if !strings.Contains(out, "skip reason     customer deleted, TICKET-77") {
		t.Fatalf("dlq show of the skipped event:\n%s", out)
	}
	out, _, _ = run(t, e.args("status", "--json")...)
	var st admin.Status
	if json.Unmarshal([]byte(out), &st) != nil || st.Skipped != 1 || st.Quarantined != 0 || st.PublishedLastMinute != 2 {
		t.Fatalf("status after the skip:\n%s", out)
	}
}

// The actor defaults to $PGOUTBOX_ACTOR.
func TestDLQSkipActorFromEnv(t *testing.T) {
	e := newOpsEnv(t)
	evs := e.enqueue(1, "env1")
	e.quarantine(evs["env1"][0], "boom")
	t.Setenv("PGOUTBOX_ACTOR", "ops-robot")
	out, errOut, code := run(t, e.args("dlq", "skip", evs["env1"][0].String(), "--reason", "test")...)
	if code != 0 || out != "skipped 1 event (order/env1 #1) as ops-robot\n" {
		t.Fatalf("code %d, stdout %q, stderr %q", code, out, errOut)
	}
}

// A retried lane head is published again, and the rest of its lane after it, in order.
func TestDLQRetryReleasesTheLaneInOrder(t *testing.T) {
	t.Parallel()
	e := newOpsEnv(t)
	evs := e.enqueue(4, "q1", "q2")
	rec := &brokertest.Recorder{}
	rec.Refuse(evs["q1"][0])
	e.startDLQRelay(rec)
	wait.For(t, 20*time.Second, "q1's head to be quarantined and q2 published", func() bool {
		return e.count("outbox_events", "quarantined_at IS NOT NULL") == 1 && e.count("outbox_events", "aggregate_id = 'q2' AND published_at IS NULL") == 0
	})
	if got := fmt.Sprint(rec.Sequences("q1")); got != "[]" {
		t.Fatalf("q1 reached the broker as %s while its head was quarantined", got)
	}
	rec.Cure(evs["q1"][0])
	out, errOut, code := run(t, e.args("dlq", "retry", "--aggregate-id", "q1")...)
	if code != 0 || out != "retried 1 event\n" {
		t.Fatalf("dlq retry: code %d, stdout %q, stderr %q", code, out, errOut)
	}
	wait.For(t, 20*time.Second, "q1's lane to be published", func() bool {
		return e.count("outbox_events", "published_at IS NULL") == 0
	})
	if got := fmt.Sprint(rec.Sequences("q1")); got != "[1 2 3 4]" {
		t.Fatalf("q1 reached the broker as %s", got)
	}
}

func jsonEqual(a []byte, b string) bool {
	var x, y any
	return json.Unmarshal(a, &x) == nil && json.Unmarshal([]byte(b), &y) == nil && fmt.Sprint(x) == fmt.Sprint(y)
}
