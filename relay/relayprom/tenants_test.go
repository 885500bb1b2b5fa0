package relayprom_test

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/pgoutbox/pgoutbox/broker/brokertest"
	"github.com/pgoutbox/pgoutbox/internal/pgtest"
	"github.com/pgoutbox/pgoutbox/internal/wait"
	"github.com/pgoutbox/pgoutbox/relay"
	"github.com/pgoutbox/pgoutbox/relay/relayprom"
)

// Two outboxes with one tenant name (refused by the Group) still make one
// series per name: the scrape succeeds, the name reads unhealthy, and the
// other tenants' series are there.
func TestTenantsOneSeriesPerTenantName(t *testing.T) {
	t.Parallel()
	_, a := pgtest.Outboxes(t, 4, "shop", "zz_ok")
	_, b := pgtest.Outboxes(t, 4, "shop")
	reg := prometheus.NewRegistry()
	tenants, err := relayprom.NewTenants(reg, &relayprom.TenantsConfig{Logger: quiet()})
	pgtest.Must(t, err, "NewTenants")
	g, err := relay.NewGroup(&brokertest.Recorder{}, &relay.GroupConfig{
		Config:           relay.Config{Logger: quiet(), Observer: tenants},
		Databases:        []relay.Database{{Name: "a", Pool: a}, {Name: "b", Pool: b}},
		DiscoverInterval: 100 * time.Millisecond,
	})
	pgtest.Must(t, err, "NewGroup")
	pgtest.Must(t, tenants.Watch(g), "Watch")
	pgtest.Must(t, g.Start(context.Background()), "start")
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		pgtest.Must(t, g.Stop(ctx), "stop")
	})
	wait.For(t, 30*time.Second, "zz_ok served", func() bool { return g.TenantHealthy("a", "zz_ok") == nil })
	for range 3 { // each scrape, not only the first
		families, err := reg.Gather()
		pgtest.Must(t, err, "gather")
		n := 0
		for _, f := range families {
			if f.GetName() != "pgoutbox_relay_tenant_healthy" {
				continue
			}
			for _, m := range f.GetMetric() {
				if m.GetLabel()[0].GetValue() == "shop" {
					n++
					if m.GetGauge().GetValue() != 0 {
						t.Errorf("tenant_healthy{shop} = %v, want 0", m.GetGauge().GetValue())
					}
				}
			}
		}
		if n != 1 {
			t.Fatalf("%d series of tenant_healthy{shop}, want 1", n)
		}
		if v := value(t, reg, "pgoutbox_relay_tenant_healthy", "tenant", "zz_ok"); v != 1 {
			t.Errorf("tenant_healthy{zz_ok} = %v, want 1", v)
		}
		if v := value(t, reg, "pgoutbox_relay_tenants", "state", "refused"); v != 2 {
			t.Errorf("tenants{refused} = %v, want 2", v)
		}
	}
}

func TestTenantsConfigValidate(t *testing.T) {
	t.Parallel()
	var none *relayprom.TenantsConfig
	if err := none.Validate(); err != nil {
		t.Errorf("nil TenantsConfig: %v", err)
	}
	bad := &relayprom.TenantsConfig{MaxTenants: -1}
	err := bad.Validate()
	if err == nil || err.Error() != "relayprom: TenantsConfig.MaxTenants (-1) must be in 1..10000" {
		t.Errorf("MaxTenants -1: Validate = %v", err)
	}
	if _, nerr := relayprom.NewTenants(prometheus.NewRegistry(), bad); nerr == nil || err == nil || nerr.Error() != err.Error() {
		t.Errorf("NewTenants = %v, want Validate's error", nerr)
	}
}
