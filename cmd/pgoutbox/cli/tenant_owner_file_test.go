package cli

import (
	"fmt"
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

// tenant_owner and --tenant-owner together name at most 100 roles per
// database; more is refused at the start, naming the entry and no role.
func TestRelayTenantsFileTenantOwnerBound(t *testing.T) {
	t.Parallel()
	var fileOwners, flagOwners []string
	for i := range 60 {
		fileOwners = append(fileOwners, fmt.Sprintf("file_owner_%d", i))
		flagOwners = append(flagOwners, fmt.Sprintf("flag_owner_%d", i))
	}
	file := filepath.Join(t.TempDir(), "tenants.yaml")
	body := "databases:\n  - url: 'postgres://relay@127.0.0.1:1/x'\n    tenant_owner: '" + strings.Join(fileOwners, ",") + "'\n"
	pgtest.Must(t, os.WriteFile(file, []byte(body), 0o600), "write the tenants file")
	_, errOut, code := run(t, "relay", "--tenants-file", file, "--tenant-owner", strings.Join(flagOwners, ","), "--broker", "null://")
	if code != 2 || !strings.Contains(errOut, "databases[0].tenant_owner with --tenant-owner names more than 100 roles") ||
		strings.Contains(errOut, "_owner_") || strings.Count(errOut, "\n") != 1 {
		t.Fatalf("code %d, stderr %q; want 2 and the bound", code, errOut)
	}
}
