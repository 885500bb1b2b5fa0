package relay_test

import (
	"strings"
	"testing"
	"time"

	"github.com/pgoutbox/pgoutbox/broker/brokertest"
	"github.com/pgoutbox/pgoutbox/internal/logtest"
	"github.com/pgoutbox/pgoutbox/internal/pgtest"
	"github.com/pgoutbox/pgoutbox/internal/wait"
	"github.com/pgoutbox/pgoutbox/relay"
)

// bouncerWithin bounds the waits of the tests through PgBouncer: the listener's
// probe gives up after 10s.
const bouncerWithin = 60 * time.Second

// Through PgBouncer's transaction pooling, LISTEN runs on a server session that
// goes back to the pool at once: the relay would be deaf without knowing it,
// and its idle lock would stay with a pooled session. The listener's probe
// finds out and says so (naming the pooler and --no-notify), the guard then
// takes no idle lock, and the relay publishes by polling. With DisableNotify
// the relay uses no session state and publishes through the pooler as well.
func TestRelayThroughPgBouncerTransactionPooling(t *testing.T) {
	t.Parallel()
	bouncer := pgtest.StartBouncer(t, pgtest.BouncerTransaction) + "&default_query_exec_mode=exec"
	for _, notify := range []bool{true, false} {
		name := map[bool]string{true: "notify", false: "no-notify"}[notify]
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			o := newOutbox(t, 4)
			via := pgtest.Pool(t, bouncer, 6)
			var logs logtest.Buffer
			rec := &brokertest.Recorder{}
			startRelayVia(t, via, o, rec, relay.Config{PollInterval: 200 * time.Millisecond, DisableNotify: !notify,
				Logger: logs.Logger()})
			if notify {
				wait.Forf(t, bouncerWithin, func() string { return "the listener's warning; the log:\n" + logs.String() }, func() bool {
					return strings.Contains(logs.String(), "did not hear the relay's own notification") &&
						strings.Contains(logs.String(), "--no-notify")
				})
				// The relay has been idle since it started, for the probe's 10s.
				if n := idleLock(t, o, true) + idleLock(t, o, false); n != 0 {
					t.Fatalf("%d sessions hold or wait for the idle lock through transaction pooling", n)
				}
			}
			o.enqueue(t, 3, 4)
			wait.Forf(t, bouncerWithin, func() string { return "the events published by polling; the log:\n" + logs.String() },
				func() bool { return len(rec.Messages()) == 12 })
			// Idle again: no session holds (or waits for) the idle lock.
			if n := idleLock(t, o, true) + idleLock(t, o, false); n != 0 {
				t.Fatalf("%d sessions hold or wait for the idle lock through transaction pooling; the log:\n%s", n, logs.String())
			}
			if strings.Contains(logs.String(), "level=ERROR") {
				t.Fatalf("errors in the log:\n%s", logs.String())
			}
		})
	}
}

// Through PgBouncer's session pooling a client keeps its server session: the
// listener hears its probe, the idle relay holds the idle lock and a commit's
// notification wakes it. The relay's pool, listener and guard fit in
// PgBouncer's server connections (pgtest.BouncerPoolSize): a session-pooled
// client beyond them would wait for one.
func TestRelayThroughPgBouncerSessionPooling(t *testing.T) {
	t.Parallel()
	o := newOutbox(t, 4)
	via := pgtest.Pool(t, pgtest.StartBouncer(t, pgtest.BouncerSession), 2)
	var logs logtest.Buffer
	rec := &brokertest.Recorder{}
	startRelayVia(t, via, o, rec, relay.Config{Workers: 1, PollInterval: time.Hour,
		Logger: logs.Logger()})
	wait.Forf(t, bouncerWithin, func() string { return "the idle relay to hold the idle lock; the log:\n" + logs.String() },
		func() bool { return idleLock(t, o, true) == 1 })
	// Polling is hourly: only a notification publishes these.
	o.enqueue(t, 2, 3)
	wait.Forf(t, bouncerWithin, func() string { return "the notified events; the log:\n" + logs.String() },
		func() bool { return len(rec.Messages()) == 6 })
	if strings.Contains(logs.String(), "did not hear") {
		t.Fatalf("the listener's probe failed through session pooling:\n%s", logs.String())
	}
}
