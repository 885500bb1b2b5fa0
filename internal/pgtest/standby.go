//go:build unix

package pgtest

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
)

// StandbyName is the application_name a standby started by StartStandby
// connects to its primary with (the name synchronous_standby_names lists).
const StandbyName = "standby1"

// backupName is the application_name of pg_basebackup's connections while it
// copies a standby's data directory.
const backupName = "pgtest_basebackup"

// StartStandby makes a streaming standby of the running cluster c:
// pg_basebackup -R of it (a copy between pg_backup_start and pg_backup_stop
// where the binaries lack pg_basebackup) into a fresh directory, started on a free port with
// c's settings. With synchronous, c then waits for the standby to flush every
// commit (synchronous_standby_names = StandbyName; c must have been started
// with synchronous_commit on, which the throwaway defaults turn off). Stop it
// when done; a promoted standby is a primary like any other cluster.
func (c *Cluster) StartStandby(synchronous bool) (*Cluster, error) {
	return c.StartStandbyOn(synchronous, 0)
}

// StartStandbyOn is StartStandby on the given port (0: a free one), e.g. the
// port of a primary that failed, so that a multi-host URL given to processes
// before the failover names the new standby too.
func (c *Cluster) StartStandbyOn(synchronous bool, port int) (*Cluster, error) {
	return c.StartStandbyWith(&StandbyConfig{Synchronous: synchronous, Port: port})
}

// StandbySlot is the physical replication slot on the primary a standby
// started with StandbyConfig.SyncSlots streams through (primary_slot_name),
// the one synchronized_standby_slots names.
const StandbySlot = "pgtest_standby1"

// StandbyConfig is a standby's configuration (StartStandbyWith); a nil
// *StandbyConfig means all defaults.
type StandbyConfig struct {
	// Synchronous: the primary waits for the standby to flush every commit
	// (see StartStandby).
	Synchronous bool
	// Port is the standby's port; 0 means a free one.
	Port int
	// SyncSlots makes the standby synchronise the primary's failover logical
	// slots (PostgreSQL 17 and later): the primary gets the physical slot
	// StandbySlot, which the standby streams through (primary_slot_name,
	// hot_standby_feedback on), and synchronized_standby_slots naming it; the
	// standby runs with sync_replication_slots on and a primary_conninfo
	// naming the "test" database. The primary needs wal_level logical
	// (LogicalSettings).
	SyncSlots bool
}

// StartStandbyWith makes a streaming standby of the running cluster c as
// StartStandby does, configured by cfg.
func (c *Cluster) StartStandbyWith(cfg *StandbyConfig) (*Cluster, error) {
	var sc StandbyConfig
	if cfg != nil {
		sc = *cfg
	}
	ctx, cancel := context.WithTimeout(context.Background(), ClusterStartTimeout)
	defer cancel()
	dir, err := os.MkdirTemp("", "pgoutbox-pg-standby-")
	if err != nil {
		return nil, fmt.Errorf("pgtest: standby directory: %w", err)
	}
	fail := func(err error) (*Cluster, error) {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	if c.cred != nil {
		if err := os.Chown(dir, int(c.cred.uid), int(c.cred.gid)); err != nil {
			return fail(fmt.Errorf("pgtest: standby directory: %w", err))
		}
	}
	if sc.SyncSlots {
		// Before the copy: the slot keeps the WAL from the backup on.
		if err := c.exec(ctx, "SELECT pg_create_physical_replication_slot('"+StandbySlot+"', true)"); err != nil {
			return fail(err)
		}
	}
	data := filepath.Join(dir, "data")
	conninfo := fmt.Sprintf("host=127.0.0.1 port=%d user=postgres application_name=%s", c.Port, StandbyName)
	if _, err := os.Stat(filepath.Join(c.bindir, "pg_basebackup")); err == nil {
		// The copy's own replication connections go by another name, so that
		// a walsender of the copy that outlives it for a moment is never
		// taken for the standby's in pg_stat_replication (requireSynchronous).
		backupConninfo := fmt.Sprintf("host=127.0.0.1 port=%d user=postgres application_name=%s", c.Port, backupName)
		backup := exec.CommandContext(ctx, filepath.Join(c.bindir, "pg_basebackup"), "-D", data, "-d", backupConninfo,
			"-R", "-X", "stream", "-c", "fast", "--no-sync")
		backup.Dir = dir
		backup.SysProcAttr = procAttr(c.cred, false)
		if out, err := backup.CombinedOutput(); err != nil {
			return fail(fmt.Errorf("pgtest: pg_basebackup of port %d: %w\n%s", c.Port, err, out))
		}
	} else if err := c.copyBackup(ctx, data); err != nil {
		return fail(err)
	}
	settings := maps.Clone(c.settings)
	settings["primary_conninfo"] = conninfo
	settings["hot_standby"] = "on"
	if sc.SyncSlots {
		// The slot sync worker reads the primary's slots from a database.
		settings["primary_conninfo"] = conninfo + " dbname=test"
		settings["primary_slot_name"] = StandbySlot
		settings["hot_standby_feedback"] = "on"
		settings["sync_replication_slots"] = "on"
		// Promoted, the standby has no standby of its own to wait for.
		settings["synchronized_standby_slots"] = ""
	}
	var lastErr error
	for range 5 {
		port := sc.Port
		if port == 0 {
			if port, err = freePort(); err != nil {
				return fail(err)
			}
		}
		sb, err := runServer(ctx, c.bindir, dir, data, port, settings, c.cred, acceptsConnections)
		if err == nil {
			if err := c.configureStandby(ctx, &sc); err != nil {
				_ = sb.Stop()
				return nil, err
			}
			return sb, nil
		}
		lastErr = err
		if ctx.Err() != nil {
			break
		}
	}
	return fail(lastErr)
}

// configureStandby makes c wait for its new standby as sc asks.
func (c *Cluster) configureStandby(ctx context.Context, sc *StandbyConfig) error {
	if sc.SyncSlots {
		if err := c.exec(ctx, "ALTER SYSTEM SET synchronized_standby_slots = '"+StandbySlot+"'", "SELECT pg_reload_conf()"); err != nil {
			return err
		}
	}
	if sc.Synchronous {
		return c.requireSynchronous(ctx)
	}
	return nil
}

// exec runs statements on c's test database.
func (c *Cluster) exec(ctx context.Context, statements ...string) error {
	conn, err := pgx.Connect(ctx, c.URL)
	if err != nil {
		return fmt.Errorf("pgtest: connect to port %d: %w", c.Port, err)
	}
	defer conn.Close(context.Background())
	for _, q := range statements {
		if _, err := conn.Exec(ctx, q); err != nil {
			return fmt.Errorf("pgtest: %s: %w", q, err)
		}
	}
	return nil
}

// SlotSyncReady reports whether the standby c has the primary's failover
// slot slot synchronised and usable after a promotion (PostgreSQL 17: synced,
// not temporary, not invalidated).
func (c *Cluster) SlotSyncReady(ctx context.Context, slot string) (bool, error) {
	conn, err := pgx.Connect(ctx, c.URL)
	if err != nil {
		return false, fmt.Errorf("pgtest: connect to port %d: %w", c.Port, err)
	}
	defer conn.Close(context.Background())
	var ready bool
	err = conn.QueryRow(ctx, `SELECT coalesce(bool_or(synced AND NOT temporary AND invalidation_reason IS NULL), false)
  FROM pg_replication_slots WHERE slot_name = $1`, slot).Scan(&ready)
	if err != nil {
		return false, fmt.Errorf("pgtest: read slot %s on port %d: %w", slot, c.Port, err)
	}
	return ready, nil
}

// acceptsConnections is a standby's readiness: it answers queries.
func acceptsConnections(ctx context.Context, adminURL string) error {
	conn, err := pgx.Connect(ctx, adminURL)
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	_, err = conn.Exec(ctx, "SELECT 1")
	return err
}

// requireSynchronous makes c wait for StandbyName's flush on every commit, and
// waits until the standby streams as the synchronous one.
func (c *Cluster) requireSynchronous(ctx context.Context) error {
	conn, err := pgx.Connect(ctx, c.URL)
	if err != nil {
		return fmt.Errorf("pgtest: connect to primary: %w", err)
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(ctx, "ALTER SYSTEM SET synchronous_standby_names = '"+StandbyName+"'"); err != nil {
		return fmt.Errorf("pgtest: synchronous_standby_names: %w", err)
	}
	if _, err := conn.Exec(ctx, "SELECT pg_reload_conf()"); err != nil {
		return fmt.Errorf("pgtest: reload: %w", err)
	}
	for {
		// StandbyName can have two walsenders for a moment, one of a
		// replication connection going away beside the new one (seen once in
		// a loaded run, as "more than one row returned by a subquery").
		// Whichever is synchronous, commits wait for this standby.
		var state string
		err := conn.QueryRow(ctx, `SELECT coalesce(string_agg(sync_state, ',' ORDER BY backend_start), '')
  FROM pg_stat_replication WHERE application_name = $1`, StandbyName).Scan(&state)
		if err != nil {
			return fmt.Errorf("pgtest: pg_stat_replication: %w", err)
		}
		if slices.Contains(strings.Split(state, ","), "sync") {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("pgtest: the standby did not become synchronous (state %q): %w", state, ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// Promote turns a standby into a primary (pg_promote, waiting for the end of
// recovery) and returns once it accepts writes.
func (c *Cluster) Promote(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, promoteTimeout)
	defer cancel()
	// pg_promote is asked not to wait: a session waiting on a hot standby can
	// be cancelled by a conflict with the recovery it waits for (SQLSTATE
	// 40001), leaving it unknown whether the promotion was requested. The end
	// of recovery is watched from fresh sessions instead, and the request is
	// made again while recovery goes on: a request can be lost. pg_promote
	// signals the postmaster, which passes the signal to the startup process;
	// when a child of the standby has just died (a WAL receiver killed, as
	// StalledReceiver.Lose does), the postmaster may restart recovery after
	// passing it on, and the new startup process never hears of the request
	// (seen once in a full run: still in recovery a minute later). A request
	// made again is ignored by a startup process already promoting.
	var requested time.Time
	tick := time.NewTicker(promotePoll)
	defer tick.Stop()
	for {
		inRecovery, err := c.promoteStep(ctx, &requested)
		if err == nil && !inRecovery {
			return nil
		}
		select {
		case <-ctx.Done():
			if err == nil {
				err = errors.New("still in recovery")
			}
			return fmt.Errorf("pgtest: promote port %d: %w (%w)", c.Port, err, ctx.Err())
		case <-tick.C:
		}
	}
}

// Promote's bounds: the whole promotion, the pace of its checks, and how long
// a request is given before it is made again.
const (
	promoteTimeout = time.Minute
	promotePoll    = 20 * time.Millisecond
	promoteAgain   = 2 * time.Second
)

// promoteStep reports whether c is still in recovery, requesting the
// promotion when no request succeeded in the last promoteAgain.
func (c *Cluster) promoteStep(ctx context.Context, requested *time.Time) (inRecovery bool, err error) {
	conn, err := pgx.Connect(ctx, c.URL)
	if err != nil {
		return true, err
	}
	defer conn.Close(context.Background())
	if err := conn.QueryRow(ctx, "SELECT pg_is_in_recovery()").Scan(&inRecovery); err != nil || !inRecovery ||
		(!requested.IsZero() && time.Since(*requested) < promoteAgain) {
		return inRecovery, err
	}
	var ok bool
	if err := conn.QueryRow(ctx, "SELECT pg_promote(false)").Scan(&ok); err != nil {
		return true, fmt.Errorf("pg_promote: %w", err)
	}
	if ok {
		*requested = time.Now()
	}
	return true, nil
}

// Crash stops the server at once, as a crash or a power loss of its host
// would: SIGKILL of the postmaster and every backend (no shutdown checkpoint,
// no goodbye to clients; their sockets are closed by the kernel). The files stay
// until Stop.
func (c *Cluster) Crash() error {
	err := c.signalAll(syscall.SIGKILL)
	<-c.exited
	return err
}

// Freeze stops every process of the server (SIGSTOP), as a hung host or a
// network black hole looks to clients: connections stay open and nothing
// answers. Thaw resumes them.
func (c *Cluster) Freeze() error { return c.signalAll(syscall.SIGSTOP) }

// Thaw resumes a frozen server (SIGCONT).
func (c *Cluster) Thaw() error { return c.signalAll(syscall.SIGCONT) }

// signalAll sends sig to the postmaster's children, then to the postmaster.
func (c *Cluster) signalAll(sig syscall.Signal) error {
	pid := c.Pid()
	var errs []error
	for _, child := range children(pid) {
		if err := syscall.Kill(child, sig); err != nil && !errors.Is(err, syscall.ESRCH) {
			errs = append(errs, fmt.Errorf("pgtest: signal backend %d: %w", child, err))
		}
	}
	if err := syscall.Kill(pid, sig); err != nil && !errors.Is(err, syscall.ESRCH) {
		errs = append(errs, fmt.Errorf("pgtest: signal postmaster %d: %w", pid, err))
	}
	return errors.Join(errs...)
}

// children lists the processes whose parent is pid, from /proc (Linux).
func children(pid int) []int {
	entries, _ := os.ReadDir("/proc")
	var out []int
	for _, e := range entries {
		child, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		// pid (comm) state ppid ...: comm may hold spaces and parentheses.
		s := string(b)
		i := strings.LastIndexByte(s, ')')
		if i < 0 {
			continue
		}
		fields := strings.Fields(s[i+1:])
		if len(fields) >= 2 {
			if ppid, err := strconv.Atoi(fields[1]); err == nil && ppid == pid {
				out = append(out, child)
			}
		}
	}
	return out
}
