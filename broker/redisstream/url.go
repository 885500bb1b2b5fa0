package redisstream

import (
	"crypto/tls"
	"fmt"
	"strconv"
	"strings"

	"github.com/redis/go-redis/v9"

	"github.com/pgoutbox/pgoutbox/internal/brokerurl"
)

// urlKind is the form of the server URL.
var urlKind = brokerurl.Kind{
	Pkg: "redisstream", Schemes: []string{"redis", "rediss"}, Form: "redis[s]://[user@]host[:port][/db]",
	Credentials: "Config.Password (the CLI reads PGOUTBOX_REDIS_PASSWORD or --redis-password-file)",
}

// ParseURL returns the connection options of rawURL:
// redis://[user@]host[:port][/db], or rediss:// for TLS (verified against
// the host name). The port defaults to 6379, the database to 0. A password
// in the URL is refused, and the error does not repeat it: pass it in
// Config.Password (the CLI reads it from the environment or a file). Query
// parameters and fragments are refused too, so that no setting is silently
// ignored.
func ParseURL(rawURL string) (*redis.Options, error) {
	u, hostport, err := urlKind.Host(rawURL, "6379")
	if err != nil {
		return nil, err
	}
	opts := &redis.Options{Addr: hostport, Username: u.User.Username()}
	if db := strings.TrimPrefix(u.Path, "/"); db != "" {
		n, err := strconv.Atoi(db)
		if err != nil || n < 0 || n > 1<<16 {
			return nil, fmt.Errorf("redisstream: URL: database %.16q is not a number", db)
		}
		opts.DB = n
	}
	if u.Scheme == "rediss" {
		opts.TLSConfig = &tls.Config{ServerName: u.Hostname(), MinVersion: tls.VersionTLS12}
	}
	return opts, nil
}
