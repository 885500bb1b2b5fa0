package pgoutbox_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/pgoutbox/pgoutbox"
	"github.com/pgoutbox/pgoutbox/internal/pgtest"
	"github.com/pgoutbox/pgoutbox/migrate"
)

// bouncerNotifyWithin bounds the wait for a producer's notification to reach a
// listener (docs/operations.md, "Connection poolers").
const bouncerNotifyWithin = 30 * time.Second

// Producers through PgBouncer in transaction pooling, with pgx in the exec query
// modes exec and simple_protocol (no named prepared statements): EnqueueTx, QueueTx in a transaction and
// as an implicit one, EnqueueSQLTx through database/sql, and the SQL function
// outbox_enqueue, from more clients than PgBouncer has server connections, with
// rollbacks; sequences have no gap and no duplicate, rolled-back events are not
// there. The wake-up works: its advisory lock and its NOTIFY are both scoped to
// the producer's transaction, so a relay listening on a direct session hears
// the commits while it holds the idle lock.
func TestProducersThroughPgBouncerTransactionPooling(t *testing.T) {
	t.Parallel()
	for _, mode := range []string{"exec", "simple_protocol"} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			producersThroughBouncer(t, mode)
		})
	}
}

func producersThroughBouncer(t *testing.T, mode string) {
	direct, schema := pgtest.Migrated(t, 2)
	bouncer := pgtest.StartBouncer(t, pgtest.BouncerTransaction) + "&default_query_exec_mode=" + mode
	pool := pgtest.Pool(t, bouncer, 16) // more clients than PgBouncer's server connections
	p, err := pgoutbox.NewProducer(&pgoutbox.Config{Schema: schema})
	pgtest.Must(t, err, "producer")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cfg, err := pgx.ParseConfig(bouncer)
	pgtest.Must(t, err, "parse the bouncer URL")
	sqldb := sql.OpenDB(stdlib.GetConnector(*cfg))
	defer sqldb.Close()
	sqldb.SetMaxOpenConns(4)

	// A relay going idle: a direct session LISTENs and holds the idle lock.
	listener, err := pgx.Connect(ctx, pgtest.URL())
	pgtest.Must(t, err, "listener")
	defer listener.Close(context.Background())
	_, err = listener.Exec(ctx, "LISTEN "+pgx.Identifier{migrate.NotifyChannel(schema)}.Sanitize())
	pgtest.Must(t, err, "listen")
	_, err = listener.Exec(ctx, "SELECT pg_advisory_lock(hashtext('pgoutbox.idle'), hashtext($1))", schema)
	pgtest.Must(t, err, "idle lock")

	fn := pgx.Identifier{schema, "outbox_enqueue"}.Sanitize()
	const workers, rounds = 12, 10
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			agg := fmt.Sprintf("a%d", w%4) // lanes shared between workers
			for i := range rounds {
				rollback := i%3 == 2
				if err := produceOnce(ctx, pool, sqldb, p, fn, w%5, agg, rollback); err != nil {
					errs <- fmt.Errorf("worker %d round %d (path %d): %w", w, i, w%5, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	// The listener heard the commits.
	wctx, wcancel := context.WithTimeout(ctx, bouncerNotifyWithin)
	defer wcancel()
	n, err := listener.WaitForNotification(wctx)
	pgtest.Must(t, err, "wait for a producer's notification")
	if n.Channel != migrate.NotifyChannel(schema) {
		t.Fatalf("notification on %q, want %q", n.Channel, migrate.NotifyChannel(schema))
	}

	// Every committed round left its 2 events, a rolled-back one none; the
	// lanes count 1, 2, 3… without a gap or a duplicate.
	var rows, lanes, gapless int
	pgtest.Must(t, direct.QueryRow(ctx, `
		SELECT count(*), count(DISTINCT aggregate_id),
		       count(*) FILTER (WHERE aggregate_sequence <= (SELECT count(*) FROM `+pgx.Identifier{schema, "outbox_events"}.Sanitize()+` i WHERE i.aggregate_id = o.aggregate_id))
		  FROM `+pgx.Identifier{schema, "outbox_events"}.Sanitize()+` o`).Scan(&rows, &lanes, &gapless), "count")
	committed := workers * (rounds - rounds/3) * 2
	if rows != committed || lanes != 4 || gapless != rows {
		t.Fatalf("%d rows in %d lanes (%d within their lane's count), want %d rows in 4 lanes without gaps", rows, lanes, gapless, committed)
	}
	var dup int
	pgtest.Must(t, direct.QueryRow(ctx, `SELECT count(*) FROM (SELECT aggregate_id, aggregate_sequence FROM `+
		pgx.Identifier{schema, "outbox_events"}.Sanitize()+` GROUP BY 1, 2 HAVING count(*) > 1) d`).Scan(&dup), "duplicates")
	if dup != 0 {
		t.Fatalf("%d duplicate sequence numbers", dup)
	}
}

// produceOnce writes two events of lane agg in one transaction by one of the
// producer's paths, and rolls back when asked (the implicit batch fails a
// statement after its events instead).
func produceOnce(ctx context.Context, pool interface {
	Begin(context.Context) (pgx.Tx, error)
	SendBatch(context.Context, *pgx.Batch) pgx.BatchResults
}, sqldb *sql.DB, p *pgoutbox.Producer, fn string, path int, agg string, rollback bool) error {
	end := func(commit func(context.Context) error, abort func(context.Context) error) error {
		if rollback {
			return abort(ctx)
		}
		return commit(ctx)
	}
	switch path {
	case 0, 1, 2: // pgx transactions
		tx, err := pool.Begin(ctx)
		if err != nil {
			return err
		}
		defer tx.Rollback(ctx)
		switch path {
		case 0:
			_, err = p.EnqueueTx(ctx, tx, ev(agg, 1), ev(agg, 2))
		case 1:
			b := &pgx.Batch{}
			var q *pgoutbox.Queued
			if q, err = p.QueueTx(ctx, b, ev(agg, 1), ev(agg, 2)); err == nil {
				if err = tx.SendBatch(ctx, b).Close(); err == nil {
					_, err = q.Result()
				}
			}
		case 2:
			for i := range 2 {
				if err == nil {
					_, err = tx.Exec(ctx, "SELECT "+fn+"($1, $2, $3, $4::jsonb)", "order", agg, "order.created", fmt.Sprint(i))
				}
			}
		}
		if err != nil {
			return err
		}
		return end(tx.Commit, tx.Rollback)
	case 3: // QueueTx outside a transaction: one implicit transaction
		b := &pgx.Batch{}
		q, err := p.QueueTx(ctx, b, ev(agg, 1), ev(agg, 2))
		if err != nil {
			return err
		}
		if rollback {
			b.Queue("SELECT 1/0")
		}
		err = pool.SendBatch(ctx, b).Close()
		var pe *pgconn.PgError
		if rollback {
			if !errors.As(err, &pe) || pe.Code != "22012" {
				return fmt.Errorf("implicit batch with a failing statement: %v, want division by zero", err)
			}
			return nil
		}
		if err != nil {
			return err
		}
		_, err = q.Result()
		return err
	default: // database/sql
		tx, err := sqldb.BeginTx(ctx, nil)
		if err != nil {
			return err
		}
		defer tx.Rollback()
		if _, err := p.EnqueueSQLTx(ctx, tx, ev(agg, 1), ev(agg, 2)); err != nil {
			return err
		}
		if rollback {
			return tx.Rollback()
		}
		return tx.Commit()
	}
}

// Why the exec query mode: pgx's default mode prepares each statement once per
// connection under a name, and through transaction pooling the next use of that
// name may reach a server connection that never saw it (PgBouncer before 1.21
// does not track prepared statements). PgBouncer hands out its most recently
// used server connection first, which makes this sequence deterministic.
func TestPgBouncerTransactionPoolingBreaksCachedStatements(t *testing.T) {
	t.Parallel()
	bouncer := pgtest.StartBouncer(t, pgtest.BouncerTransaction)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	a, err := pgx.Connect(ctx, bouncer) // pgx's default: cache_statement
	pgtest.Must(t, err, "client a")
	defer a.Close(context.Background())
	b, err := pgx.Connect(ctx, bouncer+"&default_query_exec_mode=exec")
	pgtest.Must(t, err, "client b")
	defer b.Close(context.Background())
	const q = "SELECT $1::int + 1"
	var got int
	pgtest.Must(t, a.QueryRow(ctx, q, 1).Scan(&got), "first query (prepares)")
	// b holds the server connection a prepared on.
	tx, err := b.Begin(ctx)
	pgtest.Must(t, err, "begin b")
	defer tx.Rollback(ctx)
	_, err = tx.Exec(ctx, "SELECT 1")
	pgtest.Must(t, err, "b's statement")
	err = a.QueryRow(ctx, q, 1).Scan(&got)
	var pe *pgconn.PgError
	if !errors.As(err, &pe) || pe.Code != "26000" {
		t.Fatalf("the cached statement on another server connection: err = %v, want invalid_sql_statement_name (26000)", err)
	}
	t.Logf("as expected: %v", err)
}
