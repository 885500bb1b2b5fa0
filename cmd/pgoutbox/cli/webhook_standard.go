package cli

import (
	"os"

	"github.com/pgoutbox/pgoutbox/broker/webhook"
)

// standardSecretEnv holds the Standard Webhooks secret ("whsec_…") when
// --webhook-standard-secret-file is not given.
const standardSecretEnv = "PGOUTBOX_WEBHOOK_STANDARD_SECRET"

// readStandardSecret reads the Standard Webhooks secret of o, if any, from
// --webhook-standard-secret-file or the environment, and decodes it into
// o.standardSecret. Errors name where the value came from, never the value.
func readStandardSecret(o *webhookFlags) error {
	text, from := os.Getenv(standardSecretEnv), standardSecretEnv
	if o.standardSecretFile != "" {
		from = "--webhook-standard-secret-file"
		var err error
		if text, err = readSecretFile(from, o.standardSecretFile); err != nil {
			return err
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
