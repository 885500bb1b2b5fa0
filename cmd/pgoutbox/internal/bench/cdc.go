package bench

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// cdcSlotPrefix starts the name of every slot (and publication) the bench
// creates: "pgoutbox_<schema>_<random>", so that one left behind by a run that was
// killed names the schema it served.
const cdcSlotPrefix = "pgoutbox_bench_"

// resolveSources settles Config.Sources against what the server allows: CDC needs
// wal_level = logical and a role with REPLICATION. Asked for explicitly, CDC on a
// server without them is an error; by default it is left out with a note. With
// CDC on, slots of earlier runs that were killed are dropped.
func (r *Runner) resolveSources(ctx context.Context) (note string, err error) {
	if !r.needsSources() {
		return "", nil
	}
	var walLevel string
	var canReplicate bool
	if err := r.admin.QueryRow(ctx, `SELECT current_setting('wal_level'),
       (SELECT rolreplication OR rolsuper FROM pg_roles WHERE rolname = current_user)`).Scan(&walLevel, &canReplicate); err != nil {
		return "", fmt.Errorf("bench: read wal_level: %w", err)
	}
	why := ""
	switch {
	case walLevel != "logical":
		why = fmt.Sprintf("the server has wal_level = %s, CDC needs logical", walLevel)
	case !canReplicate:
		why = "the role lacks the REPLICATION attribute CDC needs"
	}
	if r.cfg.Sources == nil {
		if why != "" {
			r.cfg.Sources = []string{SourcePoll}
			return "no CDC rows: " + why, nil
		}
		r.cfg.Sources = slices.Clone(Sources)
	} else if why != "" && slices.Contains(r.cfg.Sources, SourceCDC) {
		return "", fmt.Errorf("bench: source cdc: %s", why)
	}
	if r.hasSource(SourceCDC) {
		r.sweepCDC(ctx)
	}
	return "", nil
}

// needsSources reports whether a scenario that compares sources runs.
func (r *Runner) needsSources() bool {
	return slices.Contains(r.cfg.Scenarios, ScenarioDrain) || slices.Contains(r.cfg.Scenarios, ScenarioLatency)
}

func (r *Runner) hasSource(s string) bool { return slices.Contains(r.cfg.Sources, s) }

// newCDCSlot names a slot (and publication) unique to one run on schema.
func newCDCSlot(schema string) string {
	return "pgoutbox_" + schema + "_" + randHex(3)
}

// sweepCDC drops the slots and publications bench runs killed before their
// cleanup left behind: inactive, named by cdcSlotPrefix, in this database, and
// serving a schema that no longer exists (a live run drops its slot before its
// schema). A slot left behind retains WAL for ever.
func (r *Runner) sweepCDC(ctx context.Context) {
	rows, err := r.admin.Query(ctx, `
SELECT slot_name FROM pg_replication_slots
 WHERE slot_name LIKE $1 || '%' AND NOT active AND database = current_database()
UNION
SELECT pubname FROM pg_publication WHERE pubname LIKE $1 || '%'`, strings.ReplaceAll(cdcSlotPrefix, "_", `\_`))
	if err != nil {
		r.cfg.Logger.Warn("could not look for leftover benchmark slots", slog.Any("error", err))
		return
	}
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return
	}
	for _, name := range names {
		schema := strings.TrimPrefix(name, "pgoutbox_")
		if i := strings.LastIndexByte(schema, '_'); i > 0 {
			schema = schema[:i]
		}
		var exists bool
		if err := r.admin.QueryRow(ctx, "SELECT EXISTS (SELECT FROM pg_namespace WHERE nspname = $1)", schema).Scan(&exists); err != nil || exists {
			continue
		}
		r.dropCDCObjects(ctx, name)
		r.cfg.Logger.Info("dropped a replication slot an earlier benchmark left behind", slog.String("slot", name))
	}
}

// dropCDCObjects drops an inactive slot and the publication of the same name.
func (r *Runner) dropCDCObjects(ctx context.Context, name string) error {
	_, err1 := r.admin.Exec(ctx, "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = $1 AND NOT active", name)
	_, err2 := r.admin.Exec(ctx, "DROP PUBLICATION IF EXISTS "+pgx.Identifier{name}.Sanitize())
	return errors.Join(err1, err2)
}

// waitSlotActive waits until the CDC relay streams from its slot: from then on,
// every commit reaches it through the stream rather than the table path.
func (r *Runner) waitSlotActive(ctx context.Context, slot string, procs []*relayProc) error {
	deadline := time.Now().Add(60 * time.Second)
	for {
		var active bool
		err := r.admin.QueryRow(ctx, "SELECT coalesce((SELECT active FROM pg_replication_slots WHERE slot_name = $1), false)", slot).Scan(&active)
		if err != nil {
			return fmt.Errorf("slot %s: %w", slot, err)
		}
		if active {
			return nil
		}
		if err := sampleAll(procs); err != nil {
			return err
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("slot %s not active 60s after the CDC relay started", slot)
		}
		select {
		case <-time.After(20 * time.Millisecond):
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// cleanupCDC stops the CDC relay, then runs `pgoutbox cdc disable`, which drops
// the slot and the publication (it must run after the relay stopped); should that
// fail, the slot is dropped directly once inactive. It runs on every way out of a
// CDC run, on errors and cancellation too, with a context of its own: a slot left
// behind retains WAL for ever.
func (r *Runner) cleanupCDC(procs *[]*relayProc, schema, slot string) {
	_ = stopRelays(*procs)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, r.cfg.Executable, "cdc", "disable",
		"--schema", schema, "--slot", slot, "--publication", slot)
	cmd.Env = append(relayEnv(), "DATABASE_URL="+r.cfg.DatabaseURL) // not in argv: ps shows argv
	out, err := cmd.CombinedOutput()
	if err == nil {
		return
	}
	r.cfg.Logger.Warn("pgoutbox cdc disable failed; dropping the slot directly", slog.String("slot", slot),
		slog.String("error", r.scrub(err.Error())), slog.String("output", r.scrub(strings.TrimSpace(string(out)))))
	for {
		var exists bool
		qerr := r.admin.QueryRow(ctx, "SELECT EXISTS (SELECT FROM pg_replication_slots WHERE slot_name = $1)", slot).Scan(&exists)
		if qerr == nil && !exists {
			break
		}
		if qerr == nil {
			qerr = r.dropCDCObjects(ctx, slot)
		}
		if ctx.Err() != nil {
			r.cfg.Logger.Error("could not drop the benchmark's replication slot: drop it by hand, it retains WAL",
				slog.String("slot", slot), slog.Any("error", qerr))
			return
		}
		time.Sleep(100 * time.Millisecond) // the walsender lets go of the slot soon after the relay exits
	}
	_, _ = r.admin.Exec(ctx, "DROP PUBLICATION IF EXISTS "+pgx.Identifier{slot}.Sanitize())
}

// relayEnv is the environment of pgoutbox subprocesses: without the variables
// that would add settings besides their flags. The callers add the URLs
// (DATABASE_URL, PGOUTBOX_BROKER), which stay out of the command line.
func relayEnv() []string {
	env := []string{}
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "PGOUTBOX_") && !strings.HasPrefix(kv, "DATABASE_URL=") {
			env = append(env, kv)
		}
	}
	return env
}
