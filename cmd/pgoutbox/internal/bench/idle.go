package bench

import (
	"context"
	"fmt"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgoutbox/pgoutbox/migrate"
)

// IdleResult is the idle scenario: what a relay with nothing to do costs the
// database.
type IdleResult struct {
	Method        string  `json:"method"`
	Source        string  `json:"source"` // pg_stat_statements or pg_stat_database
	Seconds       float64 `json:"seconds"`
	PollIntervalS float64 `json:"poll_interval_s"`
	Queries       int64   `json:"queries"`
	QueriesPerSec float64 `json:"queries_per_s"`
	// Transactions is the pg_stat_database xact_commit + xact_rollback delta; the
	// server may report an idle backend's counters up to ~10 s late.
	Transactions  int64            `json:"transactions"`
	XactsPerSec   float64          `json:"xacts_per_s"`
	TopStatements []StatementCalls `json:"top_statements,omitempty"`
	RelayRSS      []RelayRSS       `json:"relay_rss"`
	MaxRSSMiB     float64          `json:"max_rss_mib"`
}

// StatementCalls is one statement's calls during the window.
type StatementCalls struct {
	Calls int64  `json:"calls"`
	Query string `json:"query"`
}

const idleMethod = "One relay (null broker, LISTEN on, --poll-interval as set) runs against an " +
	"empty outbox in a database of its own, where nothing else connects. Once it holds its " +
	"idle lock, and 11 s more (the server may report counters up to 10 s late), the statements executed in that database over the window are counted from " +
	"pg_stat_statements (calls, every statement including LISTEN and pings that reach the " +
	"server); without the extension, from pg_stat_database transaction counters."

func (r *Runner) idle(ctx context.Context) (*IdleResult, error) {
	c := r.cfg
	res := &IdleResult{Method: idleMethod, PollIntervalS: c.PollInterval.Seconds()}
	pgss := r.statStatements(ctx)
	res.Source = "pg_stat_database"
	if pgss {
		res.Source = "pg_stat_statements"
	}

	dbName := "pgoutbox_bench_idle_" + randHex(4)
	if _, err := r.admin.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{dbName}.Sanitize()); err != nil {
		return nil, fmt.Errorf("create database: %w", err)
	}
	defer func() {
		dctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		_, _ = r.admin.Exec(dctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{dbName}.Sanitize()+" WITH (FORCE)")
	}()
	dbURL, err := withDatabase(c.DatabaseURL, dbName)
	if err != nil {
		return nil, err
	}
	const schema = "pgoutbox"
	if err := func() error {
		p, err := pgxpool.New(ctx, dbURL)
		if err != nil {
			return err
		}
		defer p.Close()
		_, err = migrate.Up(ctx, p, &migrate.Config{Schema: schema, Lines: []migrate.Line{migrate.LineOutbox}})
		return err
	}(); err != nil {
		return nil, fmt.Errorf("migrate idle database: %w", err)
	}
	null, err := r.broker(ctx, "null")
	if err != nil {
		return nil, err
	}
	r.prog.step("idle: starting a relay")
	procs, err := r.startRelays(ctx, 1, relayOpts{schema: schema, dbURL: dbURL, broker: null})
	if err != nil {
		return nil, err
	}
	defer stopRelays(procs)
	// Idle: the relay holds its idle lock (it listens, and waits); then the
	// server's statistics catch up with its start (an idle backend's counters
	// may be reported up to 10 s late), as in the tenants scenario.
	if err := r.waitIdleLocks(ctx, []string{dbName}, 1, procs); err != nil {
		return nil, err
	}
	if !sleepCtx(ctx, min(11*time.Second, c.IdleDuration)) {
		return nil, ctx.Err()
	}
	q0, x0, st0, ep0, err := r.idleSnapshot(ctx, dbName, pgss)
	if err != nil {
		return nil, err
	}
	start := time.Now()
	for time.Since(start) < c.IdleDuration {
		if err := sampleAll(procs); err != nil {
			return nil, err
		}
		r.prog.update("idle: watching an idle relay, %.0fs left", (c.IdleDuration - time.Since(start)).Seconds())
		if !sleepCtx(ctx, min(250*time.Millisecond, c.IdleDuration-time.Since(start))) {
			return nil, ctx.Err()
		}
	}
	q1, x1, st1, ep1, err := r.idleSnapshot(ctx, dbName, pgss)
	if err != nil {
		return nil, err
	}
	if pgss && (ep1 != ep0 || q1 < q0) {
		// Entries were evicted (pg_stat_statements.max reached on a busy server) or
		// the statistics were reset meanwhile: the calls deltas mean nothing.
		pgss = false
		res.Source = "pg_stat_database (pg_stat_statements evicted or reset entries during the window)"
	}
	el := time.Since(start)
	if err := stopRelays(procs); err != nil {
		return nil, err
	}
	res.Seconds = round3(el.Seconds())
	res.Transactions = x1 - x0
	res.XactsPerSec = round3(float64(res.Transactions) / el.Seconds())
	if pgss {
		res.Queries = q1 - q0
		for q, n := range st1 {
			if d := n - st0[q]; d > 0 {
				res.TopStatements = append(res.TopStatements, StatementCalls{Calls: d, Query: oneLine(q, 160)})
			}
		}
		slices.SortFunc(res.TopStatements, func(a, b StatementCalls) int { return int(b.Calls - a.Calls) })
		if len(res.TopStatements) > 10 {
			res.TopStatements = res.TopStatements[:10]
		}
	} else {
		res.Queries = res.Transactions
	}
	res.QueriesPerSec = round3(float64(res.Queries) / el.Seconds())
	res.RelayRSS = rssOf(procs)
	res.MaxRSSMiB = maxRSSMiB(res.RelayRSS)
	return res, nil
}

// statStatements reports whether pg_stat_statements can be read (creating the
// extension if it is preloaded but not created).
func (r *Runner) statStatements(ctx context.Context) bool {
	if _, err := r.admin.Exec(ctx, "CREATE EXTENSION IF NOT EXISTS pg_stat_statements"); err != nil {
		return false
	}
	// Created but not preloaded: reading it fails.
	return r.admin.QueryRow(ctx, "SELECT count(*) >= 0 FROM pg_stat_statements").Scan(new(bool)) == nil
}

// idleSnapshot reads the database's transaction count and, with pgss, its
// statements' calls and the extension's eviction epoch (deallocations and last
// reset, pg_stat_statements_info), which must not change between two snapshots.
func (r *Runner) idleSnapshot(ctx context.Context, db string, pgss bool) (queries, xacts int64, stmts map[string]int64, epoch string, err error) {
	if err = r.admin.QueryRow(ctx, "SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = $1", db).Scan(&xacts); err != nil {
		return 0, 0, nil, "", fmt.Errorf("pg_stat_database: %w", err)
	}
	if !pgss {
		return 0, xacts, nil, "", nil
	}
	// Older versions of the extension lack the view: no epoch then.
	_ = r.admin.QueryRow(ctx, "SELECT dealloc || '@' || stats_reset FROM pg_stat_statements_info").Scan(&epoch)
	rows, err := r.admin.Query(ctx, `SELECT query, calls FROM pg_stat_statements
 WHERE dbid = (SELECT oid FROM pg_database WHERE datname = $1)`, db)
	if err != nil {
		return 0, 0, nil, "", fmt.Errorf("pg_stat_statements: %w", err)
	}
	stmts = map[string]int64{}
	for rows.Next() {
		var q string
		var n int64
		if err := rows.Scan(&q, &n); err != nil {
			rows.Close()
			return 0, 0, nil, "", err
		}
		stmts[q] += n
		queries += n
	}
	return queries, xacts, stmts, epoch, rows.Err()
}

// withDatabase returns connURL (URL or key=value form) naming database db.
func withDatabase(connURL, db string) (string, error) {
	if strings.Contains(connURL, "://") {
		u, err := url.Parse(connURL)
		if err != nil {
			return "", fmt.Errorf("database URL: %w", err)
		}
		u.Path = "/" + db
		return u.String(), nil
	}
	return connURL + " dbname=" + db, nil
}

func oneLine(s string, n int) string {
	s = strings.Join(strings.Fields(s), " ")
	if len(s) > n {
		s = s[:n] + "…"
	}
	return s
}

func sleepCtx(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}
