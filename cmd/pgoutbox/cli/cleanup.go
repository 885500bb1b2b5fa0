package cli

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"

	"github.com/pgoutbox/pgoutbox/admin"
	"github.com/pgoutbox/pgoutbox/internal/pgbound"
	"github.com/pgoutbox/pgoutbox/migrate"
)

func newCleanupCmd() *cobra.Command {
	var (
		db      dbFlags
		lf      logFlags
		cfg     admin.CleanupConfig
		asJSON  bool
		tenants tenantFlags
	)
	cmd := &cobra.Command{
		Use:   "cleanup",
		Short: "Delete published events older than the retention, in small batches",
		Long: `Delete published events whose published_at is older than --retention, and with
--inbox-retention the consumer inbox's dedup rows older than theirs. Unpublished
and quarantined events, the per-aggregate sequence counters and the audit of
skipped dead letters are never deleted.

Rows go in batches of --batch-size, each one short statement that commits on its
own and skips rows others hold, so relays and producers keep running at full
speed. On a partitioned outbox (migrate --partitioned), partitions ahead of time
are created and whole days older than the retention are dropped instead.

The retention is also how far back "pgoutbox replay" reaches. Dedup rows must be
kept at least as long as an event can be delivered again: --inbox-retention must
be at least --retention. It prints its progress on a terminal and a summary line
(--json: one JSON object). "pgoutbox relay --cleanup-interval" runs it periodically.

--dry-run prints what a run would delete now (published events, dedup rows, the
partitions it would drop) and deletes nothing. A --retention under 1h needs --force.

--tenants cleans many outboxes of the database, one after the other, with the
same flags (--inbox-retention: each tenant's inbox in its own schema), and prints
one row per tenant (--json: an array). A tenant that fails is reported in its row
and the others are still cleaned; the exit status is then 1.`,
		Example: `  pgoutbox cleanup                                  # 7 days
  pgoutbox cleanup --retention 72h --batch-size 10000
  pgoutbox cleanup --inbox-schema app --inbox-retention 336h --json
  pgoutbox cleanup --tenants 'tenant_*' --retention 72h`,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := db.validate(); err != nil {
				return err
			}
			switch {
			case cfg.Retention <= 0:
				return usagef("--retention must be positive, got %s", cfg.Retention)
			case cfg.BatchSize < 1:
				return usagef("--batch-size must be positive, got %d", cfg.BatchSize)
			case cfg.InboxRetention < 0:
				return usagef("--inbox-retention must not be negative, got %s", cfg.InboxRetention)
			case cfg.InboxRetention > 0 && cfg.InboxRetention < cfg.Retention:
				return usagef("--inbox-retention %s is shorter than --retention %s: an event replayed from the outbox could be applied twice",
					cfg.InboxRetention, cfg.Retention)
			case cfg.InboxSchema != "" && cfg.InboxRetention == 0:
				return usagef("--inbox-schema needs --inbox-retention")
			}
			many, err := tenants.parse(cmd.Flags())
			if err != nil {
				return err
			}
			if many {
				if cfg.InboxSchema != "" {
					return usagef("--inbox-schema (PGOUTBOX_INBOX_SCHEMA) does not go with --tenants: each tenant's inbox is in its own schema")
				}
				return runCleanupTenants(cmd.Context(), &db, &lf, &tenants, cfg, asJSON, cmd.OutOrStdout(), cmd.ErrOrStderr())
			}
			return runCleanup(cmd.Context(), &db, &lf, cfg, asJSON, cmd.OutOrStdout(), cmd.ErrOrStderr())
		},
	}
	fs := cmd.Flags()
	db.register(fs)
	lf.register(fs)
	fs.DurationVar(&cfg.Retention, "retention", admin.DefaultRetention, "keep published events this long after publishing (env PGOUTBOX_RETENTION)")
	fs.IntVar(&cfg.BatchSize, "batch-size", admin.DefaultCleanupBatchSize, "rows looked at and deleted per statement (env PGOUTBOX_CLEANUP_BATCH_SIZE)")
	fs.StringVar(&cfg.InboxSchema, "inbox-schema", "", "schema of processed_events (env PGOUTBOX_INBOX_SCHEMA) (default --schema)")
	fs.DurationVar(&cfg.InboxRetention, "inbox-retention", 0, "also delete dedup rows older than this; at least --retention (env PGOUTBOX_INBOX_RETENTION) (default off)")
	fs.BoolVar(&asJSON, "json", false, "print the summary as JSON (env PGOUTBOX_JSON)")
	fs.Bool("force", false, "accept a --retention below 1h (no environment variable: it must be said on the command line)")
	tenants.register(fs, "cleans each in turn, one result row per tenant")
	fs.BoolVar(&cfg.DryRun, "dry-run", false, "count what would be deleted (rows per table, partitions that would be dropped) and delete nothing")
	return cmd
}

// cleanupSummary is the --json output of pgoutbox cleanup.
type cleanupSummary struct {
	Cutoff            time.Time `json:"cutoff"`
	Deleted           int64     `json:"deleted"`
	Batches           int       `json:"batches"`
	DroppedPartitions []string  `json:"dropped_partitions"`
	DroppedRows       int64     `json:"dropped_rows"`
	CreatedPartitions []string  `json:"created_partitions"`
	InboxDeleted      int64     `json:"inbox_deleted"`
	DurationSeconds   float64   `json:"duration_seconds"`
	// DryRun: the counts are what a run would delete; nothing was.
	DryRun bool `json:"dry_run"`
}

func runCleanup(ctx context.Context, db *dbFlags, lf *logFlags, cfg admin.CleanupConfig, asJSON bool, stdout, stderr io.Writer) error {
	logger, err := lf.logger(stderr)
	if err != nil {
		return err
	}
	conn, err := db.connectMigrated(ctx)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if cfg.InboxRetention > 0 {
		if err := checkCompatible(ctx, conn, cmp.Or(cfg.InboxSchema, db.schema), migrate.LineInbox); err != nil {
			return err
		}
	}
	cfg.Schema, cfg.Logger = db.schema, logger
	tty := !asJSON && progressTTY(stdout)
	if tty {
		cfg.Progress = func(p admin.CleanupProgress) {
			fmt.Fprintf(stdout, "\rdeleted %d rows in %d batches, dropped %d partitions", p.Deleted, p.Batches, p.DroppedPartitions)
		}
	}
	res, err := admin.Cleanup(ctx, conn, cfg)
	if tty {
		fmt.Fprint(stdout, "\r\x1b[K")
	}
	if err != nil {
		if res.Batches > 0 || len(res.DroppedPartitions) > 0 {
			fmt.Fprintf(stdout, "stopped after deleting %d rows in %d batches and dropping %d partitions\n",
				res.Deleted, res.Batches, len(res.DroppedPartitions))
		}
		return err
	}
	if asJSON {
		enc := json.NewEncoder(stdout)
		return enc.Encode(cleanupSummary{
			Cutoff: res.Cutoff.UTC(), Deleted: res.Deleted, Batches: res.Batches,
			DroppedPartitions: nonNil(res.DroppedPartitions), DroppedRows: res.DroppedRows,
			CreatedPartitions: nonNil(res.CreatedPartitions), InboxDeleted: res.InboxDeleted,
			DurationSeconds: res.Duration.Seconds(), DryRun: cfg.DryRun,
		})
	}
	if cfg.DryRun {
		line := fmt.Sprintf("dry run: would delete %d published events older than %s (outbox_events)", res.Deleted,
			res.Cutoff.UTC().Format(time.RFC3339))
		if len(res.DroppedPartitions) > 0 {
			line += fmt.Sprintf(", drop %d partitions (%d rows: %s)", len(res.DroppedPartitions), res.DroppedRows,
				strings.Join(res.DroppedPartitions, ", "))
		}
		if cfg.InboxRetention > 0 {
			line += fmt.Sprintf(", delete %d dedup rows (processed_events)", res.InboxDeleted)
		}
		fmt.Fprintf(stdout, "%s; nothing deleted\n", line)
		return nil
	}
	line := fmt.Sprintf("deleted %d published events older than %s in %d batches", res.Deleted,
		res.Cutoff.UTC().Format(time.RFC3339), res.Batches)
	if len(res.DroppedPartitions) > 0 {
		line += fmt.Sprintf(", dropped %d partitions (%d rows: %s)", len(res.DroppedPartitions), res.DroppedRows,
			strings.Join(res.DroppedPartitions, ", "))
	}
	if len(res.CreatedPartitions) > 0 {
		line += fmt.Sprintf(", created %d partitions", len(res.CreatedPartitions))
	}
	if cfg.InboxRetention > 0 {
		line += fmt.Sprintf(", deleted %d dedup rows", res.InboxDeleted)
	}
	fmt.Fprintf(stdout, "%s in %s\n", line, res.Duration.Round(time.Millisecond))
	return nil
}

func nonNil(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}

// progressTTY reports whether w is a terminal, where progress is drawn on one
// line with carriage returns; elsewhere (a pipe, a file, a log) nothing is.
func progressTTY(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0 && os.Getenv("TERM") != "dumb"
}

// tenantCleanup is one row of cleanup --tenants (--json: an array of them).
type tenantCleanup struct {
	Tenant string `json:"tenant"`
	cleanupSummary
	// Error says why the tenant's cleanup failed or stopped; null when it ran.
	Error *string `json:"error"`
}

// runCleanupTenants is cleanup --tenants: each tenant in turn, so that the load on
// the database is one cleanup's, whatever the number of tenants.
func runCleanupTenants(ctx context.Context, db *dbFlags, lf *logFlags, tf *tenantFlags, cfg admin.CleanupConfig, asJSON bool,
	stdout, stderr io.Writer) error {
	logger, err := lf.logger(stderr)
	if err != nil {
		return err
	}
	pool, err := db.openPool(ctx, 2)
	if err != nil {
		return err
	}
	defer pool.Close()
	tenants, err := listTenants(ctx, pool, tf)
	if err != nil {
		return err
	}
	rows := make([]tenantCleanup, 0, len(tenants))
	failed := 0
	for _, tenant := range tenants {
		if ctx.Err() != nil {
			break
		}
		c := cfg
		c.Schema, c.Logger = tenant, logger.With("tenant", tenant)
		res, err := cleanupTenant(ctx, pool, c, tf.trust)
		row := tenantCleanup{Tenant: tenant, cleanupSummary: cleanupSummary{
			Cutoff: res.Cutoff.UTC(), Deleted: res.Deleted, Batches: res.Batches,
			DroppedPartitions: nonNil(res.DroppedPartitions), DroppedRows: res.DroppedRows,
			CreatedPartitions: nonNil(res.CreatedPartitions), InboxDeleted: res.InboxDeleted,
			DurationSeconds: res.Duration.Seconds(), DryRun: cfg.DryRun,
		}}
		if err != nil {
			failed++
			msg := errLine(err)
			row.Error = &msg
		}
		rows = append(rows, row)
	}
	if asJSON {
		if err := dlqWriteJSON(stdout, rows); err != nil {
			return err
		}
	} else if err := writeTenantCleanup(stdout, rows, cfg); err != nil {
		return err
	}
	switch {
	case ctx.Err() != nil:
		return fmt.Errorf("cleanup: stopped after %d of %d tenants: %w", len(rows), len(tenants), ctx.Err())
	case failed > 0:
		return fmt.Errorf("cleanup failed for %d of %d tenants (see their rows); the others were cleaned", failed, len(tenants))
	}
	return nil
}

// cleanupTenant checks one tenant's outbox (trusted first, then migrated, and
// its inbox with --inbox-retention) and cleans it. Every statement waits for a
// lock another session holds on the tenant's tables at most
// admin.DefaultTenantLockTimeout (pgbound.LockOnly: a cleanup's batches run as
// long as the data needs): a stuck tenant fails at once with an error wrapping
// admin.ErrTenantStuck, and the next is cleaned.
func cleanupTenant(ctx context.Context, pool *pgxpool.Pool, cfg admin.CleanupConfig, trust migrate.Trust) (admin.CleanupResult, error) {
	res, err := cleanupBounded(ctx, pgbound.LockOnly(admin.DefaultTenantLockTimeout).On(pool), cfg, trust)
	return res, admin.TenantStuck(err)
}

func cleanupBounded(ctx context.Context, pool *pgbound.Pool, cfg admin.CleanupConfig, trust migrate.Trust) (admin.CleanupResult, error) {
	if err := usageOnSkew(migrate.CheckTenant(ctx, pool, cfg.Schema, trust)); err != nil {
		return admin.CleanupResult{}, err
	}
	if cfg.InboxRetention > 0 {
		if err := checkCompatible(ctx, pool, cfg.Schema, migrate.LineInbox); err != nil {
			return admin.CleanupResult{}, err
		}
	}
	return admin.Cleanup(ctx, pool, cfg)
}

func writeTenantCleanup(w io.Writer, rows []tenantCleanup, cfg admin.CleanupConfig) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	verb := "DELETED"
	if cfg.DryRun {
		verb = "WOULD DELETE"
	}
	header := "TENANT\t" + verb + "\tBATCHES\tPARTITIONS DROPPED\tPARTITION ROWS"
	if cfg.InboxRetention > 0 {
		header += "\tDEDUP ROWS " + verb
	}
	fmt.Fprintln(tw, header+"\tDURATION\tERROR")
	for _, r := range rows {
		line := fmt.Sprintf("%s\t%d\t%d\t%d\t%d", tenantName(r.Tenant), r.Deleted, r.Batches, len(r.DroppedPartitions), r.DroppedRows)
		if cfg.InboxRetention > 0 {
			line += fmt.Sprintf("\t%d", r.InboxDeleted)
		}
		errText := "-"
		if r.Error != nil {
			errText = *r.Error
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\n", line, time.Duration(r.DurationSeconds*float64(time.Second)).Round(time.Millisecond), errText)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	summary := dlqPlural(len(rows), "tenant")
	for _, r := range rows {
		if !r.Cutoff.IsZero() {
			summary += ", published events older than about " + r.Cutoff.Format(time.RFC3339)
			break
		}
	}
	if cfg.DryRun {
		summary += "; dry run: nothing deleted"
	}
	_, err := fmt.Fprintln(w, summary)
	return err
}
