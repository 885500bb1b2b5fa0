package admin_test

import (
	"context"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgoutbox/pgoutbox"
	"github.com/pgoutbox/pgoutbox/internal/pgtest"
	"github.com/pgoutbox/pgoutbox/migrate"
)

// The package's shared test helpers: names, counts, fixtures.

// quietLog is the logger of every relay and cleaner the tests start.
var quietLog = slog.New(slog.DiscardHandler)

// quoted is the quoted SQL identifier of parts, e.g. quoted(schema, "outbox_events").
func quoted(parts ...string) string { return pgx.Identifier(parts).Sanitize() }

// countRows counts the rows of table (already quoted) that match where.
func countRows(t *testing.T, pool *pgxpool.Pool, table, where string) int64 {
	t.Helper()
	var n int64
	pgtest.Must(t, pool.QueryRow(context.Background(), "SELECT count(*) FROM "+table+" WHERE "+where).Scan(&n), "count %s", where)
	return n
}

// opsEnqueue writes perAgg events to each of n aggregates of aggType, interleaved,
// and returns their ids.
func opsEnqueue(t *testing.T, pool *pgxpool.Pool, schema, aggType string, n, perAgg int) []pgoutbox.UUID {
	t.Helper()
	p, err := pgoutbox.NewProducer(&pgoutbox.Config{Schema: schema})
	pgtest.Must(t, err, "producer")
	var evs []pgoutbox.Event
	for s := range perAgg {
		for a := range n {
			evs = append(evs, pgoutbox.Event{AggregateType: aggType, AggregateID: fmt.Sprintf("a%02d", a),
				EventType: aggType + ".changed", Payload: map[string]int{"n": s}, Headers: map[string]string{"Test": "yes"}})
		}
	}
	res, err := p.EnqueueTx(context.Background(), pool, evs...)
	pgtest.Must(t, err, "enqueue")
	ids := make([]pgoutbox.UUID, len(res))
	for i, r := range res {
		ids[i] = r.EventID
	}
	return ids
}

// partitionedOutbox is a schema migrated with the partitioned outbox.
func partitionedOutbox(t *testing.T, maxConns int32) (*pgxpool.Pool, string) {
	t.Helper()
	pool, schema := pgtest.Schema(t, maxConns)
	_, err := migrate.Up(context.Background(), pool, &migrate.Config{Schema: schema, Partitioned: true})
	pgtest.Must(t, err, "migrate --partitioned")
	return pool, schema
}

// dayPartition creates the daily partition of the UTC day daysAgo days before
// today, as outbox_create_partitions did back then, and returns its name.
func dayPartition(t *testing.T, pool *pgxpool.Pool, schema string, daysAgo int) string {
	t.Helper()
	now := time.Now().UTC()
	day := time.Date(now.Year(), now.Month(), now.Day()-daysAgo, 0, 0, 0, 0, time.UTC)
	name := "outbox_events_p" + day.Format("20060102")
	_, err := pool.Exec(context.Background(), fmt.Sprintf("CREATE TABLE %s PARTITION OF %s FOR VALUES FROM ('%s') TO ('%s')",
		quoted(schema, name), quoted(schema, "outbox_events"),
		day.Format(time.RFC3339), day.AddDate(0, 0, 1).Format(time.RFC3339)))
	pgtest.Must(t, err, "create partition %s", name)
	return name
}
