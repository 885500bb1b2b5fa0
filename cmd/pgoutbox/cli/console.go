package cli

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/pgoutbox/pgoutbox/admin/adminhttp"
	"github.com/pgoutbox/pgoutbox/migrate"
)

// consoleUsersEnv holds the console's users in the users file's format, for
// deployments that pass secrets through the environment. It has no flag: a
// secret is never a flag value.
const consoleUsersEnv = "PGOUTBOX_CONSOLE_USERS"

type consoleFlags struct {
	db       dbFlags
	broker   brokerFlags
	log      logFlags
	listen   string
	schemas  []string
	owners   string // --tenant-owner
	authFile string
	noAuth   bool
	basePath string
	refresh  time.Duration
	stopMax  time.Duration
}

func newConsoleCmd() *cobra.Command {
	var f consoleFlags
	cmd := &cobra.Command{
		Use:   "console",
		Short: "Serve the web console: backlog, blocked lanes, dead letters, replay, relays",
		Long: `Serve pgoutbox's web console (docs/console.md) on --listen: the outboxes' backlog
and its age, the last hour's publishes and quarantines, blocked lanes, dead letters
(show, retry, skip with a reason), replay with a dry-run preview, relays and CDC
slots. The pages refresh themselves; every action is recorded in the operator audit
(pgoutbox dlq audit) with the signed-in user as the actor ("console:<name>").

Sign-in is required: HTTP basic auth or a bearer token, checked against the users
of --auth-file or of the environment variable PGOUTBOX_CONSOLE_USERS, one a line:

  # name   role       secret: a generated token of 32+ characters, or a password hash
  alice    operator   <the output of: openssl rand -hex 24>
  bob      viewer     <the output of: pgoutbox console hash-password>

A token signs in as a bearer token (or the basic-auth password); a password hash
(bcrypt as hash-password prints it, or argon2id as a PHC string) with basic auth, the
user's name and password. sha256: hashes are refused. Failed sign-ins
are limited per client, per user and in all (429 with Retry-After past the limits)
and logged at most once a minute per client, with their count.

Viewers see everything; operators also retry, skip and replay. Only on a loopback
address (127.0.0.1, [::1], localhost) may --insecure-loopback-no-auth turn sign-in
off: anyone who can open a connection on this machine then acts as an operator.

--schemas chooses the outboxes (tenants) shown: names and globs ("tenant_*"),
default --schema. Every page and action on a tenant first checks that its owner is
trusted (a superuser, this login and its members, the roles of --tenant-owner) and
that its tables carry no trigger, rule, policy or foreign code: a refused tenant is
shown as refused, with the reason, and nothing touches its tables. Without
--broker, replay previews only (a dry run); with it, replays publish there (the
same broker flags as pgoutbox replay).

SIGTERM or SIGINT stops it after the requests in flight, at most
--shutdown-timeout.`,
		Example: `  pgoutbox console --auth-file /etc/pgoutbox/console-users
  pgoutbox console --listen 127.0.0.1:8080 --insecure-loopback-no-auth
  PGOUTBOX_CONSOLE_USERS="ops operator $TOKEN" pgoutbox console --listen :8080 --schemas 'tenant_*' --broker nats://nats:4222`,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runConsole(cmd.Context(), &f, cmd.ErrOrStderr())
		},
	}
	fs := cmd.Flags()
	f.db.register(fs)
	f.broker.register(fs)
	f.log.register(fs)
	fs.StringVar(&f.listen, "listen", "127.0.0.1:8080", "host:port to serve the console on (env PGOUTBOX_CONSOLE_LISTEN)")
	fs.StringSliceVar(&f.schemas, "schemas", nil, "outbox schemas shown, names and globs such as tenant_* (env PGOUTBOX_CONSOLE_SCHEMAS) (default --schema)")
	registerTenantOwner(fs, &f.owners, "with --schemas: "+trustedOwnersHelp+"; a refused tenant's pages show why and its actions run nothing")
	fs.StringVar(&f.authFile, "auth-file", "", "file of the users who may sign in, \"<name> <viewer|operator> <secret>\" a line (env PGOUTBOX_CONSOLE_AUTH_FILE); or set "+consoleUsersEnv)
	// No environment variable: turning authentication off must be said on the command line.
	fs.BoolVar(&f.noAuth, "insecure-loopback-no-auth", false, "serve without sign-in; refused unless --listen is a loopback address")
	fs.StringVar(&f.basePath, "base-path", "", "path prefix the console is served under behind a reverse proxy, e.g. /console (env PGOUTBOX_CONSOLE_BASE_PATH)")
	fs.DurationVar(&f.refresh, "refresh", adminhttp.DefaultRefresh, "how often the pages refresh their figures (env PGOUTBOX_CONSOLE_REFRESH)")
	fs.DurationVar(&f.stopMax, "shutdown-timeout", 10*time.Second, "on SIGTERM, wait this long for requests in flight (env PGOUTBOX_SHUTDOWN_TIMEOUT)")
	cmd.AddCommand(newConsoleHashPasswordCmd())
	return cmd
}

func newConsoleHashPasswordCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "hash-password",
		Short: "Print the bcrypt hash of a password read from standard input, for the console's users",
		Long: `Read a password (one line, at least 12 bytes, no white space) from standard input and
print its bcrypt hash, the secret of a users' line of pgoutbox console. The password is
never an argument: it would show in the process list and the shell's history.

  read -rs PW && printf '%s\n' "$PW" | pgoutbox console hash-password`,
		// Not cobra.NoArgs: its error would repeat the argument, a password.
		Args: func(_ *cobra.Command, args []string) error {
			if len(args) > 0 {
				return usagef("hash-password takes no argument: give the password on standard input")
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, _ []string) error {
			line, err := bufio.NewReader(io.LimitReader(cmd.InOrStdin(), 1024)).ReadString('\n')
			if err != nil && !errors.Is(err, io.EOF) {
				return fmt.Errorf("read the password: %w", err)
			}
			h, err := adminhttp.HashPassword([]byte(strings.TrimRight(line, "\r\n")))
			if err != nil {
				return usageError{err}
			}
			_, err = fmt.Fprintln(cmd.OutOrStdout(), h)
			return err
		},
	}
}

// loopbackListen reports whether addr's host is a loopback address or
// "localhost"; an empty host (every interface) is not.
func loopbackListen(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil || host == "" {
		return false
	}
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// consoleUsers returns the users of --auth-file or PGOUTBOX_CONSOLE_USERS.
func consoleUsers(f *consoleFlags) ([]adminhttp.User, error) {
	env := os.Getenv(consoleUsersEnv)
	switch {
	case f.noAuth && (f.authFile != "" || env != ""):
		return nil, usagef("--insecure-loopback-no-auth and users (--auth-file or %s): give one of them", consoleUsersEnv)
	case f.noAuth:
		return nil, nil
	case f.authFile != "" && env != "":
		return nil, usagef("--auth-file and %s both give users: give one of them", consoleUsersEnv)
	case f.authFile != "":
		users, err := adminhttp.LoadUsers(f.authFile)
		if err != nil {
			return nil, usagef("--auth-file: %v", err)
		}
		return users, nil
	case env != "":
		// Lines may also be separated by ";" where a newline is awkward.
		users, err := adminhttp.ParseUsers(strings.NewReader(strings.ReplaceAll(env, ";", "\n")))
		if err != nil {
			return nil, usagef("%s: %v", consoleUsersEnv, err)
		}
		return users, nil
	}
	return nil, usagef("no users: set --auth-file or %s (\"<name> <viewer|operator> <secret>\" a line); "+
		"on a loopback address --insecure-loopback-no-auth serves without sign-in", consoleUsersEnv)
}

func runConsole(ctx context.Context, f *consoleFlags, stderr io.Writer) error {
	if err := f.db.validate(); err != nil {
		return err
	}
	if f.stopMax <= 0 {
		return usagef("--shutdown-timeout must be positive, got %s", f.stopMax)
	}
	if _, _, err := net.SplitHostPort(f.listen); err != nil {
		return usagef("--listen %q: want host:port, e.g. 127.0.0.1:8080", f.listen)
	}
	if f.noAuth && !loopbackListen(f.listen) {
		return usagef("--insecure-loopback-no-auth needs a loopback --listen (127.0.0.1, [::1] or localhost), got %q: "+
			"on any other address sign-in is required (--auth-file or %s)", f.listen, consoleUsersEnv)
	}
	users, err := consoleUsers(f)
	if err != nil {
		return err
	}
	logger, err := f.log.logger(stderr)
	if err != nil {
		return err
	}
	trust, err := parseTenantOwner(f.owners)
	if err != nil {
		return err
	}
	schemas, err := f.selector()
	if err != nil {
		return err
	}
	cfg := adminhttp.Config{Schemas: schemas, Trust: trust, Users: users, NoAuth: f.noAuth, BasePath: f.basePath, Refresh: f.refresh, Logger: logger}
	var target *brokerTarget
	if strings.TrimSpace(f.broker.url) != "" {
		if target, err = f.broker.parse(); err != nil {
			return err
		}
		cfg.Destination = target.describe()
	}
	if err := cfg.Validate(); err != nil {
		return usageError{consoleFlagNames(err)}
	}

	pool, err := f.db.openPool(ctx, 4)
	if err != nil {
		return err
	}
	defer closePool(pool, logger)
	cctx, cancel := context.WithTimeout(ctx, f.db.connectTimeout)
	defer cancel()
	found, err := migrate.Outboxes(cctx, pool, schemas)
	if err != nil {
		return err
	}
	if len(found) == 0 {
		return fmt.Errorf("no outbox schema matches %s in this database: run 'pgoutbox migrate' first, or check --schema/--schemas", schemas)
	}
	for _, s := range found {
		// Trust first: checkMigrated reads the tenant's tables. A refused
		// tenant does not stop the console (any role with CREATE could make
		// one): its pages say it is refused.
		if err := migrate.CheckTrusted(cctx, pool, s, trust); errors.Is(err, migrate.ErrUntrusted) {
			logger.Warn("console: tenant refused", slog.String("schema", s), slog.Any("error", err))
			continue
		} else if err != nil {
			return err
		}
		if err := checkMigrated(cctx, pool, s); err != nil {
			return err
		}
	}

	if target != nil {
		pub, closeBroker, err := target.open(ctx, logger)
		if err != nil {
			return err
		}
		defer closeBroker()
		cfg.Publisher = pub
	} else {
		logger.Info("no --broker: the replay page previews only (dry run)")
	}
	h, err := adminhttp.New(pool, &cfg)
	if err != nil {
		return usageError{consoleFlagNames(err)}
	}

	ln, err := net.Listen("tcp", f.listen)
	if err != nil {
		return usagef("--listen %s: %v", f.listen, err)
	}
	if f.noAuth {
		// The name resolved to something: it must still be loopback.
		if tcp, ok := ln.Addr().(*net.TCPAddr); !ok || !tcp.IP.IsLoopback() {
			ln.Close()
			return usagef("--insecure-loopback-no-auth: --listen %s resolved to %s, which is not loopback", f.listen, ln.Addr())
		}
		logger.Warn("the console runs WITHOUT sign-in (--insecure-loopback-no-auth): anyone who can connect to this machine's loopback acts as an operator")
	}
	srv := &http.Server{
		Handler:           h,
		ReadHeaderTimeout: 10 * time.Second,
		ReadTimeout:       30 * time.Second,
		// A replay runs while its page waits.
		WriteTimeout:   adminhttp.DefaultReplayTimeout + time.Minute,
		IdleTimeout:    2 * time.Minute,
		MaxHeaderBytes: 64 << 10,
		ErrorLog:       slog.NewLogLogger(logger.Handler(), slog.LevelWarn),
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	logger.Info("console listening", slog.String("url", "http://"+ln.Addr().String()+f.basePath+"/"),
		slog.String("schemas", strings.Join(found, ",")), slog.Int("users", len(users)))

	select {
	case <-ctx.Done(): // SIGTERM or SIGINT
	case err := <-served:
		return fmt.Errorf("console: serve: %w", err)
	}
	logger.Info("stopping: finishing requests in flight", slog.Duration("shutdown_timeout", f.stopMax))
	sctx, scancel := context.WithTimeout(context.Background(), f.stopMax)
	defer scancel()
	if err := srv.Shutdown(sctx); err != nil {
		_ = srv.Close()
		return fmt.Errorf("console: requests still in flight after --shutdown-timeout %s were cut", f.stopMax)
	}
	if err := <-served; err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("console: serve: %w", err)
	}
	return nil
}

// selector parses the tenants the console shows: --schemas, by default the one
// --schema. A --schemas of blanks only is refused, as --tenants is: the zero
// Selector would mean "public" to the console (adminhttp.Config.Schemas), not
// every outbox.
func (f *consoleFlags) selector() (migrate.Selector, error) {
	where, text := "--schemas", strings.Join(f.schemas, ",")
	if len(f.schemas) == 0 {
		where, text = "--schema", f.db.schema
	}
	sel, err := parseSelector(where, text)
	if err != nil {
		return sel, usageError{err}
	}
	if sel.IsZero() {
		return sel, emptySelector(where)
	}
	return sel, nil
}

// consoleFlagNames rewrites adminhttp.Config field names in err as the flags
// that set them.
func consoleFlagNames(err error) error {
	return errors.New(strings.NewReplacer("Config.BasePath", "--base-path",
		"Config.Refresh", "--refresh", "Config.Users", "users", "Config.Trust", "--tenant-owner").Replace(err.Error()))
}
