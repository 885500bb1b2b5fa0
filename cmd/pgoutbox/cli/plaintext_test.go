package cli

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"

	"github.com/spf13/pflag"
)

func TestWarnPlaintextCredentials(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		kind, url string
		warn      bool
		password  string // read from the environment or a file
	}{
		{"nats", "nats://u:Zsecret1@h:4222", true, ""},
		{"nats", "nats://Ztoken1@h:4222", true, ""},
		{"nats", "nats://h1:4222,nats://u:Zsecret1@h2:4222", true, ""},
		{"nats", "ws://u:Zsecret1@h:8080", true, ""},
		{"nats", "tls://u:Zsecret1@h:4222", false, ""},
		{"nats", "nats://h:4222", false, ""},
		{"rabbitmq", "amqp://guest:Zsecret1@h:5672/", true, ""},
		{"rabbitmq", "amqps://guest:Zsecret1@h:5671/", false, ""},
		{"rabbitmq", "amqp://h:5672/", false, ""},
		{"kafka", "kafka://u:Zsecret1@k1:9092,k2:9092?sasl=plain", true, ""},
		{"kafka", "kafka://u:Zsecret1@k1:9092,k2:9092?sasl=plain&tls=true", false, ""},
		{"kafka", "kafka://k1:9092", false, ""},
		// MQTT and Redis: the password comes from the environment or a file,
		// never the URL; the scheme alone says whether it is encrypted.
		{"mqtt", "mqtt://h:1883", true, "Zsecret1"},
		{"mqtt", "mqtt://app@h:1883", true, "Zsecret1"},
		{"mqtt", "mqtt://app@h:1883", true, ""},
		{"mqtt", "mqtts://app@h:8883", false, "Zsecret1"},
		{"mqtt", "mqtt://h:1883", false, ""},
		{"redis", "redis://h:6379", true, "Zsecret1"},
		{"redis", "redis://app@h:6379/2", true, "Zsecret1"},
		{"redis", "rediss://h:6379", false, "Zsecret1"},
		{"redis", "redis://h:6379", false, ""},
	} {
		var b brokerFlags
		b.register(pflag.NewFlagSet("test", pflag.ContinueOnError))
		b.url = tc.url
		switch tc.kind {
		case "mqtt":
			kindFlags[mqttFlags](&b, "mqtt").password = tc.password
		case redisKind:
			kindFlags[redisFlags](&b, redisKind).password = tc.password
		}
		var logs bytes.Buffer
		k := kindNamed(tc.kind)
		warnPlaintextCredentials(slog.New(slog.NewTextHandler(&logs, nil)), &brokerTarget{flags: &b, kind: k})
		if got := strings.Contains(logs.String(), "level=WARN"); got != tc.warn {
			t.Errorf("%s %s: warned %v, want %v: %s", tc.kind, tc.url, got, tc.warn, logs.String())
		}
		if tc.warn && !strings.Contains(logs.String(), "(use "+k.tls+")") {
			t.Errorf("%s %s: the warning does not name %s: %s", tc.kind, tc.url, k.tls, logs.String())
		}
		if strings.Contains(logs.String(), "Zsecret1") || strings.Contains(logs.String(), "Ztoken1") {
			t.Errorf("%s: the warning shows the secret: %s", tc.url, logs.String())
		}
	}
	// Every kind that warns names the form that asks for TLS.
	for _, k := range brokerKinds {
		if k.plaintext != nil && k.tls == "" {
			t.Errorf("kind %s warns of plaintext without naming its TLS form", k.name)
		}
	}
}

// An environment value a flag refuses is shown without its secrets.
func TestEnvErrorHidesSecrets(t *testing.T) {
	for _, tc := range []struct{ name, value, secret string }{
		{"PGOUTBOX_BENCH_BROKER", `nats://u:Zsecret1@h:4222,"bad`, "Zsecret1"},
		{"PGOUTBOX_BENCH_BROKER", `"nats://Ztoken1@h:4222`, "Ztoken1"},
	} {
		t.Setenv(tc.name, tc.value)
		_, errOut, code := run(t, "bench", "--from-json", "/nonexistent")
		if code != exitUsage || strings.Contains(errOut, tc.secret) || !strings.Contains(errOut, tc.name) {
			t.Errorf("%s=%s: exit %d, stderr %q: want a usage error naming the variable, without the secret", tc.name, tc.value, code, errOut)
		}
	}
}
