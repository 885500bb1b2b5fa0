//go:build unix

package pgtest

import (
	"context"
	"errors"
	"fmt"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
)

// walReceiverTimeout bounds StallWALReceiver's wait for a streaming receiver.
const walReceiverTimeout = time.Minute

// A StalledReceiver is a standby's WAL receiver stopped by StallWALReceiver.
type StalledReceiver struct{ pid int }

// StallWALReceiver stops the WAL receiver of the standby c (SIGSTOP), as a
// receiver stuck on a slow disk or a stalled network would look to its
// primary: the replication connection stays open, nothing more is read,
// written or flushed, so that a primary waiting for c's flush waits (its
// logical walsenders decode the commits regardless). WAL the primary sends
// from now on stays in the socket, unread. Resume or Lose ends the stall.
func (c *Cluster) StallWALReceiver(ctx context.Context) (*StalledReceiver, error) {
	ctx, cancel := context.WithTimeout(ctx, walReceiverTimeout)
	defer cancel()
	conn, err := pgx.Connect(ctx, c.URL)
	if err != nil {
		return nil, fmt.Errorf("pgtest: connect to standby: %w", err)
	}
	defer conn.Close(context.Background())
	for {
		var pid int
		err := conn.QueryRow(ctx, "SELECT coalesce((SELECT pid FROM pg_stat_wal_receiver WHERE status = 'streaming'), 0)").Scan(&pid)
		if err != nil {
			return nil, fmt.Errorf("pgtest: read the WAL receiver: %w", err)
		}
		if pid > 0 {
			if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
				return nil, fmt.Errorf("pgtest: stop the WAL receiver %d: %w", pid, err)
			}
			return &StalledReceiver{pid: pid}, nil
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("pgtest: no streaming WAL receiver on port %d: %w", c.Port, ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// Resume lets the stalled receiver go on (SIGCONT).
func (r *StalledReceiver) Resume() error {
	if err := syscall.Kill(r.pid, syscall.SIGCONT); err != nil && !errors.Is(err, syscall.ESRCH) {
		return fmt.Errorf("pgtest: resume the WAL receiver %d: %w", r.pid, err)
	}
	return nil
}

// Lose kills the stalled receiver (SIGKILL), as the crash of the standby's
// host loses what it had not flushed: the WAL sent to it since the stall was
// never read, and is gone with the process. The standby's postmaster takes
// the receiver's death for a crash and restarts recovery from the WAL on
// disk; the standby lacks every transaction committed on its primary after
// the stall.
func (r *StalledReceiver) Lose() error {
	if err := syscall.Kill(r.pid, syscall.SIGKILL); err != nil && !errors.Is(err, syscall.ESRCH) {
		return fmt.Errorf("pgtest: kill the WAL receiver %d: %w", r.pid, err)
	}
	return nil
}
