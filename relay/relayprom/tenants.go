package relayprom

import (
	"errors"
	"fmt"
	"log/slog"
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/pgoutbox/pgoutbox/internal/config"
	"github.com/pgoutbox/pgoutbox/relay"
)

// DefaultMaxTenants is TenantsConfig.MaxTenants's default.
const DefaultMaxTenants = 100

// OtherTenant is the tenant label of the tenants beyond
// TenantsConfig.MaxTenants.
const OtherTenant = "_other"

// TenantsConfig configures Tenants.
type TenantsConfig struct {
	// MaxTenants bounds the tenant label's values: the first MaxTenants
	// tenants seen get their own, the others share OtherTenant (and have no
	// backlog gauges of their own). Zero means DefaultMaxTenants (100).
	MaxTenants int
	// Aggregate drops the tenant label: every tenant's work is counted
	// together, as a single relay's, and there are no per-tenant gauges.
	Aggregate bool
	// Logger receives backlog query failures. Nil means slog.Default().
	Logger *slog.Logger
}

// Validate reports the problems of the configuration as given, zero fields
// meaning their defaults, each naming its field; nil is valid (all defaults).
func (c *TenantsConfig) Validate() error {
	_, err := c.withDefaults()
	return err
}

func (c *TenantsConfig) withDefaults() (TenantsConfig, error) {
	return config.Resolve("relayprom", c, func(c *TenantsConfig) {
		config.Default(&c.MaxTenants, DefaultMaxTenants)
		if c.Logger == nil {
			c.Logger = slog.Default()
		}
	}, func(c *TenantsConfig, p *config.Problems) {
		p.Check(c.MaxTenants > 0 && c.MaxTenants <= 10000, "TenantsConfig.MaxTenants (%d) must be in 1..10000", c.MaxTenants)
	})
}

// Tenants exports the work of a relay.Group: it implements relay.Observer
// (set it as GroupConfig.Config.Observer) with Metrics' series under a
// "tenant" label, and, once Watch is called, collects for each served tenant
// the backlog gauges of Outbox and
//
//	pgoutbox_relay_tenant_healthy{tenant}   1 while the tenant is served and healthy, else 0
//	pgoutbox_relay_tenants{state}           tenants served and healthy, failing, or not served
type Tenants struct {
	reg prometheus.Registerer
	cfg TenantsConfig

	mu       sync.RWMutex
	byTenant map[string]*Metrics // the first MaxTenants tenants
	other    *Metrics            // the others, or all of them with Aggregate
	group    *relay.Group
	backlog  map[string]tenantBacklog // by tenant: a labelled Outbox

	healthy, count *prometheus.Desc
}

// NewTenants registers the Group's metrics on reg.
func NewTenants(reg prometheus.Registerer, cfg *TenantsConfig) (*Tenants, error) {
	if reg == nil {
		return nil, errors.New("relayprom: NewTenants needs a prometheus.Registerer")
	}
	c, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	t := &Tenants{reg: reg, cfg: c, byTenant: map[string]*Metrics{}, backlog: map[string]tenantBacklog{},
		healthy: prometheus.NewDesc("pgoutbox_relay_tenant_healthy",
			"1 while the tenant's outbox is served and its relay healthy, else 0 (see the relay's log and /readyz for why).", []string{"tenant"}, nil),
		count: prometheus.NewDesc("pgoutbox_relay_tenants",
			"Outboxes selected, by state: healthy, failing (served, unhealthy) or refused (not served: not migrated, bad name, duplicate).", []string{"state"}, nil),
	}
	label := prometheus.Labels{"tenant": OtherTenant}
	if c.Aggregate {
		label = nil
	}
	if t.other, err = New(prometheus.WrapRegistererWith(label, reg)); err != nil {
		return nil, err
	}
	return t, nil
}

// of returns the Metrics of tenant.
func (t *Tenants) of(tenant string) *Metrics {
	if t.cfg.Aggregate {
		return t.other
	}
	t.mu.RLock()
	m := t.byTenant[tenant]
	full := len(t.byTenant) >= t.cfg.MaxTenants
	t.mu.RUnlock()
	if m != nil {
		return m
	}
	if full {
		return t.other
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if m := t.byTenant[tenant]; m != nil {
		return m
	}
	if len(t.byTenant) >= t.cfg.MaxTenants {
		return t.other
	}
	m, err := New(prometheus.WrapRegistererWith(prometheus.Labels{"tenant": tenant}, t.reg))
	if err != nil {
		t.cfg.Logger.Warn("relayprom: cannot register a tenant's metrics; counting it as "+OtherTenant, slog.String("tenant", tenant), slog.Any("error", err))
		return t.other
	}
	t.byTenant[tenant] = m
	return m
}

// BatchClaimed implements relay.Observer.
func (t *Tenants) BatchClaimed(c relay.ClaimedBatch) { t.of(c.Tenant).BatchClaimed(c) }

// BatchSettled implements relay.Observer.
func (t *Tenants) BatchSettled(s relay.SettledBatch) { t.of(s.Tenant).BatchSettled(s) }

// CleanupDeleted counts rows deleted by cleanup, across tenants.
func (t *Tenants) CleanupDeleted(table string, rows int64) { t.other.CleanupDeleted(table, rows) }

// Watch registers the per-tenant gauges of g on the registerer: tenant
// health, and each labelled tenant's backlog (one query per tenant and
// scrape at most every DefaultMaxAge; MaxTenants bounds them).
func (t *Tenants) Watch(g *relay.Group) error {
	t.mu.Lock()
	t.group = g
	t.mu.Unlock()
	if err := t.reg.Register(t); err != nil {
		return fmt.Errorf("relayprom: register tenant gauges: %w", err)
	}
	return nil
}

// Describe implements prometheus.Collector. It describes nothing: the
// tenants' series come and go with the tenants (an unchecked collector).
func (t *Tenants) Describe(chan<- *prometheus.Desc) {}

// Collect implements prometheus.Collector.
func (t *Tenants) Collect(ch chan<- prometheus.Metric) {
	t.mu.RLock()
	g := t.group
	t.mu.RUnlock()
	if g == nil {
		return
	}
	states := g.Tenants()
	var healthy, failing, refused float64
	// One series per tenant name, even when two outboxes have that name (the
	// Group refuses both): a series collected twice fails the whole scrape.
	// The name is healthy only if every outbox having it is.
	up, count := map[string]bool{}, map[string]int{}
	var names []string
	for _, s := range states {
		switch {
		case !s.Serving:
			refused++
		case s.Err != nil:
			failing++
		default:
			healthy++
		}
		if t.cfg.Aggregate || !t.labelled(s.Tenant) {
			continue
		}
		if count[s.Tenant] == 0 {
			names = append(names, s.Tenant)
			up[s.Tenant] = true
		}
		count[s.Tenant]++
		up[s.Tenant] = up[s.Tenant] && s.Serving && s.Err == nil
	}
	seen := map[string]bool{}
	for _, name := range names {
		seen[name] = true
		ch <- prometheus.MustNewConstMetric(t.healthy, prometheus.GaugeValue, boolValue(up[name]), name)
	}
	for _, s := range states {
		// The backlog of a name is one outbox's: none while two have it.
		if !seen[s.Tenant] || count[s.Tenant] != 1 {
			continue
		}
		if c := t.backlogOf(g, s); c != nil {
			c.Collect(ch)
		}
	}
	ch <- prometheus.MustNewConstMetric(t.count, prometheus.GaugeValue, healthy, "healthy")
	ch <- prometheus.MustNewConstMetric(t.count, prometheus.GaugeValue, failing, "failing")
	ch <- prometheus.MustNewConstMetric(t.count, prometheus.GaugeValue, refused, "refused")
	t.mu.Lock()
	for tenant := range t.backlog {
		if !seen[tenant] || count[tenant] != 1 {
			delete(t.backlog, tenant)
		}
	}
	t.mu.Unlock()
}

// labelled reports whether tenant has a label of its own (within MaxTenants),
// giving it one if there is room.
func (t *Tenants) labelled(tenant string) bool { return t.of(tenant) != t.other }

// backlogOf returns the labelled backlog collector of a served tenant.
func (t *Tenants) backlogOf(g *relay.Group, s relay.TenantState) prometheus.Collector {
	if !s.Serving || s.Pool == nil {
		return nil
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	// A tenant name may pass to another outbox (dropped in one database,
	// created in another): the collector reads the outbox it was made for.
	if b := t.backlog[s.Tenant]; b.c != nil && b.database == s.Database && b.schema == s.Schema {
		return b.c
	}
	db, schema := s.Database, s.Schema
	o, err := NewOutbox(s.Pool, &OutboxConfig{Schema: schema, Logger: t.cfg.Logger.With(slog.String("tenant", s.Tenant)),
		Health: func() error { return g.TenantHealthy(db, schema) }})
	if err != nil {
		return nil
	}
	c := prometheus.WrapCollectorWith(prometheus.Labels{"tenant": s.Tenant}, o)
	t.backlog[s.Tenant] = tenantBacklog{database: db, schema: schema, c: c}
	return c
}

// tenantBacklog is the backlog collector of one tenant's outbox.
type tenantBacklog struct {
	database, schema string
	c                prometheus.Collector
}

var _ relay.Observer = (*Tenants)(nil)
