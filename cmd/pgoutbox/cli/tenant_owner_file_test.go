package cli

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/pgoutbox/internal/pgtest"
	"github.com/pgoutbox/pgoutbox/internal/wait"
)

// A database's tenant_owner trusts its roles in that database alone: the
// relay serves database a's tenant owned by a role named only there, and
// refuses database b's tenant of the same owner (b names none, and
// --tenant-owner names another role), while --tenant-owner's roles still count
// in every database.
func TestRelayTenantsFileTenantOwnerPerDatabase(t *testing.T) {
	t.Parallel()
	ea, eb := newCLITenants(t, "tenant_x"), newCLITenants(t, "tenant_x")
	owner := pgtest.Role(t, ea.pool, "")
	other := pgtest.Role(t, ea.pool, "")
	for _, e := range []*cliTenants{ea, eb} {
		e.exec("ALTER SCHEMA tenant_x OWNER TO " + pgx.Identifier{owner}.Sanitize())
		e.enqueue("tenant_x", 3, 0)
	}
	// Before the role is dropped (cleanups run last in, first out): b's schema
	// is not dropped with it, being in another database.
	t.Cleanup(func() { eb.exec("ALTER SCHEMA tenant_x OWNER TO CURRENT_USER") })

	file := filepath.Join(t.TempDir(), "tenants.yaml")
	body := "databases:\n" +
		"  - name: dba\n    url: '" + ea.url + "'\n    schemas: tenant_*\n    tenant_prefix: a-\n    tenant_owner: '" + other + ", " + owner + "'\n" +
		"  - name: dbb\n    url: '" + eb.url + "'\n    schemas: tenant_*\n    tenant_prefix: b-\n"
	pgtest.Must(t, os.WriteFile(file, []byte(body), 0o600), "write the tenants file")

	p := startOpsRelay(t, nil, "--tenants-file", file, "--tenant-owner", other, "--broker", "null://",
		"--discover-interval", "200ms", "--metrics-addr", "127.0.0.1:0", "--workers", "1")
	wait.For(t, time.Minute, "database a's tenant drained", func() bool { return ea.pending("tenant_x") == 0 })
	wait.Forf(t, time.Minute, func() string { return "database b's tenant refused:\n" + p.stderr.String() }, func() bool {
		_, body := p.get(t, "/readyz")
		return strings.Contains(body, `(database dbb, schema "tenant_x"): migrate: outbox refused`)
	})
	code, body := p.get(t, "/readyz")
	if code != 503 || strings.Contains(body, "database dba") {
		t.Errorf("/readyz %d:\n%s", code, body)
	}
	// Refused before any statement touched it: nothing of b's was published.
	if n := eb.pending("tenant_x"); n != 3 {
		t.Errorf("database b: %d events pending, want 3 (never served)", n)
	}
	p.sigterm(t)
}
