// Package cli implements the pgoutbox command: each verb is a cobra command built
// here, so that tests run the CLI in-process exactly as the binary does.
package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/pgoutbox/pgoutbox/migrate"
)

// Exit codes.
const (
	exitOK    = 0
	exitError = 1 // the command failed
	exitUsage = 2 // bad flags, arguments or configuration
)

// usageError marks errors in what the user asked for, which exit with exitUsage.
type usageError struct{ err error }

func (e usageError) Error() string { return e.err.Error() }
func (e usageError) Unwrap() error { return e.err }

func usagef(format string, args ...any) error { return usageError{fmt.Errorf(format, args...)} }

// Run executes the pgoutbox command line args (without the program name), writing
// output to stdout and errors to stderr, and returns the process exit code. ctx
// cancellation (SIGINT/SIGTERM in the binary) stops long-running verbs.
func Run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	root := newRoot(stdout, stderr)
	root.SetArgs(args)
	err := root.ExecuteContext(ctx)
	if err == nil {
		return exitOK
	}
	// One line, no stack trace: multi-line driver errors are folded.
	msg := strings.Join(strings.Fields(err.Error()), " ")
	fmt.Fprintf(stderr, "pgoutbox: %s\n", msg)
	var ue usageError
	if errors.As(err, &ue) {
		return exitUsage
	}
	return exitError
}

func newRoot(stdout, stderr io.Writer) *cobra.Command {
	root := &cobra.Command{
		Use:   "pgoutbox",
		Short: "Transactional outbox for Go services on PostgreSQL",
		Long: `pgoutbox writes events in the same transaction as your business rows and
publishes them to a broker after commit, at least once and in order per aggregate.

Configuration comes from flags, or from the environment variable named in each
flag's help (DATABASE_URL for the database).`,
		SilenceErrors: true,
		SilenceUsage:  true,
		RunE: func(c *cobra.Command, _ []string) error {
			return c.Help()
		},
	}
	root.SetOut(stdout)
	root.SetErr(stderr)
	root.SetFlagErrorFunc(func(c *cobra.Command, err error) error {
		return usagef("%s: %v (see '%s --help')", c.CommandPath(), err, c.CommandPath())
	})
	root.CompletionOptions.DisableDefaultCmd = true
	root.AddCommand(newMigrateCmd(), newVersionCmd(), newDemoCmd())
	// Unknown verbs and stray arguments are usage errors too.
	for _, c := range append(root.Commands(), root) {
		if c.Args == nil {
			c.Args = noArgs
		}
	}
	return root
}

func noArgs(c *cobra.Command, args []string) error {
	if len(args) == 0 {
		return nil
	}
	if c.HasSubCommands() {
		return usagef("unknown command %q for %s (see '%s --help')", args[0], c.CommandPath(), c.CommandPath())
	}
	return usagef("%s takes no arguments, got %q", c.CommandPath(), args)
}

// envString returns the environment variable's value, or def when it is unset.
func envString(name, def string) string {
	if v, ok := os.LookupEnv(name); ok {
		return v
	}
	return def
}

// dbFlags are the connection settings shared by every verb that talks to PostgreSQL.
type dbFlags struct {
	url            string
	schema         string
	connectTimeout time.Duration
}

func (d *dbFlags) register(fs *pflag.FlagSet) {
	fs.StringVar(&d.url, "database-url", os.Getenv("DATABASE_URL"),
		"PostgreSQL connection string, URL or key=value form (env DATABASE_URL)")
	fs.StringVar(&d.schema, "schema", envString("PGOUTBOX_SCHEMA", migrate.DefaultSchema),
		"PostgreSQL schema holding the outbox tables (env PGOUTBOX_SCHEMA)")
	d.connectTimeout = 10 * time.Second
	if v := os.Getenv("PGOUTBOX_CONNECT_TIMEOUT"); v != "" {
		if t, err := time.ParseDuration(v); err == nil {
			d.connectTimeout = t
		}
	}
	fs.DurationVar(&d.connectTimeout, "connect-timeout", d.connectTimeout,
		"give up connecting to PostgreSQL after this long (env PGOUTBOX_CONNECT_TIMEOUT)")
}

func (d *dbFlags) validate() error {
	if v := os.Getenv("PGOUTBOX_CONNECT_TIMEOUT"); v != "" {
		if _, err := time.ParseDuration(v); err != nil {
			return usagef("PGOUTBOX_CONNECT_TIMEOUT=%q is not a duration (e.g. 10s)", v)
		}
	}
	if d.connectTimeout <= 0 {
		return usagef("--connect-timeout must be positive, got %s", d.connectTimeout)
	}
	if err := migrate.ValidateSchema(d.schema); err != nil {
		return usagef("--schema: %v", err)
	}
	return nil
}

// connect opens one connection, failing fast with a one-line error for a missing,
// malformed or unreachable database.
func (d *dbFlags) connect(ctx context.Context) (*pgx.Conn, error) {
	if err := d.validate(); err != nil {
		return nil, err
	}
	if strings.TrimSpace(d.url) == "" {
		return nil, usagef("no database: set --database-url or DATABASE_URL (e.g. postgres://user@localhost:5432/app)")
	}
	cfg, err := pgx.ParseConfig(d.url)
	if err != nil {
		return nil, usagef("invalid database URL: %v", err)
	}
	cfg.ConnectTimeout = d.connectTimeout
	ctx, cancel := context.WithTimeout(ctx, d.connectTimeout)
	defer cancel()
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("connect to database: %w", err)
	}
	return conn, nil
}
