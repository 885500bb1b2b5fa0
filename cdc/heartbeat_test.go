package cdc_test

import (
	"context"
	"testing"
	"time"

	"github.com/pgoutbox/pgoutbox/admin"
	"github.com/pgoutbox/pgoutbox/broker/brokertest"
	"github.com/pgoutbox/pgoutbox/internal/pgtest"
	"github.com/pgoutbox/pgoutbox/internal/wait"
)

// A CDC source keeps a heartbeat as the polling relay does: status shows it
// running with source cdc (idle once it has published everything, busy while
// it holds events), renewed every interval, and stopped after Stop.
func TestCDCHeartbeat(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	a, err := admin.New(e.pool, &admin.Config{Schema: e.schema})
	pgtest.Must(t, err, "admin")
	ctx := context.Background()
	relay := func() *admin.RelayHeartbeat {
		t.Helper()
		st, err := a.Status(ctx)
		pgtest.Must(t, err, "status")
		for _, h := range st.Relays {
			if h.ID == e.cfg.Owner() {
				return &h
			}
		}
		return nil
	}
	if h := relay(); h != nil {
		t.Fatalf("a heartbeat before the source started: %+v", h)
	}
	cfg := e.cfg
	cfg.HeartbeatInterval = 200 * time.Millisecond
	src := e.start(t, &brokertest.Recorder{}, cfg)
	ids := e.enqueue(t, 5, 4, 10)
	wait.For(t, 60*time.Second, "the events published", func() bool { return e.count(t, "published_at IS NULL") == 0 })
	wait.For(t, 30*time.Second, "an idle heartbeat", func() bool { h := relay(); return h != nil && h.State == "idle" })
	first := relay()
	if !first.Running() || first.Source != "cdc" || first.Version == "" || first.Host == "" || first.PID == 0 ||
		time.Duration(first.Every) != 200*time.Millisecond || first.Gone {
		t.Fatalf("first heartbeat %+v", first)
	}
	wait.For(t, 30*time.Second, "a later heartbeat", func() bool { return relay().LastSeen.After(first.LastSeen) })
	pgtest.Must(t, src.Stop(ctx), "stop")
	if h := relay(); h.State != "stopped" || h.Running() || h.Gone || h.Source != "cdc" {
		t.Fatalf("after Stop: %+v", h)
	}
	t.Logf("%d events; last heartbeat %+v", len(ids), relay())
}
