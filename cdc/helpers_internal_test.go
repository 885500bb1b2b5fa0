package cdc

import (
	"context"
	"log/slog"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgoutbox/pgoutbox/broker/null"
	"github.com/pgoutbox/pgoutbox/internal/pgtest"
)

// idleSource is a source on a migrated schema of the test's own that publishes
// nowhere and is never started: the test drives its steps by hand.
func idleSource(t *testing.T) (*pgxpool.Pool, *Source) {
	t.Helper()
	pool, schema := pgtest.Migrated(t, 4)
	s, err := New(pool, &null.Publisher{}, &Config{Schema: schema, Logger: slog.New(slog.DiscardHandler)})
	pgtest.Must(t, err, "new source")
	s.hardCtx = context.Background()
	return pool, s
}
