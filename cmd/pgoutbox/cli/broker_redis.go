package cli

import (
	"context"
	"log/slog"
	"os"
	"time"

	"github.com/spf13/pflag"

	"github.com/pgoutbox/pgoutbox/broker"
	"github.com/pgoutbox/pgoutbox/broker/redisstream"
)

// redisPasswordEnv holds the Redis password unless --redis-password-file is set.
const redisPasswordEnv = "PGOUTBOX_REDIS_PASSWORD"

// redisFlags are the flags of Redis Streams, and the password parse read.
type redisFlags struct {
	passwordFile string
	maxLen       int64
	dedupWindow  time.Duration
	password     string // read by parse
}

func redisFlagSet(fs *pflag.FlagSet) any {
	o := &redisFlags{}
	fs.StringVar(&o.passwordFile, "redis-password-file", "", "file holding the Redis password; else "+redisPasswordEnv+" is used (env PGOUTBOX_REDIS_PASSWORD_FILE)")
	fs.Int64Var(&o.maxLen, "redis-max-len", 0, "trim each Redis stream to about this many entries; 0 never trims (trimming drops entries no consumer has read) (env PGOUTBOX_REDIS_MAX_LEN)")
	fs.DurationVar(&o.dedupWindow, "redis-dedup-window", redisstream.DefaultDedupWindow, "how long a published event id is remembered, so a re-publish is not appended again (env PGOUTBOX_REDIS_DEDUP_WINDOW)")
	return o
}

// parseRedis checks the URL and the flags and reads the password.
func parseRedis(t *brokerTarget) error {
	if _, err := redisstream.ParseURL(t.flags.url); err != nil {
		return usagef("--broker: %v", err)
	}
	o := kindFlags[redisFlags](t.flags, redisKind)
	if o.maxLen < 0 {
		return usagef("--redis-max-len %d: want 0 (no trimming) or more", o.maxLen)
	}
	if o.dedupWindow < time.Millisecond {
		return usagef("--redis-dedup-window %s: want at least 1ms", o.dedupWindow)
	}
	if o.passwordFile != "" {
		var err error
		if o.password, err = readSecretFile("--redis-password-file", o.passwordFile); err != nil {
			return err
		}
	} else {
		o.password = os.Getenv(redisPasswordEnv)
	}
	return nil
}

// openRedis connects to Redis; refused credentials are a configuration error.
func openRedis(ctx context.Context, t *brokerTarget, log *slog.Logger) (broker.Publisher, func(), error) {
	o := kindFlags[redisFlags](t.flags, redisKind)
	cfg := redisstream.Config{Password: o.password, MaxLen: o.maxLen, DedupWindow: o.dedupWindow,
		Timeout: t.flags.ackTimeout, Logger: log, Encoding: t.encoding}
	if t.template != nil {
		cfg.Stream = *t.template
	}
	pctx, cancel := context.WithTimeout(ctx, t.flags.ackTimeout)
	defer cancel()
	pub, err := redisstream.Dial(pctx, t.flags.url, &cfg)
	if err != nil {
		return nil, nil, usageError{err}
	}
	return pub, func() { _ = pub.Close() }, nil
}
