package cdcprom_test

import (
	"log"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/pgoutbox/pgoutbox/broker"
	"github.com/pgoutbox/pgoutbox/cdc"
	"github.com/pgoutbox/pgoutbox/cdc/cdcprom"
)

// Metrics observe a source; its Collector adds the slot's figures. Register
// both on one registry.
func Example() {
	var (
		pool *pgxpool.Pool    // a pool whose role has REPLICATION
		pub  broker.Publisher // any broker adapter
	)
	reg := prometheus.NewRegistry()
	m, err := cdcprom.New(reg)
	if err != nil {
		log.Fatal(err)
	}
	src, err := cdc.New(pool, pub, &cdc.Config{Schema: "app", Observer: m})
	if err != nil {
		return // here: no pool or publisher
	}
	reg.MustRegister(src.Collector())
}
