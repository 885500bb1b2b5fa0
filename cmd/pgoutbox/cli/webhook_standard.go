package cli

import (
	"io"
	"os"
	"strings"

	"github.com/pgoutbox/pgoutbox/broker/webhook"
)

// standardSecretEnv holds the Standard Webhooks secret ("whsec_…") when
// --webhook-standard-secret-file is not given.
const standardSecretEnv = "PGOUTBOX_WEBHOOK_STANDARD_SECRET"

// maxSecretFile bounds what is read of a secret file: a real secret is far
// shorter, and a wrong path (a log, a device) must not be read whole.
const maxSecretFile = 4 << 10

// readStandardSecret reads the Standard Webhooks secret of o, if any, from
// --webhook-standard-secret-file or the environment, and decodes it into
// o.standardSecret. Errors name where the value came from, never the value.
func readStandardSecret(o *webhookFlags) error {
	text, from := os.Getenv(standardSecretEnv), standardSecretEnv
	if o.standardSecretFile != "" {
		from = "--webhook-standard-secret-file"
		f, err := os.Open(o.standardSecretFile)
		if err != nil {
			return usagef("%s: %v", from, err)
		}
		defer f.Close()
		raw, err := io.ReadAll(io.LimitReader(f, maxSecretFile+1))
		switch {
		case err != nil:
			return usagef("%s: %v", from, err)
		case len(raw) > maxSecretFile:
			return usagef("%s: the file is over %d bytes: not a secret", from, maxSecretFile)
		}
		text = strings.TrimRight(string(raw), "\r\n")
		if text == "" {
			return usagef("%s: the file is empty", from)
		}
	}
	if text == "" {
		return nil
	}
	key, err := webhook.ParseStandardSecret(text)
	if err != nil {
		return usagef("%s: %v", from, err)
	}
	o.standardSecret = key
	return nil
}
