// Package brokerurl is the one way a broker adapter reads the URL it is given
// (Config, or the CLI's --broker): a bounded length, no whitespace or control
// characters, net/url's parse errors without the URL, the scheme among the
// adapter's, and credentials refused without echoing them — a password comes
// from the environment or a file, never from a URL that ends up in process
// lists, shell histories and logs.
//
// Two shapes of URL are read:
//   - [Kind.Host]: scheme://[user@]host[:port][/path] (mqtt://, redis://): a
//     user name may stay, a password is refused;
//   - [Kind.Name]: scheme://<name>[?param=value&…] (kinesis://, pubsub://),
//     whose credentials come from the cloud's own chain: any user info is
//     refused, and each parameter is one of the adapter's, given once.
//
// No error of this package repeats the URL, a password, or a query value.
package brokerurl

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"unicode"
)

// MaxLen bounds the URLs read, in bytes.
const MaxLen = 2048

// Kind describes the URLs of one adapter.
type Kind struct {
	// Pkg prefixes every error: the adapter's package name ("mqtt").
	Pkg string
	// Schemes are the accepted schemes, in lower case; a URL's scheme is
	// matched without regard to case.
	Schemes []string
	// Form is the URL's form, as errors show it
	// ("mqtt://[user@]host[:port]").
	Form string
	// Credentials says where credentials come from instead of the URL, as the
	// refusal shows it ("PGOUTBOX_MQTT_PASSWORD or --mqtt-password-file").
	Credentials string
}

// Host reads raw as scheme://[user@]host[:port][/path] of one of k's
// schemes, without a password, query or fragment, and returns it with its
// scheme in lower case and host:port, the port being defPort when absent
// (checked 1..65535). The path is the caller's to check.
func (k Kind) Host(raw, defPort string) (u *url.URL, hostport string, err error) {
	if err := k.plain(raw); err != nil {
		return nil, "", err
	}
	u, err = url.Parse(raw)
	if err != nil {
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err // ue.URL may hold a password
		}
		return nil, "", fmt.Errorf("%s: malformed URL: %w", k.Pkg, err)
	}
	if _, has := u.User.Password(); has {
		return nil, "", fmt.Errorf("%s: the URL carries a password: pass it through %s instead", k.Pkg, k.Credentials)
	}
	if err := k.scheme(u.Scheme); err != nil {
		return nil, "", err
	}
	u.Scheme = strings.ToLower(u.Scheme)
	if u.Opaque != "" || u.Hostname() == "" {
		return nil, "", fmt.Errorf("%s: URL: no host, want %s", k.Pkg, k.Form)
	}
	if u.RawQuery != "" || u.ForceQuery || u.Fragment != "" {
		return nil, "", fmt.Errorf("%s: URL: want %s, without query or fragment", k.Pkg, k.Form)
	}
	port := u.Port()
	switch {
	case port != "":
		if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
			return nil, "", fmt.Errorf("%s: URL: invalid port %.10q", k.Pkg, port)
		}
	case strings.HasSuffix(u.Host, ":"):
		return nil, "", fmt.Errorf("%s: URL: empty port", k.Pkg)
	default:
		port = defPort
	}
	return u, net.JoinHostPort(u.Hostname(), port), nil
}

// Name reads raw as scheme://<name>[?param=value&…] of one of k's schemes and
// returns the name (possibly empty) and the parameters. The name must hold no
// user info ('@': credentials) and no fragment; each parameter must be one of
// params, given once. The name's own rules are the caller's.
func (k Kind) Name(raw string, params ...string) (name string, values map[string]string, err error) {
	if err := k.plain(raw); err != nil {
		return "", nil, err
	}
	scheme, rest, ok := strings.Cut(raw, "://")
	if !ok || k.scheme(scheme) != nil {
		return "", nil, fmt.Errorf("%s: want a URL %s", k.Pkg, k.Form)
	}
	name, query, _ := strings.Cut(rest, "?")
	if strings.Contains(name, "@") {
		return "", nil, fmt.Errorf("%s: the URL must not hold credentials (user info): they come from %s", k.Pkg, k.Credentials)
	}
	if strings.Contains(name, "#") {
		return "", nil, fmt.Errorf("%s: the URL holds a fragment; want %s", k.Pkg, k.Form)
	}
	q, err := url.ParseQuery(query)
	if err != nil {
		return "", nil, fmt.Errorf("%s: the URL's query is malformed", k.Pkg)
	}
	values = make(map[string]string, len(q))
	for key, v := range q {
		if !slices.Contains(params, key) {
			return "", nil, fmt.Errorf("%s: unknown query parameter %q (want %s)", k.Pkg, truncate(key), strings.Join(params, " or "))
		}
		if len(v) != 1 {
			return "", nil, fmt.Errorf("%s: query parameter %q given %d times", k.Pkg, key, len(v))
		}
		values[key] = v[0]
	}
	return name, values, nil
}

// plain refuses an empty or oversized URL, and one with whitespace or a
// control character (net/url would quote it whole).
func (k Kind) plain(raw string) error {
	switch {
	case strings.TrimSpace(raw) == "":
		return fmt.Errorf("%s: empty URL, want %s", k.Pkg, k.Form)
	case len(raw) > MaxLen:
		return fmt.Errorf("%s: URL of %d bytes, above %d", k.Pkg, len(raw), MaxLen)
	case strings.IndexFunc(raw, func(r rune) bool { return unicode.IsSpace(r) || unicode.IsControl(r) }) >= 0:
		return fmt.Errorf("%s: malformed URL: it contains whitespace or a control character", k.Pkg)
	}
	return nil
}

func (k Kind) scheme(s string) error {
	for _, want := range k.Schemes {
		if strings.EqualFold(s, want) {
			return nil
		}
	}
	return fmt.Errorf("%s: URL: scheme %.20q, want %s", k.Pkg, s, strings.Join(k.Schemes, " or "))
}

// truncate cuts s to 40 bytes for an error.
func truncate(s string) string {
	if len(s) > 40 {
		return s[:40] + "…"
	}
	return s
}
