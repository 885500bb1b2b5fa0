package cli

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/pgoutbox/pgoutbox/internal/pgtest"
)

// A value that fails to parse as a database or broker URL is never printed,
// not even in part: the real binary exits 2 with one line naming where the
// value came from.
func TestParseErrorsQuoteNoValue(t *testing.T) {
	t.Parallel()
	const secret = "s3cr3t-PW"
	dir := t.TempDir()
	file := func(name, body string) string {
		p := filepath.Join(dir, name)
		pgtest.Must(t, os.WriteFile(p, []byte(body), 0o600), "write %s", name)
		return p
	}
	for _, tc := range []struct {
		name string
		env  []string
		args []string
		want string
	}{
		{"DATABASE_URL with a password and a bad port", []string{"DATABASE_URL=postgres://app:" + secret + "@db:99999/app"},
			[]string{"relay", "--broker", "null://"}, "DATABASE_URL"},
		{"key = value with spaces", []string{"DATABASE_URL=host = db port = x password = " + secret},
			[]string{"status"}, "invalid port"},
		{"unterminated quote in a flag", nil,
			[]string{"migrate", "--database-url", "host=db password = '" + secret}, "--database-url"},
		{"a password with a space", nil,
			[]string{"dlq", "list", "--database-url", "postgres://app:pa ss" + secret + "@db/app"}, "not a valid URL"},
		{"url_env naming the webhook secret", []string{"PGOUTBOX_WEBHOOK_SECRET=" + secret + "-0123456789abcdef0123456789"},
			[]string{"relay", "--broker", "null://", "--tenants-file", file("env.yaml", "databases:\n  - url_env: PGOUTBOX_WEBHOOK_SECRET\n")},
			"url_env PGOUTBOX_WEBHOOK_SECRET"},
		{"a file's key = value URL", nil,
			[]string{"relay", "--broker", "null://", "--tenants-file", file("kv.yaml", "databases:\n  - url: 'host = db port = x password = "+secret+"'\n")},
			"databases[0].url"},
		{"a token as the broker", []string{"PGOUTBOX_BROKER=" + secret + "-token"},
			[]string{"relay", "--database-url", pgtest.URL()}, "is not a broker URL"},
	} {
		cmd := exec.Command(binary, tc.args...)
		cmd.Env = append(os.Environ(), tc.env...)
		out, err := cmd.CombinedOutput()
		code := -1
		if cmd.ProcessState != nil {
			code = cmd.ProcessState.ExitCode()
		}
		msg := string(out)
		if code != 2 || !strings.Contains(msg, tc.want) || strings.Count(msg, "\n") != 1 {
			t.Errorf("%s: exit %d (%v), output %q; want 2 and one line with %q", tc.name, code, err, msg, tc.want)
		}
		if strings.Contains(msg, "s3cr3t") {
			t.Errorf("%s: the value is shown: %q", tc.name, msg)
		}
	}
}

// Whatever a refused value's size, the error is one line of bounded length:
// a selector's error names the bad item by position and never quotes it; an
// error that quotes a value cuts it short and says so.
func TestErrorLineIsBounded(t *testing.T) {
	t.Parallel()
	huge := strings.Repeat("t_", 100_000) + "["
	for _, tc := range []struct {
		args []string
		cut  bool // the error quotes the value, cut short
	}{
		{[]string{"relay", "--database-url", pgtest.URL(), "--tenants", huge, "--broker", "null://"}, false},
		{[]string{"status", "--database-url", pgtest.URL(), "--tenants", huge}, false},
		{[]string{"relay", "--database-url", pgtest.URL(), "--broker", "nats://127.0.0.1:4222", "--topic-template", huge}, true}, // no stream subjects in it
	} {
		_, stderr, code := run(t, tc.args...)
		if code != 2 || len(stderr) > maxErrorLine+100 || strings.Count(stderr, "\n") != 1 || strings.Contains(stderr, "t_t_t_t_") != tc.cut ||
			tc.cut && !strings.Contains(stderr, "more bytes not shown") {
			t.Errorf("%s: exit %d, %d bytes: %.200q", tc.args[0], code, len(stderr), stderr)
		}
	}
}
