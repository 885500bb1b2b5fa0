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

func TestConsoleServesAndStops(t *testing.T) {
	t.Parallel()
	_, schema := pgtest.Migrated(t, 1)
	tok := consoleSecret()
	users := writeUsers(t, 0o600, "# users\nops operator "+tok+"\n")
	var errb lockedWriter
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan int, 1)
	go func() {
		done <- Run(ctx, []string{"console", "--database-url", pgtest.URL(), "--schema", schema, "--listen", "127.0.0.1:0",
			"--auth-file", users, "--broker", "null://"}, io.Discard, &errb)
	}()
	addr := regexp.MustCompile(`url=http://(127\.0\.0\.1:\d+)/`)
	var base string
	wait.Forf(t, 20*time.Second, func() string { return "the console to listen: " + errb.String() }, func() bool {
		if m := addr.FindStringSubmatch(errb.String()); m != nil {
			base = "http://" + m[1]
			return true
		}
		return false
	})
	get := func(path, auth string) (int, string) {
		req, _ := http.NewRequest("GET", base+path, nil)
		if auth != "" {
			req.Header.Set("Authorization", auth)
		}
		res, err := http.DefaultClient.Do(req)
		pgtest.Must(t, err, "get")
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		return res.StatusCode, string(b)
	}
	if s, _ := get("/?schema="+schema, ""); s != http.StatusUnauthorized {
		t.Errorf("without credentials: %d", s)
	}
	if s, _ := get("/?schema="+schema, "Bearer "+tok); s != http.StatusOK {
		t.Errorf("with the token: %d", s)
	}
	// With --broker the replay page offers to replay, naming the destination.
	if s, body := get("/replay?schema="+schema, "Bearer "+tok); s != http.StatusOK || strings.Contains(body, "preview-only") || !strings.Contains(body, "null") {
		t.Errorf("replay page with --broker: %d\n%s", s, body)
	}
	if strings.Contains(errb.String(), tok) {
		t.Errorf("the token is in the log")
	}
	cancel()
	select {
	case code := <-done:
		if code != exitOK {
			t.Fatalf("exit %d: %s", code, errb.String())
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the console did not stop")
	}
}

func TestConsoleNoAuthOnLoopback(t *testing.T) {
	t.Parallel()
	_, schema := pgtest.Migrated(t, 1)
	var errb lockedWriter
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan int, 1)
	go func() {
		done <- Run(ctx, []string{"console", "--database-url", pgtest.URL(), "--schema", schema, "--listen", "127.0.0.1:0",
			"--insecure-loopback-no-auth"}, io.Discard, &errb)
	}()
	addr := regexp.MustCompile(`url=http://(127\.0\.0\.1:\d+)/`)
	var base string
	wait.Forf(t, 20*time.Second, func() string { return "the console to listen: " + errb.String() }, func() bool {
		if m := addr.FindStringSubmatch(errb.String()); m != nil {
			base = "http://" + m[1]
			return true
		}
		return false
	})
	if !strings.Contains(errb.String(), "WITHOUT sign-in") {
		t.Errorf("no warning: %s", errb.String())
	}
	res, err := http.Get(base + "/")
	pgtest.Must(t, err, "get")
	res.Body.Close()
	if res.StatusCode != http.StatusOK {
		t.Errorf("no-auth console: %d", res.StatusCode)
	}
	cancel()
	if code := <-done; code != exitOK {
		t.Fatalf("exit %d", code)
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
