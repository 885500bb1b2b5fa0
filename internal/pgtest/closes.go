package pgtest

import (
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// PoolCountingCloses is Pool, with the count of the connections the pool has
// closed so far: a reset of the pool, or a statement abandoned by its
// context (pgx then closes the connection), shows there.
func PoolCountingCloses(tb testing.TB, url string, maxConns int32) (*pgxpool.Pool, *atomic.Int64) {
	tb.Helper()
	closed := &atomic.Int64{}
	p := pool(tb, url, maxConns, func(c *pgxpool.Config) { c.BeforeClose = func(*pgx.Conn) { closed.Add(1) } })
	return p, closed
}
