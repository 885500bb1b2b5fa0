package cdc_test

import (
	"context"
	"log"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/pgoutbox/pgoutbox/broker"
	"github.com/pgoutbox/pgoutbox/cdc"
)

// Run the CDC source for a schema: it creates the publication and the slot if
// missing, publishes what the stream will not send from the table, then follows
// the slot until stopped.
func Example() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, "postgres://app@localhost:5432/app") // a role with REPLICATION
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	var pub broker.Publisher // e.g. natsbroker.Dial(...)

	src, err := cdc.New(pool, pub, &cdc.Config{Schema: "app"}) // slot and publication "pgoutbox_app"
	if err != nil {
		log.Fatal(err)
	}
	prometheus.MustRegister(src.Collector())
	if err := src.Start(ctx); err != nil { // wal_level, REPLICATION, slot in use: reported here
		log.Fatal(err)
	}
	// ... until SIGTERM:
	stopCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := src.Stop(stopCtx); err != nil {
		log.Print(err)
	}
}
