package pgtest

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/jackc/pgx/v5"
)

// replicationCutTimeout bounds CutReplication: the reload and the end of every
// WAL sender.
const replicationCutTimeout = 30 * time.Second

// refuseReplication are the pg_hba.conf lines CutReplication puts first.
const refuseReplication = "local replication all reject\nhost replication all 0.0.0.0/0 reject\nhost replication all ::/0 reject\n"

// CutReplication stops streaming from the primary c to its standbys for good, as
// a lasting network cut between a primary and an asynchronous standby would:
// replication connections are refused from now on (pg_hba.conf, reloaded) and
// the WAL senders are terminated. A standby keeps what it had received; a
// transaction committed on c afterwards exists on c alone. It returns once no
// standby streams from c.
func (c *Cluster) CutReplication(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, replicationCutTimeout)
	defer cancel()
	hba := filepath.Join(c.dir, "data", "pg_hba.conf")
	old, err := os.ReadFile(hba)
	if err != nil {
		return fmt.Errorf("pgtest: cut replication: %w", err)
	}
	// Written in place: the file keeps its owner, the server's OS user.
	if err := os.WriteFile(hba, append([]byte(refuseReplication), old...), 0o600); err != nil {
		return fmt.Errorf("pgtest: cut replication: %w", err)
	}
	conn, err := pgx.Connect(ctx, c.URL)
	if err != nil {
		return fmt.Errorf("pgtest: cut replication: %w", err)
	}
	defer conn.Close(context.Background())
	// The reload is the postmaster's, after the signal: a reconnecting standby is
	// refused once the server reports the file's rules in force.
	if _, err := conn.Exec(ctx, "SELECT pg_reload_conf()"); err != nil {
		return fmt.Errorf("pgtest: cut replication: reload: %w", err)
	}
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		var streaming int
		err := conn.QueryRow(ctx, `SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
			WHERE backend_type = 'walsender'`).Scan(&streaming)
		if err != nil {
			return fmt.Errorf("pgtest: cut replication: end the WAL senders: %w", err)
		}
		if streaming == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("pgtest: cut replication: WAL senders still running: %w", ctx.Err())
		case <-tick.C:
		}
	}
}

// WaitStandbysReplayed waits until every standby streaming from the primary c
// has replayed the WAL c had inserted when it was called (commits made with
// synchronous_commit off included).
func (c *Cluster) WaitStandbysReplayed(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, replicationCutTimeout)
	defer cancel()
	conn, err := pgx.Connect(ctx, c.URL)
	if err != nil {
		return fmt.Errorf("pgtest: wait for standbys: %w", err)
	}
	defer conn.Close(context.Background())
	var target string
	if err := conn.QueryRow(ctx, "SELECT pg_current_wal_insert_lsn()::text").Scan(&target); err != nil {
		return fmt.Errorf("pgtest: wait for standbys: %w", err)
	}
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		var standbys, behind int
		err := conn.QueryRow(ctx, `SELECT count(*), count(*) FILTER (WHERE replay_lsn IS NULL OR replay_lsn < $1::pg_lsn)
			FROM pg_stat_replication`, target).Scan(&standbys, &behind)
		if err != nil {
			return fmt.Errorf("pgtest: wait for standbys: %w", err)
		}
		if standbys > 0 && behind == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("pgtest: wait for standbys: %d of %d behind %s: %w", behind, standbys, target, ctx.Err())
		case <-tick.C:
		}
	}
}
