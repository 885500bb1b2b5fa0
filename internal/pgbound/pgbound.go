// Package pgbound runs statements under server-side bounds: PostgreSQL's
// lock_timeout and statement_timeout, set with SET LOCAL in the statements'
// own transaction before they are parsed. It is the one way pgoutbox keeps a
// statement on a table that someone else may lock (a tenant's outbox in a
// relay serving many) from waiting for that lock.
//
// Why the server and not a context: when a context ends, pgx closes the
// connection (its default) and the caller cannot tell a lock from a hung
// host; the server's answer (SQLSTATE 55P03 or 57014, Stuck) leaves the
// connection usable and says what happened. Why SET LOCAL: the settings end
// with the transaction, so nothing is left on a session that a pooler in
// transaction mode hands on to other clients. Why before the Parse: parsing
// a statement already takes its tables' locks (the first use of a prepared
// statement on a connection).
package pgbound

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Bounds are the server-side limits of each statement: how long it may wait
// for a lock, and run. Make them with New.
type Bounds struct {
	statement time.Duration
	// begin opens a transaction with both limits set for it alone.
	begin string
}

// New returns the bounds of a statement that runs at most statement and
// waits for a lock at most lock, each rounded up to a whole millisecond, at
// least one (0 would mean no limit to PostgreSQL).
func New(statement, lock time.Duration) Bounds {
	return Bounds{statement: statement,
		begin: "BEGIN; SET LOCAL statement_timeout = " + millis(statement) + "; SET LOCAL lock_timeout = " + millis(lock)}
}

func millis(d time.Duration) string {
	return strconv.FormatInt(max(1, (d+time.Millisecond-1).Milliseconds()), 10)
}

// LockOnly returns the bounds of a statement that may run as long as it
// needs (statement_timeout 0, PostgreSQL's "no limit") but waits for a lock at
// most lock, rounded up to a whole millisecond, at least one: for the work of
// an operator's command (a cleanup's batches) whose length follows the data,
// not a lock someone else holds. Its Deadline is zero: no backstop.
func LockOnly(lock time.Duration) Bounds {
	return Bounds{begin: "BEGIN; SET LOCAL statement_timeout = 0; SET LOCAL lock_timeout = " + millis(lock)}
}

// Deadline is the client-side backstop of a statement under b, for its
// context: past it the server has not answered although it should have ended
// the statement long before, which is what a hung host looks like.
func (b Bounds) Deadline() time.Duration { return 2 * b.statement }

// rollbackTimeout bounds the rollback of a bounded transaction that failed;
// past it the connection is closed (the pool does not keep a connection
// inside a transaction).
const rollbackTimeout = 2 * time.Second

// Send runs the statements of b on a connection of pool in one transaction
// under bd, then commits it; read, if not nil, reads b's results
// in order before the commit's. It takes two round trips: the BEGIN with its
// settings, then b with the COMMIT. The settings must come first because a
// statement's Parse already takes its tables' locks (the first use of a
// prepared statement on a connection). On failure the transaction is rolled
// back, so that the connection returns to the pool usable. Send queues the
// COMMIT on b: a batch is sent once. ctx governs the whole transaction.
func Send(ctx context.Context, pool *pgxpool.Pool, bd Bounds, b *pgx.Batch, read func(pgx.BatchResults) error) error {
	if bd.begin == "" {
		return errors.New("pgbound: Bounds not made with New or LockOnly")
	}
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return fmt.Errorf("acquire a connection: %w", err)
	}
	defer conn.Release()
	if _, err := conn.Exec(ctx, bd.begin); err != nil {
		if !pgconn.Timeout(err) {
			rollback(ctx, conn.Conn())
		}
		return fmt.Errorf("begin a bounded transaction: %w", err)
	}
	b.Queue("COMMIT")
	br := conn.SendBatch(ctx, b)
	if read != nil {
		err = read(br)
	}
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	if err != nil && !pgconn.Timeout(err) {
		// After a client-side deadline the connection is suspect (a hung
		// host): Release closes it rather than wait for a ROLLBACK.
		rollback(ctx, conn.Conn())
	}
	return err
}

// BeginFunc is Send for statements that need a pgx.Tx: fn runs in a
// transaction under bd, committed when it returns nil. It costs a round trip
// more than Send (the COMMIT); for statements off the hot path.
func BeginFunc(ctx context.Context, pool *pgxpool.Pool, bd Bounds, fn func(pgx.Tx) error) error {
	if bd.begin == "" {
		return errors.New("pgbound: Bounds not made with New or LockOnly")
	}
	return pgx.BeginTxFunc(ctx, pool, pgx.TxOptions{BeginQuery: bd.begin}, fn)
}

// Pool runs every statement and transaction on a pool under bounds: each
// statement outside a transaction (Exec, Query, QueryRow) in a bounded
// transaction of its own, each transaction (Begin) bounded. It serves code
// written for a *pgxpool.Pool that opens its own transactions (admin.Cleanup,
// admin.Admin), so that none of its statements waits for a lock past the
// bounds. Make it with Bounds.On.
type Pool struct {
	pool *pgxpool.Pool
	bd   Bounds
}

// On returns pool with every statement under b.
func (b Bounds) On(pool *pgxpool.Pool) *Pool { return &Pool{pool: pool, bd: b} }

// Begin opens a transaction under the bounds.
func (p *Pool) Begin(ctx context.Context) (pgx.Tx, error) {
	if p.bd.begin == "" {
		return nil, errors.New("pgbound: Bounds not made with New or LockOnly")
	}
	return p.pool.BeginTx(ctx, pgx.TxOptions{BeginQuery: p.bd.begin})
}

// Exec runs sql in a bounded transaction of its own.
func (p *Pool) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	var tag pgconn.CommandTag
	err := BeginFunc(ctx, p.pool, p.bd, func(tx pgx.Tx) error {
		var err error
		tag, err = tx.Exec(ctx, sql, args...)
		return err
	})
	return tag, err
}

// Query runs sql in a bounded transaction of its own, committed when the rows
// are closed (rolled back if reading them failed). The commit's error is seen
// only by Err after Close, which pgx.CollectRows and pgx.ForEachRow do not
// call: run a statement that changes rows with Exec, QueryRow or in a
// transaction of Begin, whose commits are checked.
func (p *Pool) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	tx, err := p.Begin(ctx)
	if err != nil {
		return nil, err
	}
	rows, err := tx.Query(ctx, sql, args...)
	if err != nil {
		_ = tx.Rollback(context.WithoutCancel(ctx))
		return nil, err
	}
	return &txRows{Rows: rows, ctx: ctx, tx: tx}, nil
}

// QueryRow runs sql in a bounded transaction of its own when its row is
// scanned.
func (p *Pool) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	return txRow{p: p, ctx: ctx, sql: sql, args: args}
}

// txRows ends its transaction when closed.
type txRows struct {
	pgx.Rows
	ctx  context.Context
	tx   pgx.Tx
	done bool
	err  error // the commit's
}

func (r *txRows) Close() {
	r.Rows.Close()
	if r.done {
		return
	}
	r.done = true
	if r.Rows.Err() != nil {
		_ = r.tx.Rollback(context.WithoutCancel(r.ctx))
		return
	}
	r.err = r.tx.Commit(r.ctx)
}

func (r *txRows) Err() error {
	if err := r.Rows.Err(); err != nil {
		return err
	}
	return r.err
}

type txRow struct {
	p    *Pool
	ctx  context.Context
	sql  string
	args []any
}

func (r txRow) Scan(dest ...any) error {
	return BeginFunc(r.ctx, r.p.pool, r.p.bd, func(tx pgx.Tx) error { return tx.QueryRow(r.ctx, r.sql, r.args...).Scan(dest...) })
}

// rollback ends a transaction left open or failed on conn, if any.
func rollback(ctx context.Context, conn *pgx.Conn) {
	if conn.IsClosed() || conn.PgConn().TxStatus() == 'I' {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), rollbackTimeout)
	defer cancel()
	_, _ = conn.Exec(ctx, "ROLLBACK")
}

// Stuck reports whether err is the server ending a statement at its
// bounds: a lock held by another session past lock_timeout (SQLSTATE 55P03
// lock_not_available) or a statement past statement_timeout, or cancelled by
// an administrator (57014 query_canceled). A client-side deadline is not
// one: it means the server did not answer.
func Stuck(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && (pgErr.Code == "55P03" || pgErr.Code == "57014") && !pgconn.Timeout(err)
}
