package kafka_test

import (
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"slices"
	"strings"
	"testing"

	"github.com/pgoutbox/pgoutbox/broker/kafka"
)

func TestParseURL(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		in     string
		seeds  []string
		tls    bool
		sasl   kafka.SASL
		redact string
	}{
		{in: "kafka://b1", seeds: []string{"b1:9092"}, redact: "kafka://b1:9092"},
		{in: " b1:9093 ", seeds: []string{"b1:9093"}, redact: "kafka://b1:9093"},
		{in: "KAFKA://b1:1,b-2.example.com:65535,10.0.0.7,[::1]:9094,[fe80::2]/",
			seeds:  []string{"b1:1", "b-2.example.com:65535", "10.0.0.7:9092", "[::1]:9094", "[fe80::2]:9092"},
			redact: "kafka://b1:1,b-2.example.com:65535,10.0.0.7:9092,[::1]:9094,[fe80::2]:9092"},
		{in: "kafka://b1:9092?tls=true", seeds: []string{"b1:9092"}, tls: true, redact: "kafka://b1:9092?tls=true"},
		{in: "kafka://b1:9092?tls=0", seeds: []string{"b1:9092"}, redact: "kafka://b1:9092"},
		{in: "kafka://relay:p%40ss%3Aw%2Frd@b1,b2?sasl=scram-sha-512&tls=1",
			seeds: []string{"b1:9092", "b2:9092"}, tls: true,
			sasl:   kafka.SASL{Mechanism: kafka.SASLScramSHA512, User: "relay", Password: "p@ss:w/rd"},
			redact: "kafka://relay:xxxxx@b1:9092,b2:9092?sasl=scram-sha-512&tls=true"},
		// An unescaped '@' or '/' in the password is taken as meant.
		{in: "kafka://relay:p@ss/w?rd@b1?sasl=PLAIN",
			seeds:  []string{"b1:9092"},
			sasl:   kafka.SASL{Mechanism: kafka.SASLPlain, User: "relay", Password: "p@ss/w?rd"},
			redact: "kafka://relay:xxxxx@b1:9092?sasl=plain"},
		{in: "kafka://relay@b1?sasl=Scram-Sha-256",
			seeds:  []string{"b1:9092"},
			sasl:   kafka.SASL{Mechanism: kafka.SASLScramSHA256, User: "relay"},
			redact: "kafka://relay@b1:9092?sasl=scram-sha-256"},
	} {
		u, err := kafka.ParseURL(tc.in)
		if err != nil {
			t.Errorf("ParseURL(%q): %v", tc.in, err)
			continue
		}
		if !slices.Equal(u.SeedBrokers, tc.seeds) || u.TLS != tc.tls || u.SASL != tc.sasl {
			t.Errorf("ParseURL(%q) = %+v %v %#v, want %v %v %#v", tc.in, u.SeedBrokers, u.TLS, u.SASL, tc.seeds, tc.tls, tc.sasl)
		}
		if got := u.String(); got != tc.redact {
			t.Errorf("ParseURL(%q).String() = %q, want %q", tc.in, got, tc.redact)
		}
	}
}

// FuzzParseURL checks that ParseURL never panics and accepts only usable URLs,
// and that nothing it says depends on the password beyond whether there is one:
// its error, or every printed form of its result, is the same with another
// password in the URL. A password can then not be shown, whatever it holds.
func FuzzParseURL(f *testing.F) {
	for _, seed := range [][3]string{
		{"relay", "s3cret-pw", "b1:9092,b2:9093?tls=true&sasl=scram-sha-512"},
		{"relay", "p@ss:w/rd?#x", "b1?sasl=plain"},
		{"relay", "pa%2Fss%zz", "b1?sasl=plain"},
		{"", "orphan-pw", "b1?sasl=plain"},
		{"relay", "no-mechanism", "[::1]:9094"},
		{"relay", "bad-port-pw", "b1:99999?sasl=plain"},
		{"relay", "bad-host-pw", "b 1?sasl=plain"},
		{"relay", "option-pw", "b1?tls=maybe&sasl=plain"},
		{"relay", "unknown-pw", "b1?password=unknown-pw2"},
		{"relay", "path-pw", "b1/topic?sasl=plain"},
		{"relay", "frag-pw", "b1#frag"},
		{"relay", "at-pw", "b1@b2?sasl=plain"},
		{"re%20lay", "x", "[fe80::1]?sasl=SCRAM-SHA-256"},
	} {
		f.Add(seed[0], seed[1], seed[2])
	}
	f.Fuzz(func(t *testing.T, user, password, rest string) {
		if strings.ContainsAny(user, ":@") {
			return // the user would end where another split is meant
		}
		s := "kafka://" + user + ":" + password + "@" + rest
		u, err := kafka.ParseURL(s)
		if err == nil {
			if len(u.SeedBrokers) == 0 {
				t.Fatalf("ParseURL(%q): no seed brokers", s)
			}
			for _, hp := range u.SeedBrokers {
				if _, _, err := net.SplitHostPort(hp); err != nil {
					t.Fatalf("ParseURL(%q): seed %q: %v", s, hp, err)
				}
			}
			if u.SASL.Mechanism == "" {
				t.Fatalf("ParseURL(%q): credentials without a mechanism accepted", s)
			}
			if !strings.Contains(rest, "@") {
				wantUser, _ := url.PathUnescape(user)
				wantPass, _ := url.PathUnescape(password)
				if u.SASL.User != wantUser || u.SASL.Password != wantPass {
					t.Fatalf("ParseURL(%q): credentials %q / %q, want %q / %q", s, u.SASL.User, u.SASL.Password, wantUser, wantPass)
				}
			}
		}

		// Another password that parses alike: empty, well-escaped or not.
		other := "Q"
		switch _, uerr := url.PathUnescape(password); {
		case password == "":
			other = ""
		case uerr != nil:
			other = "%zz"
		}
		s2 := "kafka://" + user + ":" + other + "@" + rest
		u2, err2 := kafka.ParseURL(s2)
		switch {
		case (err == nil) != (err2 == nil):
			t.Fatalf("ParseURL(%q) = %v but ParseURL(%q) = %v: the password decides", s, err, s2, err2)
		case err != nil && err.Error() != err2.Error():
			t.Fatalf("ParseURL(%q): error %q depends on the password (with another: %q)", s, err, err2)
		case err == nil:
			if a, b := shown(u), shown(u2); a != b {
				t.Fatalf("ParseURL(%q): printed forms depend on the password:\n%s\nwith another:\n%s", s, a, b)
			}
		}
	})
}

// shown is every way u may end up printed or logged.
func shown(u kafka.URL) string {
	var b strings.Builder
	cfg := kafka.Config{SASL: u.SASL}
	fmt.Fprintf(&b, "%s\n%s\n%v|%+v|%#v\n%v|%+v|%#v\n", u.String(), u.SASL.String(), u, u, u, cfg, cfg, cfg)
	noTime := func(_ []string, a slog.Attr) slog.Attr {
		if a.Key == slog.TimeKey {
			return slog.Attr{}
		}
		return a
	}
	slog.New(slog.NewJSONHandler(&b, &slog.HandlerOptions{ReplaceAttr: noTime})).Info("x", "sasl", u.SASL, "url", u, "config", cfg)
	slog.New(slog.NewTextHandler(&b, &slog.HandlerOptions{ReplaceAttr: noTime})).Info("x", "sasl", u.SASL, "url", u, "config", cfg)
	return b.String()
}
