package cdcprom_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/goleak"

	"github.com/pgoutbox/pgoutbox"
	"github.com/pgoutbox/pgoutbox/broker"
	"github.com/pgoutbox/pgoutbox/broker/brokertest"
	"github.com/pgoutbox/pgoutbox/cdc"
	"github.com/pgoutbox/pgoutbox/cdc/cdcprom"
	"github.com/pgoutbox/pgoutbox/internal/pgtest"
	"github.com/pgoutbox/pgoutbox/internal/promtest"
	"github.com/pgoutbox/pgoutbox/internal/wait"
)

// TestMain runs the package's tests on a throwaway cluster of their own with
// logical replication (the shared server keeps its default settings), as cdc's
// tests do.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(pgtest.MainLogical(m))
}

// value returns the gauge or counter name{labels} (a histogram's sample count),
// or -1 when it is absent.
func value(t *testing.T, reg prometheus.Gatherer, name string, labels ...string) float64 {
	t.Helper()
	if v, ok := promtest.Value(t, reg, name, labels...); ok {
		return v
	}
	return -1
}

func TestNewNeedsARegisterer(t *testing.T) {
	if _, err := cdcprom.New(nil); err == nil {
		t.Fatal("New(nil) succeeded")
	}
	reg := prometheus.NewRegistry()
	a, err := cdcprom.New(reg)
	pgtest.Must(t, err, "first New")
	b, err := cdcprom.New(reg)
	pgtest.Must(t, err, "second New on the same registry")
	a.PositionConfirmed(cdc.Position{LSN: 42})
	b.PositionConfirmed(cdc.Position{LSN: 43})
	if v := value(t, reg, "pgoutbox_cdc_confirmed_lsn"); v != 43 {
		t.Fatalf("confirmed_lsn = %v, want the shared gauge at 43", v)
	}
}

// The failover gauge is absent until a look (never on PostgreSQL 15), then
// follows each one, per slot; a second New on the registry shares it.
func TestFailoverReadyGauge(t *testing.T) {
	reg := prometheus.NewRegistry()
	m, err := cdcprom.New(reg)
	pgtest.Must(t, err, "New")
	if v := value(t, reg, "pgoutbox_cdc_failover_slot_ready", "slot", "s1"); v != -1 {
		t.Fatalf("failover_slot_ready = %v before any look, want absent", v)
	}
	m.FailoverChecked(cdc.FailoverReadiness{Slot: "s1", Checked: true, Ready: true})
	if v := value(t, reg, "pgoutbox_cdc_failover_slot_ready", "slot", "s1"); v != 1 {
		t.Fatalf("failover_slot_ready = %v, want 1", v)
	}
	again, err := cdcprom.New(reg)
	pgtest.Must(t, err, "second New")
	again.FailoverChecked(cdc.FailoverReadiness{Slot: "s1", Checked: true, Err: cdc.ErrFailoverNotSynchronized})
	if v := value(t, reg, "pgoutbox_cdc_failover_slot_ready", "slot", "s1"); v != 0 {
		t.Fatalf("failover_slot_ready = %v, want 0", v)
	}
}

// The held-transactions gauge follows each look at the standbys, back to 0.
func TestStandbyHeldGauge(t *testing.T) {
	reg := prometheus.NewRegistry()
	m, err := cdcprom.New(reg)
	pgtest.Must(t, err, "New")
	m.StandbyChecked(cdc.StandbyWait{Required: 1, Connected: 1, HeldTransactions: 3, HeldEvents: 7})
	if v := value(t, reg, "pgoutbox_cdc_standby_held_transactions"); v != 3 {
		t.Fatalf("standby_held_transactions = %v, want 3", v)
	}
	m.StandbyChecked(cdc.StandbyWait{Required: 1, Connected: 1})
	if v := value(t, reg, "pgoutbox_cdc_standby_held_transactions"); v != 0 {
		t.Fatalf("standby_held_transactions = %v, want 0", v)
	}
}

// A real Source on real PostgreSQL, observed by Metrics on a real registry
// beside the Source's own Collector (as the CLI registers them): published,
// failed and quarantined events are counted by reason and path, and the
// confirmed position is reported.
func TestMetricsOfARealSource(t *testing.T) {
	pool, schema := pgtest.Migrated(t, 8)
	slot := cdc.DefaultSlot(schema)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		wait.For(t, 30*time.Second, "the slot dropped", func() bool {
			_, _ = pool.Exec(ctx, "SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE slot_name = $1 AND active", slot)
			_, err := pool.Exec(ctx, "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = $1", slot)
			return err == nil
		})
		_, _ = pool.Exec(ctx, "DROP PUBLICATION IF EXISTS "+pgx.Identifier{slot}.Sanitize())
	})

	reg := prometheus.NewRegistry()
	m, err := cdcprom.New(reg)
	pgtest.Must(t, err, "cdcprom.New")
	// The poison aggregate's first event is refused for good; the others go.
	rec := &brokertest.Recorder{Fail: func(msg *broker.Message) error {
		if msg.AggregateID == "poison" {
			return broker.Permanent(errors.New("refused"))
		}
		return nil
	}}
	src, err := cdc.New(pool, rec, &cdc.Config{Schema: schema, Observer: m, PollInterval: 50 * time.Millisecond,
		StatusInterval: time.Second, Logger: slog.New(slog.DiscardHandler)})
	pgtest.Must(t, err, "cdc.New")
	pgtest.Must(t, reg.Register(src.Collector()), "register the source's collector beside cdcprom's")
	pgtest.Must(t, src.Start(context.Background()), "start")
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := src.Stop(ctx); err != nil {
			t.Errorf("stop: %v", err)
		}
	})

	prod, err := pgoutbox.NewProducer(&pgoutbox.Config{Schema: schema})
	pgtest.Must(t, err, "producer")
	var events []pgoutbox.Event
	for i := range 10 {
		events = append(events, pgoutbox.Event{AggregateType: "acct", AggregateID: fmt.Sprintf("a%d", i), EventType: "acct.opened", Payload: map[string]int{"n": i}})
	}
	events = append(events, pgoutbox.Event{AggregateType: "acct", AggregateID: "poison", EventType: "acct.opened", Payload: map[string]int{}})
	var before int64
	pgtest.Must(t, pool.QueryRow(context.Background(), "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')::bigint").Scan(&before), "current lsn")
	_, err = prod.EnqueueTx(context.Background(), pool, events...)
	pgtest.Must(t, err, "enqueue")

	wait.Forf(t, 30*time.Second, func() string {
		return fmt.Sprintf("10 published and 1 quarantined (published %v, quarantined %v)",
			value(t, reg, "pgoutbox_cdc_published_total"), value(t, reg, "pgoutbox_cdc_quarantined_total"))
	}, func() bool {
		return value(t, reg, "pgoutbox_cdc_published_total") == 10 && value(t, reg, "pgoutbox_cdc_quarantined_total") == 1
	})
	if v := value(t, reg, "pgoutbox_cdc_publish_failures_by_reason_total", "reason", "permanent"); v != 1 {
		t.Errorf("failures{reason=permanent} = %v, want 1", v)
	}
	if v := value(t, reg, "pgoutbox_cdc_publish_failures_by_reason_total", "reason", "unavailable"); v != 0 {
		t.Errorf("failures{reason=unavailable} = %v, want 0 (created up front)", v)
	}
	if v := value(t, reg, "pgoutbox_cdc_publish_attempts"); v != 10 {
		t.Errorf("publish_attempts observations = %v, want 10", v)
	}
	if v := value(t, reg, "pgoutbox_cdc_batch_size", "path", "stream"); v < 1 {
		t.Errorf("batch_size{path=stream} observations = %v, want at least 1", v)
	}
	if v := value(t, reg, "pgoutbox_cdc_broker_ack_seconds", "path", "stream"); v < 1 {
		t.Errorf("broker_ack_seconds{path=stream} observations = %v, want at least 1", v)
	}
	// The Collector's figures are there too, on the same registry.
	if v := value(t, reg, "pgoutbox_cdc_events_published_total"); v != 10 {
		t.Errorf("the Collector's events_published_total = %v, want 10", v)
	}
	// The events' commit lies past before: once they are settled, the position
	// confirmed to the server passes it.
	wait.Forf(t, 30*time.Second, func() string {
		return fmt.Sprintf("the confirmed position past the commit at %d (confirmed_lsn %v)", before, value(t, reg, "pgoutbox_cdc_confirmed_lsn"))
	}, func() bool { return value(t, reg, "pgoutbox_cdc_confirmed_lsn") > float64(before) })
}
