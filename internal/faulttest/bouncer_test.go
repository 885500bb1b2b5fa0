package faulttest

import (
	"strings"
	"testing"
	"time"

	"github.com/pgoutbox/pgoutbox/internal/pgtest"
)

// Everything but the database's own administration through PgBouncer in
// transaction pooling (docs/operations.md, "Connection poolers"): producers
// that roll back some transactions, two relays that poll (--no-notify: the
// LISTEN session and the idle lock need a session of their own), and the
// consumer, all with pgx's exec query mode; the checker then finds nothing
// lost, duplicated into an effect or reordered.
func TestPgBouncerTransactionPooling(t *testing.T) {
	t.Parallel()
	bouncer := pgtest.StartBouncer(t, pgtest.BouncerTransaction) + "&default_query_exec_mode=exec"
	e := newEnv(t, envConfig{via: bouncer})
	through := relayHost{dbServer: bouncer}
	e.relayOn(through, "r1", nil, "--no-notify")
	e.relayOn(through, "r2", nil, "--no-notify")
	e.consumer("c1", nil)
	opts := producerOpts{txs: 150, aggregates: 8, rollbackPercent: 20, pause: 5 * time.Millisecond}
	p1 := e.producer("p1", nil, opts)
	p2 := e.producer("p2", nil, opts)
	p1.wait(t, 2*time.Minute)
	p2.wait(t, 2*time.Minute)
	e.failOnCrash()
	e.waitDrained(2 * time.Minute)
	e.stopAll()
	v := e.verdict()
	mustHold(t, v)
	if v.RolledBack == 0 {
		t.Fatalf("no transaction was rolled back; the test proves less than it says:\n%s", v)
	}
	for _, p := range e.procs {
		if strings.Contains(p.out.String(), "prepared statement") {
			t.Fatalf("%s met a prepared-statement error through transaction pooling:\n%s", p.name, tail(p.out.String(), 20))
		}
	}
}
