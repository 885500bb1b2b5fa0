package webhook_test

import (
	"strings"
	"testing"

	"github.com/pgoutbox/pgoutbox/broker/webhook"
)

func TestParseURL(t *testing.T) {
	t.Parallel()
	for raw, ok := range map[string]bool{
		"https://hooks.example.com/outbox":                    true,
		"http://127.0.0.1:8080":                               true,
		"https://[::1]:8443/in?token=x":                       true,
		"https://u:p@hooks.example.com/in":                    true,
		"https://h/hooks/{aggregate_type}/{event_type}":       true,
		"https://h/v{schema_version}/{aggregate_id}?tenant=a": true,
		"https://h/a%2Fb/{aggregate_type}":                    true,
		"HTTPS://H/x":                                         true,
		"":                                                    false,
		"hooks.example.com/outbox":                            false,
		"ftp://h/x":                                           false,
		"nats://h:4222":                                       false,
		"http:opaque":                                         false,
		"http:///path":                                        false,
		"http://h:0/":                                         false,
		"http://h:99999/":                                     false,
		"http://h:x/":                                         false,
		"https://h/x#frag":                                    false,
		"https://h/x?a={aggregate_type}":                      false,
		"https://{aggregate_type}.h/x":                        false,
		"https://h/{unknown}":                                 false,
		"https://h/{aggregate_type":                           false,
		"https://h/aggregate_type}":                           false,
		"https://h/a b/{aggregate_type}":                      false,
		"https://h/café/{aggregate_type}":                     false,
		"https://h/%zz":                                       false,
		"https://h/x\n":                                       false,
		"https://user:secret%zz@h/x":                          false,
		"https://h/{aggregate_type}{aggregate_type}/{aggregate_id}": true,
		"https://h/hooks/{tenant}/{aggregate_type}":                 true,
		"https://{tenant}.h/x":                                      false,
		"https://h/x?tenant={tenant}":                               false,
		"https://h:{tenant}/x":                                      false,
	} {
		u, err := webhook.ParseURL(raw)
		if (err == nil) != ok {
			t.Errorf("ParseURL(%q) = %v, %v; want ok=%v", raw, u, err, ok)
		}
	}
}

// FuzzParseURL checks that ParseURL never panics, accepts only absolute http(s)
// URLs with a host, and never puts a URL's password in an error.
func FuzzParseURL(f *testing.F) {
	for _, s := range []string{
		"https://hooks.example.com/outbox", "http://127.0.0.1:8080/{aggregate_type}", "https://u:p@h/x",
		"ftp://h", "https://h/x#f", "https://h/{x}", "http://[::1", "https://h/%zz", "https://h:99999",
	} {
		f.Add(s)
	}
	const password = "Zq8vPw3kXy"
	f.Fuzz(func(t *testing.T, raw string) {
		u, err := webhook.ParseURL(raw)
		if err == nil {
			if u.Scheme != "http" && u.Scheme != "https" || u.Hostname() == "" || u.Fragment != "" {
				t.Fatalf("accepted %q: scheme %q, host %q, fragment %q", raw, u.Scheme, u.Hostname(), u.Fragment)
			}
		}
		if strings.Contains(raw, password) {
			return
		}
		// The same text with a password in its user info, where one can be.
		scheme, rest, found := strings.Cut(raw, "://")
		if !found {
			return
		}
		if _, err := webhook.ParseURL(scheme + "://admin:" + password + "@" + rest); err != nil && strings.Contains(err.Error(), password) {
			t.Fatalf("error %q reveals the password", err)
		}
	})
}
