package relay

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgoutbox/pgoutbox/broker"
	"github.com/pgoutbox/pgoutbox/internal/config"
	"github.com/pgoutbox/pgoutbox/internal/lifecycle"
	"github.com/pgoutbox/pgoutbox/internal/pgbound"
	"github.com/pgoutbox/pgoutbox/migrate"
)

// DefaultDiscoverInterval is GroupConfig.DiscoverInterval's default.
const DefaultDiscoverInterval = 30 * time.Second

// Limits of a Group.
const (
	maxGroupDatabases = 1000
	maxTenantName     = 100
	// tenantStopTimeout bounds the graceful stop of an outbox that discovery
	// no longer finds; its leases then expire on their own.
	tenantStopTimeout = 10 * time.Second
)

// Database is one database of a Group and the outboxes it holds.
type Database struct {
	// Name names the database in logs and health reports; unique in the
	// Group. Empty means the pool's database name.
	Name string
	// Pool is the database's connection budget for the whole Group: every
	// outbox of the database claims and settles on it, so its MaxConns bounds
	// them all together. The hub's LISTEN and idle-lock sessions are two more
	// connections of their own (none with Config.DisableNotify).
	Pool *pgxpool.Pool
	// Schemas selects the outbox schemas to serve: names and globs, parsed
	// where they come in (migrate.ParseSelector). Every DiscoverInterval the
	// Group lists the schemas of the database that hold an outbox
	// (migrate.Outboxes) and serves those that match: outboxes come and go
	// without a restart. The zero Selector means every outbox schema of the
	// database.
	Schemas migrate.Selector
	// TenantPrefix is put before each schema's name to make its tenant name
	// (Message.Tenant, {tenant} in destinations), keeping apart the same schema
	// name in two databases. Tenant names hold letters, digits, '_' and '-'
	// only, at most 100 bytes: a schema whose tenant name would not is reported
	// and not served. Outboxes whose tenant names are equal (the same schema
	// in two databases without prefixes, or "a_" + "x" and "" + "a_x") are
	// all refused (ErrTenantNameClash), whatever the order of the databases
	// and whichever was served first; prefixes of which none begins another
	// ("eu-", "us-") make that impossible.
	TenantPrefix string
	// Trust says who may own a served outbox. Before an outbox is served, its
	// schema and tables must be owned by a trusted role and carry nothing
	// pgoutbox did not create (migrate.CheckTrusted): otherwise it is refused,
	// logged once and named by Healthy and Tenants, and none of its code runs.
	// The zero Trust trusts superusers and the roles that already hold the
	// rights of the role Pool connects as.
	Trust migrate.Trust
}

// GroupConfig configures a Group.
type GroupConfig struct {
	// Config is every outbox relay's configuration: ID, BatchSize, Workers,
	// Lease, backoffs, Logger, Observer (whose reports carry the Tenant). Its
	// Schema and Tenant must be empty: each outbox has its own. Destinations
	// must be empty too: a Group does not support destinations (NewGroup
	// refuses them); run a Relay per outbox with Config.Destinations.
	Config Config
	// Databases lists the databases served, at most 1000.
	Databases []Database
	// DiscoverInterval is how often each database's outboxes are listed again.
	// Zero means DefaultDiscoverInterval (30s).
	DiscoverInterval time.Duration
}

var tenantName = regexp.MustCompile(`^[A-Za-z0-9_-]+$`)

// ValidateTenant reports whether name can be a tenant name: 1 to 100 bytes
// of letters, digits, '_' and '-', so that it is safe in every broker's
// destination.
func ValidateTenant(name string) error {
	if len(name) == 0 || len(name) > maxTenantName || !tenantName.MatchString(name) {
		return fmt.Errorf("relay: tenant name %q must be 1 to %d bytes of letters, digits, '_' and '-'", name, maxTenantName)
	}
	return nil
}

// Validate reports every problem of the configuration as given, zero fields
// meaning their defaults, each naming its field ("relay group:
// GroupConfig.Databases[0].Pool must not be nil"), joined. Databases is
// required, so a nil or zero GroupConfig is invalid. NewGroup calls it.
func (c *GroupConfig) Validate() error {
	_, err := c.withDefaults()
	return err
}

func (c *GroupConfig) withDefaults() (GroupConfig, error) {
	return config.Resolve("relay group", c, func(c *GroupConfig) {
		config.Default(&c.DiscoverInterval, DefaultDiscoverInterval)
		c.Databases = slices.Clone(c.Databases)
		for i := range c.Databases {
			if d := &c.Databases[i]; d.Name == "" && d.Pool != nil {
				d.Name = d.Pool.Config().ConnConfig.Database
			}
		}
	}, func(c *GroupConfig, p *config.Problems) {
		p.Check(c.Config.Schema == "" && c.Config.Tenant == "",
			"GroupConfig.Config.Schema and .Tenant must be empty: each outbox has its own")
		if len(c.Config.Destinations) > 0 {
			p.Field("GroupConfig.Config.Destinations", errGroupDestinations)
		}
		p.Check(len(c.Databases) > 0 && len(c.Databases) <= maxGroupDatabases,
			"GroupConfig.Databases (%d) must hold 1..%d databases", len(c.Databases), maxGroupDatabases)
		p.Check(c.DiscoverInterval > 0, "GroupConfig.DiscoverInterval (%s) must be positive", c.DiscoverInterval)
		names := map[string]bool{}
		for i, d := range c.Databases {
			p.Check(d.Pool != nil, "GroupConfig.Databases[%d].Pool must not be nil", i)
			p.Check(d.Name != "" && !names[d.Name], "GroupConfig.Databases[%d].Name (%q) must be set and unique", i, d.Name)
			names[d.Name] = true
			p.Field(fmt.Sprintf("GroupConfig.Databases[%d].Trust", i), d.Trust.Validate())
			p.Check(d.TenantPrefix == "" || tenantName.MatchString(d.TenantPrefix),
				"GroupConfig.Databases[%d].TenantPrefix (%q) must hold letters, digits, '_' and '-' only", i, d.TenantPrefix)
		}
		one := c.Config
		one.Schema = migrate.DefaultSchema
		if _, err := one.withDefaults(); err != nil {
			p.Field("GroupConfig.Config", err)
		}
	})
}

// Group serves many outboxes, in several schemas of several databases, from
// one process: a relay per outbox, with each one's guarantees (leases, lanes,
// quarantine, per-aggregate order), sharing per database one pool, one LISTEN
// session, one idle-lock session and one poll statement (see hub). Each
// outbox's relay has Config.Workers workers of its own, so one outbox's
// backlog cannot hold the others' claims: they wait for a connection of the
// pool, which serves waiters in order, never for the backlog.
//
// An outbox that cannot be served (its schema not migrated, refused, or gone)
// is reported by Healthy and Tenants and left out; the others keep flowing.
// So is an outbox whose tables another session keeps locked (its owner, a
// migration of it): each statement waits for a lock at most
// Config.LockTimeout, the outbox is reported (ErrOutboxStuck) and retried
// with backoff, and the shared pool and probe go on without it.
// Any number of Groups and Relays may serve the same outboxes: they coordinate
// through PostgreSQL alone.
//
// Start and Stop follow the rule of Relay.Start.
type Group struct {
	cfg GroupConfig
	pub broker.Publisher
	log *slog.Logger
	lc  lifecycle.Lifecycle
	dbs []*groupDB
	// bounds are the relays' (Config.StatementTimeout, Config.LockTimeout),
	// for the check of a new outbox: its owner's locks (a migration under
	// way) must not hold up discovering and serving the others.
	bounds pgbound.Bounds

	// names holds each served tenant name's database: a name is reserved
	// before its relay starts, so that two outboxes never publish under one
	// name (their events would share destinations).
	namesMu sync.Mutex
	names   map[string]*groupDB
}

type groupDB struct {
	Database
	hub *hub

	mu       sync.Mutex
	tenants  map[string]*tenant // by schema: served
	problems map[string]error   // by schema: selected, not served, and why
	listErr  error              // the last listing's failure, nil once it works
}

type tenant struct {
	name  string
	relay *Relay
}

// NewGroup returns a Group publishing with pub. Invalid settings are reported
// here; the outboxes are listed when it starts.
func NewGroup(pub broker.Publisher, cfg *GroupConfig) (*Group, error) {
	if pub == nil || cfg == nil {
		return nil, errors.New("relay: NewGroup needs a publisher and a config")
	}
	c, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	one := c.Config
	one.Schema = migrate.DefaultSchema
	resolved, _ := one.withDefaults()
	c.Config.ID = resolved.ID
	g := &Group{cfg: c, pub: pub, log: resolved.Logger.With(slog.String("relay", resolved.ID)), names: map[string]*groupDB{},
		bounds: pgbound.New(resolved.StatementTimeout, resolved.LockTimeout)}
	for _, d := range c.Databases {
		g.dbs = append(g.dbs, &groupDB{
			Database: d,
			hub:      newHub(d.Pool, g.log.With(slog.String("database", d.Name)), &resolved),
			tenants:  map[string]*tenant{},
			problems: map[string]error{},
		})
	}
	g.lc.Name = "relay group"
	g.lc.Stopped = g.stopped
	return g, nil
}

// Start lists each database's outboxes, starts a relay for each, and keeps
// listing them every DiscoverInterval. A database that cannot be listed is
// reported by Healthy and listed again later.
func (g *Group) Start(ctx context.Context) error {
	return g.lc.Start(ctx, func(context.Context) error {
		g.log.Info("relay group starting", slog.Int("databases", len(g.dbs)), slog.Duration("discover_interval", g.cfg.DiscoverInterval))
		for _, d := range g.dbs {
			if err := d.hub.start(context.WithoutCancel(g.lc.Hard())); err != nil {
				return err
			}
		}
		g.discover()
		discovering := make(chan struct{})
		g.lc.Go(func() {
			defer close(discovering)
			g.rediscover()
		})
		// The relays stop once discovery has: gracefully, and hard when the
		// Group's stop turns hard (its Hard context ends).
		g.lc.Go(func() {
			<-discovering
			if err := g.stopRelays(g.lc.Hard()); err != nil {
				g.log.Warn("relay group stopped hard", slog.Any("error", err))
			}
		})
		return nil
	})
}

// Stop stops every outbox's relay as Relay.Stop does, all at once, and then
// the Group. See Start for the rule of Start and Stop.
func (g *Group) Stop(ctx context.Context) error { return g.lc.Stop(ctx) }

// stopped runs once the relays have stopped.
func (g *Group) stopped(bool) { g.log.Info("relay group stopped") }

// stopRelays stops every relay and then the hubs.
func (g *Group) stopRelays(ctx context.Context) error {
	var wg sync.WaitGroup
	errs := make(chan error, 1)
	for _, d := range g.dbs {
		d.mu.Lock()
		for schema, t := range d.tenants {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if err := t.relay.Stop(ctx); err != nil {
					select {
					case errs <- fmt.Errorf("tenant %s: %w", t.name, err):
					default:
					}
				}
			}()
			d.hub.remove(t.relay)
			delete(d.tenants, schema)
		}
		d.mu.Unlock()
	}
	wg.Wait()
	for _, d := range g.dbs {
		_ = d.hub.stop(ctx)
	}
	select {
	case err := <-errs:
		return err
	default:
		return nil
	}
}

func (g *Group) rediscover() {
	t := time.NewTicker(g.cfg.DiscoverInterval)
	defer t.Stop()
	for {
		select {
		case <-g.lc.Stopping():
			return
		case <-t.C:
			g.discover()
		}
	}
}

// discover lists every database's outboxes, all at once, then refuses every
// tenant name that two outboxes would share (clashes), and, database by
// database, starts relays for the new outboxes and stops those gone.
func (g *Group) discover() {
	var wg sync.WaitGroup
	listed := make([][]string, len(g.dbs))
	errs := make([]error, len(g.dbs))
	// A listing is no work in flight: a stop, even one that begins during
	// Start's first listing (SIGTERM while a database hangs), ends it at once.
	stoppable, cancelAll := g.lc.Grace(g.lc.Hard(), 0)
	defer cancelAll()
	for i, d := range g.dbs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(stoppable, discoverTimeout)
			defer cancel()
			listed[i], errs[i] = migrate.Outboxes(ctx, d.Pool, d.Schemas)
		}()
	}
	wg.Wait()
	if g.lc.IsStopping() {
		return
	}
	clash := g.clashes(listed, errs)
	for i, d := range g.dbs {
		if errs[i] != nil {
			// Its outboxes found before keep being served, unless a name clashes.
			for schema, err := range clash[d] {
				g.refuse(d, schema, err)
			}
		}
		g.reconcile(d, listed[i], errs[i], clash[d])
	}
}

// ErrTenantNameClash is wrapped by the error that refuses an outbox whose
// tenant name (TenantPrefix + schema) another outbox of the Group also has.
var ErrTenantNameClash = errors.New("relay: two outboxes have the same tenant name")

// clashes finds the outboxes whose tenant name is another's too, among those
// just listed and, for a database that could not be listed, those it serves.
// Every one of them is refused, whatever the order of the databases and
// whichever was served first: one name for two outboxes would send both
// outboxes' events to the same destinations, where a consumer takes one's
// event for a duplicate of the other's (same aggregate and sequence).
func (g *Group) clashes(listed [][]string, errs []error) map[*groupDB]map[string]error {
	type source struct {
		d      *groupDB
		schema string
	}
	byName := map[string][]source{}
	for i, d := range g.dbs {
		schemas := listed[i]
		if errs[i] != nil {
			d.mu.Lock()
			schemas = slices.Collect(maps.Keys(d.tenants))
			d.mu.Unlock()
		}
		for _, s := range schemas {
			name := d.TenantPrefix + s
			byName[name] = append(byName[name], source{d, s})
		}
	}
	out := map[*groupDB]map[string]error{}
	for name, srcs := range byName {
		if len(srcs) < 2 {
			continue
		}
		// Named in a fixed order, so that the message (logged when it changes)
		// is the same at every listing.
		slices.SortFunc(srcs, func(a, b source) int {
			return cmp.Or(strings.Compare(a.d.Name, b.d.Name), strings.Compare(a.schema, b.schema))
		})
		var where []string
		for _, src := range srcs {
			where = append(where, fmt.Sprintf("schema %q of database %q", src.schema, src.d.Name))
		}
		err := fmt.Errorf("%w: %q is the tenant name of %s: none of them is served until the databases' TenantPrefix (tenant_prefix) tell them apart",
			ErrTenantNameClash, name, strings.Join(where, " and "))
		for _, src := range srcs {
			if out[src.d] == nil {
				out[src.d] = map[string]error{}
			}
			out[src.d][src.schema] = err
		}
	}
	return out
}

// refuse records why schema of d is not served, logging it when it changed,
// and stops its relay if it had one.
func (g *Group) refuse(d *groupDB, schema string, err error) {
	d.mu.Lock()
	t := d.tenants[schema]
	if t != nil {
		d.hub.remove(t.relay)
		delete(d.tenants, schema)
	}
	prev, seen := d.problems[schema]
	d.problems[schema] = err
	d.mu.Unlock()
	if !seen || prev.Error() != err.Error() {
		d.hub.log.Error("outbox not served", slog.String("schema", schema), slog.Any("error", err))
	}
	if t != nil {
		sctx, cancel := context.WithTimeout(context.Background(), tenantStopTimeout)
		_ = t.relay.Stop(sctx)
		cancel()
		g.release(t.name)
	}
}

// discoverTimeout bounds listing a database's outboxes, and checking the new
// ones.
const discoverTimeout = 10 * time.Second

// reconcile serves the outboxes of d that listing found, except those whose
// tenant name clashes (refused), and lets go those it no longer finds.
func (g *Group) reconcile(d *groupDB, schemas []string, err error, clash map[string]error) {
	ctx, cancel := context.WithTimeout(g.lc.Hard(), discoverTimeout)
	defer cancel()
	d.mu.Lock()
	prev := d.listErr
	d.listErr = err
	d.mu.Unlock()
	if err != nil {
		if prev == nil {
			d.hub.log.Warn("cannot list the outboxes; serving those found before", slog.Any("error", err))
		}
		return
	}
	if prev != nil {
		d.hub.log.Info("outboxes listed again")
	}
	found := map[string]bool{}
	for _, s := range schemas {
		found[s] = true
		if err := clash[s]; err != nil {
			g.refuse(d, s, err)
			continue
		}
		d.mu.Lock()
		_, served := d.tenants[s]
		d.mu.Unlock()
		if !served {
			g.serve(ctx, d, s)
		} else if err := migrate.CheckTrusted(ctx, d.Pool, s, d.Trust); errors.Is(err, migrate.ErrUntrusted) {
			// Checked again at every listing: an owner changed or a trigger
			// added since the outbox was found stops its relay.
			g.refuse(d, s, err)
		}
	}
	d.mu.Lock()
	var gone []*tenant
	for s, t := range d.tenants {
		if !found[s] {
			gone = append(gone, t)
			d.hub.remove(t.relay)
			delete(d.tenants, s)
		}
	}
	for s := range d.problems {
		if !found[s] {
			delete(d.problems, s)
		}
	}
	d.mu.Unlock()
	for _, t := range gone {
		d.hub.log.Info("outbox gone: stopping its relay", slog.String("tenant", t.name))
		sctx, cancel := context.WithTimeout(context.Background(), tenantStopTimeout)
		_ = t.relay.Stop(sctx)
		cancel()
		g.release(t.name)
	}
}

// serve checks schema's outbox and starts its relay, or records why not.
func (g *Group) serve(ctx context.Context, d *groupDB, schema string) {
	name := d.TenantPrefix + schema
	r, err := g.start(ctx, d, schema, name)
	if err != nil {
		g.refuse(d, schema, err)
		return
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	delete(d.problems, schema)
	d.tenants[schema] = &tenant{name: name, relay: r}
	d.hub.add(r)
	d.hub.log.Info("serving outbox", slog.String("tenant", name), slog.String("schema", schema))
}

// start reserves the tenant name, checks the outbox and starts its relay.
func (g *Group) start(ctx context.Context, d *groupDB, schema, name string) (*Relay, error) {
	if err := ValidateTenant(name); err != nil {
		return nil, err
	}
	if err := g.reserve(name, d); err != nil {
		return nil, err
	}
	r, err := func() (*Relay, error) {
		if err := pgbound.BeginFunc(ctx, d.Pool, g.bounds, func(tx pgx.Tx) error { return migrate.CheckTenant(ctx, tx, schema, d.Trust) }); err != nil {
			return nil, err
		}
		cfg := g.cfg.Config
		cfg.Schema, cfg.Tenant = schema, name
		r, err := newRelay(d.Pool, g.pub, &cfg, d.hub)
		if err != nil {
			return nil, err
		}
		// Not stopped through this context, but by stopRelays.
		return r, r.Start(context.WithoutCancel(g.lc.Hard()))
	}()
	if err != nil {
		g.release(name)
		return nil, err
	}
	return r, nil
}

// reserve records that d serves the tenant name, unless another database
// does.
func (g *Group) reserve(name string, d *groupDB) error {
	g.namesMu.Lock()
	defer g.namesMu.Unlock()
	if o := g.names[name]; o != nil && o != d {
		return fmt.Errorf("relay: tenant name %q is already served from database %q: set a TenantPrefix", name, o.Name)
	}
	g.names[name] = d
	return nil
}

// release frees a tenant name.
func (g *Group) release(name string) {
	g.namesMu.Lock()
	delete(g.names, name)
	g.namesMu.Unlock()
}

// TenantState is one outbox of a Group, served or not.
type TenantState struct {
	Database string
	Schema   string
	Tenant   string
	// Serving is true while a relay publishes the outbox's events.
	Serving bool
	// Err is why the outbox is not served, or the relay's health (Relay.Healthy).
	Err error
	// Stats are the relay's counters; zero when not served.
	Stats Stats
	// Pool is the database's pool (Database.Pool).
	Pool *pgxpool.Pool
}

// Tenants returns the state of every outbox selected, in database and
// schema order.
func (g *Group) Tenants() []TenantState {
	var out []TenantState
	for _, d := range g.dbs {
		var part []TenantState
		d.mu.Lock()
		for s, t := range d.tenants {
			part = append(part, TenantState{Database: d.Name, Schema: s, Tenant: t.name, Serving: true,
				Err: t.relay.Healthy(), Stats: t.relay.Stats(), Pool: d.Pool})
		}
		for s, err := range d.problems {
			part = append(part, TenantState{Database: d.Name, Schema: s, Tenant: d.TenantPrefix + s, Err: err, Pool: d.Pool})
		}
		d.mu.Unlock()
		slices.SortFunc(part, func(a, b TenantState) int { return strings.Compare(a.Schema, b.Schema) })
		out = append(out, part...)
	}
	return out
}

// ErrNotServed is TenantHealthy's answer for an outbox the Group does not
// serve (not selected, gone, or refused: Tenants says why).
var ErrNotServed = errors.New("relay: outbox not served")

// TenantHealthy is the health (Relay.Healthy) of the relay serving schema in
// database, or ErrNotServed.
func (g *Group) TenantHealthy(database, schema string) error {
	for _, d := range g.dbs {
		if d.Name != database {
			continue
		}
		d.mu.Lock()
		t := d.tenants[schema]
		d.mu.Unlock()
		if t != nil {
			return t.relay.Healthy()
		}
	}
	return ErrNotServed
}

// ErrTenant is wrapped by the errors of Group.Healthy that concern one outbox.
var ErrTenant = errors.New("relay: tenant unhealthy")

// Healthy reports nil when every selected outbox is served and healthy, and
// every database could be listed; else an error naming each database and
// tenant at fault (errors.Is matches ErrTenant, and the Relay errors such as
// ErrDatabaseUnreachable).
func (g *Group) Healthy() error {
	var errs []error
	for _, d := range g.dbs {
		d.mu.Lock()
		if d.listErr != nil {
			errs = append(errs, fmt.Errorf("database %s: %w", d.Name, d.listErr))
		}
		d.mu.Unlock()
	}
	for _, t := range g.Tenants() {
		if t.Err != nil {
			errs = append(errs, fmt.Errorf("%w %s (database %s, schema %q): %w", ErrTenant, t.Tenant, t.Database, t.Schema, t.Err))
		}
	}
	return errors.Join(errs...)
}

// ID returns the relay id the Group's relays write in claimed_by.
func (g *Group) ID() string { return g.cfg.Config.ID }
