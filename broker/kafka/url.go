package kafka

import (
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"net/url"
	"slices"
	"strconv"
	"strings"
)

// URL is a parsed kafka:// URL: where the cluster is and how to reach it.
type URL struct {
	// SeedBrokers are the brokers to bootstrap from, as host:port.
	SeedBrokers []string
	// TLS is set by tls=true.
	TLS bool
	// SASL holds the credentials of the URL's user info and the mechanism of
	// its sasl option; its Mechanism is empty when the URL has none.
	SASL SASL
}

const defaultPort = "9092"

// urlSyntax is the shape of a URL, for error messages.
const urlSyntax = "kafka://[user:password@]host[:port][,host[:port]…][?tls=true&sasl=plain|scram-sha-256|scram-sha-512]"

// ParseURL parses a broker URL:
//
//	kafka://[user:password@]host[:port][,host[:port]…][?option=value&…]
//
// The hosts are the seed brokers, names or IP addresses (IPv6 in brackets); the
// port defaults to 9092. The scheme may be left out. Options:
//
//   - tls=true: connect with TLS, verifying the brokers' certificates against
//     the system's roots (SSL_CERT_FILE and SSL_CERT_DIR are honoured). Use
//     Config.TLS for other roots or client certificates. Defaults to false.
//   - sasl=plain, scram-sha-256 or scram-sha-512: authenticate with the URL's
//     user and password, which must then be present (percent-encoded where they
//     hold reserved characters such as '@', ':' or '/'). There is no default:
//     credentials without a mechanism are an error.
//
// Errors never quote the user info, so a password cannot end up in a log; use
// [URL.String] to show a URL.
func ParseURL(s string) (URL, error) {
	var u URL
	rest := strings.TrimSpace(s)
	if rest == "" {
		return u, errors.New("kafka: empty broker URL (want " + urlSyntax + ")")
	}
	if scheme, after, ok := strings.Cut(rest, "://"); ok {
		if !validScheme(scheme) {
			// Not quoted: without a valid scheme, what precedes "://" may be
			// user info.
			return u, errors.New("kafka: malformed broker URL (want " + urlSyntax + ")")
		}
		if !strings.EqualFold(scheme, "kafka") {
			return u, fmt.Errorf("kafka: broker URL scheme %q, want kafka://", scheme)
		}
		rest = after
	}

	// The user info ends at the last '@': a password may hold any character,
	// while hosts and options never hold an '@'.
	var userinfo string
	hasUserinfo := false
	if at := strings.LastIndexByte(rest, '@'); at >= 0 {
		userinfo, rest, hasUserinfo = rest[:at], rest[at+1:], true
	}
	hosts, query, _ := strings.Cut(rest, "?")
	if strings.ContainsRune(rest, '#') {
		return u, errors.New("kafka: broker URL has a fragment ('#'); want " + urlSyntax)
	}
	hosts = strings.TrimSuffix(hosts, "/")
	if strings.Contains(hosts, "/") {
		return u, fmt.Errorf("kafka: broker URL has a path after %q; want %s", hosts[:strings.IndexByte(hosts, '/')], urlSyntax)
	}
	if hosts == "" {
		return u, errors.New("kafka: broker URL has no host (want " + urlSyntax + ")")
	}
	for _, h := range strings.Split(hosts, ",") {
		hp, err := parseHostPort(h)
		if err != nil {
			return URL{}, err
		}
		u.SeedBrokers = append(u.SeedBrokers, hp)
	}

	if hasUserinfo {
		rawUser, rawPass, _ := strings.Cut(userinfo, ":")
		user, err := url.PathUnescape(rawUser)
		if err != nil {
			return URL{}, errors.New("kafka: broker URL: invalid percent-encoding in the user name")
		}
		pass, err := url.PathUnescape(rawPass)
		if err != nil {
			return URL{}, errors.New("kafka: broker URL: invalid percent-encoding in the password")
		}
		if user == "" {
			return URL{}, errors.New("kafka: broker URL has user info without a user name")
		}
		u.SASL.User, u.SASL.Password = user, pass
	}

	if err := u.parseOptions(query); err != nil {
		return URL{}, err
	}
	switch {
	case u.SASL.Mechanism != "" && u.SASL.User == "":
		return URL{}, fmt.Errorf("kafka: broker URL option sasl=%s needs user:password@ before the host", strings.ToLower(u.SASL.Mechanism))
	case u.SASL.Mechanism == "" && u.SASL.User != "":
		return URL{}, errors.New("kafka: broker URL has credentials but no sasl option (want sasl=plain, sasl=scram-sha-256 or sasl=scram-sha-512)")
	}
	return u, nil
}

func (u *URL) parseOptions(query string) error {
	if query == "" {
		return nil
	}
	values, err := url.ParseQuery(query)
	if err != nil {
		return fmt.Errorf("kafka: broker URL options: %w", err)
	}
	// In a fixed order, so that the same URL always gets the same error.
	for _, key := range slices.Sorted(maps.Keys(values)) {
		vs := values[key]
		if len(vs) != 1 {
			return fmt.Errorf("kafka: broker URL option %q is given %d times", key, len(vs))
		}
		v := vs[0]
		switch key {
		case "tls":
			on, err := strconv.ParseBool(v)
			if err != nil {
				return fmt.Errorf("kafka: broker URL option tls=%q: want true or false", v)
			}
			u.TLS = on
		case "sasl":
			m := normalizeMechanism(v)
			switch m {
			case SASLPlain, SASLScramSHA256, SASLScramSHA512:
				u.SASL.Mechanism = m
			default:
				return fmt.Errorf("kafka: broker URL option sasl=%q: want plain, scram-sha-256 or scram-sha-512", v)
			}
		default:
			return fmt.Errorf("kafka: broker URL option %q is unknown (want tls or sasl)", key)
		}
	}
	return nil
}

// validScheme reports whether s is a URL scheme (RFC 3986: a letter, then
// letters, digits, '+', '-' or '.').
func validScheme(s string) bool {
	if s == "" {
		return false
	}
	for i, r := range s {
		letter := 'a' <= r && r <= 'z' || 'A' <= r && r <= 'Z'
		if !letter && (i == 0 || !('0' <= r && r <= '9' || r == '+' || r == '-' || r == '.')) {
			return false
		}
	}
	return true
}

// parseHostPort checks one seed broker and returns it as host:port.
func parseHostPort(h string) (string, error) {
	raw := h
	h = strings.TrimSpace(h)
	if h == "" {
		return "", errors.New("kafka: broker URL has an empty host in its list (want " + urlSyntax + ")")
	}
	host, port := h, ""
	hasPort := false
	if strings.HasPrefix(h, "[") {
		end := strings.IndexByte(h, ']')
		if end < 0 {
			return "", fmt.Errorf("kafka: broker URL host %q: missing ']'", raw)
		}
		host = h[1:end]
		if after := h[end+1:]; after != "" {
			if !strings.HasPrefix(after, ":") {
				return "", fmt.Errorf("kafka: broker URL host %q: want [address]:port", raw)
			}
			port, hasPort = after[1:], true
		}
		if ip := net.ParseIP(host); ip == nil || ip.To4() != nil && !strings.Contains(host, ":") {
			return "", fmt.Errorf("kafka: broker URL host %q: not an IPv6 address", raw)
		}
	} else {
		if i := strings.LastIndexByte(h, ':'); i >= 0 {
			host, port, hasPort = h[:i], h[i+1:], true
		}
		if strings.Contains(host, ":") {
			return "", fmt.Errorf("kafka: broker URL host %q: an IPv6 address goes in brackets, as in [::1]:9092", raw)
		}
		if !validHostname(host) {
			return "", fmt.Errorf("kafka: broker URL host %q: not a host name or IP address", raw)
		}
	}
	if !hasPort {
		port = defaultPort
	} else if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 || port[0] == '+' || port[0] == '-' {
		return "", fmt.Errorf("kafka: broker URL host %q: invalid port %q", raw, port)
	}
	return net.JoinHostPort(host, port), nil
}

// validHostname reports whether s is a DNS name or an IPv4 address: labels of
// letters, digits, '-' and '_' (some internal names have them) separated by dots.
func validHostname(s string) bool {
	if s == "" || len(s) > 253 {
		return false
	}
	for _, label := range strings.Split(strings.TrimSuffix(s, "."), ".") {
		if label == "" || len(label) > 63 {
			return false
		}
		for _, r := range label {
			if !('a' <= r && r <= 'z' || 'A' <= r && r <= 'Z' || '0' <= r && r <= '9' || r == '-' || r == '_') {
				return false
			}
		}
	}
	return true
}

// LogValue is String for log/slog.
func (u URL) LogValue() slog.Value { return slog.StringValue(u.String()) }

// MarshalJSON encodes String, so that the password stays out of JSON logs.
func (u URL) MarshalJSON() ([]byte, error) { return json.Marshal(u.String()) }

// String returns the URL with the password replaced by "xxxxx", fit for logs.
func (u URL) String() string {
	var b strings.Builder
	b.WriteString("kafka://")
	if u.SASL.User != "" {
		b.WriteString(url.PathEscape(u.SASL.User))
		if u.SASL.Password != "" {
			b.WriteString(":xxxxx")
		}
		b.WriteByte('@')
	}
	b.WriteString(strings.Join(u.SeedBrokers, ","))
	var opts []string
	if u.SASL.Mechanism != "" {
		opts = append(opts, "sasl="+strings.ToLower(u.SASL.Mechanism))
	}
	if u.TLS {
		opts = append(opts, "tls=true")
	}
	if len(opts) > 0 {
		b.WriteString("?" + strings.Join(opts, "&"))
	}
	return b.String()
}
