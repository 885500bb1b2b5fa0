package cli

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"unicode"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/pflag"

	"github.com/pgoutbox/pgoutbox"
	"github.com/pgoutbox/pgoutbox/admin"
	"github.com/pgoutbox/pgoutbox/migrate"
)

// tenantFlags is the --tenants selector of the operator verbs: a tenant is one
// outbox schema of the database. It has no environment variable, like the dlq
// selection flags: a variable left set in a shell must never widen a command to
// other tenants.
type tenantFlags struct {
	raw    string
	owners string // --tenant-owner
	sel    migrate.Selector
	trust  migrate.Trust
	on     bool // --tenants was given
}

func (t *tenantFlags) register(fs *pflag.FlagSet, help string) {
	fs.StringVar(&t.raw, "tenants", "", "outbox schemas to work on, a comma list of names and globs ('tenant_*,billing'; '*' for every outbox "+
		"of the database) instead of --schema; "+help+" (no environment variable)")
	registerTenantOwner(fs, &t.owners, tenantOwnerHelp)
}

// registerTenantOwner declares --tenant-owner into dst, with help, for a verb
// whose tenants are chosen on its command line; it has no environment variable
// either. parseTenantOwner reads it.
func registerTenantOwner(fs *pflag.FlagSet, dst *string, help string) {
	fs.StringVar(dst, "tenant-owner", "", help+" (no environment variable)")
}

// parseTenantOwner reads --tenant-owner (migrate.ParseOwners).
func parseTenantOwner(owners string) (migrate.Trust, error) {
	trust, err := migrate.ParseOwners(owners)
	if err != nil {
		return trust, usagef("--tenant-owner: %v", err)
	}
	return trust, nil
}

// tenantOwnerHelp is the help of --tenant-owner, for the operator verbs and
// the relay.
const tenantOwnerHelp = "with --tenants: " + trustedOwnersHelp

// trustedOwnersHelp says what --tenant-owner names, whichever flag chooses the
// tenants.
const trustedOwnersHelp = "roles, a comma list, trusted to own a tenant's schema and tables besides superusers and the roles " +
	"holding this login's rights; other tenants are refused, as are tables with triggers, rules, policies or foreign code (docs/security.md)"

// parse checks --tenants and reports whether it was given. It refuses --schema
// (or PGOUTBOX_SCHEMA) beside it, and an empty selector: "every outbox" must
// be said with '*'.
func (t *tenantFlags) parse(fs *pflag.FlagSet) (bool, error) {
	f := fs.Lookup("tenants")
	if f == nil || !f.Changed {
		return false, nil
	}
	if s := fs.Lookup("schema"); s != nil && s.Changed {
		return false, usagef("--tenants chooses the schemas: give it or --schema (PGOUTBOX_SCHEMA), not both")
	}
	sel, err := parseSelector("--tenants", t.raw)
	if err != nil {
		return false, usageError{err}
	}
	if sel.IsZero() {
		return false, emptySelector("--tenants")
	}
	trust, err := parseTenantOwner(t.owners)
	if err != nil {
		return false, err
	}
	t.sel, t.trust, t.on = sel, trust, true
	return true, nil
}

// parseSelector parses a schema selector where it comes in: a flag, or a value
// of the tenants file, which where names ("--tenants", "line 3:
// databases[0].schemas"). It is the CLI's one call of migrate.ParseSelector, so
// that a bad selector reads the same wherever it is given ("--tenants: migrate:
// bad schema selector: item 2 is not a valid glob (path.Match)"), and never
// quotes the value. The Selector is passed on as it is: nothing parses it again.
func parseSelector(where, text string) (migrate.Selector, error) {
	sel, err := migrate.ParseSelector(text)
	if err != nil {
		return migrate.Selector{}, fmt.Errorf("%s: %w", where, err)
	}
	return sel, nil
}

// emptySelector refuses a selector of blanks only where "every outbox" must be
// said with '*'.
func emptySelector(where string) error {
	return usagef("%s is empty: give schema names or globs, or '*' for every outbox of the database", where)
}

// noTenantMatches is the error of an operator verb whose --tenants matches no
// outbox: never a healthy, empty answer for a mistyped selector.
func noTenantMatches(sel migrate.Selector) error {
	return fmt.Errorf("no outbox schema of this database matches --tenants %s", tenantName(sel.String()))
}

// tenantConcurrency is how many tenants the CLI reads at once (admin's default),
// and the size of its pool.
const tenantConcurrency = admin.DefaultTenantConcurrency

// listTenants lists the outboxes --tenants chooses; none is an error, so that a
// mistyped selector never looks like a healthy, empty database.
func listTenants(ctx context.Context, pool *pgxpool.Pool, t *tenantFlags) ([]string, error) {
	tenants, err := admin.Tenants(ctx, pool, t.sel)
	if err != nil {
		return nil, err
	}
	if len(tenants) == 0 {
		return nil, noTenantMatches(t.sel)
	}
	return tenants, nil
}

// oneTenant resolves --tenants for a verb that acts on one outbox: the selector
// must match exactly one, and it must be trusted (migrate.CheckTrusted) since
// the verb then works on it as on --schema.
func oneTenant(ctx context.Context, db *dbFlags, t *tenantFlags, verb, hint string) (string, error) {
	pool, err := db.openPool(ctx, 2)
	if err != nil {
		return "", err
	}
	defer pool.Close()
	tenants, err := listTenants(ctx, pool, t)
	if err != nil {
		return "", err
	}
	if len(tenants) > 1 {
		return "", usagef("%s acts on one outbox, but --tenants %s matches %d (%s): name one tenant%s", verb, tenantName(t.sel.String()),
			len(tenants), tenantList(tenants), hint)
	}
	if err := migrate.CheckTrusted(ctx, pool, tenants[0], t.trust); err != nil {
		return "", err
	}
	return tenants[0], nil
}

// findTenants sends each event id to the one tenant of --tenants holding it
// (admin.FindEvents): refused unless every id is found, each in one tenant.
func findTenants(ctx context.Context, db *dbFlags, t *tenantFlags, ids []pgoutbox.UUID) ([]admin.TenantIDs, error) {
	pool, err := db.openPool(ctx, tenantConcurrency)
	if err != nil {
		return nil, err
	}
	defer pool.Close()
	tenants, err := listTenants(ctx, pool, t)
	if err != nil {
		return nil, err
	}
	return admin.FindEvents(ctx, pool, tenants, ids, &admin.TenantsConfig{Trust: t.trust})
}

// tenantList names a few tenants for a message.
func tenantList(tenants []string) string {
	const most = 5
	var names []string
	for i, s := range tenants {
		if i == most {
			names = append(names, fmt.Sprintf("and %d more", len(tenants)-most))
			break
		}
		names = append(names, tenantName(s))
	}
	return strings.Join(names, ", ")
}

// tenantName prints a schema name on a terminal: as it is when every character
// is printable, quoted (Go syntax) when not, so that a hostile name can neither
// break a table nor send escape sequences to the terminal.
func tenantName(s string) string {
	if strings.IndexFunc(s, func(r rune) bool { return !unicode.IsPrint(r) }) >= 0 {
		return strconv.Quote(s)
	}
	return s
}

// errLine prints an error on one table cell: whitespace folded, unprintable
// characters replaced.
func errLine(err error) string {
	s := strings.Join(strings.Fields(err.Error()), " ")
	return strings.Map(func(r rune) rune {
		if !unicode.IsPrint(r) {
			return unicode.ReplacementChar
		}
		return r
	}, s)
}
