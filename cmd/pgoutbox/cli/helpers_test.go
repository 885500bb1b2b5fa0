package cli

// The package's shared test fixtures: a test's own migrated schema (schemaDB,
// opsEnv, relayEnv). The processes a test runs against it are in proc_test.go.

import (
	"context"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgoutbox/pgoutbox"
	"github.com/pgoutbox/pgoutbox/internal/natstest"
	"github.com/pgoutbox/pgoutbox/internal/pgtest"
)

// schemaDB is a test's outbox schema and a pool that sets the scene in it and
// checks it.
type schemaDB struct {
	t      *testing.T
	pool   *pgxpool.Pool
	schema string
}

func (e *schemaDB) table(name string) string { return pgx.Identifier{e.schema, name}.Sanitize() }

func (e *schemaDB) exec(sql string, args ...any) {
	e.t.Helper()
	_, err := e.pool.Exec(context.Background(), sql, args...)
	pgtest.Must(e.t, err, "exec %s", sql)
}

func (e *schemaDB) count(table, where string) int {
	e.t.Helper()
	var n int
	pgtest.Must(e.t, e.pool.QueryRow(context.Background(), "SELECT count(*) FROM "+e.table(table)+" WHERE "+where).Scan(&n), "count")
	return n
}

// opsEnv is a migrated schema of one test's own for the status and dlq verbs.
type opsEnv struct {
	schemaDB
}

func newOpsEnv(t *testing.T) *opsEnv {
	t.Helper()
	pool, schema := pgtest.Migrated(t, 8)
	return &opsEnv{schemaDB{t: t, pool: pool, schema: schema}}
}

// args prefixes a verb's arguments with the connection flags.
func (e *opsEnv) args(verb ...string) []string {
	return append(verb, "--database-url", pgtest.URL(), "--schema", e.schema)
}

// enqueue writes perAgg events to each aggregate ("order", id), in sequence order
// and one transaction per aggregate, and returns their ids per aggregate.
func (e *opsEnv) enqueue(perAgg int, aggIDs ...string) map[string][]pgoutbox.UUID {
	e.t.Helper()
	p, err := pgoutbox.NewProducer(&pgoutbox.Config{Schema: e.schema})
	pgtest.Must(e.t, err, "producer")
	out := map[string][]pgoutbox.UUID{}
	for _, id := range aggIDs {
		events := make([]pgoutbox.Event, perAgg)
		for s := range events {
			events[s] = pgoutbox.Event{AggregateType: "order", AggregateID: id, EventType: "order.changed",
				Payload: map[string]any{"agg": id, "n": s + 1}, Headers: map[string]string{"test": "yes"}}
		}
		res, err := p.EnqueueTx(context.Background(), e.pool, events...)
		pgtest.Must(e.t, err, "enqueue")
		for _, r := range res {
			out[id] = append(out[id], r.EventID)
		}
	}
	return out
}

func (e *opsEnv) quarantine(id pgoutbox.UUID, lastErr string) {
	e.t.Helper()
	e.exec("UPDATE "+e.table("outbox_events")+" SET quarantined_at = now(), attempt_count = 3, last_error = $2 WHERE event_id = $1", id, lastErr)
}

// relayEnv is a migrated schema and a NATS stream of one test's own, with helpers
// to run `pgoutbox relay` processes against them.
type relayEnv struct {
	t      *testing.T
	pool   *pgxpool.Pool
	dbURL  string // the database pool is on
	schema string
	target natstest.Target
}

func newRelayEnv(t *testing.T) *relayEnv {
	t.Helper()
	pool, schema := pgtest.Migrated(t, 8)
	return &relayEnv{t: t, pool: pool, dbURL: pgtest.URL(), schema: schema, target: natstest.New(t, natstest.URL())}
}

func (e *relayEnv) table() string { return pgx.Identifier{e.schema, "outbox_events"}.Sanitize() }

func (e *relayEnv) count(where string) int {
	e.t.Helper()
	var n int
	pgtest.Must(e.t, e.pool.QueryRow(context.Background(), "SELECT count(*) FROM "+e.table()+" WHERE "+where).Scan(&n), "count")
	return n
}

// enqueue writes perAgg events to each of n aggregates, interleaved, and returns their ids.
func (e *relayEnv) enqueue(aggregates, perAgg int) []pgoutbox.UUID {
	e.t.Helper()
	p, err := pgoutbox.NewProducer(&pgoutbox.Config{Schema: e.schema})
	pgtest.Must(e.t, err, "producer")
	var ids []pgoutbox.UUID
	var batch []pgoutbox.Event
	for s := range perAgg {
		for a := range aggregates {
			batch = append(batch, pgoutbox.Event{AggregateType: "acct", AggregateID: fmt.Sprintf("a%04d", a), EventType: "changed", Payload: s})
			if len(batch) == 1000 || (s == perAgg-1 && a == aggregates-1) {
				res, err := p.EnqueueTx(context.Background(), e.pool, batch...)
				pgtest.Must(e.t, err, "enqueue")
				for _, r := range res {
					ids = append(ids, r.EventID)
				}
				batch = batch[:0]
			}
		}
	}
	return ids
}

func (e *relayEnv) startRelay(id, brokerURL string, extra ...string) *relayProc {
	e.t.Helper()
	args := append([]string{"relay", "--database-url", pgtest.URL(), "--schema", e.schema, "--id", id,
		"--broker", brokerURL, "--nats-stream", e.target.Stream, "--topic-template", e.target.Template}, extra...)
	return startRelayProc(e.t, "relay "+id, nil, args)
}
