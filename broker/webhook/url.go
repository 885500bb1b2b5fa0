package webhook

import (
	"errors"
	"fmt"
	"net/url"
	"slices"
	"strconv"
	"strings"

	"github.com/pgoutbox/pgoutbox/broker"
)

// endpoint is a parsed Config.URL: a fixed URL, or one whose path is a template.
type endpoint struct {
	base   *url.URL
	origin string           // scheme://host[:port], the only part errors and logs show
	fixed  string           // the URL to POST to when path is nil
	path   *broker.Template // the escaped path with placeholders, or nil
	fields []string         // the placeholders path uses
	ping   string           // the URL Ping sends HEAD to
}

// placeholders are the fields a path template may use, as broker.Template has them.
var placeholders = []string{"aggregate_type", "aggregate_id", "event_type", "schema_version", "tenant"}

// ParseURL checks that raw is a webhook endpoint the publisher can POST to, as
// given to Config.URL or to the CLI's --broker: an absolute http:// or https://
// URL with a host, an optional port, path and query, and no fragment. The path may
// hold the placeholders of [broker.Template] ({aggregate_type}, {aggregate_id},
// {event_type}, {schema_version}, {tenant}); the host and query may not. Each
// value is put in the path percent-escaped as one segment (a '/', '?', '#' or
// '%' in it is escaped; "", "." and ".." are refused), so no value can change
// the scheme, host, query or the rest of the path. It returns the URL as
// parsed, placeholders included.
//
// A URL may hold credentials — a password in its user info, a token in its path
// or query — so errors name the endpoint by its scheme and host only.
func ParseURL(raw string) (*url.URL, error) {
	ep, err := parseEndpoint(raw)
	if err != nil {
		return nil, fmt.Errorf("webhook: %w", err)
	}
	u := *ep.base
	if u.User != nil {
		user := *u.User
		u.User = &user
	}
	return &u, nil
}

func parseEndpoint(raw string) (*endpoint, error) {
	if raw == "" {
		return nil, errors.New("empty endpoint URL")
	}
	u, err := url.Parse(raw)
	if err != nil {
		return nil, fmt.Errorf("malformed endpoint URL: %s", parseErrorText(err))
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		if u.Scheme == "" {
			return nil, errors.New("endpoint URL has no scheme, want http:// or https://")
		}
		return nil, fmt.Errorf("endpoint URL scheme %q, want http or https", u.Scheme)
	}
	if u.Opaque != "" || u.Host == "" || u.Hostname() == "" {
		return nil, fmt.Errorf("endpoint URL %s://…: no host", u.Scheme)
	}
	origin := u.Scheme + "://" + u.Host
	if port := u.Port(); port != "" {
		if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
			return nil, fmt.Errorf("endpoint URL %s: invalid port %q", origin, port)
		}
	}
	if u.Fragment != "" || u.RawFragment != "" {
		return nil, fmt.Errorf("endpoint URL %s: has a #fragment, which is never sent", origin)
	}
	if strings.ContainsAny(u.RawQuery, "{}") {
		return nil, fmt.Errorf("endpoint URL %s: placeholders are expanded in the path only, not in the query", origin)
	}
	ep := &endpoint{base: u, origin: origin, fixed: u.String(), ping: u.String()}

	// When the path holds a brace, url.Parse keeps the path as written in RawPath
	// (a brace is not valid in an escaped path). Anything else is a fixed URL.
	rawPath := u.RawPath
	if !strings.ContainsAny(rawPath, "{}") {
		return ep, nil
	}
	// The literal text must be escaped already, so that the expanded path (literal
	// text and escaped values) is a valid escaped path and is sent as built.
	// Errors quote a placeholder at most, never the path: it may hold a token.
	for rest := rawPath; rest != ""; {
		open := strings.IndexAny(rest, "{}")
		lit := rest
		if open >= 0 {
			lit = rest[:open]
		}
		for i := 0; i < len(lit); i++ {
			if !isPathByte(lit[i]) {
				return nil, fmt.Errorf("endpoint URL %s: a path with placeholders must be percent-encoded elsewhere (byte %q)", origin, lit[i])
			}
		}
		if open < 0 {
			break
		}
		end := strings.IndexByte(rest[open:], '}')
		if rest[open] == '}' || end < 0 {
			return nil, fmt.Errorf("endpoint URL %s: unbalanced { or } in the path", origin)
		}
		name := rest[open+1 : open+end]
		if !slices.Contains(placeholders, name) {
			return nil, fmt.Errorf("endpoint URL %s: unknown placeholder {%.40s} in the path (want one of {%s})", origin, name, strings.Join(placeholders, "}, {"))
		}
		if !slices.Contains(ep.fields, name) {
			ep.fields = append(ep.fields, name)
		}
		rest = rest[open+end+1:]
	}
	tmpl, err := broker.ParseTemplate(rawPath)
	if err != nil {
		return nil, fmt.Errorf("endpoint URL %s: invalid path template", origin)
	}
	ep.path = &tmpl
	// Ping goes to the path before the first placeholder.
	pu := *u
	pu.RawPath = rawPath[:strings.IndexByte(rawPath, '{')]
	pu.Path, _ = url.PathUnescape(pu.RawPath)
	ep.ping = pu.String()
	return ep, nil
}

// isPathByte reports whether c may appear unescaped in an escaped URL path (RFC
// 3986 pchar and '/'; '%' for escapes, which url.Parse has checked).
func isPathByte(c byte) bool {
	switch {
	case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		return true
	}
	return strings.IndexByte("-._~!$&'()*+,;=:@/%", c) >= 0
}

// parseErrorText describes a url.Parse error without the URL, which may hold a
// password, and without the text of a bad escape, which may be part of one.
func parseErrorText(err error) string {
	var ue *url.Error
	if errors.As(err, &ue) {
		err = ue.Err
	}
	var escErr url.EscapeError
	if errors.As(err, &escErr) {
		return "invalid percent-encoding"
	}
	return err.Error()
}

// target returns the URL to POST m to.
func (e *endpoint) target(m *broker.Message) (string, error) {
	if e.path == nil {
		return e.fixed, nil
	}
	esc := *m
	for _, f := range e.fields {
		var v *string
		switch f {
		case "aggregate_type":
			v = &esc.AggregateType
		case "aggregate_id":
			v = &esc.AggregateID
		case "event_type":
			v = &esc.EventType
		case "tenant":
			v = &esc.Tenant
		default: // schema_version, a number
			continue
		}
		// "" would leave an empty segment, "." and ".." would move up the path: to
		// another endpoint, maybe.
		if *v == "" || *v == "." || *v == ".." {
			return "", fmt.Errorf("{%s} %q cannot be a path segment", f, *v)
		}
		*v = url.PathEscape(*v)
	}
	u := *e.base
	var err error
	if u.RawPath, err = e.path.ExpandChecked(&esc); err != nil {
		return "", err
	}
	if u.Path, err = url.PathUnescape(u.RawPath); err != nil {
		return "", fmt.Errorf("expanded path: %s", parseErrorText(err))
	}
	return u.String(), nil
}
