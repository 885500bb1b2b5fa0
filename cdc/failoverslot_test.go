package cdc_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/pgoutbox/pgoutbox"
	"github.com/pgoutbox/pgoutbox/broker"
	"github.com/pgoutbox/pgoutbox/broker/brokertest"
	"github.com/pgoutbox/pgoutbox/cdc"
	"github.com/pgoutbox/pgoutbox/cdc/cdcprom"
	"github.com/pgoutbox/pgoutbox/internal/logtest"
	"github.com/pgoutbox/pgoutbox/internal/pgtest"
	"github.com/pgoutbox/pgoutbox/internal/promtest"
	"github.com/pgoutbox/pgoutbox/internal/wait"
)

// failoverSlotPair starts a PostgreSQL 17 primary with a synchronous standby
// that synchronises its failover slots (pgtest.StandbyConfig.SyncSlots) and
// returns them with an env migrated through a multi-host URL, as
// failoverPair does for PostgreSQL 15.
func failoverSlotPair(t *testing.T) (primary, standby *pgtest.Cluster, e *env) {
	t.Helper()
	bindir, err := pgtest.Bindir17()
	pgtest.Must(t, err, "PostgreSQL 17 binaries")
	settings := maps.Clone(pgtest.LogicalSettings)
	settings["synchronous_commit"] = "on"
	primary, err = pgtest.StartCluster(&pgtest.ClusterConfig{MaxConnections: 50, Settings: settings, Bindir: bindir})
	pgtest.Must(t, err, "start primary")
	t.Cleanup(func() { _ = primary.Stop() })
	standby, err = primary.StartStandbyWith(&pgtest.StandbyConfig{Synchronous: true, SyncSlots: true})
	pgtest.Must(t, err, "start standby")
	t.Cleanup(func() { _ = standby.Stop() })
	return primary, standby, multiHostEnv(t, primary, standby)
}

// loader writes events to 8 aggregates, 4 per transaction, until stopped,
// going on through errors (a failover): acked holds the events whose commit
// returned.
type loader struct {
	mu    sync.Mutex
	acked []pgoutbox.UUID
	after atomic.Int64 // commits returned since mark
	mark  atomic.Bool
	stop  chan struct{}
	done  chan struct{}
}

func startLoader(e *env) *loader {
	l := &loader{stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(l.done)
		for n := 0; ; n++ {
			select {
			case <-l.stop:
				return
			default:
			}
			var events []pgoutbox.Event
			for i := range 4 {
				events = append(events, pgoutbox.Event{AggregateType: "acct", AggregateID: fmt.Sprintf("a%04d", (n*4+i)%8),
					EventType: "acct.changed", Payload: map[string]int{"n": n}})
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			res, err := e.prod.EnqueueTx(ctx, e.pool, events...)
			cancel()
			if err != nil {
				time.Sleep(20 * time.Millisecond) // the database is failing over
				continue
			}
			l.mu.Lock()
			for _, r := range res {
				l.acked = append(l.acked, r.EventID)
			}
			l.mu.Unlock()
			if l.mark.Load() {
				l.after.Add(1)
			}
		}
	}()
	return l
}

func (l *loader) committed() []pgoutbox.UUID {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.acked)
}

func (l *loader) halt() { close(l.stop); <-l.done }

// On PostgreSQL 17 the slot is a failover slot, and a standby with
// sync_replication_slots keeps a copy. Under load, once the source reports
// the copy sync-ready (Config.StandbyURL; the cdcprom gauge says 1), the
// primary crashes and the standby is promoted: the source, on a multi-host
// URL, reaches the promoted server and resumes from the synced slot by
// itself, with no Recover and no ErrSlotMissing. Checked against the promoted
// database: every event it has reaches the stream, nothing it lacks does (no
// phantom), no (aggregate, sequence) carries two ids, per-aggregate order
// holds and every committed event is delivered (brokertest.CheckStream).
func TestFailoverResumesFromTheSyncedSlot(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	primary, standby, e := failoverSlotPair(t)
	reg := prometheus.NewRegistry()
	metrics, err := cdcprom.New(reg)
	pgtest.Must(t, err, "cdcprom")
	e.cfg.Observer = metrics
	e.cfg.StandbyURL = standby.URL
	e.cfg.FailoverCheckInterval = 100 * time.Millisecond
	rec := &brokertest.Recorder{}
	src := e.start(t, rec, e.cfg)
	first := e.enqueue(t, 8, 3, 8)
	wait.For(t, 60*time.Second, "the first events published", func() bool { return e.count(t, "published_at IS NULL") == 0 })

	// The slot sync worker copies the slot within seconds; a promotion is
	// safe only once the copy is sync-ready.
	wait.For(t, 60*time.Second, "the standby's copy of the slot sync-ready, as the source reports", func() bool {
		ready, err := standby.SlotSyncReady(ctx, e.cfg.Slot)
		pgtest.Must(t, err, "read the standby's slot")
		r := src.FailoverReadiness()
		v, _ := promtest.Value(t, reg, "pgoutbox_cdc_failover_slot_ready")
		return ready && r.Ready && r.StandbyChecked && v == 1
	})

	load := startLoader(e)
	stopped := false
	defer func() {
		if !stopped {
			load.halt()
		}
	}()
	wait.For(t, 60*time.Second, "some load committed", func() bool { return len(load.committed()) >= 200 })
	pgtest.Must(t, primary.Crash(), "crash the primary")
	pgtest.Must(t, standby.Promote(ctx), "promote the standby")
	promoted := time.Now()
	e.pool.Reset() // no connection of the old primary's left
	load.mark.Store(true)
	wait.For(t, 60*time.Second, "load committed on the promoted server", func() bool { return load.after.Load() >= 20 })
	load.halt()
	stopped = true

	// Resumed: an event committed after the promote reaches the stream.
	all := load.committed()
	last := all[len(all)-1]
	wait.For(t, 60*time.Second, "the source to publish from the promoted server", func() bool {
		return slices.ContainsFunc(rec.Messages(), func(m broker.Message) bool { return m.EventID == last })
	})
	resumed := time.Since(promoted)
	wait.For(t, 60*time.Second, "every event of the promoted database published", func() bool {
		return e.count(t, "published_at IS NULL") == 0
	})
	if h := src.Healthy(); errors.Is(h, cdc.ErrSlotMissing) {
		t.Fatalf("Healthy() = %v after the failover: the synced slot should have been found", h)
	}
	got := rec.Messages()
	inDB := checkAgainstDatabase(t, e, got)
	dups := brokertest.CheckStream(t, got, slices.Concat(first, all))
	var synced bool
	pgtest.Must(t, e.pool.QueryRow(ctx, "SELECT synced FROM pg_replication_slots WHERE slot_name = $1", e.cfg.Slot).Scan(&synced), "read the slot")
	t.Logf("delivery resumed from the synced slot %s after the promote (no recover); %d messages, %d duplicates; %d events in the promoted database; slot synced=%v; %+v",
		resumed.Round(time.Millisecond), len(got), dups, inDB, synced, src.Stats())
}

// On PostgreSQL 17 with no standby synchronising the slot: a slot made
// without failover (by an older pgoutbox, by hand) becomes a failover slot at
// start; the source warns that no standby synchronises it, FailoverReadiness
// says ErrFailoverNotSynchronized and the gauge is 0; it streams as usual.
func TestFailoverSlotWithoutAStandbyWarns(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	bindir, err := pgtest.Bindir17()
	pgtest.Must(t, err, "PostgreSQL 17 binaries")
	cl, err := pgtest.StartCluster(&pgtest.ClusterConfig{Settings: pgtest.LogicalSettings, Bindir: bindir})
	pgtest.Must(t, err, "start PostgreSQL 17")
	t.Cleanup(func() { _ = cl.Stop() })
	e := envOn(t, cl.URL)
	_, err = e.pool.Exec(ctx, fmt.Sprintf("CREATE PUBLICATION %s FOR TABLE %s WITH (publish = 'insert', publish_via_partition_root = true)",
		e.cfg.Publication, e.table()))
	pgtest.Must(t, err, "create the publication")
	_, err = e.pool.Exec(ctx, "SELECT pg_create_logical_replication_slot($1, 'pgoutput')", e.cfg.Slot)
	pgtest.Must(t, err, "create a slot without failover")
	var logs logtest.Buffer
	e.cfg.Logger = logs.Logger()
	reg := prometheus.NewRegistry()
	metrics, err := cdcprom.New(reg)
	pgtest.Must(t, err, "cdcprom")
	e.cfg.Observer = metrics
	rec := &brokertest.Recorder{}
	src := e.start(t, rec, e.cfg)

	var failover bool
	pgtest.Must(t, e.pool.QueryRow(ctx, "SELECT failover FROM pg_replication_slots WHERE slot_name = $1", e.cfg.Slot).Scan(&failover), "read the slot")
	if !failover {
		t.Fatal("the slot is not a failover slot after the start")
	}
	if r := src.FailoverReadiness(); !r.Checked || r.Ready || !errors.Is(r.Err, cdc.ErrFailoverNotSynchronized) {
		t.Fatalf("FailoverReadiness() = %+v, want checked, not ready, ErrFailoverNotSynchronized", r)
	}
	if v, ok := promtest.Value(t, reg, "pgoutbox_cdc_failover_slot_ready", "slot", e.cfg.Slot); !ok || v != 0 {
		t.Fatalf("pgoutbox_cdc_failover_slot_ready = %v (exported %v), want 0", v, ok)
	}
	if !strings.Contains(logs.String(), "level=WARN") || !strings.Contains(logs.String(), "failover slot is not ready") {
		t.Fatalf("no WARN about the failover slot:\n%s", logs.String())
	}
	ids := e.enqueue(t, 4, 2, 4)
	wait.For(t, 60*time.Second, "the events published", func() bool { return e.count(t, "published_at IS NULL") == 0 })
	brokertest.CheckStream(t, rec.Messages(), ids)
}
