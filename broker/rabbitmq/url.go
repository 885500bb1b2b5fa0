package rabbitmq

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net/url"
	"os"
	"strconv"
	"strings"
	"unicode"

	amqp "github.com/rabbitmq/amqp091-go"
)

// target is a server URL, checked at start-up.
type target struct {
	url     string // as given, with its password: only for amqp.DialConfig
	display string // without the password: for logs and errors
	uri     amqp.URI
	tls     *tls.Config // nil for amqp://
}

// queryParams are the URL query parameters amqp091-go understands; any other is
// refused, so that a misspelt "hearbeat=5" is not silently ignored.
var queryParams = []string{
	"heartbeat", "connection_timeout", "channel_max", "auth_mechanism",
	"certfile", "keyfile", "cacertfile", "server_name_indication",
}

// parseURL checks raw at start-up: amqp091-go would only find a mistake when it
// first dials, in the background, where it would look like an outage forever.
// Errors never contain the password: net/url's errors quote the whole URL, so
// only their cause is kept, and a URL is only ever shown through displayURL.
func parseURL(raw string, tlsConfig *tls.Config) (*target, error) {
	if strings.TrimSpace(raw) == "" {
		return nil, errors.New("rabbitmq: empty server URL")
	}
	if strings.IndexFunc(raw, func(r rune) bool { return unicode.IsSpace(r) || unicode.IsControl(r) }) >= 0 {
		return nil, errors.New("rabbitmq: malformed server URL: it contains whitespace or a control character")
	}
	u, err := url.Parse(raw)
	if err != nil {
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err // ue.URL holds the password
		}
		return nil, fmt.Errorf("rabbitmq: malformed server URL: %w", err)
	}
	if u.Scheme != "amqp" && u.Scheme != "amqps" {
		return nil, fmt.Errorf("rabbitmq: server URL: scheme %q, want amqp or amqps", u.Scheme)
	}
	if u.Opaque != "" || u.Hostname() == "" {
		// amqp:user:pass@host parses as an opaque URL; amqp:/// means localhost
		// to amqp091-go, but a relay should say which server it means.
		return nil, fmt.Errorf("rabbitmq: server URL: no host, want %s://[user:password@]host[:port][/vhost]", u.Scheme)
	}
	display := displayURL(u)
	if port := u.Port(); port != "" {
		if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
			return nil, fmt.Errorf("rabbitmq: server URL %s: invalid port %q", display, port)
		}
	} else if strings.HasSuffix(u.Host, ":") {
		return nil, fmt.Errorf("rabbitmq: server URL %s: empty port", display)
	}
	q := u.Query()
	for name := range q {
		known := false
		for _, k := range queryParams {
			known = known || k == name
		}
		if !known {
			return nil, fmt.Errorf("rabbitmq: server URL %s: unknown query parameter %q (known: %s)", display, name, strings.Join(queryParams, ", "))
		}
	}
	for _, m := range q["auth_mechanism"] {
		switch strings.ToUpper(m) {
		case "PLAIN", "AMQPLAIN", "EXTERNAL":
		default:
			return nil, fmt.Errorf("rabbitmq: server URL %s: auth_mechanism %q, want plain, amqplain or external", display, m)
		}
	}
	if v := q.Get("connection_timeout"); v != "" {
		if n, err := strconv.Atoi(v); err != nil || n < 1 {
			return nil, fmt.Errorf("rabbitmq: server URL %s: connection_timeout %q, want a positive number of milliseconds", display, v)
		}
	}
	uri, err := amqp.ParseURI(raw)
	if err != nil {
		// net/url accepted raw above, so this is about a query parameter's
		// value, which ParseURI quotes, never the password.
		return nil, fmt.Errorf("rabbitmq: server URL %s: %w", display, err)
	}
	t := &target{url: raw, display: display, uri: uri}
	if uri.Scheme == "amqps" {
		if t.tls, err = tlsFromURI(uri, tlsConfig); err != nil {
			return nil, fmt.Errorf("rabbitmq: server URL %s: %w", display, err)
		}
	}
	return t, nil
}

// displayURL is u without its password and query, safe to log.
func displayURL(u *url.URL) string {
	d := url.URL{Scheme: u.Scheme, Host: u.Host, Path: u.Path, RawPath: u.RawPath}
	if u.User != nil {
		d.User = url.User(u.User.Username())
	}
	return d.String()
}

// tlsFromURI returns the TLS config for an amqps:// server: a copy of the
// caller's, or one built from the URL's parameters as amqp091-go would, but now,
// so that a missing certificate file is a start-up error.
func tlsFromURI(uri amqp.URI, given *tls.Config) (*tls.Config, error) {
	if given != nil {
		return given.Clone(), nil
	}
	c := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: uri.ServerName}
	if uri.CACertFile != "" {
		pem, err := os.ReadFile(uri.CACertFile)
		if err != nil {
			return nil, fmt.Errorf("cacertfile: %w", err)
		}
		c.RootCAs = x509.NewCertPool()
		if !c.RootCAs.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("cacertfile %s: no PEM certificate in it", uri.CACertFile)
		}
	}
	if (uri.CertFile == "") != (uri.KeyFile == "") {
		return nil, errors.New("certfile and keyfile go together")
	}
	if uri.CertFile != "" {
		cert, err := tls.LoadX509KeyPair(uri.CertFile, uri.KeyFile)
		if err != nil {
			return nil, fmt.Errorf("client certificate: %w", err)
		}
		c.Certificates = []tls.Certificate{cert}
	}
	return c, nil
}
