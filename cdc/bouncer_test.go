package cdc_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/pgoutbox/pgoutbox/broker/brokertest"
	"github.com/pgoutbox/pgoutbox/cdc"
	"github.com/pgoutbox/pgoutbox/internal/pgtest"
)

// The CDC source needs a replication connection, which PgBouncer (1.18, and
// any version in transaction pooling) does not pass on: through it the source
// fails to start, at once and saying so, instead of waiting or running without
// a stream (docs/operations.md, "Connection poolers").
func TestCDCThroughPgBouncerFailsClearly(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	bouncer := pgtest.StartBouncer(t, pgtest.BouncerTransaction) + "&default_query_exec_mode=exec"
	via := pgtest.Pool(t, bouncer, 4)
	s, err := cdc.New(via, &brokertest.Recorder{}, &e.cfg)
	pgtest.Must(t, err, "cdc.New")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	err = s.Start(ctx)
	defer func() {
		sctx, scancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer scancel()
		_ = s.Stop(sctx)
	}()
	if err == nil || !strings.Contains(err.Error(), "open replication connection") {
		t.Fatalf("Start through PgBouncer: err = %v, want the replication connection refused", err)
	}
	t.Logf("as expected: %v", err)
}
