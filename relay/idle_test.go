package relay_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/pgoutbox"
	"github.com/pgoutbox/pgoutbox/broker/brokertest"
	"github.com/pgoutbox/pgoutbox/internal/pgtest"
	"github.com/pgoutbox/pgoutbox/internal/wait"
	"github.com/pgoutbox/pgoutbox/migrate"
	"github.com/pgoutbox/pgoutbox/relay"
)

// idleLock reports how many sessions hold (granted) or wait for (!granted) the
// schema's idle lock in exclusive mode.
func idleLock(t testing.TB, o *outbox, granted bool) int {
	t.Helper()
	var n int
	pgtest.Must(t, o.pool.QueryRow(context.Background(), `
		SELECT count(*) FROM pg_locks
		WHERE locktype = 'advisory' AND classid::int = hashtext($3) AND objid::int = hashtext($1)
		  AND objsubid = 2 AND mode = 'ExclusiveLock' AND granted = $2`, o.schema, granted, migrate.IdleLockClass).Scan(&n), "pg_locks")
	return n
}

// notifiedBy commits fn's transaction and reports whether it sent a notification
// on the schema's channel. A sentinel notification sent after the commit arrives
// after any notification of that commit, so no timing is involved.
func notifiedBy(t *testing.T, o *outbox, fn func(tx pgx.Tx) error) bool {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, o.pool.Config().ConnConfig.ConnString())
	pgtest.Must(t, err, "listener")
	defer conn.Close(ctx)
	channel := migrate.NotifyChannel(o.schema)
	_, err = conn.Exec(ctx, "LISTEN "+pgx.Identifier{channel}.Sanitize())
	pgtest.Must(t, err, "listen")
	pgtest.Must(t, pgx.BeginFunc(ctx, o.pool, fn), "producer transaction")
	_, err = o.pool.Exec(ctx, "SELECT pg_notify($1, 'sentinel')", channel)
	pgtest.Must(t, err, "sentinel")
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	n, err := conn.WaitForNotification(wctx)
	pgtest.Must(t, err, "wait for notification")
	return n.Payload != "sentinel"
}

func enqueueIn(o *outbox, agg string) func(tx pgx.Tx) error {
	return func(tx pgx.Tx) error {
		_, err := o.prod.EnqueueTx(context.Background(), tx,
			pgoutbox.Event{AggregateType: "a", AggregateID: agg, EventType: "e"},
			pgoutbox.Event{AggregateType: "a", AggregateID: agg, EventType: "e"})
		return err
	}
}

// Producers notify only while a relay waits for work, and once per transaction.
func TestProducersNotifyOnlyWhenARelayIsIdle(t *testing.T) {
	t.Parallel()
	o := newOutbox(t, 8)
	if notifiedBy(t, o, enqueueIn(o, "1")) {
		t.Fatal("a commit notified with no relay waiting")
	}

	rec := &brokertest.Recorder{}
	startRelay(t, o, rec, relay.Config{PollInterval: time.Hour})
	wait.For(t, 10*time.Second, "the idle relay to hold the idle lock", func() bool { return idleLock(t, o, true) == 1 })
	// The relay claimed once more after taking the lock: the first events are out.
	wait.For(t, 10*time.Second, "the first events", func() bool { return len(rec.Messages()) == 2 })

	start := time.Now()
	if !notifiedBy(t, o, enqueueIn(o, "2")) {
		t.Fatal("a commit did not notify while the relay was idle")
	}
	wait.For(t, 10*time.Second, "the notified events", func() bool { return len(rec.Messages()) == 4 })
	wait.For(t, 10*time.Second, "the relay to be idle again", func() bool { return idleLock(t, o, true) == 1 })
	sqlEnqueue := func(tx pgx.Tx) error {
		_, err := tx.Exec(context.Background(), "SELECT "+pgx.Identifier{o.schema, "outbox_enqueue"}.Sanitize()+"('a', '3', 'e', '{}')")
		return err
	}
	if !notifiedBy(t, o, sqlEnqueue) {
		t.Fatal("outbox_enqueue did not notify while the relay was idle")
	}
	wait.For(t, 10*time.Second, "the event from outbox_enqueue", func() bool { return len(rec.Messages()) == 5 })
	t.Logf("published %s after the commit, with an hour's poll interval", time.Since(start))
	// Busy, then idle again: it holds the lock again.
	wait.For(t, 10*time.Second, "the relay to be idle again", func() bool { return idleLock(t, o, true) == 1 })
}

// The race the lock closes: a producer commits without notifying (no relay was
// idle when it checked) while the relay goes idle. The relay's lock request waits
// for that commit, then the relay claims again and finds the event; with an
// hour's poll interval, nothing else would.
func TestRelayGoingIdleWaitsForCommitsThatDidNotNotify(t *testing.T) {
	t.Parallel()
	o := newOutbox(t, 8)
	ctx := context.Background()

	// The producer checks the lock as it enqueues, and holds it in shared mode from
	// then until its commit.
	tx, err := o.pool.Begin(ctx)
	pgtest.Must(t, err, "begin")
	defer tx.Rollback(ctx)
	pgtest.Must(t, enqueueIn(o, "1")(tx), "enqueue")

	rec := &brokertest.Recorder{}
	startRelay(t, o, rec, relay.Config{PollInterval: time.Hour})
	wait.For(t, 10*time.Second, "the relay to wait for the idle lock", func() bool { return idleLock(t, o, false) == 1 })
	pgtest.Must(t, tx.Commit(ctx), "commit")
	wait.For(t, 10*time.Second, "the relay to hold the idle lock", func() bool { return idleLock(t, o, true) == 1 })
	wait.For(t, 10*time.Second, "the events committed during the race", func() bool { return len(rec.Messages()) == 2 })
}

// A relay with notifications disabled never takes the lock, so producers stop
// paying for NOTIFY.
func TestRelayWithoutNotifyTakesNoLock(t *testing.T) {
	t.Parallel()
	o := newOutbox(t, 8)
	rec := &brokertest.Recorder{}
	startRelay(t, o, rec, relay.Config{PollInterval: 50 * time.Millisecond, DisableNotify: true})
	o.enqueue(t, 1, 1)
	wait.For(t, 10*time.Second, "the polled event", func() bool { return len(rec.Messages()) == 1 })
	if n := idleLock(t, o, true) + idleLock(t, o, false); n != 0 {
		t.Fatalf("%d idle locks held or awaited by a relay that does not listen", n)
	}
	if notifiedBy(t, o, enqueueIn(o, "2")) {
		t.Fatal("a commit notified with no relay listening")
	}
}
