package relay_test

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgoutbox/pgoutbox"
	"github.com/pgoutbox/pgoutbox/broker/brokertest"
	"github.com/pgoutbox/pgoutbox/internal/pgtest"
	"github.com/pgoutbox/pgoutbox/migrate"
	"github.com/pgoutbox/pgoutbox/relay"
)

// One Group serves every tenant_* outbox schema of a database; each event's
// Tenant names its outbox, for destinations such as
// outbox.{tenant}.{aggregate_type}.{event_type}.
func ExampleNewGroup() {
	ctx := context.Background()
	pool, drop := exampleDatabase(ctx) // real code has its pool
	defer drop()
	for _, schema := range []string{"tenant_a", "tenant_b"} {
		if _, err := migrate.Up(ctx, pool, &migrate.Config{Schema: schema, Lines: []migrate.Line{migrate.LineOutbox}}); err != nil {
			log.Fatal(err)
		}
		p, _ := pgoutbox.NewProducer(&pgoutbox.Config{Schema: schema})
		if _, err := p.EnqueueTx(ctx, pool, pgoutbox.Event{AggregateType: "order", AggregateID: "1", EventType: "order.placed", Payload: map[string]int{"cents": 100}}); err != nil {
			log.Fatal(err)
		}
	}

	// The selector is parsed once, where it comes in (a flag, a file).
	tenants, err := migrate.ParseSelector("tenant_*")
	if err != nil {
		log.Fatal(err)
	}
	pub := &brokertest.Recorder{} // a broker adapter: nats.New, kafka.New, ...
	g, err := relay.NewGroup(pub, &relay.GroupConfig{
		Config:    relay.Config{Logger: quietLogger()},
		Databases: []relay.Database{{Pool: pool, Schemas: tenants}},
	})
	if err != nil {
		log.Fatal(err)
	}
	if err := g.Start(ctx); err != nil {
		log.Fatal(err)
	}
	published := func() (n int64) {
		for _, t := range g.Tenants() {
			n += t.Stats.Published
		}
		return n
	}
	for deadline := time.Now().Add(10 * time.Second); published() < 2 && time.Now().Before(deadline); {
		time.Sleep(10 * time.Millisecond)
	}
	for _, t := range g.Tenants() {
		fmt.Println(t.Tenant, "serving:", t.Serving, "published:", t.Stats.Published)
	}
	if err := g.Stop(ctx); err != nil {
		log.Fatal(err)
	}
	// Output:
	// tenant_a serving: true published: 1
	// tenant_b serving: true published: 1
}

// exampleDatabase gives an example a database of its own on the test server,
// and a function that closes the pool and drops the database.
func exampleDatabase(ctx context.Context) (*pgxpool.Pool, func()) {
	url, drop, err := pgtest.CreateDatabase("example")
	if err != nil {
		log.Fatal(err)
	}
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		_ = drop()
		log.Fatal(err)
	}
	return pool, func() {
		pool.Close()
		_ = drop()
	}
}
