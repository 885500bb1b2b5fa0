package cli

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/pgoutbox/pgoutbox/internal/natstest"
	"github.com/pgoutbox/pgoutbox/internal/pgtest"
	"github.com/pgoutbox/pgoutbox/internal/wait"
)

// perSubjectToken counts a stream's messages by the subject's second token
// (the tenant in prefix.{tenant}.…).
func perSubjectToken(t *testing.T, target natstest.Target) map[string]int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := target.JS.Stream(ctx, target.Stream)
	pgtest.Must(t, err, "stream")
	info, err := s.Info(ctx, jetstream.WithSubjectFilter(target.Prefix+".>"))
	pgtest.Must(t, err, "stream info")
	out := map[string]int{}
	for subj, n := range info.State.Subjects {
		toks := strings.Split(subj, ".")
		out[toks[1]] += int(n)
	}
	return out
}

// One relay process serves the selected outbox schemas of a database, finds
// one added while it runs, names a broken one in /readyz and its metrics while
// the others flow, and stops with status 0.
func TestRelayTenantsProcess(t *testing.T) {
	t.Parallel()
	e := newCLITenants(t, "t_a", "t_b", "t_c", "other")
	for _, s := range []string{"t_a", "t_b", "t_c", "other"} {
		e.enqueue(s, 40, 0)
	}
	target := natstest.New(t, natstest.URL())
	p := startOpsRelay(t, nil, "--database-url", e.url, "--tenants", "t_*", "--broker", natstest.URL(),
		"--nats-stream", target.Stream, "--topic-template", target.Prefix+".{tenant}.{aggregate_type}.{event_type}",
		"--discover-interval", "200ms", "--metrics-addr", "127.0.0.1:0", "--workers", "2")
	wait.For(t, time.Minute, "t_* drained", func() bool { return e.pending("t_a")+e.pending("t_b")+e.pending("t_c") == 0 })
	pgtest.MigrateSchema(t, e.pool, "t_new")
	e.enqueue("t_new", 10, 0)
	wait.For(t, time.Minute, "t_new found and drained", func() bool { return e.pending("t_new") == 0 })
	if n := e.pending("other"); n != 40 {
		t.Fatalf("schema other is not selected, yet %d of its 40 events are pending", n)
	}
	got := perSubjectToken(t, target)
	for tenant, want := range map[string]int{"t_a": 40, "t_b": 40, "t_c": 40, "t_new": 10} {
		if got[tenant] != want {
			t.Errorf("tenant %s: %d messages, want %d (all: %v)", tenant, got[tenant], want, got)
		}
	}
	if v := p.metric(t, `pgoutbox_relay_tenant_healthy{tenant="t_a"}`); v != 1 {
		t.Errorf("tenant_healthy{t_a} = %v, want 1", v)
	}
	if v := p.metric(t, `pgoutbox_relay_published_total{tenant="t_a"}`); v != 40 {
		t.Errorf("published_total{t_a} = %v, want 40", v)
	}

	// t_c broken (its outbox table gone): named, and the others keep flowing.
	_, err := e.pool.Exec(context.Background(), "ALTER TABLE t_c.outbox_events RENAME TO gone")
	pgtest.Must(t, err, "break t_c")
	_, err = e.pool.Exec(context.Background(), "CREATE TABLE t_c.outbox_events (id int)")
	pgtest.Must(t, err, "break t_c")
	wait.For(t, time.Minute, "t_c named in /readyz", func() bool {
		code, body := p.get(t, "/readyz")
		return code == 503 && strings.Contains(body, "t_c")
	})
	e.enqueue("t_a", 5, 0)
	wait.For(t, time.Minute, "t_a keeps flowing", func() bool { return e.pending("t_a") == 0 })
	if v := p.metric(t, `pgoutbox_relay_tenant_healthy{tenant="t_c"}`); v != 0 {
		t.Errorf("tenant_healthy{t_c} = %v, want 0", v)
	}
	p.sigterm(t)
}

func TestRelayTenantsRefusals(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	file := func(name, body string) string {
		p := filepath.Join(dir, name)
		pgtest.Must(t, os.WriteFile(p, []byte(body), 0o600), "write %s", name)
		return p
	}
	db := []string{"--database-url", pgtest.URL()}
	secretURL := "postgres://u:s3cr3t-pw@127.0.0.1:1/x"
	for _, tc := range []struct {
		args []string
		want string
	}{
		{append(db, "--tenants", "t_*", "--broker", "nats://127.0.0.1:1", "--topic-template", "x.{aggregate_type}"), "must hold {tenant}"},
		{append(db, "--tenants", "t_*", "--broker", "kafka://127.0.0.1:1", "--topic-template", "x.{aggregate_type}"), "must hold {tenant}"},
		{append(db, "--tenants", "t_*", "--broker", "https://hooks.example/x", "--webhook-unsigned"), "must hold {tenant}"},
		{append(db, "--tenants", "t_*", "--schema", "a", "--broker", "null://"), "--schema names one outbox"},
		{append(db, "--tenants", "t_*", "--source", "cdc", "--broker", "null://"), "one schema per replication slot"},
		{append(db, "--tenants", "t_*", "--cleanup-interval", "1m", "--broker", "null://"), "--cleanup-interval"},
		{append(db, "--tenants", "[", "--broker", "null://"), "--tenants"},
		{append(db, "--tenants", "t_*", "--db-max-conns", "0", "--broker", "null://"), "--db-max-conns"},
		{append(db, "--tenants", "t_*", "--tenant-metrics", "some", "--broker", "null://"), "--tenant-metrics"},
		{append(db, "--tenants", "t_*", "--discover-interval", "1ms", "--broker", "null://"), "--discover-interval"},
		{append(db, "--tenants", "t_*", "--tenants-file", "x", "--broker", "null://"), "exclude each other"},
		{[]string{"--tenants-file", filepath.Join(dir, "missing.yaml"), "--broker", "null://"}, "--tenants-file"},
		{[]string{"--tenants-file", file("empty.yaml", ""), "--broker", "null://"}, "lists no databases"},
		{[]string{"--tenants-file", file("unknown.yaml", "databases:\n  - url: x\n    passwrd: y\n"), "--broker", "null://"}, "passwrd"},
		{[]string{"--tenants-file", file("both.yaml", "databases:\n  - url: x\n    url_env: Y\n"), "--broker", "null://"}, "exactly one of url and url_env"},
		{[]string{"--tenants-file", file("env.yaml", "databases:\n  - url_env: PGOUTBOX_TEST_UNSET_TENANT_URL_9F2\n"), "--broker", "null://"}, "is not set"},
		{[]string{"--tenants-file", file("sel.yaml", "databases:\n  - url: "+secretURL+"\n    schemas: '['\n"), "--broker", "null://"}, "schemas"},
		{[]string{"--tenants-file", file("badurl.yaml", "databases:\n  - url: 'postgres://u:s3cr3t-pw@[::1'\n"), "--broker", "null://"}, "invalid database URL"},
		{[]string{"--tenants-file", file("type.yaml", "databases:\n  - url: "+secretURL+"\n    max_conns: "+secretURL+"\n"), "--broker", "null://"}, "tenants-file"},
	} {
		_, stderr, code := run(t, append([]string{"relay"}, tc.args...)...)
		if code != 2 || !strings.Contains(stderr, tc.want) {
			t.Errorf("relay %q: exit %d, stderr %q; want 2 and %q", tc.args, code, stderr, tc.want)
		}
		if strings.Contains(stderr, "s3cr3t-pw") {
			t.Errorf("relay %q: the password is shown: %q", tc.args, stderr)
		}
	}
}
