package inbox

import (
	"context"
	"database/sql"
	"errors"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Driver is the database handle a Consumer works through, and decides the type of the
// transaction its Handler receives: [Pgx] gives a pgx.Tx, [SQL] a *sql.Tx. It is
// sealed: use one of those two constructors.
type Driver[TX any] interface {
	begin(ctx context.Context) (txn[TX], error)
	exec(ctx context.Context, q string, args ...any) (int64, error)
	queryRow(ctx context.Context, q string, args []any, dest ...any) error
}

// txn is one consumer transaction.
type txn[TX any] interface {
	native() TX
	exec(ctx context.Context, q string, args ...any) (int64, error)
	queryRow(ctx context.Context, q string, args []any, dest ...any) error
	commit(ctx context.Context) error
	rollback(ctx context.Context) error
}

// PgxDB is what the pgx driver needs of a handle: *pgxpool.Pool and *pgx.Conn have
// it. (A pgx.Tx has it too; each consumer transaction is then a savepoint of it.)
type PgxDB interface {
	// Begin starts a consumer transaction.
	Begin(ctx context.Context) (pgx.Tx, error)
	// Exec and QueryRow run the statements outside a consumer transaction
	// (positions, cleanup).
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Pgx returns a driver on a pgx handle, normally a *pgxpool.Pool sized for the
// subscribers' concurrency: each delivery in progress holds one connection for the
// duration of its transaction.
func Pgx(db PgxDB) Driver[pgx.Tx] { return pgxDriver{db} }

type pgxDriver struct{ db PgxDB }

func (d pgxDriver) begin(ctx context.Context) (txn[pgx.Tx], error) {
	tx, err := d.db.Begin(ctx)
	if err != nil {
		return nil, err
	}
	return pgxTxn{tx}, nil
}

func (d pgxDriver) exec(ctx context.Context, q string, args ...any) (int64, error) {
	tag, err := d.db.Exec(ctx, q, args...)
	return tag.RowsAffected(), err
}

func (d pgxDriver) queryRow(ctx context.Context, q string, args []any, dest ...any) error {
	return noRows(d.db.QueryRow(ctx, q, args...).Scan(dest...))
}

type pgxTxn struct{ tx pgx.Tx }

func (t pgxTxn) native() pgx.Tx { return t.tx }

func (t pgxTxn) exec(ctx context.Context, q string, args ...any) (int64, error) {
	tag, err := t.tx.Exec(ctx, q, args...)
	return tag.RowsAffected(), err
}

func (t pgxTxn) queryRow(ctx context.Context, q string, args []any, dest ...any) error {
	return noRows(t.tx.QueryRow(ctx, q, args...).Scan(dest...))
}

func (t pgxTxn) commit(ctx context.Context) error   { return t.tx.Commit(ctx) }
func (t pgxTxn) rollback(ctx context.Context) error { return t.tx.Rollback(ctx) }

// SQL returns a driver on a database/sql handle with any PostgreSQL driver (pgx's
// stdlib, lib/pq). Transactions begin with the handle's defaults (READ COMMITTED
// unless the server or connection says otherwise).
func SQL(db *sql.DB) Driver[*sql.Tx] { return sqlDriver{db} }

type sqlDriver struct{ db *sql.DB }

func (d sqlDriver) begin(ctx context.Context) (txn[*sql.Tx], error) {
	tx, err := d.db.BeginTx(ctx, nil)
	if err != nil {
		return nil, err
	}
	return sqlTxn{tx}, nil
}

func (d sqlDriver) exec(ctx context.Context, q string, args ...any) (int64, error) {
	res, err := d.db.ExecContext(ctx, q, args...)
	if err != nil {
		return 0, err
	}
	return res.RowsAffected()
}

func (d sqlDriver) queryRow(ctx context.Context, q string, args []any, dest ...any) error {
	return noRows(d.db.QueryRowContext(ctx, q, args...).Scan(dest...))
}

type sqlTxn struct{ tx *sql.Tx }

func (t sqlTxn) native() *sql.Tx { return t.tx }

func (t sqlTxn) exec(ctx context.Context, q string, args ...any) (int64, error) {
	res, err := t.tx.ExecContext(ctx, q, args...)
	if err != nil {
		return 0, err
	}
	return res.RowsAffected()
}

func (t sqlTxn) queryRow(ctx context.Context, q string, args []any, dest ...any) error {
	return noRows(t.tx.QueryRowContext(ctx, q, args...).Scan(dest...))
}

func (t sqlTxn) commit(context.Context) error   { return t.tx.Commit() }
func (t sqlTxn) rollback(context.Context) error { return t.tx.Rollback() }

// errNoRows is what queryRow returns for an empty result, whatever the driver.
var errNoRows = errors.New("inbox: no rows")

func noRows(err error) error {
	if errors.Is(err, pgx.ErrNoRows) || errors.Is(err, sql.ErrNoRows) {
		return errNoRows
	}
	return err
}

// retryable reports whether err means the transaction lost a race PostgreSQL detected
// (serialization failure, deadlock) and can simply be run again.
func retryable(err error) bool {
	var s interface{ SQLState() string }
	if !errors.As(err, &s) {
		return false
	}
	switch s.SQLState() {
	case "40001", "40P01": // serialization_failure, deadlock_detected
		return true
	}
	return false
}
