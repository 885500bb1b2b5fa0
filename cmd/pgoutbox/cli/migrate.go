package cli

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/pgoutbox/pgoutbox/migrate"
)

func newMigrateCmd() *cobra.Command {
	var db dbFlags
	var lines string
	var partitioned bool
	cmd := &cobra.Command{
		Use:   "migrate",
		Short: "Create or upgrade the outbox tables (safe to run any number of times)",
		Long: `Apply the missing migrations: outbox_events, the per-aggregate sequence
counters, the outbox_enqueue SQL function (line "outbox") and processed_events
(line "inbox"). Running it again is a no-op; several processes may run it at
once (an advisory lock serialises them).

--partitioned creates outbox_events partitioned by day (occurred_at), so that
cleanup drops whole days instead of deleting rows; see docs/design.md for the
trade-offs. It applies when the table is first created.

Use "pgoutbox migrate print" to get the SQL for your own migration tool, and
"pgoutbox migrate status" to see what a database has.`,
		Example: `  DATABASE_URL=postgres://app@db:5432/app pgoutbox migrate
  pgoutbox migrate --schema outbox --lines outbox
  pgoutbox migrate print --schema outbox > pgoutbox.sql`,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := migrateConfig(db.schema, lines)
			if err != nil {
				return err
			}
			cfg.Partitioned = partitioned
			conn, err := db.connect(cmd.Context())
			if err != nil {
				return err
			}
			defer conn.Close(cmd.Context())
			applied, err := migrate.Up(cmd.Context(), conn, cfg)
			for _, a := range applied {
				fmt.Fprintf(cmd.OutOrStdout(), "applied %s/%04d_%s\n", a.Line, a.Version, a.Name)
			}
			if errors.Is(err, migrate.ErrDatabaseNewer) {
				return usageError{err}
			}
			if err != nil {
				return err
			}
			if len(applied) == 0 {
				fmt.Fprintf(cmd.OutOrStdout(), "schema %s is up to date\n", cfg.Schema)
			}
			return nil
		},
	}
	db.register(cmd.Flags())
	cmd.Flags().StringVar(&lines, "lines", "all",
		`migration lines to apply: all, outbox, inbox, or a comma list (env PGOUTBOX_MIGRATE_LINES)`)
	cmd.Flags().BoolVar(&partitioned, "partitioned", false,
		"create outbox_events partitioned by day, so cleanup drops partitions (env PGOUTBOX_PARTITIONED)")

	cmd.AddCommand(newMigratePrintCmd(), newMigrateStatusCmd())
	return cmd
}

func migrateConfig(schema, lines string) (*migrate.Config, error) {
	if err := migrate.ValidateSchema(schema); err != nil {
		return nil, usagef("--schema: %v", err)
	}
	ls, err := migrate.ParseLines(lines)
	if err != nil {
		return nil, usagef("--lines: %v", err)
	}
	return &migrate.Config{Schema: schema, Lines: ls}, nil
}

func newMigratePrintCmd() *cobra.Command {
	var schema, lines, only string
	var partitioned, grants bool
	roles := map[migrate.Role]*string{}
	cmd := &cobra.Command{
		Use:   "print",
		Short: "Print the migration SQL instead of applying it",
		Long: `Print every migration as one idempotent SQL script, for teams that apply schema
changes with their own tool. The script also fills pgoutbox's bookkeeping table,
so a later "pgoutbox migrate" agrees that it is applied. No database is needed.

--grants prints instead the GRANT statements that give each role the least
privileges it needs (producer, enqueuer: a producer that may only call
outbox_enqueue, relay, CDC, consumer, operator; the migrator owns the objects),
for the role names of the --*-role flags. Run them as the objects'
owner after migrating. docs/security.md explains each grant.`,
		Example: `  pgoutbox migrate print --schema outbox > pgoutbox.sql
  pgoutbox migrate print --grants --schema outbox --producer-role app --relay-role relay`,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := migrateConfig(schema, lines)
			if err != nil {
				return err
			}
			cfg.Partitioned = partitioned
			if grants {
				return printGrants(cmd, cfg, only, roles)
			}
			for _, name := range append([]string{"roles"}, roleFlags(roles)...) {
				if cmd.Flags().Changed(name) {
					return usagef("--%s applies to --grants only", name)
				}
			}
			script, err := migrate.SQL(cfg)
			if err != nil {
				return err
			}
			_, err = fmt.Fprint(cmd.OutOrStdout(), script)
			return err
		},
	}
	cmd.Flags().StringVar(&schema, "schema", migrate.DefaultSchema,
		"PostgreSQL schema to create the objects in (env PGOUTBOX_SCHEMA)")
	cmd.Flags().StringVar(&lines, "lines", "all",
		"migration lines to print: all, outbox, inbox, or a comma list (env PGOUTBOX_MIGRATE_LINES)")
	cmd.Flags().BoolVar(&partitioned, "partitioned", false,
		"print the partitioned outbox_events (env PGOUTBOX_PARTITIONED)")
	cmd.Flags().BoolVar(&grants, "grants", false, "print the least-privilege GRANT statements for each role instead of the migrations")
	cmd.Flags().StringVar(&only, "roles", "all", "with --grants: the roles to grant to: all, or a comma list of producer, enqueuer, relay, cdc, consumer, operator")
	for _, r := range migrate.Roles[1:] { // the migrator owns the objects: nothing to grant
		roles[r] = cmd.Flags().String(string(r)+"-role", migrate.DefaultRoleName(r),
			fmt.Sprintf("with --grants: the database role of the %s", r))
	}
	return cmd
}

func roleFlags(roles map[migrate.Role]*string) []string {
	var out []string
	for r := range roles {
		out = append(out, string(r)+"-role")
	}
	return out
}

// printGrants writes migrate.Grants for the roles named by the flags.
func printGrants(cmd *cobra.Command, cfg *migrate.Config, only string, roles map[migrate.Role]*string) error {
	which, err := migrate.ParseRoles(only)
	if err != nil {
		return usagef("--roles: %v", err)
	}
	names := map[migrate.Role]string{}
	for r, n := range roles {
		if err := migrate.ValidateRoleName(*n); err != nil {
			return usagef("--%s-role: %v", r, err)
		}
		names[r] = *n
	}
	script, err := migrate.Grants(&migrate.GrantsConfig{Schema: cfg.Schema, Lines: cfg.Lines, Partitioned: cfg.Partitioned,
		RoleNames: names, Roles: which})
	if err != nil {
		return usageError{err}
	}
	_, err = fmt.Fprint(cmd.OutOrStdout(), script)
	return err
}

func newMigrateStatusCmd() *cobra.Command {
	var db dbFlags
	var lines string
	cmd := &cobra.Command{
		Use:   "status",
		Short: "List each migration and whether the database has it",
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := migrateConfig(db.schema, lines)
			if err != nil {
				return err
			}
			conn, err := db.connect(cmd.Context())
			if err != nil {
				return err
			}
			defer conn.Close(cmd.Context())
			st, err := migrate.State(cmd.Context(), conn, cfg)
			if err != nil {
				return err
			}
			w := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintln(w, "LINE\tVERSION\tNAME\tCOMPAT\tSTATE")
			for _, s := range st {
				state, compat := "pending", string(s.Compat)
				switch {
				case s.WithinWindow():
					state = "applied by a newer binary, within this binary's window"
				case s.Unknown:
					state = "applied, unknown to this binary (newer?)"
				case s.Applied:
					state = "applied"
				}
				if compat == "" {
					compat = "-"
				}
				fmt.Fprintf(w, "%s\t%d\t%s\t%s\t%s\n", s.Line, s.Version, s.Name, compat, state)
			}
			if err := w.Flush(); err != nil {
				return err
			}
			_, err = fmt.Fprintf(cmd.OutOrStdout(), "\nwindow: binaries that know %s run against this schema once migrated\n", migrate.WindowString(cfg.Lines...))
			return err
		},
	}
	db.register(cmd.Flags())
	cmd.Flags().StringVar(&lines, "lines", "all",
		"migration lines to list: all, outbox, inbox, or a comma list (env PGOUTBOX_MIGRATE_LINES)")
	return cmd
}

// warnAhead logs, at the start of a long-running service, the migrations a
// newer pgoutbox applied that this binary runs beside because they are expand
// steps (its compatibility window): a rollout in progress, and this binary is
// one to upgrade. Reading them failing is not fatal: the service's own checks
// have passed.
func warnAhead(ctx context.Context, q migrate.Querier, schema string, log *slog.Logger) {
	st, err := migrate.State(ctx, q, &migrate.Config{Schema: schema, Lines: []migrate.Line{migrate.LineOutbox}})
	if err != nil {
		log.Warn("could not list the migrations a newer pgoutbox applied", slog.Any("error", err))
		return
	}
	var ahead []string
	for _, s := range st {
		if s.WithinWindow() {
			ahead = append(ahead, fmt.Sprintf("%s/%d %s", s.Line, s.Version, s.Name))
		}
	}
	if len(ahead) > 0 {
		log.Warn("the database has migrations of a newer pgoutbox, all expand steps within this binary's window: it runs, and is one to upgrade",
			slog.String("schema", schema), slog.String("migrations", strings.Join(ahead, ", ")), slog.String("window", migrate.WindowString(migrate.LineOutbox)))
	}
}

// checkCompatible refuses a database migrated by a newer pgoutbox (version skew):
// a configuration error, exit 2, naming the unknown migrations. Every command
// that uses the outbox or inbox tables calls it at start (through checkMigrated).
func checkCompatible(ctx context.Context, q migrate.Querier, schema string, lines ...migrate.Line) error {
	return usageOnSkew(migrate.CheckCompatible(ctx, q, schema, lines...))
}

// usageOnSkew makes version skew (migrate.ErrDatabaseNewer) a configuration
// error, exit 2; other errors are returned as they are.
func usageOnSkew(err error) error {
	if errors.Is(err, migrate.ErrDatabaseNewer) {
		return usageError{err}
	}
	return err
}
