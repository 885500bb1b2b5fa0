package migrate_test

import (
	"context"
	"fmt"
	"log"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgoutbox/pgoutbox/internal/pgtest"
	"github.com/pgoutbox/pgoutbox/migrate"
)

func ExampleUp() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, pgtest.URL()) // your DATABASE_URL
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	// Config.Schema defaults to "public"; this example uses a schema of its own.
	schema := pgtest.Name("example")
	defer pool.Exec(ctx, "DROP SCHEMA "+schema+" CASCADE")

	applied, err := migrate.Up(ctx, pool, &migrate.Config{Schema: schema})
	if err != nil {
		log.Fatal(err)
	}
	for _, a := range applied {
		fmt.Printf("applied %s/%d %s\n", a.Line, a.Version, a.Name)
	}
	again, _ := migrate.Up(ctx, pool, &migrate.Config{Schema: schema})
	fmt.Println("second run applied", len(again))
	// Output:
	// applied outbox/1 outbox_events
	// applied outbox/2 notify
	// applied outbox/3 skips
	// applied outbox/4 quiet_notify
	// applied outbox/5 wake_inline
	// applied outbox/6 enqueue_limits
	// applied outbox/7 operator_audit
	// applied outbox/8 enqueue_definer
	// applied outbox/9 enqueue_names
	// applied outbox/10 brin_explicit
	// applied outbox/11 relay_heartbeats
	// applied outbox/12 destinations
	// applied outbox/13 attempts
	// applied outbox/14 destination_lanes_fillfactor
	// applied outbox/15 fewer_checks
	// applied inbox/1 processed_events
	// applied inbox/2 consumer_positions
	// second run applied 0
}
