// Package cli implements the pgoutbox command: each verb is a cobra command built
// here, so that tests run the CLI in-process exactly as the binary does.
package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/pgoutbox/pgoutbox/internal/failpoint"
	"github.com/pgoutbox/pgoutbox/internal/redact"
	"github.com/pgoutbox/pgoutbox/migrate"
)

// Exit codes.
const (
	exitOK    = 0
	exitError = 1 // the command failed
	exitUsage = 2 // bad flags, arguments or configuration
)

// maxErrorLine bounds the error line a command ends with.
const maxErrorLine = 4096

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
	if ctx.Err() != nil && errors.Is(err, context.Canceled) {
		msg = "interrupted (SIGTERM or SIGINT) before it finished: " + msg
	}
	if len(msg) > maxErrorLine {
		// An error may quote what it refused (a selector, a name): whatever
		// its input, it is one line of bounded length.
		msg = fmt.Sprintf("%s… (%d more bytes not shown)", strings.ToValidUTF8(msg[:maxErrorLine], ""), len(msg)-maxErrorLine)
	}
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
	// Flags not given on the command line take the environment variable their help
	// names ("(env NAME)"): one rule for every verb, checked like the flag itself.
	root.PersistentPreRunE = func(c *cobra.Command, _ []string) error {
		if err := failpoint.EnvError(); err != nil {
			return usageError{err}
		}
		if err := applyEnv(c.Flags()); err != nil {
			return err
		}
		return checkBounds(c.Flags())
	}
	root.AddCommand(newMigrateCmd(), newRelayCmd(), newVersionCmd(), newDemoCmd(), newBenchCmd(), newStatusCmd(), newDLQCmd(), newReplayCmd(), newCleanupCmd(), newCDCCmd(), newConsoleCmd(), newDestinationsCmd())
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

var envInUsage = regexp.MustCompile(`\(env ([A-Z][A-Z0-9_]*)\)`)

// applyEnv sets each flag that was not given on the command line from the
// environment variable named in its usage, if that variable is set and non-empty.
func applyEnv(fs *pflag.FlagSet) error {
	var err error
	fs.VisitAll(func(f *pflag.Flag) {
		m := envInUsage.FindStringSubmatch(f.Usage)
		if err != nil || f.Changed || m == nil {
			return
		}
		v, ok := os.LookupEnv(m[1])
		if !ok || v == "" {
			return
		}
		if serr := fs.Set(f.Name, v); serr != nil {
			// The value may be a URL with credentials or a secret: shown redacted.
			shown, msg := strings.TrimPrefix(redact.Env(m[1]+"="+v), m[1]+"="), redact.Text(serr.Error())
			if redact.IsSecretName(m[1]) {
				msg = redact.Text(serr.Error(), v)
			}
			err = usagef("%s=%q (for --%s): %s", m[1], shown, f.Name, msg)
		}
	})
	return err
}

// durationFloors are the documented lower bounds (docs/operations.md, "Lower
// bounds") of every interval and timeout flag, whatever verb has it: a value
// below would make a command spin (--poll-interval 1ns ran 11,762 transactions in
// 4s) or give up before any server could answer. Flags whose zero means "off" or
// "the default" are listed in zeroOK.
var durationFloors = map[string]time.Duration{
	"poll-interval":   10 * time.Millisecond,
	"lease":           time.Second,
	"publish-timeout": 100 * time.Millisecond,
	"backoff-base":    10 * time.Millisecond,
	"backoff-max":     10 * time.Millisecond,
	// The relay's server-side bounds; 0 is their default.
	"statement-timeout": 10 * time.Millisecond,
	"lock-timeout":      10 * time.Millisecond,
	"ack-timeout":       100 * time.Millisecond,
	"connect-timeout":   100 * time.Millisecond,
	"shutdown-timeout":  100 * time.Millisecond,
	"cleanup-interval":  100 * time.Millisecond,
	"interval":          50 * time.Millisecond, // status --watch
	"retention":         time.Millisecond,      // and retentionFloor without --force
	"inbox-retention":   time.Millisecond,
	// relay --tenants: each listing is a catalog query per database.
	"discover-interval": 100 * time.Millisecond,
}

// boundsHelp documents durationFloors in the verbs' help.
const boundsHelp = `Lower bounds (exit status 2 below them, docs/operations.md "Lower bounds"):
--poll-interval 10ms, --lease 1s, --publish-timeout 100ms, --backoff-base and
--backoff-max 10ms, --statement-timeout and --lock-timeout 10ms (0: the default),
--ack-timeout 100ms, --connect-timeout 100ms, --shutdown-timeout
100ms, --cleanup-interval 100ms, --discover-interval 100ms, status --interval 50ms;
a --retention under 1h needs --force.`

// zeroOK are the flags of durationFloors whose 0 means "off" or "the default".
var zeroOK = map[string]bool{"cleanup-interval": true, "publish-timeout": true, "inbox-retention": true,
	"statement-timeout": true, "lock-timeout": true}

// retentionFloor is the shortest --retention accepted without --force: a
// shorter one deletes published events before a consumer's outage or a replay
// could need them.
const retentionFloor = time.Hour

// checkBounds is the one check of every verb's duration flags against
// durationFloors, and of --retention against retentionFloor (unless --force).
// It runs before every verb, after the environment was applied.
func checkBounds(fs *pflag.FlagSet) error {
	var err error
	fs.VisitAll(func(f *pflag.Flag) {
		floor, ok := durationFloors[f.Name]
		if err != nil || !ok || f.Value.Type() != "duration" {
			return
		}
		d, perr := time.ParseDuration(f.Value.String())
		if perr != nil {
			return
		}
		switch {
		case d == 0 && (zeroOK[f.Name] || !f.Changed):
		case d < 0:
			err = usagef("--%s must not be negative, got %s", f.Name, d)
		case d == 0:
			err = usagef("--%s must be positive, got %s", f.Name, d)
		case d < floor:
			err = usagef("--%s %s is below its lower bound of %s (docs/operations.md, \"Lower bounds\")", f.Name, d, floor)
		case f.Name == "retention" && d < retentionFloor:
			if force := fs.Lookup("force"); force == nil || force.Value.String() != "true" {
				err = usagef("--retention %s is below %s: published events would be deleted before a consumer outage or a replay could need them; pass --force if you mean it", d, retentionFloor)
			}
		}
	})
	return err
}

// dbFlags are the connection settings shared by every verb that talks to PostgreSQL.
type dbFlags struct {
	url            string
	schema         string
	connectTimeout time.Duration
}

func (d *dbFlags) register(fs *pflag.FlagSet) {
	fs.StringVar(&d.url, "database-url", "",
		"PostgreSQL connection string, URL or key=value form (env DATABASE_URL)")
	fs.StringVar(&d.schema, "schema", migrate.DefaultSchema,
		"PostgreSQL schema holding the outbox tables (env PGOUTBOX_SCHEMA)")
	fs.DurationVar(&d.connectTimeout, "connect-timeout", 10*time.Second,
		"give up connecting to PostgreSQL after this long; a multi-host URL shares it among its hosts, at least 2s each (env PGOUTBOX_CONNECT_TIMEOUT)")
}

func (d *dbFlags) validate() error {
	if d.connectTimeout <= 0 {
		return usagef("--connect-timeout must be positive, got %s", d.connectTimeout)
	}
	if err := migrate.ValidateSchema(d.schema); err != nil {
		return usagef("--schema: %v", err)
	}
	return nil
}

// parse checks the flags and returns the database URL's configuration.
func (d *dbFlags) parse() (*pgx.ConnConfig, error) {
	if err := d.validate(); err != nil {
		return nil, err
	}
	if strings.TrimSpace(d.url) == "" {
		return nil, usagef("no database: set --database-url or DATABASE_URL (e.g. postgres://user@localhost:5432/app)")
	}
	cfg, err := parseConnString("--database-url (DATABASE_URL)", d.url)
	if err != nil {
		return nil, err
	}
	cfg.ConnectTimeout = perHostConnectTimeout(d.connectTimeout, cfg.Config)
	return cfg, nil
}

// parseConnString parses a database URL or key=value connection string that
// source (a flag, an environment variable, an entry of a file) gave. Its
// error names source and the kind of problem, never any of the value
// (redact.ConnStringError): pgx's own error quotes it, hiding only the
// passwords it can recognise.
func parseConnString(source, s string) (*pgx.ConnConfig, error) {
	cfg, err := pgx.ParseConfig(s)
	if err != nil {
		return nil, usageError{redact.ConnStringError(source, err)}
	}
	return cfg, nil
}

// poolCloseTimeout bounds closing a service's pool once the service has
// stopped. Closing waits for every connection's goodbye and for connections
// still being made; on a hung database host (a frozen primary) that is
// pgx's own 15s per connection, although the service has nothing left to do:
// past the bound the process exits and the kernel closes the sockets.
const poolCloseTimeout = 2 * time.Second

// closePool closes pool, giving up waiting after poolCloseTimeout.
// newPool makes a verb's pool on conn, of at most maxConns connections, which
// pings only connections idle for over a minute (pingAfterLongIdle). It does
// not connect.
func newPool(ctx context.Context, conn *pgx.ConnConfig, maxConns int32) (*pgxpool.Pool, error) {
	poolCfg, err := pgxpool.ParseConfig("")
	if err != nil {
		return nil, err
	}
	poolCfg.ConnConfig = conn
	poolCfg.ShouldPing = pingAfterLongIdle
	poolCfg.MaxConns = maxConns
	return pgxpool.NewWithConfig(ctx, poolCfg)
}

// openPool is newPool on --database-url, connected within --connect-timeout:
// a database that does not answer fails the verb at once. The pool reconnects
// by itself later (status --watch, long-running verbs).
func (d *dbFlags) openPool(ctx context.Context, maxConns int32) (*pgxpool.Pool, error) {
	connCfg, err := d.parse()
	if err != nil {
		return nil, err
	}
	cctx, cancel := context.WithTimeout(ctx, d.connectTimeout)
	defer cancel()
	pool, err := newPool(cctx, connCfg, maxConns)
	if err != nil {
		return nil, fmt.Errorf("connect to database: %w", err)
	}
	if err := pool.Ping(cctx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("connect to database: %w", err)
	}
	return pool, nil
}

func closePool(pool *pgxpool.Pool, logger *slog.Logger) {
	done := make(chan struct{})
	go func() {
		pool.Close()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(poolCloseTimeout):
		logger.Warn("the database did not answer while its connections were closed; leaving them to the operating system",
			slog.Duration("waited", poolCloseTimeout))
	}
}

// minHostConnectTimeout is the least time a connection attempt gives one host
// of a multi-host URL.
const minHostConnectTimeout = 2 * time.Second

// perHostConnectTimeout shares total among the hosts of cfg: pgx gives each
// host the whole ConnectTimeout in turn, so on a multi-host URL whose first
// host hangs (a frozen primary: the TCP handshake succeeds, nothing answers)
// every new connection would spend all of --connect-timeout there before it
// tried the new primary. Each host gets an equal share, at least
// minHostConnectTimeout.
func perHostConnectTimeout(total time.Duration, cfg pgconn.Config) time.Duration {
	hosts := map[string]bool{net.JoinHostPort(cfg.Host, strconv.Itoa(int(cfg.Port))): true}
	for _, f := range cfg.Fallbacks {
		hosts[net.JoinHostPort(f.Host, strconv.Itoa(int(f.Port)))] = true
	}
	return max(total/time.Duration(len(hosts)), min(total, minHostConnectTimeout))
}

// connect opens one connection, failing fast with a one-line error for a missing,
// malformed or unreachable database.
func (d *dbFlags) connect(ctx context.Context) (*pgx.Conn, error) {
	cfg, err := d.parse()
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, d.connectTimeout)
	defer cancel()
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("connect to database: %w", err)
	}
	return conn, nil
}

// connectMigrated is connect for a verb that reads or writes the outbox tables:
// the connection is returned only once checkMigrated has found the schema
// migrated and of a compatible version.
func (d *dbFlags) connectMigrated(ctx context.Context) (*pgx.Conn, error) {
	conn, err := d.connect(ctx)
	if err != nil {
		return nil, err
	}
	if err := checkMigrated(ctx, conn, d.schema); err != nil {
		conn.Close(context.WithoutCancel(ctx))
		return nil, err
	}
	return conn, nil
}
