package cli

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"

	"github.com/pgoutbox/pgoutbox/internal/pgtest"
	"github.com/pgoutbox/pgoutbox/migrate"
)

// selector parses s, a schema selector.
func selector(t testing.TB, s string) migrate.Selector {
	t.Helper()
	sel, err := migrate.ParseSelector(s)
	pgtest.Must(t, err, "selector %q", s)
	return sel
}

// A schema selector is parsed where it comes in, before any connection (the
// database URL here reaches nothing), and a bad one reads the same at every
// edge: where it was given, then migrate's reason naming the item by its
// position, never its value.
func TestSelectorRefusedAtEachEdge(t *testing.T) {
	t.Parallel()
	const reason = "migrate: bad schema selector: item 2 is not a valid glob"
	dir := t.TempDir()
	file := filepath.Join(dir, "tenants.yaml")
	pgtest.Must(t, os.WriteFile(file, []byte("databases:\n  - url: postgres://127.0.0.1:1/x\n    schemas: 'a, s3cr3t['\n"), 0o600), "write")
	db := []string{"--database-url", "postgres://127.0.0.1:1/x"}
	noAuth := []string{"--insecure-loopback-no-auth", "--listen", "127.0.0.1:0"}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"relay", "--tenants", "a, s3cr3t[", "--broker", "null://"}, "--tenants: " + reason},
		{[]string{"relay", "--tenants-file", file, "--broker", "null://"}, "--tenants-file " + file + ": line 3: databases[0].schemas: " + reason},
		{[]string{"status", "--tenants", "a, s3cr3t["}, "--tenants: " + reason},
		{[]string{"dlq", "list", "--tenants", "a, s3cr3t["}, "--tenants: " + reason},
		{[]string{"cleanup", "--tenants", "a, s3cr3t["}, "--tenants: " + reason},
		{append([]string{"console", "--schemas", "a, s3cr3t["}, noAuth...), "--schemas: " + reason},
		{append([]string{"console", "--schemas", "a", "--schemas", "s3cr3t["}, noAuth...), "--schemas: " + reason},
		{append([]string{"console", "--schema", "s3cr3t[b"}, noAuth...), "--schema: migrate: bad schema selector: item 1 is not a valid glob"},
		// "Every outbox" is said with '*', never with a blank list.
		{[]string{"status", "--tenants", " , "}, "--tenants is empty"},
		{append([]string{"console", "--schemas", " "}, noAuth...), "--schemas is empty"},
	} {
		_, stderr, code := run(t, append(tc.args, db...)...)
		if code != exitUsage || !strings.Contains(stderr, tc.want) || strings.Contains(stderr, "s3cr3t") {
			t.Errorf("%q: exit %d, stderr %q; want %d and %q, without the value", tc.args, code, stderr, exitUsage, tc.want)
		}
	}
}

// Each edge hands on the Selector it parsed: the relay's flag and file, the
// operator verbs' --tenants, the console's --schemas and --schema.
func TestSelectorParsedAtEachEdge(t *testing.T) {
	t.Parallel()
	relayFlag := func(sel string) string {
		f := &relayFlags{tenants: relayTenantFlags{selector: sel, maxConns: 1}}
		f.db = dbFlags{url: "postgres://127.0.0.1:1/x", schema: "public", connectTimeout: time.Minute}
		dbs, err := f.tenantDatabases(t.Context())
		pgtest.Must(t, err, "relay --tenants %q", sel)
		return dbs[0].schemas.String()
	}
	relayFile := func(sel string) string {
		tf, err := parseTenantsFile([]byte("databases:\n  - url: x\n    schemas: '" + sel + "'\n"))
		pgtest.Must(t, err, "tenants file schemas %q", sel)
		return tf.Databases[0].Schemas.String()
	}
	operator := func(sel string) string {
		var tf tenantFlags
		fs := pflag.NewFlagSet("status", pflag.ContinueOnError)
		tf.register(fs, "")
		pgtest.Must(t, fs.Parse([]string{"--tenants", sel}), "flags")
		on, err := tf.parse(fs)
		pgtest.Must(t, err, "--tenants %q", sel)
		if !on {
			t.Errorf("--tenants %q: not on", sel)
		}
		return tf.sel.String()
	}
	console := func(sel string) string {
		f := &consoleFlags{schemas: strings.Split(sel, ",")}
		got, err := f.selector()
		pgtest.Must(t, err, "console --schemas %q", sel)
		return got.String()
	}
	for name, parse := range map[string]func(string) string{
		"relay --tenants": relayFlag, "--tenants-file": relayFile, "status --tenants": operator, "console --schemas": console,
	} {
		for in, want := range map[string]string{"tenant_*": "tenant_*", " tenant_*, billing ,": "tenant_*,billing", "*": "*"} {
			if got := parse(in); got != want {
				t.Errorf("%s %q: selector %q, want %q", name, in, got, want)
			}
		}
	}
	// The relay and its file read a blank selector as every outbox, as they
	// always did; the console's default is the one --schema.
	if got := relayFile(""); got != "" {
		t.Errorf("tenants file with empty schemas: %q, want every outbox", got)
	}
	f := &consoleFlags{}
	f.db.schema = "billing"
	if got, err := f.selector(); err != nil || got.String() != "billing" {
		t.Errorf("console without --schemas: %q, %v; want --schema's billing", got, err)
	}
}
