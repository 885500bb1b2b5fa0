package rabbitmq

import (
	"crypto/tls"
	"net/url"
	"strings"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"
)

func TestParseURL(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		raw, display, host, vhost string
		port                      int
		tls                       bool
	}{
		{"amqp://guest:guest@127.0.0.1:5672/", "amqp://guest@127.0.0.1:5672/", "127.0.0.1", "/", 5672, false},
		{"amqp://rabbit.internal", "amqp://rabbit.internal", "rabbit.internal", "/", 5672, false},
		{"amqps://u:p%40ss@mq.example.com/prod?heartbeat=5", "amqps://u@mq.example.com/prod", "mq.example.com", "prod", 5671, true},
		{"amqp://u:p@[::1]:5673/%2F", "amqp://u@[::1]:5673/%2F", "::1", "/", 5673, false},
		{"amqp://u@h/v?connection_timeout=500&channel_max=10&auth_mechanism=plain", "amqp://u@h/v", "h", "v", 5672, false},
	} {
		tg, err := parseURL(c.raw, nil)
		if err != nil {
			t.Errorf("parseURL(%q): %v", c.raw, err)
			continue
		}
		if tg.display != c.display || tg.uri.Host != c.host || tg.uri.Vhost != c.vhost || tg.uri.Port != c.port || (tg.tls != nil) != c.tls {
			t.Errorf("parseURL(%q) = display %q host %q vhost %q port %d tls %v; want %q %q %q %d %v",
				c.raw, tg.display, tg.uri.Host, tg.uri.Vhost, tg.uri.Port, tg.tls != nil, c.display, c.host, c.vhost, c.port, c.tls)
		}
	}
}

func TestParseURLUsesTheCallersTLSConfig(t *testing.T) {
	t.Parallel()
	given := &tls.Config{ServerName: "given", MinVersion: tls.VersionTLS13}
	// The URL's cacertfile is ignored (and not read) when a config is given.
	tg, err := parseURL("amqps://h/?cacertfile=/nonexistent.pem", given)
	if err != nil {
		t.Fatal(err)
	}
	if tg.tls == given || tg.tls.ServerName != "given" {
		t.Errorf("want a copy of the given config, got %p %+v", tg.tls, tg.tls)
	}
}

// FuzzParseURL checks that parseURL never panics, never shows the password in
// an error or in the URL it logs, keeps errors on one line, and accepts only
// URLs that amqp091-go parses to an amqp or amqps server with a host.
func FuzzParseURL(f *testing.F) {
	for _, s := range []string{
		"amqp://guest:guest@127.0.0.1:5672/", "amqps://u:secretpw@h/v?heartbeat=5", "amqp://u:pw@h:0/",
		"amqp://u:pw@h:99999", "amqp:u:pw@h", "amqp:///", "http://u:pw@h", "amqp://u:pw@[::1", "amqp://u:p%zz@h",
		"amqp://u:pw@h/?hearbeat=1", "amqp://u:pw@h/?auth_mechanism=x", "amqp://u:pw@h/?channel_max=70000",
		"amqp://u:pw@h:/", "amqp://u:pw@h/?connection_timeout=0", "amqps://u:pw@h/?certfile=a",
	} {
		f.Add(s)
	}
	// A config of the caller's, so that the fuzzer's cacertfile paths are
	// never read.
	given := &tls.Config{MinVersion: tls.VersionTLS12}
	f.Fuzz(func(t *testing.T, raw string) {
		tg, err := parseURL(raw, given)
		password := ""
		if u, perr := url.Parse(raw); perr == nil && u.User != nil {
			password, _ = u.User.Password()
		}
		// Only a password that appears nowhere else in raw can be looked for.
		leaks := func(s string) bool {
			return len(password) >= 4 && strings.Count(raw, password) == 1 && strings.Contains(s, password)
		}
		if err != nil {
			if msg := err.Error(); leaks(msg) || strings.Contains(msg, "\n") {
				t.Fatalf("parseURL(%q): error %q shows the password or spans lines", raw, msg)
			}
			return
		}
		if leaks(tg.display) {
			t.Fatalf("parseURL(%q): display %q shows the password", raw, tg.display)
		}
		uri, err := amqp.ParseURI(raw)
		if err != nil {
			t.Fatalf("parseURL(%q) accepted what amqp091-go refuses: %v", raw, err)
		}
		if uri.Scheme != "amqp" && uri.Scheme != "amqps" || uri.Host == "" || uri.Port < 1 || uri.Port > 65535 {
			t.Fatalf("parseURL(%q) accepted scheme %q host %q port %d", raw, uri.Scheme, uri.Host, uri.Port)
		}
	})
}
