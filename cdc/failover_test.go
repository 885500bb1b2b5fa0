package cdc_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"testing"
	"time"

	"github.com/pgoutbox/pgoutbox"
	"github.com/pgoutbox/pgoutbox/broker/brokertest"
	"github.com/pgoutbox/pgoutbox/cdc"
	"github.com/pgoutbox/pgoutbox/internal/pgtest"
	"github.com/pgoutbox/pgoutbox/internal/wait"
)

// PostgreSQL 15 does not carry logical slots to a standby. After the primary of
// a synchronous pair crashes and the standby is promoted, the source (on a
// multi-host URL) reaches the new primary, finds no slot there and says so
// (Healthy matches ErrSlotMissing); Recover recreates the slot and publishes
// from the table what the lost slot had not delivered, and a new source goes
// on from there: every committed event reaches the stream, in order per
// aggregate.
func TestFailoverLosesTheSlotAndRecoverBringsDeliveryBack(t *testing.T) {
	t.Parallel()
	settings := maps.Clone(pgtest.LogicalSettings)
	settings["synchronous_commit"] = "on"
	primary, err := pgtest.StartCluster(&pgtest.ClusterConfig{MaxConnections: 50, Settings: settings})
	pgtest.Must(t, err, "start primary")
	t.Cleanup(func() { _ = primary.Stop() })
	standby, err := primary.StartStandby(true)
	pgtest.Must(t, err, "start standby")
	t.Cleanup(func() { _ = standby.Stop() })
	url := fmt.Sprintf("postgres://postgres@127.0.0.1:%d,127.0.0.1:%d/test?sslmode=disable&target_session_attrs=read-write&connect_timeout=5",
		primary.Port, standby.Port)

	pool, schema := pgtest.MigratedOn(t, url, 16)
	prod, err := pgoutbox.NewProducer(&pgoutbox.Config{Schema: schema})
	pgtest.Must(t, err, "producer")
	e := &env{pool: pool, schema: schema, prod: prod, cfg: cdc.Config{Schema: schema, Slot: cdc.DefaultSlot(schema),
		Publication: cdc.DefaultSlot(schema), Logger: quietLogger(), PollInterval: 50 * time.Millisecond, StatusInterval: time.Second}}
	rec := &brokertest.Recorder{}
	src, err := cdc.New(pool, rec, &e.cfg)
	pgtest.Must(t, err, "new source")
	pgtest.Must(t, src.Start(context.Background()), "start")
	stopped := false
	t.Cleanup(func() {
		if !stopped {
			_ = src.Stop(context.Background())
		}
	})
	first := e.enqueue(t, 10, 3, 10)
	wait.For(t, 30*time.Second, "the first events published", func() bool { return e.count(t, "published_at IS NULL") == 0 })
	// Committed (and on the synchronous standby) an instant before the crash:
	// some may not have been decoded and published yet.
	second := e.enqueue(t, 20, 5, 20)

	pgtest.Must(t, primary.Crash(), "crash the primary")
	ctx := context.Background()
	pgtest.Must(t, standby.Promote(ctx), "promote the standby")
	promoted := time.Now()
	wait.For(t, 60*time.Second, "Healthy to say the slot is gone", func() bool {
		h := src.Healthy()
		return errors.Is(h, cdc.ErrStreamDown) && errors.Is(h, cdc.ErrSlotMissing)
	})
	detected := time.Since(promoted)
	// Producers go on writing to the new primary, where no slot sees them.
	pool.Reset() // the producers' pool: no connection of the old primary's left
	during := e.enqueue(t, 15, 4, 15)
	stopCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	pgtest.Must(t, src.Stop(stopCtx), "stop the source")
	stopped = true

	res, err := cdc.Recover(ctx, pool, rec, &e.cfg, cdc.RecoverOptions{})
	pgtest.Must(t, err, "recover on the new primary")
	if res.Quarantined+res.Failing != 0 || res.Published < int64(len(during)) {
		t.Fatalf("recover: %+v: want at least the %d events written after the failover published, none failed", res, len(during))
	}
	e.start(t, rec, e.cfg)
	third := e.enqueue(t, 20, 2, 20)
	wait.For(t, 60*time.Second, "every event published after the recovery", func() bool { return e.count(t, "published_at IS NULL") == 0 })
	dups := brokertest.CheckStream(t, rec.Messages(), slices.Concat(first, second, during, third))
	t.Logf("slot loss reported %s after the promote; recover %+v; %d duplicates", detected.Round(time.Millisecond), res, dups)
}
