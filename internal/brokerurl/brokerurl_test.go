package brokerurl

import (
	"strings"
	"testing"
)

var (
	host = Kind{Pkg: "mqtt", Schemes: []string{"mqtt", "mqtts"}, Form: "mqtt[s]://[user@]host[:port]", Credentials: "PGOUTBOX_MQTT_PASSWORD"}
	name = Kind{Pkg: "kinesis", Schemes: []string{"kinesis"}, Form: "kinesis://<stream>", Credentials: "the AWS default chain"}
)

const secret = "hunter2-s3cret"

func TestHost(t *testing.T) {
	for _, tc := range []struct{ in, def, scheme, hostport, user string }{
		{"mqtt://h", "1883", "mqtt", "h:1883", ""},
		{"MQTTS://app@h:8884/", "8883", "mqtts", "h:8884", "app"},
		{"mqtt://[::1]:1", "1883", "mqtt", "[::1]:1", ""},
	} {
		u, hp, err := host.Host(tc.in, tc.def)
		if err != nil || u.Scheme != tc.scheme || hp != tc.hostport || u.User.Username() != tc.user {
			t.Errorf("Host(%q) = %v, %q, %v", tc.in, u, hp, err)
		}
	}
	for in, want := range map[string]string{
		"":               "empty URL",
		"   ":            "empty URL",
		"tcp://h":        "want mqtt or mqtts",
		"mqtt:///":       "no host",
		"mqtt:h":         "no host",
		"mqtt://h?x=1":   "without query",
		"mqtt://h?":      "without query",
		"mqtt://h#f":     "without query or fragment",
		"mqtt://h:0":     "invalid port",
		"mqtt://h:65536": "invalid port",
		"mqtt://h:":      "empty port",
		"mqtt://h /":     "whitespace",
		"mqtt://h\x00":   "control character",
		"mqtt://%zz":     "malformed URL",
		"mqtt://h/" + strings.Repeat("a", MaxLen): "above 2048",
	} {
		_, _, err := host.Host(in, "1")
		if err == nil || !strings.Contains(err.Error(), want) || !strings.HasPrefix(err.Error(), "mqtt: ") {
			t.Errorf("Host(%.40q): %v, want an error saying %q", in, err, want)
		}
	}
}

// An attacker's (or a careless operator's) URL with a password: refused, and
// no error repeats it, whatever else is wrong with the URL.
func TestHostRefusesPasswordsWithoutEchoing(t *testing.T) {
	for _, in := range []string{
		"mqtt://u:" + secret + "@h",
		"mqtt://:" + secret + "@h:1883",
		"mqtts://u:" + secret + "@h/x",
		"mqtt://u:" + secret + "@h:%zz",                          // malformed after the password
		"mqtt://u:" + secret + "@h:99999",                        // a bad port too
		"tcp://u:" + secret + "@h",                               // a foreign scheme too
		"mqtt://u:" + secret + "@h?" + secret,                    // and in the query
		"mqtt://u:" + secret + " @h",                             // whitespace
		"mqtt://u:" + secret + "@" + strings.Repeat("h", MaxLen), // too long
		"mqtt://u:" + escaped(secret) + "@h",                     // escaped
	} {
		_, _, err := host.Host(in, "1883")
		if err == nil {
			t.Errorf("Host(%.60q) accepted", in)
			continue
		}
		if strings.Contains(err.Error(), secret) || strings.Contains(err.Error(), escaped(secret)) {
			t.Errorf("Host(%.60q): the error %q repeats the password", in, err)
		}
	}
	if _, _, err := host.Host("mqtt://u:"+secret+"@h", "1"); err == nil || !strings.Contains(err.Error(), "carries a password: pass it through PGOUTBOX_MQTT_PASSWORD") {
		t.Errorf("the refusal does not say where the password goes: %v", err)
	}
}

func escaped(s string) string { return strings.ReplaceAll(s, "-", "%2D") }

func TestName(t *testing.T) {
	n, q, err := name.Name("KINESIS://outbox-{aggregate_type}?region=eu-west-1&endpoint=http://127.0.0.1:1", "region", "endpoint")
	if err != nil || n != "outbox-{aggregate_type}" || q["region"] != "eu-west-1" || q["endpoint"] != "http://127.0.0.1:1" {
		t.Fatalf("Name: %q %v %v", n, q, err)
	}
	if n, q, err := name.Name("kinesis://", "region"); err != nil || n != "" || len(q) != 0 {
		t.Errorf("empty name: %q %v %v", n, q, err)
	}
	for in, want := range map[string]string{
		"sqs://outbox":                             "want a URL kinesis://<stream>",
		"kinesis:outbox":                           "want a URL",
		"kinesis://key:" + secret + "@s":           "must not hold credentials (user info): they come from the AWS default chain",
		"kinesis://" + secret + "@s":               "must not hold credentials",
		"kinesis://s#" + secret:                    "fragment",
		"kinesis://s?token=" + secret:              `unknown query parameter "token" (want region)`,
		"kinesis://s?region=a&region=b":            "given 2 times",
		"kinesis://s?%zz=" + secret:                "query is malformed",
		"kinesis://s?region=" + secret + " ":       "whitespace",
		"kinesis://" + strings.Repeat("s", MaxLen): "above 2048",
	} {
		_, _, err := name.Name(in, "region")
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Name(%.40q): %v, want an error saying %q", in, err, want)
		}
		if err != nil && strings.Contains(err.Error(), secret) {
			t.Errorf("Name(%.40q): the error %q repeats a secret", in, err)
		}
	}
}

// FuzzHost: no input panics, and no refusal repeats a password.
func FuzzHost(f *testing.F) {
	f.Add("mqtt://u:pw-secret@h:1883")
	f.Add("mqtt://h")
	f.Add("mqtt://u:pw-secret@[::1")
	f.Fuzz(func(t *testing.T, s string) {
		_, _, err := host.Host(s, "1883")
		if err == nil {
			return
		}
		if i := strings.Index(s, "://"); i >= 0 {
			if at := strings.LastIndex(s, "@"); at > i {
				if _, pw, ok := strings.Cut(s[i+3:at], ":"); ok && len(pw) >= 6 && strings.Contains(err.Error(), pw) {
					t.Fatalf("Host(%q): %v repeats the password", s, err)
				}
			}
		}
	})
}
