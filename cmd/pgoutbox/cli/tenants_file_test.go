package cli

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/pgoutbox/pgoutbox/internal/pgtest"
	"github.com/pgoutbox/pgoutbox/migrate"
)

// laughs is a YAML "billion laughs": levels of anchors, each alias list
// standing for width copies of the level before, padded to about size bytes.
func laughs(levels, width, size int) string {
	var b strings.Builder
	b.WriteString("a0: &a0 [\"postgres://u:s3cr3t-PW@h/x\"]\n")
	for l := 1; l < levels; l++ {
		fmt.Fprintf(&b, "a%d: &a%d [", l, l)
		for w := range width {
			if w > 0 {
				b.WriteString(",")
			}
			fmt.Fprintf(&b, "*a%d", l-1)
		}
		b.WriteString("]\n")
	}
	for i := 0; b.Len() < size; i++ {
		fmt.Fprintf(&b, "k%d: &k%d [*a%d, *a%d]\n", i, i, levels-1, levels-1)
	}
	fmt.Fprintf(&b, "databases:\n  - url: *a%d\n", levels-1)
	return b.String()
}

// hostileTenantsFiles are tenants files that must be refused.
var hostileTenantsFiles = []hostileFile{
	{"laughs 71KB", laughs(9, 9, 71<<10), "anchors and aliases"},
	{"laughs at the size limit", laughs(9, 9, maxTenantsFile-200), "anchors and aliases"},
	{"one anchor", "databases:\n  - &d\n    url: postgres://u:s3cr3t-PW@h/x\n", "anchors and aliases"},
	{"merge key", "base: &b {url: 'postgres://u:s3cr3t-PW@h/x'}\ndatabases:\n  - <<: *b\n", "anchors and aliases"},
	{"over the size limit", "databases:\n" + strings.Repeat("  - url: postgres://u:s3cr3t-PW@h/x\n", maxTenantsFile/30), "larger than its limit"},
	{"many nodes", "databases: [" + strings.Repeat("s3cr3t-PW,", maxTenantsFile/12) + "]\n", "YAML nodes"},
	{"many one-letter nodes", "databases: [" + strings.Repeat("a,", (maxTenantsFile-20)/2) + "]\n", "YAML nodes"},
	{"deep nesting", strings.Repeat("[", 200_000) + "s3cr3t-PW" + strings.Repeat("]", 200_000), ""},
	{"many errors", "databases:\n" + strings.Repeat("  - url: x\n    s3cr3t-PW: y\n    passwrd: postgres://u:s3cr3t-PW@h/x\n", 1000), "unknown key (not shown)"},
	{"too many databases", "databases:\n" + strings.Repeat("  - url: postgres://u:s3cr3t-PW@h/x\n", 1001), "above the limit of 1000"},
	{"long value", "databases:\n  - url: postgres://u:s3cr3t-PW@h/" + strings.Repeat("x", 5000) + "\n", "longer than its limit"},
	{"custom tag", "databases:\n  - url: !secret postgres://u:s3cr3t-PW@h/x\n", "custom YAML tags"},
	{"two documents", "databases:\n  - url: postgres://u:s3cr3t-PW@h/x\n---\ndatabases: []\n", "more than one YAML document"},
	{"repeated key", "databases:\n  - url: postgres://u:s3cr3t-PW@h/x\n    url: postgres://u:s3cr3t-PW@h/y\n", "key url is repeated"},
	{"url as a key", "databases:\n  - postgres://u:s3cr3t-PW@h/x: 1\n", "unknown key (not shown)"},
	{"value as a map", "databases:\n  - url: {postgres://u:s3cr3t-PW@h/x: 1}\n", "must be a single value"},
	{"max_conns not a number", "databases:\n  - url: x\n    max_conns: s3cr3t-PW\n", "max_conns must be a whole number"},
	{"max_conns huge", "databases:\n  - url: x\n    max_conns: 99999999999999999999\n", "max_conns must be a whole number"},
	{"url_env not a name", "databases:\n  - url_env: 's3cr3t-PW'\n", "url_env must be the name"},
	{"schemas not a selector", "databases:\n  - url: x\n    schemas: 's3cr3t-PW['\n", "line 3: databases[0].schemas: migrate: bad schema selector: item 1"},
	{"tenant_prefix", "databases:\n  - url: x\n    tenant_prefix: 's3cr3t-PW.'\n", "tenant_prefix must be"},
	{"name with a control character", "databases:\n  - url: x\n    name: \"s3cr3t-PW\\e[2J\"\n", "name must be"},
	{"tenant_owner reserved role", "databases:\n  - url: x\n    tenant_owner: 's3cr3t-PW, public'\n", "tenant_owner must be"},
	{"tenant_owner pg_ role", "databases:\n  - url: x\n    tenant_owner: pg_s3cr3t-PW\n", "tenant_owner must be"},
	{"tenant_owner control character", "databases:\n  - url: x\n    tenant_owner: \"s3cr3t-PW\\e[2J\"\n", "tenant_owner must be"},
	{"tenant_owner too long a name", "databases:\n  - url: x\n    tenant_owner: s3cr3t-PW" + strings.Repeat("x", 64) + "\n", "tenant_owner must be"},
	{"tenant_owner too many", "databases:\n  - url: x\n    tenant_owner: s3cr3t-PW" + strings.Repeat(",r", 100) + "\n", "tenant_owner must be"},
	{"tenant_owner as a list", "databases:\n  - url: x\n    tenant_owner: [s3cr3t-PW]\n", "must be a single value"},
	{"syntax error", "databases:\n  - url: 'postgres://u:s3cr3t-PW@h/x\n", "line"},
	{"tab indentation", "databases:\n\t- url: postgres://u:s3cr3t-PW@h/x\n", "line"},
	{"not a map", "- postgres://u:s3cr3t-PW@h/x\n", "must be a map"},
	{"databases not a list", "databases: postgres://u:s3cr3t-PW@h/x\n", "must be a list"},
	{"empty", "", "lists no databases"},
	{"null", "~\n", "lists no databases"},
	{"empty list", "databases: []\n", "lists no databases"},
}

// hostileFile is a file a reader must refuse with want, a word of its error,
// in it. Each plants the secret s3cr3t-PW where a careless error would quote it.
type hostileFile struct {
	name, body, want string
}

// refuseHostileFiles checks that read refuses every file with one line of at
// most maxLen bytes that quotes no value, within bounded memory: the figures
// of each are logged.
func refuseHostileFiles(t *testing.T, files []hostileFile, maxLen int, read func(ctx context.Context, path string) error) {
	t.Helper()
	dir := t.TempDir()
	for _, tc := range files {
		path := filepath.Join(dir, strings.ReplaceAll(tc.name, " ", "_")+".yaml")
		pgtest.Must(t, os.WriteFile(path, []byte(tc.body), 0o600), "write")
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		start := time.Now()
		err := read(t.Context(), path)
		took := time.Since(start)
		runtime.ReadMemStats(&after)
		if err == nil {
			t.Errorf("%s: accepted", tc.name)
			continue
		}
		msg := err.Error()
		if !strings.Contains(msg, tc.want) {
			t.Errorf("%s: error %q, want %q in it", tc.name, msg, tc.want)
		}
		if strings.Contains(msg, "s3cr3t") || len(msg) > maxLen || strings.ContainsAny(msg, "\n\x1b") {
			t.Errorf("%s: error of %d bytes quotes a value or spans lines: %.700q", tc.name, len(msg), msg)
		}
		// 23 GB were reached before these bounds: 1 GiB is far above what
		// any accepted or refused file may take, and far below the attack.
		if alloc := after.TotalAlloc - before.TotalAlloc; alloc > 1<<30 {
			t.Errorf("%s: %d MiB allocated to refuse a file of %d bytes", tc.name, alloc>>20, len(tc.body))
		}
		if _, rest, ok := strings.Cut(msg, path+": "); ok {
			msg = rest // the flag and the path: the same in every error
		}
		t.Logf("%-28s %8d bytes: refused in %v, %d MiB allocated, heap %d MiB: %.300s", tc.name, len(tc.body), took.Round(time.Millisecond),
			(after.TotalAlloc-before.TotalAlloc)>>20, after.HeapAlloc>>20, msg)
	}
}

// Every hostile tenants file is refused with one short line that quotes no
// value, within bounded memory.
func TestTenantsFileRefusesHostileYAML(t *testing.T) {
	refuseHostileFiles(t, hostileTenantsFiles, 512, func(ctx context.Context, path string) error {
		_, err := readTenantsFile(ctx, path)
		return err
	})
}

// A file in the documented format is read as written: comments, quoting
// styles, and defaults for the keys left out.
func TestTenantsFileAccepted(t *testing.T) {
	tf, err := parseTenantsFile([]byte(`# two databases
databases:
  - name: eu
    url: "postgres://relay@eu-db:5432/app?sslmode=verify-full"
    schemas: 'tenant_*, billing'
    tenant_prefix: eu-
    max_conns: 5
    tenant_owner: ' tenant_owner ,migrator'
  - url_env: US_DATABASE_URL   # holds a password
    tenant_prefix: us-
`))
	pgtest.Must(t, err, "parse")
	want := []tenantsFileDB{
		{Name: "eu", URL: "postgres://relay@eu-db:5432/app?sslmode=verify-full", Schemas: selector(t, "tenant_*, billing"), TenantPrefix: "eu-", MaxConns: 5,
			TenantOwner: migrate.Trust{Owners: []string{"tenant_owner", "migrator"}}},
		{URLEnv: "US_DATABASE_URL", TenantPrefix: "us-"},
	}
	if fmt.Sprint(tf.Databases) != fmt.Sprint(want) {
		t.Fatalf("parsed %+v, want %+v", tf.Databases, want)
	}
}

// Whatever the file holds, it is parsed within bounds and an error is one
// short line that never quotes the planted secret, wherever it stands.
func FuzzTenantsFile(f *testing.F) {
	for _, tc := range hostileTenantsFiles {
		if len(tc.body) < 4096 {
			f.Add(tc.body)
		}
	}
	f.Add("databases:\n  - url: SECRET\n    schemas: t_*\n")
	f.Add("databases:\n  - url_env: X\n    SECRET: 1\n")
	f.Add("databases: [{url: SECRET, max_conns: SECRET}]\n")
	f.Add("a: &x SECRET\ndatabases: [{url: *x}]\n")
	f.Add("databases:\n  - url: x\n    tenant_owner: 'SECRET,pg_SECRET'\n")
	f.Add("databases:\n  - url: x\n    tenant_owner: owner_a, owner_b\n")
	f.Fuzz(func(t *testing.T, body string) {
		if len(body) > 64<<10 {
			return
		}
		const secret = "Zq9-s3cr3t-Vw"
		body = strings.ReplaceAll(body, "SECRET", secret)
		tf, err := parseTenantsFile([]byte(body))
		if err != nil {
			msg := err.Error()
			if strings.Contains(msg, secret) || len(msg) > 512 || strings.ContainsAny(msg, "\n\r\x1b") {
				t.Fatalf("error of %d bytes quotes the secret or spans lines: %q", len(msg), msg)
			}
			return
		}
		if len(tf.Databases) == 0 || len(tf.Databases) > maxTenantsFileDatabases {
			t.Fatalf("accepted %d databases", len(tf.Databases))
		}
	})
}
