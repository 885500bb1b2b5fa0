package cli

import (
	"context"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/pgoutbox/pgoutbox/broker/webhook"
	"github.com/pgoutbox/pgoutbox/internal/pgtest"
	"github.com/pgoutbox/pgoutbox/internal/wait"
)

// ceRequest is one CloudEvent a webhook received.
type ceRequest struct{ path, id, source string }

// An event has the same CloudEvents source whichever command publishes it:
// cdc recover, relay --tenants (with a tenant prefix, to a webhook whose path
// holds {tenant}), relay and replay.
func TestCloudEventsSourceIsTheSameForEveryCommand(t *testing.T) {
	t.Parallel()
	e := newCDCRelayEnv(t)
	e.dropCDC()
	dir := t.TempDir()
	secret := "0123456789abcdef0123456789abcdef"
	secretFile := filepath.Join(dir, "secret")
	pgtest.Must(t, os.WriteFile(secretFile, []byte(secret), 0o600), "write secret")
	verifier := &webhook.Verifier{Secrets: [][]byte{[]byte(secret)}}
	var mu sync.Mutex
	var got []ceRequest
	srv := httptest.NewServer(verifier.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		got = append(got, ceRequest{r.URL.EscapedPath(), r.Header.Get("Ce-Id"), r.Header.Get("Ce-Source")})
		mu.Unlock()
	})))
	t.Cleanup(srv.Close)
	hook := func(path string) []string {
		return []string{"--broker", srv.URL + path, "--webhook-secret-file", secretFile, "--format", "cloudevents"}
	}
	ids := e.enqueue(2, 2)
	reset := func() {
		_, err := e.pool.Exec(context.Background(), "UPDATE "+e.table()+" SET published_at = NULL, claimed_by = NULL, claim_until = NULL")
		pgtest.Must(t, err, "mark unpublished")
	}
	// relay runs a relay process until every event is published.
	relay := func(args ...string) {
		t.Helper()
		cmd := exec.Command(binary, append([]string{"relay"}, args...)...)
		var out syncBuffer
		cmd.Stderr = &out
		pgtest.Must(t, cmd.Start(), "start relay")
		exited := make(chan struct{})
		go func() { _ = cmd.Wait(); close(exited) }()
		t.Cleanup(func() { _ = cmd.Process.Kill(); <-exited })
		wait.Forf(t, time.Minute, func() string { return "relay " + strings.Join(args, " ") + " to publish:\n" + out.String() },
			func() bool { return e.count("published_at IS NULL") == 0 })
		pgtest.Must(t, cmd.Process.Signal(syscall.SIGTERM), "SIGTERM")
		<-exited
		if code := cmd.ProcessState.ExitCode(); code != 0 {
			t.Fatalf("relay %v: exit %d:\n%s", args, code, out.String())
		}
	}

	out, errOut, code := run(t, append([]string{"cdc", "recover", "--database-url", e.dbURL, "--schema", e.schema}, hook("/recover/{tenant}")...)...)
	if code != 0 {
		t.Fatalf("cdc recover: exit %d, %q %q", code, out, errOut)
	}
	if out, errOut, code := run(t, "cdc", "disable", "--database-url", e.dbURL, "--schema", e.schema); code != 0 {
		t.Fatalf("cdc disable: exit %d, %q %q", code, out, errOut)
	}
	reset()
	tenantsFile := filepath.Join(dir, "tenants.yaml")
	pgtest.Must(t, os.WriteFile(tenantsFile, []byte("databases:\n  - url: '"+e.dbURL+"'\n    schemas: '"+e.schema+"'\n    tenant_prefix: eu-\n"), 0o600), "write")
	relay(append([]string{"--tenants-file", tenantsFile, "--discover-interval", "200ms"}, hook("/tenants/{tenant}/{aggregate_type}")...)...)
	reset()
	relay(append([]string{"--database-url", e.dbURL, "--schema", e.schema}, hook("/relay/{aggregate_type}")...)...)
	out, errOut, code = run(t, append([]string{"replay", "--database-url", e.dbURL, "--schema", e.schema, "--all"}, hook("/replay")...)...)
	if code != 0 {
		t.Fatalf("replay: exit %d, %q %q", code, out, errOut)
	}

	mu.Lock()
	defer mu.Unlock()
	want := "/pgoutbox/" + e.schema
	byCommand := map[string]map[string]string{} // command → event id → source
	for _, r := range got {
		cmd := strings.Split(r.path, "/")[1]
		if byCommand[cmd] == nil {
			byCommand[cmd] = map[string]string{}
		}
		byCommand[cmd][r.id] = r.source
		if cmd == "tenants" && !strings.HasPrefix(r.path, "/tenants/eu-"+e.schema+"/") {
			t.Errorf("relay --tenants posted to %s, want /tenants/eu-%s/…", r.path, e.schema)
		}
		if cmd == "recover" && r.path != "/recover/"+e.schema { // {tenant}: the schema, as the relay of the outbox fills it
			t.Errorf("cdc recover posted to %s, want /recover/%s", r.path, e.schema)
		}
	}
	for _, cmd := range []string{"recover", "tenants", "relay", "replay"} {
		for _, id := range ids {
			if src, ok := byCommand[cmd][id.String()]; !ok || src != want {
				t.Errorf("%s: event %s: source %q (received %v), want %q", cmd, id, src, ok, want)
			}
		}
	}
}
