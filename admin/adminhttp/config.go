package adminhttp

import (
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/pgoutbox/pgoutbox/broker"
	"github.com/pgoutbox/pgoutbox/internal/config"
	"github.com/pgoutbox/pgoutbox/migrate"
)

// Defaults and limits of Config.
const (
	// DefaultRefresh is how often the pages refresh their live figures.
	DefaultRefresh = 5 * time.Second
	// DefaultMaxTenants is how many tenant rows the overview shows, worst first.
	DefaultMaxTenants = 200
	// DefaultReplayTimeout bounds one replay started from the console.
	DefaultReplayTimeout = 10 * time.Minute
	// DefaultQueryTimeout bounds the database work of one page or action.
	DefaultQueryTimeout = 30 * time.Second

	minRefresh   = time.Second
	maxTenants   = 10000
	csrfKeyBytes = 32
)

// Config configures the console handler. The zero value is not enough: say who
// may sign in (Users) or that nobody needs to (NoAuth).
type Config struct {
	// Schemas selects the outbox schemas the console shows, the tenants: names
	// and globs of path.Match ("tenant_*"), parsed where they come in
	// (migrate.ParseSelector: a flag, a file). The schemas are discovered
	// (migrate.Outboxes) at each page.
	//
	// The zero Selector means the single schema migrate.DefaultSchema
	// ("public"), as an empty list always did here: not every schema, which
	// is what it means to migrate.Outboxes and relay.Database. To show every
	// outbox, give the selector "*".
	Schemas migrate.Selector

	// Trust says who may own a tenant's schema and tables. Every page and
	// action on a tenant first checks it (migrate.CheckTenant): a tenant whose
	// owner is not trusted, or whose tables carry code pgoutbox did not create
	// (a trigger, rule, policy, foreign default or operator), is shown as
	// refused, with the reason, and no statement touches its tables. The zero
	// Trust trusts superusers and the roles holding the console's login's
	// rights (docs/security.md, "A tenant is a trust boundary").
	Trust migrate.Trust

	// Users are the people and programs who may sign in, with HTTP basic auth
	// (name and secret) or a bearer token (the secret). Load them with
	// LoadUsers or ParseUsers. Required unless NoAuth.
	Users []User

	// NoAuth serves every request as an operator without asking who it is. Only
	// for a console bound to a loopback address by an operator who said so
	// (pgoutbox console --insecure-loopback-no-auth), or mounted behind the
	// application's own authentication. Actions are audited as NoAuthActor.
	NoAuth bool

	// NoAuthActor names the operator in the audit when NoAuth is set. Defaults
	// to admin.DefaultActor() ("<os user>@<host>") followed by " (console, no auth)".
	NoAuthActor string

	// Publisher is where a replay started from the console publishes, and
	// Destination describes it in the audit and on the page (no credentials).
	// Nil means the replay page previews (dry run) only, and says so.
	Publisher   broker.Publisher
	Destination string

	// BasePath is the path prefix the handler is mounted under (with
	// http.StripPrefix), e.g. "/console"; the pages' links carry it. Empty means
	// the root.
	BasePath string

	// Refresh is how often the pages refresh their live figures, at least 1s.
	// Defaults to DefaultRefresh (5s).
	Refresh time.Duration

	// MaxTenants caps the tenant rows the overview shows (the page says how
	// many it left out), at most 10000. Every tenant (up to 10000) is read and
	// sorted worst first before the cut. Defaults to DefaultMaxTenants (200).
	MaxTenants int

	// ReplayTimeout bounds one replay started from the console. Defaults to
	// DefaultReplayTimeout (10m).
	ReplayTimeout time.Duration

	// QueryTimeout bounds the database work of one page or action (a replay
	// has ReplayTimeout instead); past it the page says the database did not
	// answer in time. Defaults to DefaultQueryTimeout (30s).
	QueryTimeout time.Duration

	// CSRFKey signs the forms' anti-forgery tokens: 32 bytes. Empty means a
	// random key made by New (tokens then last as long as the process). Give
	// every replica behind one load balancer the same key.
	CSRFKey []byte

	// Logger receives sign-in failures and the operators' actions. Nil means
	// slog.Default().
	Logger *slog.Logger
}

// Validate reports what New would reject in c: an error naming each bad field.
func (c *Config) Validate() error {
	_, err := c.withDefaults()
	return err
}

func (c *Config) withDefaults() (Config, error) {
	return config.Resolve("adminhttp", c, func(c *Config) {
		if c.Schemas.IsZero() {
			c.Schemas = migrate.DefaultSchemaSelector()
		}
		config.Default(&c.Refresh, DefaultRefresh)
		config.Default(&c.MaxTenants, DefaultMaxTenants)
		config.Default(&c.ReplayTimeout, DefaultReplayTimeout)
		config.Default(&c.QueryTimeout, DefaultQueryTimeout)
		if c.Logger == nil {
			c.Logger = slog.Default()
		}
		c.BasePath = strings.TrimRight(c.BasePath, "/")
	}, func(c *Config, p *config.Problems) {
		p.Field("Config.Trust", c.Trust.Validate())
		switch {
		case c.NoAuth && len(c.Users) > 0:
			p.Check(false, "Config.NoAuth and Config.Users: give one of them, not both")
		case !c.NoAuth && len(c.Users) == 0:
			p.Check(false, "Config.Users: nobody may sign in; give users (LoadUsers) or set Config.NoAuth explicitly")
		}
		p.Field("Config.Users", checkUsers(c.Users))
		p.Check(len(c.NoAuthActor) <= 200, "Config.NoAuthActor (%d bytes) must be at most 200 bytes", len(c.NoAuthActor))
		p.Check(c.Publisher == nil || strings.TrimSpace(c.Destination) != "",
			"Config.Destination: required with Config.Publisher (it is recorded in the audit of each replay)")
		p.Check(c.BasePath == "" || (strings.HasPrefix(c.BasePath, "/") && validPath(c.BasePath)),
			"Config.BasePath %q must start with / and hold only letters, digits and -._~/", c.BasePath)
		p.Check(c.Refresh >= minRefresh, "Config.Refresh (%s) must be at least %s", c.Refresh, minRefresh)
		p.Check(c.MaxTenants > 0 && c.MaxTenants <= maxTenants, "Config.MaxTenants (%d) must be in 1..%d", c.MaxTenants, maxTenants)
		p.Check(c.ReplayTimeout > 0, "Config.ReplayTimeout (%s) must be positive", c.ReplayTimeout)
		p.Check(c.QueryTimeout > 0, "Config.QueryTimeout (%s) must be positive", c.QueryTimeout)
		p.Check(len(c.CSRFKey) == 0 || len(c.CSRFKey) == csrfKeyBytes, "Config.CSRFKey (%d bytes) must be %d bytes", len(c.CSRFKey), csrfKeyBytes)
	})
}

func validPath(s string) bool {
	for _, r := range s {
		ok := r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("-._~/", r)
		if !ok {
			return false
		}
	}
	return !strings.Contains(s, "//") && !strings.Contains(s, "/../") && !strings.HasSuffix(s, "/..")
}

func newCSRFKey() ([]byte, error) {
	k := make([]byte, csrfKeyBytes)
	if _, err := rand.Read(k); err != nil {
		return nil, fmt.Errorf("adminhttp: make a CSRF key: %w", err)
	}
	return k, nil
}

// ErrNoPool is returned by New without a database pool.
var ErrNoPool = errors.New("adminhttp: no database pool")
