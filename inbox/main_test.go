package inbox_test

import (
	"context"
	"database/sql"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"go.uber.org/goleak"

	"github.com/pgoutbox/pgoutbox"
	"github.com/pgoutbox/pgoutbox/broker"
	"github.com/pgoutbox/pgoutbox/inbox"
	"github.com/pgoutbox/pgoutbox/internal/pgtest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var quiet = slog.New(slog.DiscardHandler)

// fixture is a migrated schema of its own with a business table, effects, that the
// test handlers write to: one row per application, in application order.
type fixture struct {
	pool   *pgxpool.Pool
	schema string
}

func newFixture(t testing.TB, maxConns int32) *fixture {
	t.Helper()
	pool, schema := pgtest.Migrated(t, maxConns)
	f := &fixture{pool: pool, schema: schema}
	f.exec(t, `CREATE TABLE `+f.table("effects")+` (
		n            bigserial PRIMARY KEY,
		consumer     text   NOT NULL,
		event_id     uuid   NOT NULL,
		aggregate_id text   NOT NULL,
		sequence     bigint NOT NULL)`)
	return f
}

func (f *fixture) table(name string) string { return pgx.Identifier{f.schema, name}.Sanitize() }

func (f *fixture) exec(t testing.TB, q string, args ...any) {
	t.Helper()
	_, err := f.pool.Exec(context.Background(), q, args...)
	pgtest.Must(t, err, "exec %s", q)
}

func (f *fixture) count(t testing.TB, table, where string, args ...any) int {
	t.Helper()
	var n int
	err := f.pool.QueryRow(context.Background(), "SELECT count(*) FROM "+f.table(table)+" WHERE "+where, args...).Scan(&n)
	pgtest.Must(t, err, "count %s", table)
	return n
}

// sequences returns the sequences of aggregate id that consumer applied, in
// application order.
func (f *fixture) sequences(t testing.TB, consumer, id string) []int64 {
	t.Helper()
	rows, err := f.pool.Query(context.Background(),
		"SELECT sequence FROM "+f.table("effects")+" WHERE consumer = $1 AND aggregate_id = $2 ORDER BY n", consumer, id)
	pgtest.Must(t, err, "read effects")
	seqs, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	pgtest.Must(t, err, "read effects")
	return seqs
}

// sqlDB opens a database/sql handle (pgx's stdlib driver) on the test server.
func sqlDB(t testing.TB) *sql.DB {
	t.Helper()
	cfg, err := pgx.ParseConfig(pgtest.URL())
	pgtest.Must(t, err, "parse URL")
	db := stdlib.OpenDB(*cfg)
	t.Cleanup(func() { _ = db.Close() })
	return db
}

// recordEffect is the handler body of most tests: one effects row per application.
func (f *fixture) recordEffect(ctx context.Context, exec func(ctx context.Context, q string, args ...any) error, consumer string, ev inbox.Event) error {
	return exec(ctx, "INSERT INTO "+f.table("effects")+" (consumer, event_id, aggregate_id, sequence) VALUES ($1, $2, $3, $4)",
		consumer, ev.EventID.String(), ev.AggregateID, ev.AggregateSequence)
}

// pgxHandler records an effect through a pgx transaction.
func (f *fixture) pgxHandler(consumer string) inbox.Handler[pgx.Tx] {
	return func(ctx context.Context, tx pgx.Tx, ev inbox.Event) error {
		return f.recordEffect(ctx, func(ctx context.Context, q string, args ...any) error {
			_, err := tx.Exec(ctx, q, args...)
			return err
		}, consumer, ev)
	}
}

// sqlHandler records an effect through a database/sql transaction.
func (f *fixture) sqlHandler(consumer string) inbox.Handler[*sql.Tx] {
	return func(ctx context.Context, tx *sql.Tx, ev inbox.Event) error {
		return f.recordEffect(ctx, func(ctx context.Context, q string, args ...any) error {
			_, err := tx.ExecContext(ctx, q, args...)
			return err
		}, consumer, ev)
	}
}

// consumer returns a pgx consumer on the fixture's schema that records effects.
func (f *fixture) consumer(t testing.TB, cfg inbox.Config) *inbox.Consumer[pgx.Tx] {
	t.Helper()
	cfg.Schema = f.schema
	if cfg.Logger == nil {
		cfg.Logger = quiet
	}
	c, err := inbox.New(inbox.Pgx(f.pool), f.pgxHandler(cfg.Name), &cfg)
	pgtest.Must(t, err, "inbox.New")
	return c
}

// event returns the message of one outbox event of aggregate order/<id>.
func event(id string, seq int64) broker.Message {
	return broker.Message{
		EventID:           pgoutbox.NewEventID(),
		AggregateType:     "order",
		AggregateID:       id,
		AggregateSequence: seq,
		EventType:         "order.updated",
		SchemaVersion:     1,
		OccurredAt:        time.Now(),
		Payload:           []byte(fmt.Sprintf(`{"order_id":%q,"step":%d}`, id, seq)),
		Headers:           map[string]string{"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"},
	}
}

// lane returns the messages of sequences 1..n of aggregate order/<id>.
func lane(id string, n int) []broker.Message {
	out := make([]broker.Message, n)
	for i := range out {
		out[i] = event(id, int64(i+1))
	}
	return out
}

// process runs one delivery of m and fails the test unless it ends with want.
func process(t testing.TB, c inbox.Processor, m broker.Message, want inbox.Status) inbox.Outcome {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	o := c.Process(ctx, inbox.DeliveryOf(m))
	if o.Status != want {
		t.Fatalf("%s/%s #%d: status %s (err %v), want %s", m.AggregateType, m.AggregateID, m.AggregateSequence, o.Status, o.Err, want)
	}
	return o
}
