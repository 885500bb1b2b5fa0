// Package exampletest holds what the subscriber examples (kafkainbox, natsinbox,
// pubsubinbox, rabbitinbox, redisinbox, sqsinbox) share, as River's common_test.go does for its examples: the
// event they publish and the consumer service they feed, so that each example
// shows only its broker's part. Errors end the example with log.Fatal.
//
// A test fixture: only the examples import it, and it needs the test server
// (internal/pgtest).
package exampletest

import (
	"context"
	"fmt"
	"log"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgoutbox/pgoutbox"
	"github.com/pgoutbox/pgoutbox/broker"
	"github.com/pgoutbox/pgoutbox/inbox"
	"github.com/pgoutbox/pgoutbox/internal/pgtest"
	"github.com/pgoutbox/pgoutbox/migrate"
)

// Paid returns the examples' event: order 42 was paid 12.50.
func Paid() broker.Message {
	return broker.Message{EventID: pgoutbox.NewEventID(), AggregateType: "order", AggregateID: "42",
		AggregateSequence: 1, EventType: "paid", SchemaVersion: 1, OccurredAt: time.Now(),
		Payload: []byte(`{"cents":1250}`)}
}

// Republished returns m as a relay publishes it again once the broker's
// deduplication window has passed: the same event under another dedup id,
// which the broker stores again and the inbox recognises as a duplicate.
func Republished(m broker.Message) broker.Message {
	m.DedupID = m.EventID.String() + "-again"
	return m
}

// Publish sends msgs with pub, each in a Publish call of its own, in order.
func Publish(ctx context.Context, pub broker.Publisher, msgs ...broker.Message) {
	for _, m := range msgs {
		if err := pub.Publish(ctx, []broker.Message{m})[0]; err != nil {
			log.Fatal(err)
		}
	}
}

// Subscriber is what Finish needs of an example's subscriber.
type Subscriber interface {
	Stop(ctx context.Context) error
}

// Shop is the consumer service of the examples: a Consumer named "shipping"
// that records each paid order in a table once, in a database schema of the
// example's own (the inbox tables and paid_orders), and the outcomes it
// observes.
type Shop struct {
	// Consumer is what the example's subscriber feeds.
	Consumer *inbox.Consumer[pgx.Tx]
	// Close removes the example's schema and closes its pool.
	Close func()

	pool     *pgxpool.Pool
	schema   string
	outcomes observer
}

// DB gives an example a schema of its own holding the inbox tables and the
// table described by table (its name and columns: "balances (account text
// PRIMARY KEY, ...)"), and returns a function that drops it. Real code uses
// its own pool and schema ("public" by default).
func DB(ctx context.Context, table string) (*pgxpool.Pool, string, func()) {
	pool, err := pgxpool.New(ctx, pgtest.URL())
	if err != nil {
		log.Fatal(err)
	}
	schema := pgtest.Name("example")
	if _, err := migrate.Up(ctx, pool, &migrate.Config{Schema: schema, Lines: []migrate.Line{migrate.LineInbox}}); err != nil {
		log.Fatal(err)
	}
	if _, err := pool.Exec(ctx, "CREATE TABLE "+schema+"."+table); err != nil {
		log.Fatal(err)
	}
	return pool, schema, func() {
		_, _ = pool.Exec(context.Background(), "DROP SCHEMA "+schema+" CASCADE")
		pool.Close()
	}
}

// NewShop creates the schema and the Consumer, expecting n deliveries. logger
// nil means slog.Default(). Close removes the schema.
func NewShop(ctx context.Context, n int, logger *slog.Logger) *Shop {
	s := &Shop{outcomes: make(observer, n)}
	s.pool, s.schema, s.Close = DB(ctx, "paid_orders (id text PRIMARY KEY, cents int)")
	type Paid struct {
		Cents int `json:"cents"`
	}
	// An Observer sees every outcome (metrics use it); here it tells the
	// example when the deliveries are processed.
	var err error
	s.Consumer, err = inbox.New(inbox.Pgx(s.pool), inbox.HandleJSON(func(ctx context.Context, tx pgx.Tx, ev inbox.Event, p Paid) error {
		_, err := tx.Exec(ctx, "INSERT INTO "+s.schema+".paid_orders VALUES ($1, $2)", ev.AggregateID, p.Cents)
		return err
	}), &inbox.Config{Name: "shipping", Schema: s.schema, Observer: s.outcomes, Logger: logger})
	if err != nil {
		log.Fatal(err)
	}
	return s
}

// Await prints the status of each of the n deliveries NewShop expects, as the
// consumer processes them.
func (s *Shop) Await() {
	for range cap(s.outcomes) {
		select {
		case o := <-s.outcomes:
			fmt.Println(o.Status)
		case <-time.After(30 * time.Second):
			log.Fatal("no delivery within 30s")
		}
	}
}

// Finish awaits the deliveries (Await), stops sub (a subscriber's Stop lets
// the deliveries in progress commit and acknowledge them), and prints the
// report (Report) with the acknowledgements acked counts once sub stopped.
func (s *Shop) Finish(ctx context.Context, sub Subscriber, acked func() int64) {
	s.Await()
	stopCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := sub.Stop(stopCtx); err != nil {
		log.Fatal(err)
	}
	s.Report(ctx, acked())
}

// Report prints the subscriber's acks, the consumer's counts and the paid
// orders recorded.
func (s *Shop) Report(ctx context.Context, acked int64) {
	var n int
	if err := s.pool.QueryRow(ctx, "SELECT count(*) FROM "+s.schema+".paid_orders").Scan(&n); err != nil {
		log.Fatal(err)
	}
	st := s.Consumer.Stats()
	fmt.Printf("acked %d; applied %d, duplicates %d; paid orders: %d\n", acked, st.Applied, st.Duplicates, n)
}

// observer passes outcomes on; it never blocks (Observe must not).
type observer chan inbox.Outcome

func (o observer) Observe(out inbox.Outcome) {
	select {
	case o <- out:
	default:
	}
}
