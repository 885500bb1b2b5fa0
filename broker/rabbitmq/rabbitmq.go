// Package rabbitmq publishes outbox events to a RabbitMQ exchange.
//
// Each event goes to [Config.Exchange] (a durable topic exchange "outbox",
// declared if missing) with a routing key expanded from [Config.RoutingKey]
// ("{aggregate_type}.{event_type}"), as a persistent message: content_type
// the payload's (application/json unless Message.ContentType says otherwise),
// message_id the event id, type the event type, timestamp occurred_at, the
// wire headers (package wire; docs/design.md, "Wire headers") as string
// headers, and the payload as body. It is published with the mandatory flag on a channel in confirm
// mode: an event succeeds only once the server confirmed it, and fails with
// [ErrUnroutable] if no queue was bound for its routing key.
//
// RabbitMQ does not keep the order of a channel's messages when one of them
// fails, so the next event of an aggregate leaves only after the previous one
// is confirmed ([broker.PublishLanes]); events of different aggregates are all in
// flight together.
//
// [Dial] owns its connection and reconnects forever, in the background, with
// exponential backoff: a server that is unreachable makes publishes fail as
// [broker.Unavailable] until it is back.
//
// Outside the standard library it pulls in amqp091-go, besides the root package's
// pgx and OpenTelemetry trace API.
package rabbitmq

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"strings"
	"sync"
	"time"
	"unicode"
	"unicode/utf8"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/pgoutbox/pgoutbox/broker"
	"github.com/pgoutbox/pgoutbox/internal/amqpconn"
	"github.com/pgoutbox/pgoutbox/internal/config"
	"github.com/pgoutbox/pgoutbox/wire"
)

// Defaults of Config.
const (
	// DefaultExchange is the exchange when Config.Exchange is empty.
	DefaultExchange = "outbox"
	// DefaultRoutingKey is the routing key template when Config.RoutingKey is
	// unset.
	DefaultRoutingKey = "{aggregate_type}.{event_type}"
	// DefaultConfirmTimeout is the wait for one message's confirm when
	// Config.ConfirmTimeout is zero.
	DefaultConfirmTimeout = 10 * time.Second
	// DefaultMaxPending is the number of messages that may await their
	// confirm when Config.MaxPending is zero.
	DefaultMaxPending = 4000
	// DefaultConnectTimeout bounds each attempt to connect when
	// Config.ConnectTimeout is zero.
	DefaultConnectTimeout = 10 * time.Second
	// DefaultReconnectBackoff is the first wait between attempts to reconnect
	// when Config.ReconnectBackoff is zero.
	DefaultReconnectBackoff = 100 * time.Millisecond
	// DefaultMaxReconnectBackoff caps the wait between attempts to reconnect
	// when Config.MaxReconnectBackoff is zero (or ReconnectBackoff, if larger).
	DefaultMaxReconnectBackoff = 30 * time.Second
	// DefaultConnectionName is the connection's name on the server when
	// Config.ConnectionName is empty.
	DefaultConnectionName = "pgoutbox relay"
)

// closeTimeout bounds the close handshake of a connection the publisher gives
// up on.
const closeTimeout = 5 * time.Second

// Config configures a Publisher. A nil *Config means all defaults.
type Config struct {
	// Exchange is the exchange the events are published to. If missing, it is
	// declared as a durable topic exchange; an existing exchange is used as is,
	// whatever its type, never modified. Empty means DefaultExchange ("outbox").
	Exchange string

	// RoutingKey is the template of each event's routing key. Unset means
	// DefaultRoutingKey ("{aggregate_type}.{event_type}").
	RoutingKey broker.Template

	// ConfirmTimeout bounds the wait for the server's confirm of one message. A
	// message without a confirm by then fails as unavailable (it may still be
	// stored), and the connection is replaced: a server that leaves a message
	// unconfirmed that long is unreachable or stuck. Zero means
	// DefaultConfirmTimeout (10s).
	ConfirmTimeout time.Duration

	// MaxPending is how many messages may await their confirm at once, across
	// all concurrent Publish calls of this publisher; a publish beyond it waits
	// for a slot. Zero means DefaultMaxPending (4000).
	MaxPending int

	// ConnectTimeout bounds each attempt to connect: TCP connect, TLS and AMQP
	// handshakes, declaring the exchange. The URL's connection_timeout
	// parameter, if set, overrides it. Zero means DefaultConnectTimeout (10s).
	ConnectTimeout time.Duration

	// ReconnectBackoff is the wait after the first failed attempt to
	// reconnect (the first attempt after a loss is immediate); it doubles after
	// each further failure, with jitter, up to MaxReconnectBackoff. Zero means
	// DefaultReconnectBackoff (100ms).
	ReconnectBackoff time.Duration

	// MaxReconnectBackoff caps the wait between attempts to reconnect. Zero
	// means DefaultMaxReconnectBackoff (30s), or ReconnectBackoff if that is
	// larger.
	MaxReconnectBackoff time.Duration

	// ConnectionName is the connection's name on the server (the
	// connection_name client property), shown by rabbitmqctl list_connections
	// and the management UI. Empty means DefaultConnectionName ("pgoutbox
	// relay").
	ConnectionName string

	// TLSConfig is the TLS configuration for amqps:// URLs. Nil means one
	// built from the URL's cacertfile, certfile, keyfile and
	// server_name_indication parameters, with the system's roots when
	// cacertfile is not given, and TLS 1.2 at least.
	TLSConfig *tls.Config

	// DialContext opens the TCP connection to the server: a SOCKS dialer, a
	// test's wrapper. Nil means a net.Dialer's.
	DialContext func(ctx context.Context, network, addr string) (net.Conn, error)

	// Logger receives connection events: connected, lost, reconnected,
	// blocked; each once per change of state, not per attempt. Nil means
	// slog.Default().
	Logger *slog.Logger

	// Encoding is the wire format of the messages. The zero value is the
	// default Outbox-* headers; FormatCloudEvents sends CloudEvents binary mode
	// per the AMQP protocol binding: cloudEvents_* message headers (application properties), datacontenttype as the content-type property.
	Encoding wire.Encoding
}

// Validate reports every invalid field of c — an Exchange or ConnectionName
// AMQP cannot carry, a negative timeout or backoff, a MaxReconnectBackoff
// below ReconnectBackoff, an unusable Encoding — each error naming its field.
// Zero fields stand for their defaults, and a nil c (all defaults) is valid.
func (c *Config) Validate() error {
	_, err := withDefaults(c)
	return err
}

// withDefaults returns a copy of cfg (nil means all defaults) with defaults
// applied, or the errors of Validate.
func withDefaults(cfg *Config) (Config, error) {
	return config.Resolve("rabbitmq", cfg, fillDefaults, checkConfig)
}

func fillDefaults(c *Config) {
	config.Default(&c.Exchange, DefaultExchange)
	if c.RoutingKey.String() == "" {
		c.RoutingKey = broker.MustParseTemplate(DefaultRoutingKey)
	}
	config.Default(&c.ConfirmTimeout, DefaultConfirmTimeout)
	config.Default(&c.MaxPending, DefaultMaxPending)
	config.Default(&c.ConnectTimeout, DefaultConnectTimeout)
	config.Default(&c.ReconnectBackoff, DefaultReconnectBackoff)
	config.Default(&c.MaxReconnectBackoff, max(DefaultMaxReconnectBackoff, c.ReconnectBackoff))
	config.Default(&c.ConnectionName, DefaultConnectionName)
	if c.DialContext == nil {
		var d net.Dialer
		c.DialContext = d.DialContext
	}
	config.Default(&c.Logger, slog.Default())
}

func checkConfig(c *Config, p *config.Problems) {
	p.Check(len(c.Exchange) <= maxShortstr && utf8.ValidString(c.Exchange) &&
		strings.IndexFunc(c.Exchange, func(r rune) bool { return unicode.IsSpace(r) || unicode.IsControl(r) }) < 0,
		"Config.Exchange (%q): want at most %d bytes of UTF-8 without whitespace", c.Exchange, maxShortstr)
	p.Check(c.ConfirmTimeout > 0, "Config.ConfirmTimeout (%s) must be positive", c.ConfirmTimeout)
	p.Check(c.MaxPending > 0, "Config.MaxPending (%d) must be positive", c.MaxPending)
	p.Check(c.ConnectTimeout > 0, "Config.ConnectTimeout (%s) must be positive", c.ConnectTimeout)
	p.Check(c.ReconnectBackoff > 0, "Config.ReconnectBackoff (%s) must be positive", c.ReconnectBackoff)
	p.Check(c.ReconnectBackoff <= 0 || c.MaxReconnectBackoff >= c.ReconnectBackoff,
		"Config.MaxReconnectBackoff (%s) must be at least ReconnectBackoff (%s)", c.MaxReconnectBackoff, c.ReconnectBackoff)
	p.Check(len(c.ConnectionName) <= maxShortstr,
		"Config.ConnectionName: %d bytes, want at most %d", len(c.ConnectionName), maxShortstr)
	p.Field("Config.Encoding", c.Encoding.Validate())
}

// Publisher publishes outbox events to a RabbitMQ exchange. It implements
// [broker.Publisher] and [broker.Pinger] and is safe for concurrent use.
type Publisher struct {
	cfg    Config
	target *target

	// ctx ends with Close; it governs the background reconnects.
	ctx    context.Context
	cancel context.CancelFunc

	mu       sync.Mutex
	sess     *session // nil while not connected
	down     error    // why not connected
	isClosed bool     // Close was called; no more goroutines start

	closeOnce sync.Once
	wg        sync.WaitGroup // the supervisor, dispatchers, watchers, pings
}

var errClosed = errors.New("rabbitmq: publisher closed")

// Dial connects to the RabbitMQ server at url and returns a publisher that owns
// the connection, configured by config (nil means all defaults).
//
// url is amqp://[user:password@]host[:port][/vhost][?params] or amqps://…
// (port 5672 or 5671 by default; user and password guest; vhost "/", written
// %2F). A user or password with reserved characters must be percent-encoded.
// Parameters: heartbeat (seconds), connection_timeout (milliseconds),
// channel_max, auth_mechanism (plain, amqplain, external), and for amqps
// cacertfile, certfile, keyfile, server_name_indication; any other is an
// error.
//
// A malformed url is an error, which never shows the password. Dial then tries
// once to connect and declare the exchange, bounded by ctx and
// Config.ConnectTimeout. If the server refuses (wrong credentials, unknown
// vhost, no permission), that is an error too. If it cannot be reached, Dial
// still returns the publisher: publishes fail as [broker.Unavailable] while it
// reconnects in the background, for as long as it takes, and succeed once it
// can. It reconnects in the same way whenever the connection or the channel is
// lost.
func Dial(ctx context.Context, url string, config *Config) (*Publisher, error) {
	cfg, err := withDefaults(config)
	if err != nil {
		return nil, err
	}
	t, err := parseURL(url, cfg.TLSConfig)
	if err != nil {
		return nil, err
	}
	if ms := t.uri.ConnectionTimeout; ms > 0 {
		cfg.ConnectTimeout = time.Duration(ms) * time.Millisecond
	}
	p := &Publisher{cfg: cfg, target: t}
	p.ctx, p.cancel = context.WithCancel(context.Background())
	log := cfg.Logger.With(slog.String("url", t.display))

	l, s, err := p.connect(ctx, nil)
	if err != nil {
		if refused(err) {
			p.cancel()
			if l != nil {
				_ = l.conn.CloseDeadline(time.Now().Add(closeTimeout))
			}
			p.wg.Wait()
			return nil, fmt.Errorf("rabbitmq: %s: %w", t.display, err)
		}
		p.down = err
		log.Warn("rabbitmq: cannot connect yet; publishes fail as unavailable until it can", slog.Any("error", err))
	} else {
		p.sess = s
		log.Info("rabbitmq: connected", slog.String("exchange", cfg.Exchange))
	}
	p.wg.Add(1)
	go p.supervise(l, s, log)
	return p, nil
}

// refused reports whether err is the server turning the publisher away, as
// opposed to not answering: a configuration error worth stopping for at
// start-up.
func refused(err error) bool {
	var ae *amqp.Error
	if !errors.As(err, &ae) {
		return false
	}
	return ae.Code == amqp.AccessRefused || ae.Code == amqp.NotAllowed
}

// connect makes sure there is an open connection (reusing l if it is still
// open), that the exchange exists, and opens a session. It returns the
// connection even when it fails afterwards, for the next attempt to reuse.
func (p *Publisher) connect(ctx context.Context, l *link) (*link, *session, error) {
	ctx, cancel := context.WithTimeout(ctx, p.cfg.ConnectTimeout)
	defer cancel()
	if l == nil || l.conn.IsClosed() {
		var err error
		if l, err = p.dial(ctx); err != nil {
			return nil, nil, err
		}
	}
	// Channel calls cannot be cancelled; closing the connection ends them.
	closed := make(chan struct{})
	stop := context.AfterFunc(ctx, func() {
		defer close(closed)
		_ = l.conn.CloseDeadline(time.Now().Add(closeTimeout))
	})
	err := p.ensureExchange(l.conn)
	var s *session
	if err == nil {
		s, err = p.openSession(l)
	}
	if !stop() {
		<-closed
		if s != nil {
			s.fail(broker.Unavailable(ctx.Err()), 0)
		}
		return nil, nil, broker.Unavailable(fmt.Errorf("connect: %w", ctx.Err()))
	}
	if err != nil {
		return l, nil, err
	}
	return l, s, nil
}

// dial opens a connection, bounded by ctx.
func (p *Publisher) dial(ctx context.Context) (*link, error) {
	c, err := amqpconn.Dial(ctx, p.target.url, p.cfg.ConnectionName, p.target.tls, p.cfg.DialContext)
	if err != nil {
		if refused(err) {
			return nil, err
		}
		return nil, broker.Unavailable(fmt.Errorf("connect: %w", err))
	}
	l := &link{conn: c, frameMax: c.Config.FrameSize}
	blocked := c.NotifyBlocked(make(chan amqp.Blocking, 1))
	p.wg.Add(1)
	go p.watchBlocked(l, blocked)
	return l, nil
}

// watchBlocked records the server's connection.blocked and unblocked
// notifications until the connection closes.
func (p *Publisher) watchBlocked(l *link, blocked <-chan amqp.Blocking) {
	defer p.wg.Done()
	for b := range blocked {
		if b.Active {
			reason := b.Reason
			l.blocked.Store(&reason)
			p.cfg.Logger.Warn("rabbitmq: the server blocks publishing", slog.String("url", p.target.display), slog.String("reason", reason))
		} else {
			l.blocked.Store(nil)
			p.cfg.Logger.Info("rabbitmq: the server unblocked publishing", slog.String("url", p.target.display))
		}
	}
}

// ensureExchange declares the exchange if it is missing. A passive declare
// comes first, so that an existing exchange is never redeclared with other
// settings, which the server would refuse.
func (p *Publisher) ensureExchange(conn *amqp.Connection) error {
	ch, err := conn.Channel()
	if err != nil {
		return broker.Unavailable(fmt.Errorf("open channel: %w", err))
	}
	err = ch.ExchangeDeclarePassive(p.cfg.Exchange, amqp.ExchangeTopic, true, false, false, false, nil)
	if err == nil {
		return ch.Close()
	}
	var ae *amqp.Error
	if !errors.As(err, &ae) || ae.Code != amqp.NotFound {
		return fmt.Errorf("check exchange %q: %w", p.cfg.Exchange, err)
	}
	// The failed passive declare closed the channel.
	if ch, err = conn.Channel(); err != nil {
		return broker.Unavailable(fmt.Errorf("open channel: %w", err))
	}
	if err := ch.ExchangeDeclare(p.cfg.Exchange, amqp.ExchangeTopic, true, false, false, false, nil); err != nil {
		return fmt.Errorf("declare exchange %q: %w", p.cfg.Exchange, err)
	}
	p.cfg.Logger.Info("rabbitmq: declared exchange", slog.String("exchange", p.cfg.Exchange), slog.String("type", amqp.ExchangeTopic))
	return ch.Close()
}

// supervise keeps the publisher connected until Close: it waits for the session
// to end, then opens a new one, on the same connection if only the channel was
// lost, after backing off if the attempt fails.
func (p *Publisher) supervise(l *link, s *session, log *slog.Logger) {
	defer p.wg.Done()
	defer func() {
		if l != nil {
			_ = l.conn.CloseDeadline(time.Now().Add(closeTimeout))
		}
	}()
	backoff := p.cfg.ReconnectBackoff
	failing := s == nil // a failing streak, logged once
	var retry *time.Timer
	for {
		if s == nil {
			if retry != nil {
				select {
				case <-p.ctx.Done():
					retry.Stop()
					return
				case <-retry.C:
				}
			}
			var err error
			if l, s, err = p.connect(p.ctx, l); err != nil {
				p.setDown(err)
				if p.ctx.Err() != nil {
					return
				}
				if !failing {
					log.Warn("rabbitmq: cannot reconnect; retrying with backoff", slog.Any("error", err))
					failing = true
				}
				// Equal jitter: between half and all of the backoff, so that
				// relays that lost the server together do not return together.
				retry = time.NewTimer(backoff/2 + rand.N(backoff/2+1))
				backoff = min(2*backoff, p.cfg.MaxReconnectBackoff)
				continue
			}
			if failing {
				log.Info("rabbitmq: connected", slog.String("exchange", p.cfg.Exchange))
			}
			failing, backoff, retry = false, p.cfg.ReconnectBackoff, nil
			p.setSession(s)
		}
		select {
		case <-p.ctx.Done():
			s.fail(broker.Unavailable(errClosed), 0)
			p.setDown(broker.Unavailable(errClosed))
			return
		case <-s.dead:
		}
		p.setDown(s.err)
		if !s.ch.IsClosed() {
			// The publisher gave up on the session (no confirm in time):
			// the connection is suspect, not just the channel.
			_ = l.conn.CloseDeadline(time.Now().Add(closeTimeout))
		}
		if l.conn.IsClosed() {
			log.Warn("rabbitmq: connection lost; reconnecting", slog.Any("error", s.err))
			l = nil
		} else {
			log.Warn("rabbitmq: channel lost; reopening it", slog.Any("error", s.err))
		}
		s = nil
	}
}

func (p *Publisher) setSession(s *session) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.sess, p.down = s, nil
}

func (p *Publisher) setDown(err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.sess, p.down = nil, err
}

// session returns the current session, or an unavailable error saying why
// there is none.
func (p *Publisher) session() (*session, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.isClosed {
		return nil, broker.Unavailable(errClosed)
	}
	if p.sess == nil {
		return nil, broker.Unavailable(fmt.Errorf("rabbitmq: not connected to %s: %w", p.target.display, p.down))
	}
	return p.sess, nil
}

// Publish publishes msgs and returns one result per message; see
// [broker.Publisher]. ctx bounds the whole call, including waiting for a slot in
// the MaxPending window and for the confirms.
//
// A message fails with a [broker.Permanent] error when it cannot be sent as
// AMQP (a routing key or event type above 255 bytes, properties and headers
// above the connection's frame size) or the server refused its body as too
// large; with [ErrUnroutable] when no queue was bound for its routing key; and
// with a [broker.Unavailable] error when it was nacked, not confirmed within
// Config.ConfirmTimeout, or its channel or connection was lost or blocked.
func (p *Publisher) Publish(ctx context.Context, msgs []broker.Message) []error {
	if len(msgs) == 0 {
		return []error{}
	}
	if err := ctx.Err(); err != nil {
		return broker.FailAll(msgs, err)
	}
	// Not connected: fail fast, every message alike, rather than one per lane.
	if _, err := p.session(); err != nil {
		return broker.FailAll(msgs, err)
	}
	return broker.PublishLanes(ctx, msgs, p.send)
}

// send publishes m on the current session, which may be a newer one than the
// previous message's of the batch.
func (p *Publisher) send(ctx context.Context, m *broker.Message) (broker.AckFunc, error) {
	key, err := p.cfg.RoutingKey.ExpandChecked(m)
	if err != nil {
		return nil, broker.Permanent(fmt.Errorf("rabbitmq: event %s: %w", m.EventID, err))
	}
	if err := validateRoutingKey(key); err != nil {
		return nil, broker.Permanent(fmt.Errorf("rabbitmq: event %s: %w", m.EventID, err))
	}
	msg, err := encode(p.cfg.Encoding, m)
	if err != nil {
		return nil, broker.Permanent(fmt.Errorf("rabbitmq: event %s: %w", m.EventID, err))
	}
	s, err := p.session()
	if err != nil {
		return nil, err
	}
	return s.publish(ctx, m, key, msg)
}

// Ping reports whether the publisher can publish: it is connected, the server
// does not block publishing, and the exchange exists (Ping declares it if
// missing). ctx bounds the check. Its errors are marked [broker.Unavailable].
func (p *Publisher) Ping(ctx context.Context) error {
	s, err := p.session()
	if err != nil {
		return err
	}
	if reason := s.link.blocked.Load(); reason != nil {
		return broker.Unavailable(fmt.Errorf("rabbitmq: the server blocks publishing: %s", *reason))
	}
	// The session's channel may have been closed by the server (a publish to a
	// missing exchange) before the supervisor replaced the session: declaring the
	// exchange on another channel would then report a publisher that cannot publish.
	if s.ch.IsClosed() {
		return broker.Unavailable(fmt.Errorf("rabbitmq: channel to %s closed; reopening it", p.target.display))
	}
	done := make(chan error, 1)
	p.mu.Lock()
	if p.isClosed {
		p.mu.Unlock()
		return broker.Unavailable(errClosed)
	}
	p.wg.Add(1)
	p.mu.Unlock()
	go func() {
		defer p.wg.Done()
		// A round trip; it cannot be cancelled, but ends when the
		// connection does.
		done <- p.ensureExchange(s.link.conn)
	}()
	select {
	case err := <-done:
		if err != nil {
			return broker.Unavailable(fmt.Errorf("rabbitmq: ping: %w", err))
		}
		return nil
	case <-ctx.Done():
		return broker.Unavailable(fmt.Errorf("rabbitmq: ping: %w", ctx.Err()))
	}
}

// Close fails in-flight publishes and closes the connection. It waits for the
// publisher's goroutines to end, at most the time the server takes to answer
// the close (bounded by 5s). It is safe to call more than once.
func (p *Publisher) Close() error {
	p.closeOnce.Do(func() {
		p.mu.Lock()
		p.isClosed = true
		p.mu.Unlock()
		p.cancel()
		p.wg.Wait()
	})
	return nil
}

var (
	_ broker.Publisher = (*Publisher)(nil)
	_ broker.Pinger    = (*Publisher)(nil)
)
