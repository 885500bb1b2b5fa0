package redisstream

import (
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strconv"
	"strings"

	"github.com/redis/go-redis/v9"
)

// maxURLBytes bounds the URL ParseURL reads.
const maxURLBytes = 2048

// ParseURL returns the connection options of rawURL:
// redis://[user@]host[:port][/db], or rediss:// for TLS (verified against
// the host name). The port defaults to 6379, the database to 0. A password
// in the URL is refused, and the error does not repeat it: pass it in
// Config.Password (the CLI reads it from the environment or a file). Query
// parameters and fragments are refused too, so that no setting is silently
// ignored.
func ParseURL(rawURL string) (*redis.Options, error) {
	if len(rawURL) > maxURLBytes {
		return nil, fmt.Errorf("redisstream: URL of %d bytes, above %d", len(rawURL), maxURLBytes)
	}
	u, err := url.Parse(rawURL)
	if err != nil {
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err // ue.URL may hold a password
		}
		return nil, fmt.Errorf("redisstream: malformed URL: %w", err)
	}
	if _, has := u.User.Password(); has {
		return nil, errors.New("redisstream: the URL carries a password: pass it through the environment or a file instead")
	}
	if u.Scheme != "redis" && u.Scheme != "rediss" {
		return nil, fmt.Errorf("redisstream: URL %s: scheme %q, want redis or rediss", u.Redacted(), u.Scheme)
	}
	if u.Opaque != "" || u.RawQuery != "" || u.Fragment != "" || u.ForceQuery {
		return nil, fmt.Errorf("redisstream: URL %s: want redis://[user@]host[:port][/db], without query or fragment", u.Redacted())
	}
	host := u.Hostname()
	if host == "" {
		return nil, fmt.Errorf("redisstream: URL %s: no host", u.Redacted())
	}
	port := u.Port()
	if port == "" {
		port = "6379"
	} else if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
		return nil, fmt.Errorf("redisstream: URL %s: invalid port %q", u.Redacted(), port)
	}
	opts := &redis.Options{Addr: net.JoinHostPort(host, port), Username: u.User.Username()}
	if db := strings.TrimPrefix(u.Path, "/"); db != "" {
		n, err := strconv.Atoi(db)
		if err != nil || n < 0 || n > 1<<16 {
			return nil, fmt.Errorf("redisstream: URL %s: database %.16q is not a number", u.Redacted(), db)
		}
		opts.DB = n
	}
	if u.Scheme == "rediss" {
		opts.TLSConfig = &tls.Config{ServerName: host, MinVersion: tls.VersionTLS12}
	}
	return opts, nil
}
