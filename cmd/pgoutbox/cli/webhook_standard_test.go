package cli

import (
	"crypto/rand"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pgoutbox/pgoutbox/broker/webhook"
	"github.com/pgoutbox/pgoutbox/internal/pgtest"
	"github.com/pgoutbox/pgoutbox/internal/wait"
)

// A relay given only a Standard Webhooks secret, through the environment, signs
// every event so that the receiver's StandardVerifier accepts it; the secret is
// in neither the process's command line nor its logs.
func TestWebhookStandardSecretSigns(t *testing.T) {
	t.Parallel()
	key := []byte(rand.Text()[:24] + "-standard")
	var verified atomic.Int64
	srv := httptest.NewServer((&webhook.StandardVerifier{Secrets: [][]byte{key}}).Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get(webhook.HeaderSignature) == "" { // only the standard signature was asked for
			verified.Add(1)
		}
	})))
	t.Cleanup(srv.Close)
	pool, schema := pgtest.Migrated(t, 4)
	e := &relayEnv{t: t, pool: pool, schema: schema}
	e.enqueue(2, 2)
	text := webhook.FormatStandardSecret(key)
	p := startRelayProc(t, "relay", []string{standardSecretEnv + "=" + text},
		[]string{"relay", "--database-url", pgtest.URL(), "--schema", schema, "--broker", srv.URL + "/hook", "--poll-interval", "100ms"})
	wait.For(t, 60*time.Second, "4 events verified", func() bool { return e.count("published_at IS NULL") == 0 && verified.Load() >= 4 })
	cmdline, err := os.ReadFile("/proc/" + strconv.Itoa(p.cmd.Process.Pid) + "/cmdline")
	pgtest.Must(t, err, "read the relay's command line")
	for _, s := range []string{text[6:18], string(key[:12])} {
		if strings.Contains(string(cmdline), s) || strings.Contains(p.stderr.String(), s) {
			t.Errorf("the secret shows in the command line or the logs")
		}
	}
}

// A malformed Standard Webhooks secret stops the relay at once (exit 2) with one
// line that names where it came from, never the value.
func TestWebhookStandardSecretErrors(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	const planted = "s3cr3tPLANTED"
	file := func(name, body string) string {
		p := filepath.Join(dir, name)
		pgtest.Must(t, os.WriteFile(p, []byte(body), 0o600), "write %s", name)
		return p
	}
	args := []string{"relay", "--database-url", pgtest.URL(), "--broker", "https://hooks.example/x"}
	for _, tc := range []struct {
		name  string
		env   string
		extra []string
		want  string
	}{
		{"no prefix", standardSecretEnv + "=" + planted + "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA", nil, standardSecretEnv + ": webhook: a Standard Webhooks secret starts with"},
		{"not base64", standardSecretEnv + "=whsec_" + planted + "!!!!!!!!!!!!!!!!!!!!!!!!!", nil, "not whsec_ followed by standard base64"},
		{"too short", standardSecretEnv + "=" + webhook.FormatStandardSecret([]byte(planted)), nil, "is 13 bytes, want 24 to 64"},
		{"a file", "", []string{"--webhook-standard-secret-file", file("bad", "whsec_"+planted+"\n")}, "--webhook-standard-secret-file: webhook:"},
		{"an empty file", "", []string{"--webhook-standard-secret-file", file("empty", "\n")}, "--webhook-standard-secret-file: the file is empty"},
		{"a missing file", "", []string{"--webhook-standard-secret-file", filepath.Join(dir, "none")}, "--webhook-standard-secret-file: open"},
	} {
		cmd := exec.Command(binary, append(args, tc.extra...)...)
		cmd.Env = append(os.Environ(), tc.env)
		out, _ := cmd.CombinedOutput()
		msg := string(out)
		if code := cmd.ProcessState.ExitCode(); code != 2 || !strings.Contains(msg, tc.want) || strings.Count(msg, "\n") != 1 {
			t.Errorf("%s: exit %d, output %q; want 2 and one line with %q", tc.name, code, msg, tc.want)
		}
		if strings.Contains(msg, "PLANTED") || strings.Contains(msg, "czNjcjN0") {
			t.Errorf("%s: the value is shown: %q", tc.name, msg)
		}
	}
}
