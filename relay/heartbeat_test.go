package relay_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/pgoutbox/admin"
	"github.com/pgoutbox/pgoutbox/broker/brokertest"
	"github.com/pgoutbox/pgoutbox/internal/pgtest"
	"github.com/pgoutbox/pgoutbox/internal/wait"
	"github.com/pgoutbox/pgoutbox/relay"
)

// A relay's heartbeat: written at start (idle, this binary's version and
// host), renewed every interval, "stopped" at a clean stop; a relay that
// stops writing (a crash) turns gone after three intervals.
func TestRelayHeartbeat(t *testing.T) {
	t.Parallel()
	o := newOutbox(t, 8)
	a, err := admin.New(o.pool, &admin.Config{Schema: o.schema})
	pgtest.Must(t, err, "admin")
	ctx := context.Background()
	beat := func(id string) *admin.RelayHeartbeat {
		t.Helper()
		hs, err := a.Relays(ctx)
		pgtest.Must(t, err, "relays")
		for _, h := range hs {
			if h.ID == id {
				return &h
			}
		}
		return nil
	}
	r, err := relay.New(o.pool, &brokertest.Recorder{}, &relay.Config{Schema: o.schema, ID: "beating",
		HeartbeatInterval: 200 * time.Millisecond, Logger: quietLogger()})
	pgtest.Must(t, err, "relay")
	pgtest.Must(t, r.Start(ctx), "start")
	wait.For(t, 30*time.Second, "the first heartbeat", func() bool { h := beat("beating"); return h != nil && h.State == "idle" })
	first := beat("beating")
	if !first.Running() || first.Source != "poll" || first.Version == "" || first.Host == "" || first.PID == 0 || time.Duration(first.Every) != 200*time.Millisecond {
		t.Fatalf("first heartbeat %+v", first)
	}
	wait.For(t, 30*time.Second, "a later heartbeat", func() bool { return beat("beating").LastSeen.After(first.LastSeen) })
	pgtest.Must(t, r.Stop(ctx), "stop")
	if h := beat("beating"); h.State != "stopped" || h.Running() || h.Gone {
		t.Fatalf("after Stop: %+v", h)
	}

	// A relay that died: its row says busy and ages past three intervals.
	_, err = o.pool.Exec(ctx, "UPDATE "+pgx.Identifier{o.schema, "outbox_relays"}.Sanitize()+" SET state = 'busy', last_seen = now() - interval '1 second'")
	pgtest.Must(t, err, "age the row")
	if h := beat("beating"); !h.Gone || h.Running() || time.Duration(h.Age) < time.Second {
		t.Fatalf("a silent relay: %+v", h)
	}
}
