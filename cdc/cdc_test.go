package cdc_test

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/goleak"

	"github.com/pgoutbox/pgoutbox"
	"github.com/pgoutbox/pgoutbox/broker"
	"github.com/pgoutbox/pgoutbox/cdc"
	"github.com/pgoutbox/pgoutbox/internal/pgtest"
)

// TestMain runs the package's tests on a throwaway cluster of their own with
// wal_level = logical (the shared server may have PostgreSQL's defaults). Logical
// decoding reads every change of its database, and a table that another package's
// test creates while a slot here builds its snapshot can make that slot's
// decoding fail for good ("could not map filenode ... to relation OID"): on a
// cluster of its own no other package's test runs.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(pgtest.MainLogical(m))
}

// env is a migrated schema with a slot and publication of its own; both are
// dropped when the test ends, whatever happened (a slot left behind would retain
// WAL forever).
type env struct {
	pool   *pgxpool.Pool
	schema string
	cfg    cdc.Config
	prod   *pgoutbox.Producer
}

func newEnv(t testing.TB) *env {
	t.Helper()
	pool, schema := pgtest.Migrated(t, 16)
	cfg := cdc.Config{Schema: schema, Slot: cdc.DefaultSlot(schema), Publication: cdc.DefaultSlot(schema),
		Logger: quietLogger(), PollInterval: 50 * time.Millisecond, StatusInterval: time.Second}
	t.Cleanup(func() { dropSlotAndPublication(t, pool, cfg.Slot, cfg.Publication) })
	p, err := pgoutbox.NewProducer(&pgoutbox.Config{Schema: schema})
	pgtest.Must(t, err, "producer")
	return &env{pool: pool, schema: schema, cfg: cfg, prod: p}
}

func dropSlotAndPublication(t testing.TB, pool *pgxpool.Pool, slot, pub string) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for {
		_, _ = pool.Exec(ctx, "SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE slot_name = $1 AND active", slot)
		_, err := pool.Exec(ctx, "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = $1", slot)
		if err == nil {
			break
		}
		if ctx.Err() != nil {
			t.Errorf("drop slot %s: %v", slot, err)
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if _, err := pool.Exec(ctx, "DROP PUBLICATION IF EXISTS "+pgx.Identifier{pub}.Sanitize()); err != nil {
		t.Errorf("drop publication %s: %v", pub, err)
	}
}

func quietLogger() *slog.Logger { return slog.New(slog.DiscardHandler) }

func (e *env) table() string { return pgx.Identifier{e.schema, "outbox_events"}.Sanitize() }

func (e *env) count(t testing.TB, where string) int {
	t.Helper()
	var n int
	pgtest.Must(t, e.pool.QueryRow(context.Background(), "SELECT count(*) FROM "+e.table()+" WHERE "+where).Scan(&n), "count")
	return n
}

// enqueue writes perAgg events to each of aggregates aggregates, interleaved, in
// transactions of up to txSize events, and returns the ids.
func (e *env) enqueue(t testing.TB, aggregates, perAgg, txSize int) []pgoutbox.UUID {
	t.Helper()
	return pgtest.EnqueueInterleaved(t, e.pool, e.prod, aggregates, perAgg, txSize)
}

func (e *env) start(t testing.TB, pub broker.Publisher, cfg cdc.Config) *cdc.Source {
	t.Helper()
	return startOn(t, e.pool, pub, cfg)
}

// startOn is env.start on another pool (e.g. as a role of its own).
func startOn(t testing.TB, pool *pgxpool.Pool, pub broker.Publisher, cfg cdc.Config) *cdc.Source {
	t.Helper()
	s, err := cdc.New(pool, pub, &cfg)
	pgtest.Must(t, err, "cdc.New")
	pgtest.Must(t, s.Start(context.Background()), "start")
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := s.Stop(ctx); err != nil {
			t.Errorf("stop: %v", err)
		}
	})
	return s
}

// metric reads one gauge or counter of the source's collector.
func metric(t testing.TB, s *cdc.Source, name string) float64 {
	t.Helper()
	reg := prometheus.NewRegistry()
	pgtest.Must(t, reg.Register(s.Collector()), "register collector")
	mfs, err := reg.Gather()
	pgtest.Must(t, err, "gather")
	for _, mf := range mfs {
		if mf.GetName() == name {
			m := mf.GetMetric()[0]
			if m.GetGauge() != nil {
				return m.GetGauge().GetValue()
			}
			return m.GetCounter().GetValue()
		}
	}
	t.Fatalf("metric %s not collected", name)
	return 0
}

// slotConfirmedAtLeast reports whether the slot confirmed lsn.
func (e *env) slotConfirmedAtLeast(t testing.TB, lsn string) bool {
	t.Helper()
	var ok bool
	pgtest.Must(t, e.pool.QueryRow(context.Background(), `SELECT coalesce(confirmed_flush_lsn >= $2::pg_lsn, false)
  FROM pg_replication_slots WHERE slot_name = $1`, e.cfg.Slot, lsn).Scan(&ok), "slot position")
	return ok
}

func (e *env) currentLSN(t testing.TB) string {
	t.Helper()
	var lsn string
	pgtest.Must(t, e.pool.QueryRow(context.Background(), "SELECT pg_current_wal_lsn()::text").Scan(&lsn), "current lsn")
	return lsn
}
