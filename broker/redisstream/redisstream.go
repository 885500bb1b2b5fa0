// Package redisstream publishes outbox events to Redis Streams.
//
// Each event is appended (XADD) to the stream whose key [Config.Stream]
// expands to, one stream per expanded name (default
// "outbox.{aggregate_type}"). An entry's fields are, in this order: one field
// per wire header (the Outbox-* headers and the producer's headers in the
// default format; the ce-* attributes, the producer's headers and
// content-type in the CloudEvents format, see [CloudEventsBinding]), then
// "content-type" (the payload's media type) in the default format, and last
// "body", the payload unchanged. A producer header named "body" is refused.
//
// # Deduplication
//
// Redis 7 has no idempotent XADD, so the publisher appends through a small Lua
// script that runs atomically on the server: it keeps, per stream, a sorted
// set ([Config.DedupKeyPrefix] + the stream's key) of the dedup ids
// (broker.Message.BrokerDedupID: the event id unless a replay set another)
// appended within [Config.DedupWindow] (default two minutes), drops ids older
// than the window, and appends only an id it does not hold. A re-publish after
// a relay crash within the window is acknowledged without a second entry;
// after the window, it is appended again (consumers dedup on
// Outbox-Event-Id, as with every broker). The set expires with the window.
//
// # Order, limits, errors
//
// Within an aggregate, entry k+1 is sent only after k's reply; the first
// pending entry of every aggregate of a batch goes out in one pipeline
// ([broker.PublishLanesInOrder]: Redis answers one connection's commands in
// order). An entry is refused permanently before it is sent when its stream
// key is longer than [MaxStreamNameBytes] or holds control characters, or its
// fields together exceed [Config.MaxMessageBytes] (default 1 MiB). Connection
// errors, timeouts, LOADING, BUSY, OOM and the like are [broker.Unavailable];
// NOAUTH, WRONGPASS, NOPERM and unknown commands are [broker.Misconfigured];
// any other error reply for an entry (WRONGTYPE: the key is not a stream) is
// [broker.Permanent].
//
// Trimming ([Config.MaxLen], off by default) removes the oldest entries
// whether or not a consumer group has read them: an unread event can be lost.
// [Dial] warns when the server persists nothing (neither AOF nor RDB save
// points): an acknowledged event is then lost if Redis restarts.
//
// Outside the standard library it pulls in go-redis (with its own
// dependencies), besides the root package's pgx and OpenTelemetry trace API.
package redisstream

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/redis/go-redis/v9"

	"github.com/pgoutbox/pgoutbox/broker"
	"github.com/pgoutbox/pgoutbox/internal/config"
	"github.com/pgoutbox/pgoutbox/wire"
)

// Defaults and limits of Config.
const (
	// DefaultStream is the stream key template when Config.Stream is unset.
	DefaultStream = "outbox.{aggregate_type}"
	// DefaultDedupWindow is how long a dedup id is remembered when
	// Config.DedupWindow is zero.
	DefaultDedupWindow = 2 * time.Minute
	// DefaultDedupKeyPrefix is put before a stream's key to name its dedup set
	// when Config.DedupKeyPrefix is empty.
	DefaultDedupKeyPrefix = "pgoutbox:dedup:"
	// DefaultMaxMessageBytes bounds an entry's fields (names and values
	// together) when Config.MaxMessageBytes is zero.
	DefaultMaxMessageBytes = 1 << 20
	// HardMaxMessageBytes is the highest Config.MaxMessageBytes: Redis' own
	// limit of a bulk string is 512 MiB, far beyond what a stream entry should be.
	HardMaxMessageBytes = 64 << 20
	// MaxStreamNameBytes bounds an expanded stream key.
	MaxStreamNameBytes = 1024
	// DefaultTimeout bounds a command's network reads and writes when
	// Config.Timeout is zero.
	DefaultTimeout = 10 * time.Second
	// DefaultMaxPipeline is how many entries one Publish call sends in one
	// pipeline when Config.MaxPipeline is zero.
	DefaultMaxPipeline = 512

	// maxFields bounds an entry's fields: the script passes them on the Lua
	// stack, which holds a few thousand values.
	maxFields = 1000
	// Field names of the entry besides the headers.
	fieldBody        = "body"
	fieldContentType = "content-type"
)

// CloudEventsBinding is how the CloudEvents format maps onto an entry's fields:
// ce- attributes and a content-type field, as the NATS and Kafka bindings
// carry them (there is no Redis binding in the CloudEvents specification).
var CloudEventsBinding = wire.CloudEventsBinding{Prefix: "ce-", ContentTypeHeader: fieldContentType}

// Config configures a Publisher. A nil *Config means all defaults.
type Config struct {
	// Stream is the template of each event's stream key. Unset means
	// DefaultStream ("outbox.{aggregate_type}").
	Stream broker.Template

	// Password authenticates the connection (AUTH), with the URL's user name
	// if any. A URL never carries it. Empty means none.
	Password string

	// DedupWindow is how long an appended dedup id is remembered. Zero means
	// DefaultDedupWindow (2m).
	DedupWindow time.Duration

	// DedupKeyPrefix is put before a stream's key to name its dedup set. A
	// stream key starting with it is refused. Empty means
	// DefaultDedupKeyPrefix ("pgoutbox:dedup:").
	DedupKeyPrefix string

	// MaxLen, when positive, trims each stream to about that many entries
	// (XADD MAXLEN ~). Trimming drops the oldest entries even when no consumer
	// has read them. Zero means no trimming.
	MaxLen int64

	// MaxMessageBytes bounds an entry's fields, names and values together; a
	// larger entry is refused permanently. Zero means DefaultMaxMessageBytes
	// (1 MiB); at most HardMaxMessageBytes.
	MaxMessageBytes int

	// Timeout bounds each network read and write (a pipeline's reply
	// included). Zero means DefaultTimeout (10s).
	Timeout time.Duration

	// MaxPipeline is how many entries of one Publish call await their reply
	// at once. Zero means DefaultMaxPipeline (512).
	MaxPipeline int

	// Dialer, when set, opens the network connections (a test wraps them).
	// Nil means a net.Dialer with Timeout.
	Dialer func(ctx context.Context, network, addr string) (net.Conn, error)

	// Logger receives connection and persistence warnings. Nil means
	// slog.Default().
	Logger *slog.Logger

	// Encoding is the wire format of the entries. The zero value is the
	// default Outbox-* headers; FormatCloudEvents writes [CloudEventsBinding].
	Encoding wire.Encoding
}

// Validate reports every invalid field of c, each error naming its field.
// Zero fields stand for their defaults, and a nil c is valid.
func (c *Config) Validate() error {
	_, err := withDefaults(c)
	return err
}

func withDefaults(cfg *Config) (Config, error) {
	return config.Resolve("redisstream", cfg, fillDefaults, checkConfig)
}

func fillDefaults(c *Config) {
	if c.Stream.String() == "" {
		c.Stream = broker.MustParseTemplate(DefaultStream)
	}
	config.Default(&c.DedupWindow, DefaultDedupWindow)
	config.Default(&c.DedupKeyPrefix, DefaultDedupKeyPrefix)
	config.Default(&c.MaxMessageBytes, DefaultMaxMessageBytes)
	config.Default(&c.Timeout, DefaultTimeout)
	config.Default(&c.MaxPipeline, DefaultMaxPipeline)
	config.Default(&c.Logger, slog.Default())
}

func checkConfig(c *Config, p *config.Problems) {
	p.Check(c.DedupWindow >= time.Millisecond, "Config.DedupWindow (%s) must be at least 1ms", c.DedupWindow)
	p.Check(c.MaxLen >= 0, "Config.MaxLen (%d) must not be negative", c.MaxLen)
	p.Check(c.MaxMessageBytes > 0 && c.MaxMessageBytes <= HardMaxMessageBytes,
		"Config.MaxMessageBytes (%d) must be between 1 and %d", c.MaxMessageBytes, HardMaxMessageBytes)
	p.Check(c.Timeout > 0, "Config.Timeout (%s) must be positive", c.Timeout)
	p.Check(c.MaxPipeline > 0, "Config.MaxPipeline (%d) must be positive", c.MaxPipeline)
	p.Check(checkKey(c.DedupKeyPrefix) == nil, "Config.DedupKeyPrefix: must be printable UTF-8 of at most %d bytes", MaxStreamNameBytes)
	p.Field("Config.Encoding", c.Encoding.Validate())
}

//go:embed xadd.lua
var xaddSource string

// xadd appends one entry unless its dedup id was appended within the window.
var xadd = redis.NewScript(xaddSource)

// Publisher appends outbox events to Redis streams. It implements
// [broker.Publisher] and [broker.Pinger] and is safe for concurrent use.
type Publisher struct {
	cfg    Config
	client *redis.Client
	// persistenceChecked is set once the server's persistence was looked at.
	persistenceChecked atomic.Bool
	closeOnce          sync.Once
}

var errClosed = errors.New("redisstream: publisher closed")

// Dial returns a publisher on the Redis server at rawURL
// (redis://[user@]host[:port][/db] or rediss:// for TLS; see [ParseURL]),
// configured by cfg (nil means all defaults). It connects at once, governed
// by ctx: a server refusing the credentials is an error; an unreachable
// server is not (publishes fail as unavailable until it answers). Once
// connected it checks the server's persistence and logs a warning when
// nothing is persisted, or when CONFIG is not allowed.
func Dial(ctx context.Context, rawURL string, cfg *Config) (*Publisher, error) {
	c, err := withDefaults(cfg)
	if err != nil {
		return nil, err
	}
	opts, err := ParseURL(rawURL)
	if err != nil {
		return nil, err
	}
	opts.Password = c.Password
	opts.DialTimeout = c.Timeout
	opts.ReadTimeout = c.Timeout
	opts.WriteTimeout = c.Timeout
	opts.ContextTimeoutEnabled = true
	// The relay retries; a retry here would only hide an outage for longer.
	opts.MaxRetries = -1
	opts.DisableIdentity = true // CLIENT SETINFO may be refused by an ACL
	opts.Dialer = c.Dialer
	p := &Publisher{cfg: c, client: redis.NewClient(opts)}
	if err := p.Ping(ctx); err != nil {
		if broker.IsMisconfigured(err) {
			_ = p.client.Close()
			return nil, err
		}
		c.Logger.Warn("redisstream: server not reachable yet; publishes fail until it is",
			slog.String("addr", opts.Addr), slog.Any("error", err))
	}
	return p, nil
}

// checkPersistence warns when the server persists nothing.
func (p *Publisher) checkPersistence(ctx context.Context) {
	if p.persistenceChecked.Swap(true) {
		return
	}
	log := p.cfg.Logger
	aof, err1 := p.client.ConfigGet(ctx, "appendonly").Result()
	save, err2 := p.client.ConfigGet(ctx, "save").Result()
	if err := errors.Join(err1, err2); err != nil {
		log.Warn("redisstream: could not check the server's persistence (CONFIG GET refused?): "+
			"if it persists nothing, an acknowledged event is lost when Redis restarts", slog.Any("error", err))
		return
	}
	if aof["appendonly"] != "yes" && strings.TrimSpace(save["save"]) == "" {
		log.Warn("redisstream: the server persists nothing (appendonly no, no save points): " +
			"an acknowledged event is lost when Redis restarts")
	}
}

// Publish appends msgs and returns one result per message; see
// [broker.Publisher]. ctx bounds the whole call.
func (p *Publisher) Publish(ctx context.Context, msgs []broker.Message) []error {
	pl := &pipeline{p: p}
	return broker.PublishLanesInOrder(ctx, msgs, p.cfg.MaxPipeline, pl.send)
}

// pipeline gathers the entries one Publish call sends until a reply is
// awaited, then sends them all at once.
type pipeline struct {
	p      *Publisher
	queued []*entry
}

type entry struct {
	event string // event id, for errors
	key   string
	keys  []string
	args  []any
	done  bool
	err   error
}

func (pl *pipeline) send(_ context.Context, m *broker.Message) (broker.AckFunc, error) {
	e, err := pl.p.entry(m)
	if err != nil {
		return nil, err
	}
	pl.queued = append(pl.queued, e)
	return func(ctx context.Context) error {
		if !e.done {
			pl.flush(ctx)
		}
		return e.err
	}, nil
}

// flush sends every queued entry in one pipeline and records their results.
// An entry refused with NOSCRIPT (the server lost its script cache, as on a
// restart) ran nothing: the script is loaded and those entries sent again.
func (pl *pipeline) flush(ctx context.Context) {
	queued := pl.queued
	pl.queued = nil
	for attempt := 0; len(queued) > 0; attempt++ {
		cmds := make([]*redis.Cmd, len(queued))
		pipe := pl.p.client.Pipeline()
		for i, e := range queued {
			cmds[i] = xadd.EvalSha(ctx, pipe, e.keys, e.args...)
		}
		if _, err := pipe.Exec(ctx); err == nil {
			// A server unreachable at Dial is checked at the first success.
			pl.p.checkPersistence(ctx)
		}
		var again []*entry
		for i, e := range queued {
			err := cmds[i].Err()
			if attempt == 0 && redis.HasErrorPrefix(err, "NOSCRIPT") {
				again = append(again, e)
				continue
			}
			e.done = true
			if err != nil {
				e.err = fmt.Errorf("redisstream: event %s: XADD to %q: %w", e.event, e.key, classify(err))
			}
		}
		if len(again) > 0 {
			if err := xadd.Load(ctx, pl.p.client).Err(); err != nil {
				for _, e := range again {
					e.done = true
					e.err = fmt.Errorf("redisstream: event %s: load the append script: %w", e.event, classify(err))
				}
				return
			}
		}
		queued = again
	}
}

// entry builds m's script call, or why m cannot be sent.
func (p *Publisher) entry(m *broker.Message) (*entry, error) {
	enc, err := p.cfg.Encoding.Encode(m, CloudEventsBinding)
	if err != nil {
		return nil, err
	}
	key, err := p.cfg.Stream.ExpandChecked(m)
	if err != nil {
		return nil, broker.Permanent(fmt.Errorf("redisstream: event %s: %w", m.EventID, err))
	}
	if err := checkKey(key); err != nil {
		return nil, broker.Permanent(fmt.Errorf("redisstream: event %s: stream %.64q: %w", m.EventID, key, err))
	}
	if strings.HasPrefix(key, p.cfg.DedupKeyPrefix) {
		return nil, broker.Permanent(fmt.Errorf("redisstream: event %s: stream %.64q starts with the dedup prefix %q",
			m.EventID, key, p.cfg.DedupKeyPrefix))
	}
	maxLen := strconv.FormatInt(p.cfg.MaxLen, 10)
	args := make([]any, 0, 3+2*(enc.HeaderCount+2))
	args = append(args, m.BrokerDedupID(), p.cfg.DedupWindow.Milliseconds(), maxLen)
	size := 0
	add := func(k, v string) {
		args = append(args, k, v)
		size += len(k) + len(v)
	}
	for k, v := range enc.Headers {
		if strings.EqualFold(k, fieldBody) {
			return nil, broker.Permanent(fmt.Errorf("redisstream: event %s: header %q would pose as the body field", m.EventID, k))
		}
		add(k, v)
	}
	if p.cfg.Encoding.Format != wire.FormatCloudEvents {
		add(fieldContentType, enc.ContentType)
	}
	add(fieldBody, string(enc.Body))
	if n := (len(args) - 3) / 2; n > maxFields {
		return nil, broker.Permanent(fmt.Errorf("redisstream: event %s: %d fields, above %d", m.EventID, n, maxFields))
	}
	if size > p.cfg.MaxMessageBytes {
		return nil, broker.Permanent(fmt.Errorf("redisstream: event %s: entry of %d bytes, above the maximum of %d",
			m.EventID, size, p.cfg.MaxMessageBytes))
	}
	return &entry{
		event: m.EventID.String(),
		key:   key,
		keys:  []string{key, p.cfg.DedupKeyPrefix + key},
		args:  args,
	}, nil
}

// checkKey reports why s cannot be a stream key: empty, too long, not UTF-8,
// or holding control characters (which logs and tools would show garbled).
func checkKey(s string) error {
	switch {
	case s == "":
		return errors.New("empty key")
	case len(s) > MaxStreamNameBytes:
		return fmt.Errorf("key of %d bytes, above %d", len(s), MaxStreamNameBytes)
	case !utf8.ValidString(s):
		return errors.New("key is not UTF-8")
	case strings.ContainsFunc(s, func(r rune) bool { return r < ' ' || r == 0x7f }):
		return errors.New("key holds control characters")
	}
	return nil
}

// classify marks err by what it says of the server: unavailable (no answer,
// or a state that passes), misconfigured (credentials, permissions, a
// disabled command), or permanent (any other error reply: about the entry).
func classify(err error) error {
	if err == nil || broker.IsPermanent(err) || broker.IsUnavailable(err) || errors.Is(err, context.Canceled) {
		return err
	}
	var reply redis.Error
	if !errors.As(err, &reply) {
		// No reply from the server: a network error, EOF, a closed client, a
		// pool timeout.
		return broker.Unavailable(err)
	}
	code, _, _ := strings.Cut(reply.Error(), " ")
	switch code {
	case "NOAUTH", "WRONGPASS", "NOPERM":
		return broker.Misconfigured(err)
	case "LOADING", "BUSY", "MASTERDOWN", "TRYAGAIN", "CLUSTERDOWN", "READONLY", "OOM",
		"NOREPLICAS", "MISCONF", "NOSCRIPT", "MOVED", "ASK", "UNBLOCKED":
		return broker.Unavailable(err)
	case "ERR":
		msg := strings.ToLower(reply.Error())
		switch {
		case strings.Contains(msg, "unknown command"):
			return broker.Misconfigured(err)
		case strings.Contains(msg, "max number of clients"):
			return broker.Unavailable(err)
		}
	}
	return broker.Permanent(err)
}

// Ping reports whether the server answers; on its first answer it checks the
// server's persistence. Its errors are marked [broker.Unavailable] (and
// [broker.Misconfigured] for refused credentials).
func (p *Publisher) Ping(ctx context.Context) error {
	if err := p.client.Ping(ctx).Err(); err != nil {
		if errors.Is(err, redis.ErrClosed) {
			return broker.Unavailable(errClosed)
		}
		err = classify(err)
		if !broker.IsUnavailable(err) {
			err = broker.Unavailable(err)
		}
		return fmt.Errorf("redisstream: ping: %w", err)
	}
	p.checkPersistence(ctx)
	return nil
}

// Close closes the connections; in-flight publishes fail. It is safe to call
// more than once.
func (p *Publisher) Close() error {
	var err error
	p.closeOnce.Do(func() { err = p.client.Close() })
	return err
}

var (
	_ broker.Publisher = (*Publisher)(nil)
	_ broker.Pinger    = (*Publisher)(nil)
)
