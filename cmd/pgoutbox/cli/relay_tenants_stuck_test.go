package cli

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/pgoutbox/pgoutbox"
	"github.com/pgoutbox/pgoutbox/internal/natstest"
	"github.com/pgoutbox/pgoutbox/internal/pgtest"
	"github.com/pgoutbox/pgoutbox/internal/wait"
)

// With --no-notify (the PgBouncer set-up), a tenant whose outbox another
// session keeps locked (its owner's LOCK TABLE, with the tenant's new events
// in the same transaction) is named in /readyz and its metric, while another
// tenant's events reach NATS during the lock; the relay logs the locked
// tenant once and never resets its pool; the locked tenant's events follow
// once the lock goes.
func TestRelayTenantsLockedTenant(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newCLITenants(t, "t_a", "t_b")
	target := natstest.New(t, natstest.URL())
	p := startOpsRelay(t, nil, "--database-url", e.url, "--tenants", "t_*", "--no-notify", "--broker", natstest.URL(),
		"--nats-stream", target.Stream, "--topic-template", target.Prefix+".{tenant}.{aggregate_type}.{event_type}",
		"--poll-interval", "100ms", "--lock-timeout", "200ms", "--metrics-addr", "127.0.0.1:0", "--workers", "2")
	wait.For(t, time.Minute, "both tenants served", func() bool { code, _ := p.get(t, "/readyz"); return code == 200 })

	tx, err := e.pool.Begin(ctx)
	pgtest.Must(t, err, "begin")
	defer func() { _ = tx.Rollback(context.Background()) }()
	prod, err := pgoutbox.NewProducer(&pgoutbox.Config{Schema: "t_a"})
	pgtest.Must(t, err, "producer")
	for range 5 {
		_, err := prod.EnqueueTx(ctx, tx, pgoutbox.Event{AggregateType: "order", AggregateID: "1", EventType: "e"})
		pgtest.Must(t, err, "enqueue into t_a")
	}
	_, err = tx.Exec(ctx, "LOCK TABLE t_a.outbox_events IN ACCESS EXCLUSIVE MODE")
	pgtest.Must(t, err, "lock t_a")
	wait.Forf(t, time.Minute, func() string { return "t_a named in /readyz; the log:\n" + p.stderr.String() }, func() bool {
		code, body := p.get(t, "/readyz")
		return code == 503 && strings.Contains(body, "t_a") && strings.Contains(body, "time out") &&
			!strings.Contains(body, "unhealthy t_b")
	})
	began := time.Now()
	e.enqueue("t_b", 10, 0)
	wait.Forf(t, time.Minute, func() string { return "t_b's events on the stream while t_a is locked; the log:\n" + p.stderr.String() },
		func() bool { return perSubjectToken(t, target)["t_b"] == 10 })
	t.Logf("t_b's events on the stream %s after their commit, with t_a locked", time.Since(began).Round(time.Millisecond))
	if tx.Conn().PgConn().TxStatus() != 'T' {
		t.Fatal("the lock holder's transaction ended")
	}
	if v := p.metric(t, `pgoutbox_relay_tenant_healthy{tenant="t_a"}`); v != 0 {
		t.Errorf("tenant_healthy{t_a} = %v with its outbox locked, want 0", v)
	}
	if v := p.metric(t, `pgoutbox_relay_tenant_healthy{tenant="t_b"}`); v != 1 {
		t.Errorf("tenant_healthy{t_b} = %v, want 1", v)
	}
	log := p.stderr.String()
	for _, bad := range []string{"dropping the pool's connections", "database unreachable"} {
		if strings.Contains(log, bad) {
			t.Errorf("the log says %q:\n%s", bad, log)
		}
	}
	if n := strings.Count(log, `msg="the outbox's statements time out`); n != 1 {
		t.Errorf("t_a's lock logged %d times, want once:\n%s", n, log)
	}

	pgtest.Must(t, tx.Commit(ctx), "release t_a")
	wait.Forf(t, time.Minute, func() string { return "t_a's events after the lock; the log:\n" + p.stderr.String() }, func() bool {
		code, _ := p.get(t, "/readyz")
		return perSubjectToken(t, target)["t_a"] == 5 && code == 200
	})
	p.sigterm(t)
}
