package cli

import (
	"io"
	"os"
	"strings"
)

// maxSecretFile bounds what is read of a secret file: a real secret is far
// shorter, and a wrong path (a log, a device) must not be read whole.
const maxSecretFile = 4 << 10

// readSecretFile reads the secret in the file at path, given by flag (a
// --…-file flag): at most maxSecretFile bytes, its trailing newlines cut, and
// not empty. Errors name the flag, never the file's content.
func readSecretFile(flag, path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", usagef("%s: %v", flag, err)
	}
	defer f.Close()
	raw, err := io.ReadAll(io.LimitReader(f, maxSecretFile+1))
	switch {
	case err != nil:
		return "", usagef("%s: %v", flag, err)
	case len(raw) > maxSecretFile:
		return "", usagef("%s: the file is over %d bytes: not a secret", flag, maxSecretFile)
	}
	text := strings.TrimRight(string(raw), "\r\n")
	if text == "" {
		return "", usagef("%s: the file is empty", flag)
	}
	return text, nil
}
