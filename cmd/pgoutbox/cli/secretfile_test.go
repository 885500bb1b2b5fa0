package cli

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/pgoutbox/pgoutbox/internal/pgtest"
)

// Every secret file is read bounded (a wrong path — a log, a device — is not
// read whole), an empty one is refused, and no error shows the content: one
// line naming the flag, exit 2.
func TestSecretFilesBounded(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	const planted = "Zplanted-secret"
	file := func(name, body string) string {
		p := filepath.Join(dir, name)
		pgtest.Must(t, os.WriteFile(p, []byte(body), 0o600), "write %s", name)
		return p
	}
	huge := file("huge", planted+strings.Repeat("x", maxSecretFile)+"\n")
	justOver := file("over", strings.Repeat(planted, maxSecretFile/len(planted)+1)[:maxSecretFile+1])
	empty := file("empty", "\r\n\n")
	brokers := map[string][]string{
		"--webhook-secret-file":          {"--broker", "https://hooks.example/x"},
		"--webhook-standard-secret-file": {"--broker", "https://hooks.example/x"},
		"--mqtt-password-file":           {"--broker", "mqtt://app@127.0.0.1:1883", "--mqtt-client-id", "r"},
		"--redis-password-file":          {"--broker", "redis://127.0.0.1:6379"},
	}
	for flag, broker := range brokers {
		for _, tc := range []struct{ file, want string }{
			{huge, flag + ": the file is over 4096 bytes: not a secret"},
			{justOver, flag + ": the file is over 4096 bytes: not a secret"},
			{empty, flag + ": the file is empty"},
			{filepath.Join(dir, "none"), flag + ": open"},
		} {
			args := append([]string{"relay", "--database-url", pgtest.URL()}, broker...)
			_, errOut, code := run(t, append(args, flag, tc.file)...)
			if code != exitUsage || !strings.Contains(errOut, tc.want) || strings.Count(strings.TrimSpace(errOut), "\n") != 0 {
				t.Errorf("%s %s: exit %d, %q; want %d and one line with %q", flag, filepath.Base(tc.file), code, errOut, exitUsage, tc.want)
			}
			if strings.Contains(errOut, "Zplanted") || strings.Contains(errOut, "xxxx") {
				t.Errorf("%s %s: the content is shown: %q", flag, filepath.Base(tc.file), errOut)
			}
		}
	}
	// A file at the bound is read, its newline cut.
	at := file("at", strings.Repeat("s", maxSecretFile-1)+"\n")
	if got, err := readSecretFile("--x-file", at); err != nil || len(got) != maxSecretFile-1 {
		t.Errorf("a file of %d bytes: %d bytes read, %v", maxSecretFile, len(got), err)
	}
}
