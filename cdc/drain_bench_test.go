package cdc_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgoutbox/pgoutbox/broker"
	natsbroker "github.com/pgoutbox/pgoutbox/broker/nats"
	"github.com/pgoutbox/pgoutbox/internal/natstest"
	"github.com/pgoutbox/pgoutbox/internal/pgtest"
	"github.com/pgoutbox/pgoutbox/internal/wait"
	"github.com/pgoutbox/pgoutbox/migrate"
	"github.com/pgoutbox/pgoutbox/relay"
)

// drainBacklog is the backlog one iteration of BenchmarkDrainToNATS drains.
const drainBacklog = 50_000

// BenchmarkDrainToNATS drains a backlog of drainBacklog events, committed in one
// transaction while the source already streams (as `pgoutbox bench`'s drain
// does), to the NATS server at natstest.URL(): with the CDC source, and with a
// polling relay on the same cluster for comparison. Beside ns/op it reports
// events/s, this process's CPU per event (the relay: decode, publish, settle)
// and the PostgreSQL cluster's (every backend and the walsender; the
// walsenders' share apart: the polling relay's LISTEN-less cluster has none
// unless another test streams). Profile the
// source with
//
//	go test -run '^$' -bench 'DrainToNATS/cdc' -benchtime 5x -cpuprofile cpu.out ./cdc/
//
// The figures are for comparing one change with the code before it on the
// same machine, never absolute claims.
func BenchmarkDrainToNATS(b *testing.B) {
	b.Run("cdc", func(b *testing.B) { benchDrain(b, true) })
	b.Run("poll", func(b *testing.B) { benchDrain(b, false) })
}

func benchDrain(b *testing.B, cdcSource bool) {
	e := newEnv(b)
	target := natstest.New(b, natstest.URL())
	pub, err := natsbroker.Dial(context.Background(), natstest.URL(), &natsbroker.Config{
		Stream: target.Stream, StreamSubjects: target.Subjects(), Subject: broker.MustParseTemplate(target.Template),
		AckTimeout: 10 * time.Second, Logger: quietLogger()})
	pgtest.Must(b, err, "dial NATS")
	b.Cleanup(func() { _ = pub.Close() })
	if cdcSource {
		e.start(b, pub, e.cfg)
	} else {
		r, err := relay.New(e.pool, pub, &relay.Config{Schema: e.schema, ID: "bench", PollInterval: time.Second, Logger: quietLogger()})
		pgtest.Must(b, err, "relay.New")
		pgtest.Must(b, r.Start(context.Background()), "relay start")
		b.Cleanup(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			_ = r.Stop(ctx)
		})
	}
	postmaster := postmasterPID(b, e.pool)
	var wall time.Duration
	var relayCPU, pgCPU, walCPU time.Duration
	b.ResetTimer()
	for i := range b.N {
		b.StopTimer()
		loadBacklog(b, e, i, drainBacklog)
		p0, w0 := clusterCPU(b, postmaster)
		r0 := processCPU()
		start := time.Now()
		b.StartTimer()
		waitDrained(b, e)
		b.StopTimer()
		wall += time.Since(start)
		relayCPU += processCPU() - r0
		p1, w1 := clusterCPU(b, postmaster)
		pgCPU, walCPU = pgCPU+p1-p0, walCPU+w1-w0
	}
	events := float64(b.N * drainBacklog)
	b.ReportMetric(events/wall.Seconds(), "events/s")
	b.ReportMetric(float64(relayCPU.Microseconds())/events, "relay-µs/event")
	b.ReportMetric(float64(pgCPU.Microseconds())/events, "pg-µs/event")
	b.ReportMetric(float64(walCPU.Microseconds())/events, "walsender-µs/event")
}

// loadBacklog commits n events over 1,000 aggregates (256-byte payloads) in one
// transaction, with UUIDv7-shaped ids, continuing the sequences of round, and
// notifies at commit as a producer would.
func loadBacklog(b *testing.B, e *env, round, n int) {
	b.Helper()
	q := fmt.Sprintf(`
INSERT INTO %[1]s (event_id, aggregate_type, aggregate_id, aggregate_sequence, event_type, payload)
SELECT (lpad(to_hex($1::bigint + i / 64), 12, '0') || '7' || substr(h, 1, 3) || '8' || substr(h, 4, 15))::uuid,
       'bench', 'a' || lpad((i %% 1000)::text, 6, '0'), $2::bigint + i / 1000 + 1, 'bench.event',
       jsonb_build_object('i', i, 'pad', repeat('x', 232))
  FROM generate_series(0::bigint, $3::bigint - 1) AS i, LATERAL (SELECT md5(random()::text || i::text) AS h) AS r`, e.table())
	err := pgx.BeginFunc(context.Background(), e.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(context.Background(), q, time.Now().UnixMilli(), int64(round*n/1000), n); err != nil {
			return err
		}
		// Wake a polling relay as a producer would, at commit.
		_, err := tx.Exec(context.Background(), "SELECT pg_notify($1, '')", migrate.NotifyChannel(e.schema))
		return err
	})
	pgtest.Must(b, err, "load backlog")
}

// waitDrained waits until every event is published: a probe of the partial
// index every wait.Interval costs the database next to nothing.
func waitDrained(b *testing.B, e *env) {
	b.Helper()
	q := "SELECT NOT EXISTS (SELECT 1 FROM " + e.table() + " WHERE published_at IS NULL)"
	wait.For(b, 5*time.Minute, "the backlog to be drained", func() bool {
		var done bool
		pgtest.Must(b, e.pool.QueryRow(context.Background(), q).Scan(&done), "probe")
		return done
	})
}

// processCPU is this process's user and system CPU time.
func processCPU() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// postmasterPID finds the cluster's postmaster: the parent of this session's
// backend (the cluster runs on this machine).
func postmasterPID(b *testing.B, pool *pgxpool.Pool) int {
	b.Helper()
	var backend int
	pgtest.Must(b, pool.QueryRow(context.Background(), "SELECT pg_backend_pid()").Scan(&backend), "backend pid")
	st, err := procStat(backend)
	if err != nil {
		b.Skipf("no /proc view of the server: %v", err)
	}
	return st.ppid
}

// clusterCPU is the CPU time of the postmaster and every process it started
// (the live ones' own, and the exited ones' through the postmaster's
// cutime/cstime: it reaps them), and of that the walsenders'.
func clusterCPU(b *testing.B, postmaster int) (all, walsenders time.Duration) {
	b.Helper()
	pm, err := procStat(postmaster)
	if err != nil {
		b.Fatalf("postmaster: %v", err)
	}
	ticks, wal := pm.utime+pm.stime+pm.cutime+pm.cstime, int64(0)
	dirs, _ := filepath.Glob("/proc/[0-9]*")
	for _, d := range dirs {
		pid, _ := strconv.Atoi(filepath.Base(d))
		if st, err := procStat(pid); err == nil && st.ppid == postmaster {
			ticks += st.utime + st.stime
			if cmd, _ := os.ReadFile(d + "/cmdline"); strings.Contains(string(cmd), "walsender") {
				wal += st.utime + st.stime
			}
		}
	}
	const tick = time.Second / 100 // USER_HZ
	return time.Duration(ticks) * tick, time.Duration(wal) * tick
}

type procTimes struct {
	ppid                         int
	utime, stime, cutime, cstime int64
}

func procStat(pid int) (procTimes, error) {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return procTimes{}, err
	}
	s := string(raw)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+2:]) // fields from 3 (state) on
	if len(f) < 15 {
		return procTimes{}, fmt.Errorf("/proc/%d/stat: short", pid)
	}
	var t procTimes
	t.ppid, _ = strconv.Atoi(f[1])
	t.utime, _ = strconv.ParseInt(f[11], 10, 64)
	t.stime, _ = strconv.ParseInt(f[12], 10, 64)
	t.cutime, _ = strconv.ParseInt(f[13], 10, 64)
	t.cstime, _ = strconv.ParseInt(f[14], 10, 64)
	return t, nil
}
