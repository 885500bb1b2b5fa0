package admin

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"golang.org/x/sync/errgroup"

	"github.com/pgoutbox/pgoutbox"
	"github.com/pgoutbox/pgoutbox/internal/config"
	"github.com/pgoutbox/pgoutbox/internal/pgbound"
	"github.com/pgoutbox/pgoutbox/migrate"
)

// A tenant is one outbox: a schema of one database that holds a migrated outbox
// (migrate.Outboxes). The across-tenants operations (StatusAll, QuarantinedAll)
// list the tenants a migrate.Selector chooses, then work on each with the same
// code as the one-outbox operations, a few at a time, each tenant's statements
// in a transaction of its own under server-side bounds (internal/pgbound:
// lock_timeout and statement_timeout). A tenant that fails (its schema not
// migrated, dropped mid-scan, unreadable for the role, its tables locked by
// another session: ErrTenantStuck) is reported in its row; the others are
// still read, and no pooled connection is closed for it.

// Defaults of TenantsConfig.
const (
	DefaultTenantConcurrency = 4
	DefaultTenantTimeout     = 10 * time.Second
	DefaultTenantLockTimeout = time.Second
)

// ErrTenantStuck is wrapped by a tenant's error when the server ended its
// statements at their bounds (TenantsConfig.LockTimeout, TenantsConfig.Timeout):
// another session holds a lock on the tenant's tables (a LOCK TABLE, a
// migration, rows locked FOR UPDATE), or its statements run too long. The
// tenant is skipped, never waited on; the wording is relay.ErrOutboxStuck's.
var ErrTenantStuck = errors.New("admin: the tenant's statements time out (a lock held by another session, or too slow)")

// ErrNotReadInTime is wrapped by a tenant's error when TenantsConfig.Budget
// ran out before the tenant was read.
var ErrNotReadInTime = errors.New("admin: the tenant was not read in time (TenantsConfig.Budget ran out)")

// TenantStuck returns err wrapped with ErrTenantStuck when it is the server
// ending a tenant's statement at its bounds (pgbound.Stuck), else err: the one
// classification of the across-tenants operations, for a caller that runs a
// tenant's statements under the same bounds itself (cleanup --tenants).
func TenantStuck(err error) error {
	if pgbound.Stuck(err) {
		return fmt.Errorf("%w: %w", ErrTenantStuck, err)
	}
	return err
}

// TenantsConfig bounds the work of an across-tenants operation. A nil
// *TenantsConfig and the zero value are ready to use; each field names its
// default.
type TenantsConfig struct {
	// Concurrency is how many tenants are read at once; the pool must allow
	// that many connections for it to be reached. Defaults to
	// DefaultTenantConcurrency (4).
	Concurrency int
	// Timeout bounds each statement of one tenant (statement_timeout, set for
	// the tenant's transaction alone): the server ends a longer one and the
	// tenant is reported with an error wrapping ErrTenantStuck. A client-side
	// backstop of twice that over the tenant's whole transaction guards
	// against a server that does not answer (an error wrapping
	// context.DeadlineExceeded). Defaults to DefaultTenantTimeout (10s).
	Timeout time.Duration
	// LockTimeout bounds each wait of a tenant's statements for a lock another
	// session holds on its tables (lock_timeout): past it the tenant is
	// reported with an error wrapping ErrTenantStuck and skipped. Defaults to
	// DefaultTenantLockTimeout (1s), or Timeout if shorter.
	LockTimeout time.Duration
	// Budget, when positive, bounds the reading of all the tenants: the
	// tenants not read when it runs out (their reads cut short, or never
	// started) are reported in their rows with an error wrapping
	// ErrNotReadInTime, and the operation returns what it read, for a caller
	// that must answer in time whatever the database's load (the console's
	// overview). Defaults to 0: no bound but ctx's.
	Budget time.Duration
	// Trust says who may own a tenant's schema and tables: a tenant whose
	// owner is not trusted, or whose tables carry objects pgoutbox did not
	// create, is refused (an error wrapping migrate.ErrUntrusted in its row)
	// before any statement touches its tables (migrate.CheckTrusted). The zero
	// Trust trusts superusers and the roles that already hold the rights of
	// the role the operation runs as.
	Trust migrate.Trust
}

func (c *TenantsConfig) withDefaults() (TenantsConfig, error) {
	return config.Resolve("admin", c, func(c *TenantsConfig) {
		config.Default(&c.Concurrency, DefaultTenantConcurrency)
		config.Default(&c.Timeout, DefaultTenantTimeout)
		config.Default(&c.LockTimeout, min(DefaultTenantLockTimeout, c.Timeout))
	}, func(c *TenantsConfig, p *config.Problems) {
		p.Check(c.Concurrency > 0, "TenantsConfig.Concurrency (%d) must be positive", c.Concurrency)
		p.Check(c.Timeout > 0, "TenantsConfig.Timeout (%s) must be positive", c.Timeout)
		p.Check(c.LockTimeout > 0, "TenantsConfig.LockTimeout (%s) must be positive", c.LockTimeout)
		p.Check(c.Budget >= 0, "TenantsConfig.Budget (%s) must not be negative", c.Budget)
		p.Field("TenantsConfig.Trust", c.Trust.Validate())
	})
}

// withTenants is withDefaults and the tenants sel chooses.
func (c *TenantsConfig) withTenants(ctx context.Context, pool *pgxpool.Pool, sel migrate.Selector) (TenantsConfig, []string, error) {
	cfg, err := c.withDefaults()
	if err != nil {
		return TenantsConfig{}, nil, err
	}
	tenants, err := Tenants(ctx, pool, sel)
	if err != nil {
		return TenantsConfig{}, nil, err
	}
	return cfg, tenants, nil
}

// Validate reports what the across-tenants operations would reject in c, zero
// fields meaning their defaults. A nil c is valid.
func (c *TenantsConfig) Validate() error {
	_, err := c.withDefaults()
	return err
}

// Tenants lists the outboxes of pool's database that sel chooses, in name order
// (migrate.Outboxes); the zero Selector chooses every outbox.
func Tenants(ctx context.Context, pool *pgxpool.Pool, sel migrate.Selector) ([]string, error) {
	tenants, err := migrate.Outboxes(ctx, pool, sel)
	if err != nil {
		return nil, fmt.Errorf("admin: list tenants: %w", err)
	}
	return tenants, nil
}

// CheckOutbox reports whether schema holds an outbox this binary can work on.
// The across-tenants operations check each tenant with migrate.CheckTenant,
// which first refuses an outbox whose owner is not trusted
// (TenantsConfig.Trust).
//
// Deprecated: use migrate.CheckMigrated, the one outbox check.
func CheckOutbox(ctx context.Context, db migrate.Querier, schema string) error {
	return migrate.CheckMigrated(ctx, db, schema)
}

// forTenants runs fn for each tenant, at most c.Concurrency at once, each in a
// transaction of its own on pool under c's bounds (pgbound.BeginFunc), and
// returns each tenant's error in tenants' order: one the server ended at its
// bounds wraps ErrTenantStuck, one c.Budget left unread ErrNotReadInTime. fn's
// statements go through tx. The transaction is committed when fn returns nil,
// so fn may change rows; a failed one is rolled back and its connection
// returns to the pool. forTenants returns early only when ctx ends, with ctx's
// error: what fn reported for the tenants read so far would then blame them
// for the caller's cancellation.
func forTenants(ctx context.Context, pool *pgxpool.Pool, c TenantsConfig, tenants []string,
	fn func(ctx context.Context, tx pgx.Tx, i int, tenant string) error) ([]error, error) {
	bd := pgbound.New(c.Timeout, c.LockTimeout)
	bctx := ctx // ends with the budget
	if c.Budget > 0 {
		var cancel context.CancelFunc
		bctx, cancel = context.WithTimeout(ctx, c.Budget)
		defer cancel()
	}
	notInTime := func(err error) error {
		if err == nil {
			return fmt.Errorf("%w: not started within %s", ErrNotReadInTime, c.Budget)
		}
		return fmt.Errorf("%w: cut short after %s: %w", ErrNotReadInTime, c.Budget, err)
	}
	errs := make([]error, len(tenants))
	started := make([]bool, len(tenants))
	var g errgroup.Group
	g.SetLimit(c.Concurrency)
	for i, tenant := range tenants {
		if bctx.Err() != nil {
			break
		}
		started[i] = true
		g.Go(func() error {
			if bctx.Err() != nil {
				errs[i] = notInTime(nil)
				return nil
			}
			tctx, cancel := context.WithTimeout(bctx, bd.Deadline())
			defer cancel()
			err := pgbound.BeginFunc(tctx, pool, bd, func(tx pgx.Tx) error { return fn(tctx, tx, i, tenant) })
			switch {
			case err == nil, ctx.Err() != nil:
			case bctx.Err() != nil:
				errs[i] = notInTime(err)
				return nil
			case errors.Is(tctx.Err(), context.DeadlineExceeded):
				err = fmt.Errorf("gave up after %s: %w", bd.Deadline(), err)
			}
			errs[i] = TenantStuck(err)
			return nil
		})
	}
	_ = g.Wait() // the goroutines report through errs
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	for i := range tenants {
		if !started[i] {
			errs[i] = notInTime(nil)
		}
	}
	return errs, nil
}

// TenantStatus is one tenant's row of StatusAll: the headline figures of its
// Status, or the error that kept them from being read.
type TenantStatus struct {
	// Tenant is the outbox's schema.
	Tenant string
	// The figures of Status (zero when Err is set); Leases are summed over the
	// relays.
	Pending             int64
	OldestPendingAge    Duration
	Quarantined         int64
	BackingOff          int64
	LeasesLive          int64
	LeasesExpired       int64
	PublishedLastMinute int64
	// Status is the tenant's whole snapshot (table sizes, leases per relay),
	// nil when Err is set. It is not written by MarshalJSON.
	Status *Status
	// Err says why the tenant could not be read; nil when it was.
	Err error
}

// tenantStatusJSON is the JSON form of a TenantStatus: always the same keys,
// "error" null when the tenant was read.
type tenantStatusJSON struct {
	Tenant              string   `json:"tenant"`
	Pending             int64    `json:"pending"`
	OldestPendingAge    Duration `json:"oldest_pending_age_seconds"`
	Quarantined         int64    `json:"quarantined"`
	BackingOff          int64    `json:"backing_off"`
	LeasesLive          int64    `json:"leases_live"`
	LeasesExpired       int64    `json:"leases_expired"`
	PublishedLastMinute int64    `json:"published_last_minute"`
	Error               *string  `json:"error"`
}

// MarshalJSON writes the row as one object: tenant, the figures (durations in
// seconds) and "error", a string or null.
func (t TenantStatus) MarshalJSON() ([]byte, error) {
	j := tenantStatusJSON{Tenant: t.Tenant, Pending: t.Pending, OldestPendingAge: t.OldestPendingAge,
		Quarantined: t.Quarantined, BackingOff: t.BackingOff, LeasesLive: t.LeasesLive,
		LeasesExpired: t.LeasesExpired, PublishedLastMinute: t.PublishedLastMinute}
	if t.Err != nil {
		msg := t.Err.Error()
		j.Error = &msg
	}
	return json.Marshal(j)
}

// StatusAll reads the status of every tenant of pool's database that sel chooses
// (the zero Selector: every outbox), each tenant's inbox being in its own schema.
// Each tenant is first checked to be trusted and a fully migrated outbox this
// binary knows (migrate.CheckTenant), then read with Admin.Status. The rows come worst first: the
// tenants that could not be read (those cfg.Budget left unread among them), then by oldest pending age, longest first, then
// by name.
//
// The error is non-nil only when the tenants could not be listed or ctx ended; a
// tenant that fails is reported in its row's Err and the others are read. pool
// must allow cfg.Concurrency connections for the reads to run that many at once.
func StatusAll(ctx context.Context, pool *pgxpool.Pool, sel migrate.Selector, cfg *TenantsConfig) ([]TenantStatus, error) {
	c, tenants, err := cfg.withTenants(ctx, pool, sel)
	if err != nil {
		return nil, err
	}
	return statusOf(ctx, pool, tenants, c)
}

// StatusOf is StatusAll for the given tenants (outbox schemas, taken as names,
// never as globs), in the same order: worst first.
func StatusOf(ctx context.Context, pool *pgxpool.Pool, tenants []string, cfg *TenantsConfig) ([]TenantStatus, error) {
	c, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	for _, t := range tenants {
		if err := migrate.ValidateSchema(t); err != nil {
			return nil, err
		}
	}
	return statusOf(ctx, pool, tenants, c)
}

// tenantAdmin is the Admin of tenant within its transaction tx, once
// migrate.CheckTenant found the tenant trusted and fully migrated.
func tenantAdmin(ctx context.Context, tx pgx.Tx, tenant string, c TenantsConfig) (*Admin, error) {
	if err := migrate.CheckTenant(ctx, tx, tenant, c.Trust); err != nil {
		return nil, err
	}
	return New(tx, &Config{Schema: tenant})
}

func statusOf(ctx context.Context, pool *pgxpool.Pool, tenants []string, c TenantsConfig) ([]TenantStatus, error) {
	rows := make([]TenantStatus, len(tenants))
	errs, err := forTenants(ctx, pool, c, tenants, func(ctx context.Context, tx pgx.Tx, i int, tenant string) error {
		a, err := tenantAdmin(ctx, tx, tenant, c)
		if err != nil {
			return err
		}
		st, err := a.Status(ctx)
		if err != nil {
			return err
		}
		rows[i].Status = st
		return nil
	})
	if err != nil {
		return nil, err
	}
	for i, tenant := range tenants {
		r := &rows[i]
		r.Tenant, r.Err = tenant, errs[i]
		if r.Err != nil || r.Status == nil {
			r.Status = nil
			continue
		}
		st := r.Status
		r.Pending, r.OldestPendingAge, r.Quarantined = st.Pending, st.OldestPendingAge, st.Quarantined
		r.BackingOff, r.PublishedLastMinute = st.BackingOff, st.PublishedLastMinute
		for _, l := range st.Leases {
			r.LeasesLive += l.Live
			r.LeasesExpired += l.Expired
		}
	}
	slices.SortStableFunc(rows, func(a, b TenantStatus) int {
		if (a.Err != nil) != (b.Err != nil) {
			if a.Err != nil {
				return -1
			}
			return 1
		}
		return cmp.Or(cmp.Compare(b.OldestPendingAge, a.OldestPendingAge), cmp.Compare(a.Tenant, b.Tenant))
	})
	return rows, nil
}

// TenantEvents is one tenant's part of QuarantinedAll.
type TenantEvents struct {
	Tenant string
	// Events are the tenant's quarantined events matching the filter, oldest
	// quarantine first.
	Events []Event
	// Err says why the tenant could not be read; nil when it was.
	Err error
}

// QuarantinedAll lists the quarantined events matching f (ListQuarantined) of
// every tenant sel chooses, one TenantEvents per tenant in name order. f.Limit
// applies to each tenant. The error is non-nil only when the tenants could not
// be listed or ctx ended; a tenant that fails is reported in its Err.
func QuarantinedAll(ctx context.Context, pool *pgxpool.Pool, sel migrate.Selector, f Filter, cfg *TenantsConfig) ([]TenantEvents, error) {
	c, tenants, err := cfg.withTenants(ctx, pool, sel)
	if err != nil {
		return nil, err
	}
	out := make([]TenantEvents, len(tenants))
	errs, err := forTenants(ctx, pool, c, tenants, func(ctx context.Context, tx pgx.Tx, i int, tenant string) error {
		a, err := tenantAdmin(ctx, tx, tenant, c)
		if err != nil {
			return err
		}
		out[i].Events, err = a.ListQuarantined(ctx, f)
		return err
	})
	if err != nil {
		return nil, err
	}
	for i, tenant := range tenants {
		out[i].Tenant, out[i].Err = tenant, errs[i]
		if out[i].Err != nil {
			out[i].Events = nil
		}
	}
	return out, nil
}

// ErrAmbiguousEvent is wrapped by FindEvents' error when an event id is found in
// more than one tenant (an outbox copied into another schema): acting on it
// could act on the wrong tenant.
var ErrAmbiguousEvent = errors.New("event id found in more than one tenant")

// TenantIDs are event ids of one tenant.
type TenantIDs struct {
	Tenant string
	IDs    []pgoutbox.UUID
}

// FindEvents says which of tenants holds each of ids (in any state), reading
// only, so that an action by event id can be sent to the one outbox that holds
// each event. It returns the ids grouped by tenant, tenants in the order given,
// ids in the order given. Every id must be found in exactly one tenant, and every
// tenant must be readable (the id might be in one that is not): otherwise the
// error wraps ErrNotFound, ErrAmbiguousEvent or the tenant's error, names the
// ids or tenants concerned, and nothing is returned.
func FindEvents(ctx context.Context, pool *pgxpool.Pool, tenants []string, ids []pgoutbox.UUID, cfg *TenantsConfig) ([]TenantIDs, error) {
	c, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	if len(ids) == 0 {
		return nil, ErrNoEvents
	}
	found := make([][]pgoutbox.UUID, len(tenants))
	errs, err := forTenants(ctx, pool, c, tenants, func(ctx context.Context, tx pgx.Tx, i int, tenant string) error {
		if err := migrate.CheckTenant(ctx, tx, tenant, c.Trust); err != nil {
			return err
		}
		rows, err := tx.Query(ctx, "SELECT event_id FROM "+pgx.Identifier{tenant, "outbox_events"}.Sanitize()+" WHERE event_id = ANY($1)", ids)
		if err != nil {
			return err
		}
		found[i], err = pgx.CollectRows(rows, pgx.RowTo[pgoutbox.UUID])
		return err
	})
	if err != nil {
		return nil, err
	}
	var bad []error
	for i, e := range errs {
		if e != nil {
			bad = append(bad, fmt.Errorf("tenant %q: %w", tenants[i], e))
		}
	}
	if len(bad) > 0 {
		return nil, fmt.Errorf("admin: find events: %w", errors.Join(bad...))
	}
	where := map[pgoutbox.UUID][]string{}
	for i, ids := range found {
		for _, id := range ids {
			where[id] = append(where[id], tenants[i])
		}
	}
	var missing, ambiguous []string
	for _, id := range ids {
		switch ts := where[id]; {
		case len(ts) == 0:
			missing = append(missing, id.String())
		case len(ts) > 1:
			ambiguous = append(ambiguous, fmt.Sprintf("%s (in %q)", id, ts))
		}
	}
	switch {
	case len(missing) > 0:
		return nil, fmt.Errorf("admin: find events: %w in the %d selected tenants: %s", ErrNotFound, len(tenants), strings.Join(missing, ", "))
	case len(ambiguous) > 0:
		return nil, fmt.Errorf("admin: find events: %w: %s", ErrAmbiguousEvent, strings.Join(ambiguous, ", "))
	}
	var out []TenantIDs
	for _, tenant := range tenants {
		var mine []pgoutbox.UUID
		for _, id := range ids {
			if where[id][0] == tenant && !slices.Contains(mine, id) {
				mine = append(mine, id)
			}
		}
		if len(mine) > 0 {
			out = append(out, TenantIDs{Tenant: tenant, IDs: mine})
		}
	}
	return out, nil
}
