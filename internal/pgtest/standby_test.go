//go:build unix

package pgtest

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/pgoutbox/internal/wait"
)

// MultiHostURL is the "test" database on either cluster, preferring whichever
// accepts writes, as an application on an HA pair is configured.
func multiHostURL(primary, standby *Cluster) string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d,127.0.0.1:%d/test?sslmode=disable&target_session_attrs=read-write&connect_timeout=5",
		primary.Port, standby.Port)
}

// synchronousPair starts a primary (synchronous_commit on) with a synchronous
// standby, both stopped when the test ends.
func synchronousPair(t *testing.T) (primary, standby *Cluster) {
	t.Helper()
	primary, err := StartCluster(&ClusterConfig{MaxConnections: 20, Settings: map[string]string{"synchronous_commit": "on"}})
	Must(t, err, "start primary")
	t.Cleanup(func() { _ = primary.Stop() })
	standby, err = primary.StartStandby(true)
	Must(t, err, "start standby")
	t.Cleanup(func() { _ = standby.Stop() })
	return primary, standby
}

// A synchronous standby holds every acknowledged commit: after the primary
// crashes and the standby is promoted, the multi-host URL reaches it and the
// committed row is there.
func TestSynchronousStandbyFailover(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	primary, standby := synchronousPair(t)

	url := multiHostURL(primary, standby)
	conn, err := pgx.Connect(ctx, url)
	Must(t, err, "connect through the multi-host URL")
	_, err = conn.Exec(ctx, "CREATE TABLE kept (n int); INSERT INTO kept SELECT generate_series(1, 100)")
	Must(t, err, "write on the primary")
	conn.Close(ctx)

	sconn, err := pgx.Connect(ctx, standby.URL)
	Must(t, err, "connect to the standby")
	var readOnly string
	Must(t, sconn.QueryRow(ctx, "SHOW transaction_read_only").Scan(&readOnly), "read-only?")
	if readOnly != "on" {
		t.Fatalf("the standby's transaction_read_only = %s, want on", readOnly)
	}
	sconn.Close(ctx)

	Must(t, primary.Crash(), "crash the primary")
	Must(t, standby.Promote(ctx), "promote")
	var n int
	wait.For(t, 30*time.Second, "the multi-host URL to reach the new primary", func() bool {
		c, err := pgx.Connect(ctx, url)
		if err != nil {
			return false
		}
		defer c.Close(ctx)
		return c.QueryRow(ctx, "SELECT count(*) FROM kept").Scan(&n) == nil
	})
	if n != 100 {
		t.Fatalf("%d rows on the promoted standby, want the 100 committed", n)
	}
}

// A frozen server keeps its sockets open and answers nothing; Thaw resumes it.
func TestFreezeAndThaw(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c, err := StartCluster(&ClusterConfig{MaxConnections: 10})
	Must(t, err, "start")
	t.Cleanup(func() { _ = c.Stop() })
	conn, err := pgx.Connect(ctx, c.URL)
	Must(t, err, "connect")
	defer conn.Close(ctx)
	Must(t, c.Freeze(), "freeze")
	qctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	_, err = conn.Exec(qctx, "SELECT 1")
	cancel()
	if err == nil {
		t.Fatal("a query answered while the server was frozen")
	}
	Must(t, c.Thaw(), "thaw")
	wait.For(t, 30*time.Second, "the thawed server to answer", func() bool {
		c2, err := pgx.Connect(ctx, c.URL)
		if err != nil {
			return false
		}
		defer c2.Close(ctx)
		_, err = c2.Exec(ctx, "SELECT 1")
		return err == nil
	})
}

// A stalled WAL receiver holds up its primary's synchronous commits until it
// resumes; killed, it takes what it never read with it: a commit made on the
// primary after the stall is not on the promoted standby, one made before is.
func TestStalledWALReceiver(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	primary, standby := synchronousPair(t)
	conn, err := pgx.Connect(ctx, primary.URL)
	Must(t, err, "connect to the primary")
	defer conn.Close(ctx)
	_, err = conn.Exec(ctx, "CREATE TABLE kept (n int); INSERT INTO kept VALUES (1)")
	Must(t, err, "write before the stall")

	stalled, err := standby.StallWALReceiver(ctx)
	Must(t, err, "stall")
	t.Cleanup(func() { _ = stalled.Resume() })
	done := make(chan error, 1)
	go func() {
		_, err := conn.Exec(ctx, "INSERT INTO kept VALUES (2)")
		done <- err
	}()
	// The commit is written on the primary and waits for the stalled
	// standby's flush (wait event SyncRep).
	wait.For(t, 30*time.Second, "the commit to wait for the standby", func() bool {
		c, err := pgx.Connect(ctx, primary.URL)
		if err != nil {
			return false
		}
		defer c.Close(ctx)
		var waiting bool
		err = c.QueryRow(ctx, "SELECT count(*) > 0 FROM pg_stat_activity WHERE wait_event = 'SyncRep'").Scan(&waiting)
		return err == nil && waiting
	})
	Must(t, primary.Crash(), "crash the primary")
	if err := <-done; err == nil {
		t.Fatal("the commit waiting for the stalled standby returned without error")
	}
	Must(t, stalled.Lose(), "lose the unread WAL")
	Must(t, standby.Promote(ctx), "promote")
	var rows []int
	wait.For(t, 30*time.Second, "the promoted standby to answer", func() bool {
		c, err := pgx.Connect(ctx, standby.URL)
		if err != nil {
			return false
		}
		defer c.Close(ctx)
		r, err := c.Query(ctx, "SELECT n FROM kept ORDER BY n")
		if err != nil {
			return false
		}
		rows, err = pgx.CollectRows(r, pgx.RowTo[int])
		return err == nil
	})
	if len(rows) != 1 || rows[0] != 1 {
		t.Fatalf("the promoted standby has rows %v, want [1]: the row committed after the stall was never read", rows)
	}
}
