package relay

import (
	"context"
	"errors"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// bounds are the server-side limits of one outbox's statements
// (Config.StatementTimeout and Config.LockTimeout). An outbox's owner, or a
// migration of it, may hold a lock on its tables for as long as it likes; in
// a Group its relay shares a pool, a LISTEN session and the hub's probe with
// the other outboxes of the database. Each statement therefore waits for a
// lock at most lock, runs at most statement, and the server, not the client,
// ends it: the answer (SQLSTATE 55P03 or 57014) leaves the connection usable,
// where a client-side deadline closes it (pgx's default on a context's end)
// and is taken for a hung host (dropHungConnections).
type bounds struct {
	statement, lock time.Duration
	// begin opens a transaction with both limits set for it alone (SET
	// LOCAL): nothing is left on the session, which a pooler in transaction
	// mode hands on to other clients.
	begin string
}

func newBounds(statement, lock time.Duration) bounds {
	return bounds{statement: statement, lock: lock,
		begin: "BEGIN; SET LOCAL statement_timeout = " + strconv.FormatInt(statement.Milliseconds(), 10) +
			"; SET LOCAL lock_timeout = " + strconv.FormatInt(lock.Milliseconds(), 10)}
}

// deadline is the client-side backstop of a statement under b: past it the
// server has not answered although it should have ended the statement long
// before, which is what a hung host looks like.
func (b bounds) deadline() time.Duration { return 2 * b.statement }

// rollbackTimeout bounds the rollback of a bounded transaction that failed;
// past it the connection is closed (the pool does not keep a connection
// inside a transaction).
const rollbackTimeout = 2 * time.Second

// sendBounded runs the statements of b on a connection of pool in one
// transaction under bd, then commits it; read, if not nil, reads b's results
// in order before the commit's. It takes two round trips: the BEGIN with its
// settings, then b with the COMMIT. The settings must come first because a
// statement's Parse already takes its tables' locks (the first use of a
// prepared statement on a connection). On failure the transaction is rolled
// back, so that the connection returns to the pool usable.
func sendBounded(ctx context.Context, pool *pgxpool.Pool, bd bounds, b *pgx.Batch, read func(pgx.BatchResults) error) error {
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return err
	}
	defer conn.Release()
	if _, err := conn.Exec(ctx, bd.begin); err != nil {
		if !pgconn.Timeout(err) {
			rollback(ctx, conn.Conn())
		}
		return err
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

// beginBounded is sendBounded for statements that need a pgx.Tx: fn runs in
// a transaction under bd, committed when it returns nil. It costs a round
// trip more than sendBounded (the COMMIT); for statements off the hot path.
func beginBounded(ctx context.Context, pool *pgxpool.Pool, bd bounds, fn func(pgx.Tx) error) error {
	return pgx.BeginTxFunc(ctx, pool, pgx.TxOptions{BeginQuery: bd.begin}, fn)
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

// outboxStuck reports whether err is the server ending a statement at its
// bounds: a lock held by another session past lock_timeout (SQLSTATE 55P03
// lock_not_available) or a statement past statement_timeout, or cancelled by
// an administrator (57014 query_canceled). A client-side deadline is not
// one: it means the server did not answer.
func outboxStuck(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && (pgErr.Code == "55P03" || pgErr.Code == "57014") && !pgconn.Timeout(err)
}
