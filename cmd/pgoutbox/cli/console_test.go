package cli

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/pgoutbox/pgoutbox/admin/adminhttp"
	"github.com/pgoutbox/pgoutbox/internal/pgtest"
	"github.com/pgoutbox/pgoutbox/internal/wait"
)

// lockedWriter is a log buffer written and read by different goroutines.
type lockedWriter struct{ syncBuffer }

func (w *lockedWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.Write(p)
}

func consoleSecret() string {
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

func writeUsers(t *testing.T, mode os.FileMode, text string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "users")
	pgtest.Must(t, os.WriteFile(p, []byte(text), mode), "write users")
	pgtest.Must(t, os.Chmod(p, mode), "chmod users")
	return p
}

func TestConsoleRefusesUnsafeSetups(t *testing.T) {
	t.Parallel()
	_, schema := pgtest.Migrated(t, 1)
	url := pgtest.URL()
	tok := consoleSecret()
	good := writeUsers(t, 0o600, "alice operator "+tok+"\n")
	open := writeUsers(t, 0o644, "alice operator "+tok+"\n")
	cases := []struct {
		name string
		args []string
		want string
	}{
		{"no users", []string{}, "no users"},
		{"no auth on every interface", []string{"--insecure-loopback-no-auth", "--listen", ":8080"}, "loopback"},
		{"no auth on 0.0.0.0", []string{"--insecure-loopback-no-auth", "--listen", "0.0.0.0:8080"}, "loopback"},
		{"no auth on a LAN address", []string{"--insecure-loopback-no-auth", "--listen", "10.1.2.3:8080"}, "loopback"},
		{"no auth on a name", []string{"--insecure-loopback-no-auth", "--listen", "console.example:8080"}, "loopback"},
		{"no auth and users", []string{"--insecure-loopback-no-auth", "--auth-file", good}, "give one of them"},
		{"world-readable users file", []string{"--auth-file", open}, "every user of the machine"},
		{"missing users file", []string{"--auth-file", filepath.Join(t.TempDir(), "nope")}, "--auth-file"},
		{"bad listen", []string{"--auth-file", good, "--listen", "8080"}, "--listen"},
		{"bad schemas", []string{"--auth-file", good, "--schemas", "a[b"}, "--schemas"},
		{"refresh too fast", []string{"--auth-file", good, "--refresh", "10ms"}, "--refresh"},
		{"token flag does not exist", []string{"--token", tok}, "unknown flag"},
	}
	for _, owners := range []string{"public", "pg_monitor", "a\x01b", strings.Repeat("r,", 101)} {
		cases = append(cases, struct {
			name string
			args []string
			want string
		}{"--tenant-owner " + owners, []string{"--auth-file", good, "--tenant-owner", owners}, "--tenant-owner"})
	}
	for _, c := range cases {
		args := append([]string{"console", "--database-url", url, "--schema", schema}, c.args...)
		_, stderr, code := run(t, args...)
		if code != exitUsage || !strings.Contains(stderr, c.want) {
			t.Errorf("%s: code %d, stderr %q (want %q)", c.name, code, stderr, c.want)
		}
		if strings.Contains(stderr, tok) {
			t.Errorf("%s: the secret is in the output", c.name)
		}
	}
}

// consoleProc is a pgoutbox console running in the test, listening on a port
// of 127.0.0.1 it chose.
type consoleProc struct {
	t      *testing.T
	base   string
	errb   lockedWriter
	cancel context.CancelFunc
	done   chan int
}

// startConsole runs pgoutbox console with args and the listen address, and
// waits until it listens.
func startConsole(t *testing.T, args ...string) *consoleProc {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	c := &consoleProc{t: t, cancel: cancel, done: make(chan int, 1)}
	t.Cleanup(cancel)
	go func() {
		c.done <- Run(ctx, append([]string{"console", "--listen", "127.0.0.1:0"}, args...), io.Discard, &c.errb)
	}()
	addr := regexp.MustCompile(`url=http://(127\.0\.0\.1:\d+)/`)
	wait.Forf(t, 20*time.Second, func() string { return "the console to listen: " + c.errb.String() }, func() bool {
		select {
		case code := <-c.done:
			t.Fatalf("the console exited (%d): %s", code, c.errb.String())
		default:
		}
		if m := addr.FindStringSubmatch(c.errb.String()); m != nil {
			c.base = "http://" + m[1]
			return true
		}
		return false
	})
	return c
}

// get sends a GET of path with the Authorization header auth ("" for none).
func (c *consoleProc) get(path, auth string) (int, string) {
	c.t.Helper()
	req, err := http.NewRequest("GET", c.base+path, nil)
	pgtest.Must(c.t, err, "request")
	if auth != "" {
		req.Header.Set("Authorization", auth)
	}
	res, err := http.DefaultClient.Do(req)
	pgtest.Must(c.t, err, "get")
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return res.StatusCode, string(b)
}

// stop stops the console as SIGTERM does and checks that it exits cleanly.
func (c *consoleProc) stop() {
	c.t.Helper()
	c.cancel()
	select {
	case code := <-c.done:
		if code != exitOK {
			c.t.Fatalf("exit %d: %s", code, c.errb.String())
		}
	case <-time.After(20 * time.Second):
		c.t.Fatal("the console did not stop")
	}
}

func TestConsoleServesAndStops(t *testing.T) {
	t.Parallel()
	_, schema := pgtest.Migrated(t, 1)
	tok := consoleSecret()
	users := writeUsers(t, 0o600, "# users\nops operator "+tok+"\n")
	c := startConsole(t, "--database-url", pgtest.URL(), "--schema", schema, "--auth-file", users, "--broker", "null://")
	if s, _ := c.get("/?schema="+schema, ""); s != http.StatusUnauthorized {
		t.Errorf("without credentials: %d", s)
	}
	if s, _ := c.get("/?schema="+schema, "Bearer "+tok); s != http.StatusOK {
		t.Errorf("with the token: %d", s)
	}
	// With --broker the replay page offers to replay, naming the destination.
	if s, body := c.get("/replay?schema="+schema, "Bearer "+tok); s != http.StatusOK || strings.Contains(body, "preview-only") || !strings.Contains(body, "null") {
		t.Errorf("replay page with --broker: %d\n%s", s, body)
	}
	if strings.Contains(c.errb.String(), tok) {
		t.Errorf("the token is in the log")
	}
	c.stop()
}

func TestConsoleNoAuthOnLoopback(t *testing.T) {
	t.Parallel()
	_, schema := pgtest.Migrated(t, 1)
	c := startConsole(t, "--database-url", pgtest.URL(), "--schema", schema, "--insecure-loopback-no-auth")
	if !strings.Contains(c.errb.String(), "WITHOUT sign-in") {
		t.Errorf("no warning: %s", c.errb.String())
	}
	if s, _ := c.get("/", ""); s != http.StatusOK {
		t.Errorf("no-auth console: %d", s)
	}
	c.stop()
}

// The console on 'tenant_*' as a superuser, beside outboxes a role holding
// only CREATE on the database made under the glob: it starts (a refused tenant
// does not stop it), logs each refusal, serves the victim and refuses the
// attacker's outboxes, the one owned by the attacker alone being served once
// --tenant-owner names it; the attacker's code never runs as anyone else.
func TestConsoleTenantOwner(t *testing.T) {
	t.Parallel()
	a := pgtest.NewAttacker(t, "tenant_victim", 2)
	pgtest.MigrateSchema(t, a.Pool, "tenant_victim")
	for _, v := range pgtest.HostileVariants() {
		if v.Name == "plain" || v.Name == "rls" {
			a.Plant(t, "tenant_evil_"+v.Name, "postgres", v)
		}
	}
	tok := consoleSecret()
	users := writeUsers(t, 0o600, "ops operator "+tok+"\n")
	for _, owners := range []string{"", a.Role} {
		args := []string{"--database-url", a.URL, "--schemas", "tenant_*", "--auth-file", users}
		if owners != "" {
			args = append(args, "--tenant-owner", owners)
		}
		c := startConsole(t, args...)
		for schema, served := range map[string]bool{"tenant_victim": true, "tenant_evil_plain": owners != "", "tenant_evil_rls": false} {
			logged := regexp.MustCompile(`(?m)tenant refused.* schema=` + schema + `( |$)`).MatchString(c.errb.String())
			for _, page := range []string{"/", "/dlq", "/audit"} {
				s, body := c.get(page+"?schema="+schema, "Bearer "+tok)
				refused := s == http.StatusForbidden && strings.Contains(body, "tenant refused: migrate: outbox refused: schema &#34;"+schema+"&#34;")
				if served && s != http.StatusOK || !served && !refused {
					t.Errorf("--tenant-owner %q: %s of %s: %d, want served %v:\n%s", owners, page, schema, s, served, body)
				}
			}
			if logged == served {
				t.Errorf("--tenant-owner %q: %s refused in the log %v, want %v:\n%s", owners, schema, logged, !served, c.errb.String())
			}
		}
		c.stop()
	}
	if ran := a.RanAsOthers(t); len(ran) > 0 {
		t.Fatalf("the attacker's code ran as another role: %q", ran)
	}
}

// hash-password reads the password from standard input, never an argument, and
// prints a hash the users' file accepts; it refuses short or odd passwords
// without repeating them.
func TestConsoleHashPassword(t *testing.T) {
	t.Parallel()
	hash := func(stdin string, args ...string) (string, string, error) {
		var out, errb bytes.Buffer
		root := newRoot(&out, &errb)
		root.SetIn(strings.NewReader(stdin))
		root.SetArgs(append([]string{"console", "hash-password"}, args...))
		err := root.ExecuteContext(context.Background())
		return out.String(), errb.String(), err
	}
	out, _, err := hash("a-long-enough-password\n")
	if err != nil {
		t.Fatalf("hash-password: %v", err)
	}
	users, err := adminhttp.ParseUsers(strings.NewReader("ops operator " + strings.TrimSpace(out)))
	if err != nil || len(users) != 1 || !strings.HasPrefix(out, "$2") {
		t.Fatalf("the hash %q is refused: %v", out, err)
	}
	for name, c := range map[string]struct {
		stdin string
		args  []string
	}{
		"short":              {"short-pw\n", nil},
		"empty":              {"", nil},
		"white space":        {"a password with spaces\n", nil},
		"too long":           {strings.Repeat("p", 100) + "\n", nil},
		"password as an arg": {"", []string{"an-argument-password"}},
	} {
		out, errOut, err := hash(c.stdin, c.args...)
		var ue usageError
		if err == nil || !errors.As(err, &ue) {
			t.Errorf("%s: %q %v", name, out, err)
		}
		for _, secret := range append(c.args, strings.TrimSpace(c.stdin)) {
			if len(secret) > 3 && (strings.Contains(out+errOut, secret) || err != nil && strings.Contains(err.Error(), secret)) {
				t.Errorf("%s: the password is repeated", name)
			}
		}
	}
}
