package faulttest

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/pgoutbox"
	"github.com/pgoutbox/pgoutbox/checker"
	"github.com/pgoutbox/pgoutbox/internal/pgtest"
	"github.com/pgoutbox/pgoutbox/internal/wait"
)

// haPair is a primary with a streaming standby, both of the test's own, and the
// multi-host URL an application on them is given.
type haPair struct {
	primary, standby *pgtest.Cluster
	url              string
}

// newHAPair starts the pair: a primary with synchronous_commit on, as in
// production, and a standby the primary waits for on every commit when
// synchronous.
func newHAPair(t *testing.T, synchronous bool) *haPair {
	t.Helper()
	primary, err := pgtest.StartCluster(&pgtest.ClusterConfig{Settings: map[string]string{"synchronous_commit": "on"}})
	pgtest.Must(t, err, "start primary")
	t.Cleanup(func() { _ = primary.Stop() })
	standby, err := primary.StartStandby(synchronous)
	pgtest.Must(t, err, "start standby")
	t.Cleanup(func() { _ = standby.Stop() })
	// connect_timeout bounds the test's own pool and the producer's and
	// consumer's connections; the relays replace it with their
	// --connect-timeout, left at its default.
	url := fmt.Sprintf("postgres://postgres@127.0.0.1:%d,127.0.0.1:%d/test?sslmode=disable&target_session_attrs=read-write&connect_timeout=5",
		primary.Port, standby.Port)
	return &haPair{primary: primary, standby: standby, url: url}
}

// The primary of a synchronous pair fails while producers (with rollbacks) and
// two relays run on the multi-host URL, and the standby is promoted: every
// process reaches the new primary on its own, nothing committed is lost,
// nothing rolled back is published, and first appearances keep their order.
func TestPrimaryFailover(t *testing.T) {
	for _, c := range []struct {
		name  string
		fault func(*pgtest.Cluster) error
	}{
		// The primary's host dies: connections are reset.
		{"crash", (*pgtest.Cluster).Crash},
		// The primary's host hangs (a frozen VM, a network black hole):
		// connections stay open and nothing answers.
		{"hang", (*pgtest.Cluster).Freeze},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			primaryFailover(t, c.fault, c.name == "hang")
		})
	}
}

func primaryFailover(t *testing.T, fault func(*pgtest.Cluster) error, hung bool) {
	ha := newHAPair(t, true)
	e := newEnv(t, envConfig{dbServer: ha.url})
	f := newFleet(e, 2, 1)
	var extra *proc
	if hung {
		extra = e.relay("r-stopped", nil)
		extra.waitLine(t, "relay starting")
	}
	for _, r := range f.relays {
		r.waitLine(t, "relay starting")
	}
	prod := e.producer("p1", nil, producerOpts{txs: 600, aggregates: 15, rollbackPercent: 15, pause: 10 * time.Millisecond})
	wait.For(t, 60*time.Second, "events published before the failover", func() bool {
		return e.count("outbox_events", "published_at IS NOT NULL") >= 100
	})

	ctx := context.Background()
	pgtest.Must(t, fault(ha.primary), "fault the primary")
	faulted := time.Now()
	// An HA manager promotes the standby once it has found the primary gone,
	// seconds later; so does the test, once the relays have found it too.
	for _, r := range f.relays {
		r.waitLine(t, "database unreachable")
	}
	if hung {
		// SIGTERM is honoured while the primary hangs.
		stopping := time.Now()
		extra.term(t)
		t.Logf("a relay stopped %s after SIGTERM while the primary hung", time.Since(stopping).Round(time.Millisecond))
	}
	pgtest.Must(t, ha.standby.Promote(ctx), "promote the standby")
	promoted := time.Now()

	// Publishing again: an event committed on the new primary just after the
	// promote reaches the stream.
	marker := e.commitOn(ha.standby.URL, "marker")
	wait.For(t, 60*time.Second, "a relay to publish on the new primary", func() bool {
		return e.published(marker)
	})
	resumed := time.Now()
	prod.wait(t, 3*time.Minute)
	if prod.err != nil {
		t.Fatalf("producer: %v", prod.err)
	}
	e.waitDrained(2 * time.Minute)
	for _, r := range f.relays {
		if r.exited() {
			t.Fatalf("%s exited in the failover: %s\n%s", r.name, r.status(), tail(r.out.String(), 20))
		}
	}
	if testing.Verbose() {
		for _, r := range f.relays {
			t.Logf("%s said:\n%s", r.name, tail(r.out.String(), 30))
		}
	}
	stopping := time.Now()
	e.stopAll()
	stopped := time.Since(stopping)
	mustHold(t, e.verdict())
	t.Logf("relays found the primary gone %s after the fault; publishing again %s after the promote; every process stopped within %s of SIGTERM",
		promoted.Sub(faulted).Round(time.Millisecond), resumed.Sub(promoted).Round(time.Millisecond), stopped.Round(time.Millisecond))
}

// commitOn commits one event with its business row, journaled, through a
// connection of its own to url; it returns the event's id.
func (e *env) commitOn(url, name string) pgoutbox.UUID {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	journal := filepath.Join(e.dir, name+".journal")
	j, err := checker.OpenJournal(journal)
	pgtest.Must(e.t, err, "open journal")
	defer j.Close()
	e.mu.Lock()
	e.journals = append(e.journals, journal)
	e.mu.Unlock()
	conn, err := pgx.Connect(ctx, url)
	pgtest.Must(e.t, err, "connect to %s", url)
	defer conn.Close(context.Background())
	prod, err := pgoutbox.NewProducer(&pgoutbox.Config{Schema: e.schema})
	pgtest.Must(e.t, err, "producer")
	id := pgoutbox.NewEventID()
	key := name + "-0"
	pgtest.Must(e.t, j.Begin(name, []checker.Intent{{EventID: id, BusinessKey: key}}), "journal")
	tx, err := conn.Begin(ctx)
	pgtest.Must(e.t, err, "begin")
	_, err = tx.Exec(ctx, "INSERT INTO "+e.table("business")+" (key, event_id, aggregate_id) VALUES ($1, $2, $3)", key, id, name)
	pgtest.Must(e.t, err, "business row")
	_, err = prod.EnqueueTx(ctx, tx, pgoutbox.Event{ID: id, AggregateType: "acct", AggregateID: name, EventType: "changed",
		Payload: map[string]any{"tx": name}})
	pgtest.Must(e.t, err, "enqueue")
	pgtest.Must(e.t, tx.Commit(ctx), "commit")
	pgtest.Must(e.t, j.End(name, checker.Committed), "journal")
	return id
}

// published reports whether the event with id is on the env's stream.
func (e *env) published(id pgoutbox.UUID) bool {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	msgs, err := checker.ReadJetStream(ctx, e.js, e.stream)
	if err != nil {
		return false
	}
	for _, m := range msgs {
		if m.EventID == id {
			return true
		}
	}
	return false
}
