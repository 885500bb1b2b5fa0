package cli

import (
	"bytes"
	"context"
	"crypto/rand"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pgoutbox/pgoutbox/internal/pgtest"
	"github.com/pgoutbox/pgoutbox/internal/wait"
)

// A relay process whose webhook refuses its signature with 401 and echoes the whole
// request back: /readyz fails with the configuration error and the answer, the log
// says configuration error (not "broker unreachable") and warns about plain http://,
// relay_up{broker} is 0, nothing is quarantined; and none of the planted secrets —
// database password, webhook password and query token, signing secret — is in the
// logs, /readyz, /metrics, last_error or the process's command line. Once the
// receiver accepts, everything is delivered and the relay is ready.
func TestRelayWebhookRefusalKeepsSecrets(t *testing.T) {
	t.Parallel()
	newSecret := func() string { return "Zq" + strings.ToLower(rand.Text()) }
	dbPass, hookPass, hookToken, sign := newSecret(), newSecret(), newSecret(), newSecret()
	secrets := []string{dbPass, hookPass, hookToken, sign}
	pool, schema := pgtest.Migrated(t, 4)
	e := &relayEnv{t: t, pool: pool, schema: schema}
	var accept atomic.Bool
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if accept.Load() {
			w.WriteHeader(http.StatusNoContent)
			return
		}
		var dump bytes.Buffer
		_ = r.Header.Write(&dump)
		w.WriteHeader(http.StatusUnauthorized)
		_, _ = dump.WriteString("url " + r.URL.String() + " expected secret " + sign)
		_, _ = w.Write(dump.Bytes())
	}))
	t.Cleanup(srv.Close)
	db, err := url.Parse(pgtest.URL())
	pgtest.Must(t, err, "parse database URL")
	db.User = url.UserPassword(db.User.Username(), dbPass) // the server trusts: any password works
	hook := strings.Replace(srv.URL, "http://", "http://hook:"+hookPass+"@", 1) + "/hook?token=" + hookToken

	e.enqueue(2, 3)
	p := startOpsRelay(t, []string{"PGOUTBOX_METRICS_ADDR=127.0.0.1:0", "DATABASE_URL=" + db.String(),
		"PGOUTBOX_BROKER=" + hook, "PGOUTBOX_WEBHOOK_SECRET=" + sign},
		"--schema", schema, "--poll-interval", "100ms", "--backoff-base", "50ms", "--backoff-max", "200ms", "--max-attempts", "2")
	cmdline, err := os.ReadFile("/proc/" + strconv.Itoa(p.cmd.Process.Pid) + "/cmdline")
	pgtest.Must(t, err, "read the relay's command line")

	var ready string
	wait.For(t, 30*time.Second, "/readyz to report the configuration error", func() bool {
		code, body := p.get(t, "/readyz")
		ready = body
		return code == 503 && strings.Contains(body, "refuses the relay's configuration") && strings.Contains(body, "401")
	})
	wait.For(t, 30*time.Second, "retries past --max-attempts", func() bool { return e.count("attempt_count >= 3") > 0 })
	if strings.Contains(ready, "broker unreachable") {
		t.Errorf("/readyz says unreachable: %q", ready)
	}
	if up := p.metric(t, `pgoutbox_relay_up{dependency="broker"}`); up != 0 {
		t.Errorf("up{broker} %v while the broker refuses the configuration", up)
	}
	if n := e.count("quarantined_at IS NOT NULL"); n != 0 {
		t.Errorf("%d events quarantined: the events are fine, the configuration is not", n)
	}
	var lastErrors string
	pgtest.Must(t, pool.QueryRow(context.Background(), "SELECT string_agg(coalesce(last_error, ''), ' | ') FROM "+e.table()).Scan(&lastErrors), "last_error")
	_, metrics := p.get(t, "/metrics")
	logs := p.stderr.String()
	if !strings.Contains(logs, "refuses the relay's configuration") || strings.Contains(logs, "broker unreachable") ||
		!strings.Contains(logs, "plain http://") {
		t.Errorf("logs: want the configuration error and the plain-http warning, not unreachable:\n%s", logs)
	}
	for what, out := range map[string]string{"stderr": logs, "stdout": p.stdout.String(), "/readyz": ready,
		"/metrics": metrics, "last_error": lastErrors, "command line": string(cmdline)} {
		for _, s := range secrets {
			if strings.Contains(out, s) || strings.Contains(out, s[:8]) {
				t.Errorf("%s holds a secret (%q):\n%s", what, s, out)
			}
		}
	}

	accept.Store(true)
	wait.For(t, 30*time.Second, "delivery once accepted", func() bool { return e.count("published_at IS NULL") == 0 })
	wait.For(t, 30*time.Second, "/readyz 200", func() bool { code, _ := p.get(t, "/readyz"); return code == 200 })
	p.sigterm(t)
}
