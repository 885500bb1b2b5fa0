// Package mqtt publishes outbox events to an MQTT broker (Mosquitto, EMQX,
// HiveMQ, VerneMQ, …) over MQTT 3.1.1, the default, or MQTT 5
// ([Config.Version], --mqtt-version 5).
//
// Each event is one PUBLISH with QoS 1 (at least once) unless [Config.QoS]
// asks for QoS 2, retain off, to a topic expanded from [Config.Topic]
// ("outbox/{aggregate_type}/{event_type}"). An event counts as acknowledged
// only once its PUBACK (QoS 1) or PUBCOMP (QoS 2) arrived. QoS 0 is not
// offered: the broker does not acknowledge it, so an event could be lost
// without anyone knowing. The session is persistent under the required,
// stable [Config.ClientID], and a Publisher's first connection ends the one a
// previous process left there: that session's state lives in the process that
// left it, and resumed without it a half-finished QoS 2 flow's packet
// identifier would make the broker drop a new message as a repeat while
// acknowledging it (the relay publishes again whatever it saw no
// acknowledgement for, so nothing is lost). On MQTT 3.1.1 a connection asking
// for a clean session comes first and ends it, then every connection resumes
// (CleanSession false), the broker keeping the session across reconnects; on
// MQTT 5 the first connection starts clean (CleanStart true) and every
// reconnect resumes it (CleanStart false), the broker keeping it for
// [Config.SessionExpiry] (1h) after a connection is lost; Close ends it.
//
// # Payload layout on MQTT 3.1.1
//
// MQTT 3.1.1 has no message headers, so the outbox fields travel in the
// payload, a JSON object, in one of two layouts chosen by [Config.Encoding]:
//
//   - wire.FormatOutbox, the default: the envelope
//     {"headers":{...},"datacontenttype":"application/json","data":<payload>},
//     "headers" holding the Outbox-* headers and the producer's (traceparent,
//     …) as strings, "data" the payload's exact bytes when it is JSON, or
//     "data_base64" (standard base64) in its place otherwise.
//   - wire.FormatCloudEvents: a CloudEvents 1.0 event in structured content
//     mode (JSON format), as the CloudEvents MQTT binding prescribes for MQTT
//     3.1.1: the attributes (specversion, id, source, type, subject, time,
//     datacontenttype and the pgoutbox* extensions) as members, traceparent and
//     tracestate as the distributed-tracing extension, the producer's other
//     headers as a JSON object in the string extension "pgoutboxheaders", and
//     the payload in "data" (or "data_base64").
//
// # Properties on MQTT 5
//
// On MQTT 5 the payload is the event's payload, its exact bytes, and the
// Content Type property its media type; the rest travels as user properties
// ([Encode5]):
//
//   - wire.FormatOutbox: one user property per header, the Outbox-* headers
//     and the producer's (traceparent, …), under their names.
//   - wire.FormatCloudEvents: binary content mode, as the CloudEvents MQTT
//     binding prescribes for MQTT 5: each attribute (specversion, id, source,
//     type, subject, time and the pgoutbox* extensions) a user property under
//     its own name, datacontenttype the Content Type property, traceparent and
//     tracestate as user properties, the producer's other headers as a JSON
//     object in the user property "pgoutboxheaders" (so that none can pose as
//     an attribute).
//
// A user property's name and value are at most 65535 bytes each
// ([MaxPropertyBytes]), UTF-8 without NUL; a header beyond that is refused
// permanently before publishing, never cut. [Config.MaxPayloadBytes] bounds
// the payload and the properties together, and a PUBLISH above the Maximum
// Packet Size the broker announced is refused before it is sent.
//
// [ParseReceived] reads any of these forms back into a wire.Message, as
// wire.ParseReceived does for transports with headers; an inbox calls it with
// the message's payload and, on MQTT 5, its properties.
//
// # Order and duplicates
//
// An MQTT broker forwards one client's messages of one QoS in the order it
// received them; the next event of an aggregate leaves only after the previous
// one is acknowledged ([broker.PublishLanesInOrder]), so a failure cannot let
// it overtake. MQTT has no broker-side deduplication: an event re-sent after a
// lost connection or a relay crash (the client resends unacknowledged
// messages of its session on reconnect, and the relay retries) can arrive
// twice. Consumers drop the repeat by its event id (package inbox).
//
// # Errors
//
// A broker that cannot be reached, a connection lost before the
// acknowledgement or a CONNACK "server unavailable" fail as
// broker.Unavailable; a CONNACK refusing the user name or password, the
// authorisation, the client id or the protocol version fails as
// broker.Misconfigured. A topic that MQTT forbids ([CheckTopic]) and a payload
// above [Config.MaxPayloadBytes] are refused as broker.Permanent before
// anything is sent.
//
// MQTT 3.1.1's PUBACK and PUBCOMP carry no failure code: a broker that denies
// a publish by its ACL still acknowledges it (Mosquitto does) and drops the
// message, which no publisher can detect. Grant the relay's user write access
// to every topic the template can produce.
//
// MQTT 5's PUBACK and PUBREC do carry one, and a code of 0x80 or above fails
// the publish, the broker's reason string quoted in the error: "not
// authorized" (0x87, an ACL denial, now detected), "QoS not supported" or
// "retain not supported" as broker.Misconfigured (retried, readiness failing
// until the grant is fixed); "topic name invalid" (0x90), "packet too large"
// (0x95) and "payload format invalid" (0x99) as broker.Permanent (the event
// is quarantined); the others ("unspecified error", "quota exceeded", "server
// busy", …) as broker.Unavailable. QoS 2 asked of a broker whose CONNACK
// offers at most QoS 1 is broker.Misconfigured.
//
// Outside the standard library it pulls in paho.mqtt.golang (Eclipse Paho's
// MQTT 3.1.1 client) and paho.golang (Eclipse Paho's MQTT 5 client, its paho
// package only, which imports nothing outside the standard library),
// besides the root package's pgx and OpenTelemetry trace API.
package mqtt

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"sync"
	"sync/atomic"
	"time"

	paho "github.com/eclipse/paho.mqtt.golang"
	"github.com/eclipse/paho.mqtt.golang/packets"

	"github.com/pgoutbox/pgoutbox/broker"
	"github.com/pgoutbox/pgoutbox/wire"
)

// Version is an MQTT protocol version a Publisher speaks.
type Version byte

// The protocol versions a Publisher speaks, by their CONNECT protocol level.
const (
	// MQTT311 is MQTT 3.1.1, the default: the event in a JSON layout in the
	// payload.
	MQTT311 Version = 4
	// MQTT5 is MQTT 5.0: the headers as user properties, the payload as it
	// is, and failure reason codes in the acknowledgements.
	MQTT5 Version = 5
)

// ParseVersion reads a protocol version as a command line gives it: "3.1.1"
// or "5".
func ParseVersion(s string) (Version, error) {
	switch s {
	case "3.1.1":
		return MQTT311, nil
	case "5":
		return MQTT5, nil
	}
	return 0, fmt.Errorf("mqtt: protocol version %.20q: want 3.1.1 or 5", s)
}

// String returns "3.1.1" or "5".
func (v Version) String() string {
	switch v {
	case MQTT311:
		return "3.1.1"
	case MQTT5:
		return "5"
	}
	return fmt.Sprintf("Version(%d)", byte(v))
}

// QoS is an MQTT quality of service the publisher offers.
type QoS byte

// The QoS levels a Publisher offers: QoS 0 (at most once) is not one of them.
const (
	AtLeastOnce QoS = 1
	ExactlyOnce QoS = 2
)

// Defaults and limits of Config.
const (
	// DefaultTopic is the topic template when Config.Topic is unset.
	DefaultTopic = "outbox/{aggregate_type}/{event_type}"
	// DefaultMaxPayloadBytes is the largest MQTT payload (envelope included)
	// when Config.MaxPayloadBytes is zero: 256 KiB.
	DefaultMaxPayloadBytes = 256 << 10
	// HardMaxPayloadBytes is the largest payload MQTT can carry: its
	// remaining length is at most 268,435,455 bytes, the topic included.
	HardMaxPayloadBytes = 268_435_455 - 2 - MaxTopicBytes - 2
	// DefaultMaxInFlight is how many messages of one Publish call may await
	// their acknowledgement when Config.MaxInFlight is zero.
	DefaultMaxInFlight = 256
	// DefaultConnectTimeout bounds connecting (TCP, TLS, CONNECT/CONNACK) and
	// each write when Config.ConnectTimeout is zero.
	DefaultConnectTimeout = 10 * time.Second
	// DefaultKeepAlive is the MQTT keep-alive when Config.KeepAlive is zero.
	DefaultKeepAlive = 30 * time.Second
	// DefaultSessionExpiry is the MQTT 5 session expiry interval when
	// Config.SessionExpiry is zero: how long the broker keeps the session
	// after a connection is lost, for the reconnect to resume it.
	DefaultSessionExpiry = time.Hour
	// maxSessionExpiry is the longest MQTT 5 session expiry interval short
	// of "never" (0xFFFFFFFF seconds), which this package does not ask for.
	maxSessionExpiry = 0xFFFFFFFE * time.Second
)

// Config configures a Publisher.
type Config struct {
	// Version is the MQTT protocol version: MQTT311 (the default, for zero)
	// or MQTT5.
	Version Version

	// ClientID is the MQTT client id, required and stable across restarts:
	// the broker keeps the persistent session under it. Two relays must not
	// share one (the broker disconnects the older). At most 65535 bytes; many
	// brokers accept at most 23.
	ClientID string

	// Password is sent with the URL's user name. Take it from the environment
	// or a file, never from a command line.
	Password string

	// QoS is AtLeastOnce (the default, for zero) or ExactlyOnce.
	QoS QoS

	// Topic is the topic template. Unset means DefaultTopic.
	Topic broker.Template

	// MaxPayloadBytes bounds the MQTT payload (MQTT 3.1.1: the envelope
	// with the event's payload; MQTT 5: the payload with the properties,
	// user properties and content type); a larger event is refused
	// permanently before publishing. Zero
	// means DefaultMaxPayloadBytes (256 KiB); at most HardMaxPayloadBytes.
	MaxPayloadBytes int

	// MaxInFlight is how many messages of one Publish call may await their
	// acknowledgement at once. Zero means DefaultMaxInFlight (256).
	MaxInFlight int

	// AckTimeout bounds the wait for one message's acknowledgement, once
	// the acknowledgements before it have arrived; a message without one by
	// then fails as unavailable (the broker may still have it). Zero means no
	// bound but the Publish context's.
	AckTimeout time.Duration

	// ConnectTimeout bounds connecting and each write. Zero means
	// DefaultConnectTimeout (10s).
	ConnectTimeout time.Duration

	// KeepAlive is the MQTT keep-alive interval, at most 65535s. Zero means
	// DefaultKeepAlive (30s).
	KeepAlive time.Duration

	// SessionExpiry is MQTT 5's session expiry interval, whole seconds: how
	// long the broker keeps the session after the connection is lost. Zero
	// means DefaultSessionExpiry (1h). MQTT 3.1.1 has none: its persistent
	// session lasts until the broker drops it.
	SessionExpiry time.Duration

	// TLSConfig is the TLS configuration for mqtts:// URLs. Nil means the
	// system's roots, TLS 1.2 at least, the URL's host as server name.
	TLSConfig *tls.Config

	// DialContext opens the TCP connection to the broker: a SOCKS dialer, a
	// test's wrapper. Nil means a net.Dialer's.
	DialContext func(ctx context.Context, network, addr string) (net.Conn, error)

	// Logger receives connection events (connected, lost). Nil means
	// slog.Default().
	Logger *slog.Logger

	// Encoding is the payload layout (see the package doc). The zero value is
	// the Outbox envelope.
	wire.Encoding
}

// Publisher publishes to one MQTT broker over one connection, opened at the
// first Publish or Ping and again after it is lost. It is safe for concurrent
// use.
type Publisher struct {
	cfg    Config
	server *server
	topic  broker.Template
	client paho.Client // MQTT 3.1.1's, or nil
	clean  paho.Client // MQTT 3.1.1's clean-session client, until the first connect
	v5     *client5    // MQTT 5's, or nil
	log    *slog.Logger

	mu      sync.Mutex // serialises connecting
	conn    *connection
	pending *attempt // a connect whose CONNACK no caller waited for
	closed  bool
	next    atomic.Pointer[connection] // the connection being dialled
}

// connection is one network connection of the client; lost is closed when it
// ends, failing the messages that still await their acknowledgement on it.
type connection struct {
	lost chan struct{}
	once sync.Once
}

func (c *connection) end() { c.once.Do(func() { close(c.lost) }) }

func (c *connection) isLost() bool {
	select {
	case <-c.lost:
		return true
	default:
		return false
	}
}

// New returns a Publisher for the broker at rawURL, mqtt://[user@]host[:port]
// or mqtts://[user@]host[:port]. It checks the configuration only; it connects
// at the first Publish or Ping.
func New(rawURL string, cfg Config) (*Publisher, error) {
	srv, err := parseURL(rawURL)
	if err != nil {
		return nil, err
	}
	if err := cfg.check(srv); err != nil {
		return nil, err
	}
	if cfg.QoS == 0 {
		cfg.QoS = AtLeastOnce
	}
	if cfg.MaxPayloadBytes == 0 {
		cfg.MaxPayloadBytes = DefaultMaxPayloadBytes
	}
	if cfg.MaxInFlight == 0 {
		cfg.MaxInFlight = DefaultMaxInFlight
	}
	if cfg.ConnectTimeout == 0 {
		cfg.ConnectTimeout = DefaultConnectTimeout
	}
	if cfg.KeepAlive == 0 {
		cfg.KeepAlive = DefaultKeepAlive
	}
	if cfg.SessionExpiry == 0 {
		cfg.SessionExpiry = DefaultSessionExpiry
	}
	if cfg.Version == 0 {
		cfg.Version = MQTT311
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	p := &Publisher{cfg: cfg, server: srv, topic: cfg.Topic, log: cfg.Logger.With("broker", srv.display)}
	if p.topic.String() == "" {
		p.topic = broker.MustParseTemplate(DefaultTopic)
	}
	if cfg.Version == MQTT5 {
		p.v5 = newClient5()
		return p, nil
	}
	opts := paho.NewClientOptions().
		AddBroker(srv.paho).
		SetClientID(cfg.ClientID).
		SetProtocolVersion(4). // MQTT 3.1.1
		SetCleanSession(false).
		SetAutoReconnect(false). // reconnected by the next Publish, see connect
		SetConnectRetry(false).
		SetOrderMatters(false).
		SetConnectTimeout(cfg.ConnectTimeout).
		SetWriteTimeout(cfg.ConnectTimeout).
		SetKeepAlive(cfg.KeepAlive).
		SetCustomOpenConnectionFn(p.dial)
	if srv.username != "" {
		opts.SetUsername(srv.username)
	}
	if cfg.Password != "" {
		opts.SetPassword(cfg.Password)
	}
	p.client = paho.NewClient(opts)
	clean := *opts
	p.clean = paho.NewClient(clean.SetCleanSession(true))
	return p, nil
}

func (c *Config) check(srv *server) error {
	switch {
	case c.ClientID == "":
		return errors.New("mqtt: a client id is required (--mqtt-client-id): the broker keeps the persistent session under it")
	case len(c.ClientID) > 65535:
		return fmt.Errorf("mqtt: client id of %d bytes, above MQTT's 65535", len(c.ClientID))
	case c.QoS > ExactlyOnce:
		return fmt.Errorf("mqtt: QoS %d: want 1 or 2", c.QoS)
	case c.MaxPayloadBytes < 0 || c.MaxPayloadBytes > HardMaxPayloadBytes:
		return fmt.Errorf("mqtt: MaxPayloadBytes %d: want 1 to %d", c.MaxPayloadBytes, HardMaxPayloadBytes)
	case c.MaxInFlight < 0 || c.MaxInFlight > 65535:
		return fmt.Errorf("mqtt: MaxInFlight %d: want 1 to 65535", c.MaxInFlight)
	case c.ConnectTimeout < 0 || c.KeepAlive < 0 || c.AckTimeout < 0 || c.SessionExpiry < 0:
		return errors.New("mqtt: negative ConnectTimeout, KeepAlive, AckTimeout or SessionExpiry")
	case c.KeepAlive > 65535*time.Second:
		return fmt.Errorf("mqtt: KeepAlive %s, above MQTT's 65535s", c.KeepAlive)
	case c.SessionExpiry > maxSessionExpiry:
		return fmt.Errorf("mqtt: SessionExpiry %s, above MQTT's %s", c.SessionExpiry, maxSessionExpiry)
	case c.Version != 0 && c.Version != MQTT311 && c.Version != MQTT5:
		return fmt.Errorf("mqtt: protocol version %d: want MQTT311 or MQTT5 (--mqtt-version 3.1.1 or 5)", c.Version)
	case c.Password != "" && srv.username == "" && c.Version != MQTT5:
		return errors.New("mqtt: a password is set but the broker URL names no user (mqtt://user@host): MQTT 3.1.1 sends a password only with a user name")
	}
	if err := checkClientID(c.ClientID); err != nil {
		return err
	}
	if err := c.Encoding.Validate(); err != nil {
		return fmt.Errorf("mqtt: %w", err)
	}
	return nil
}

// dial is paho's OpenConnectionFunc: it dials with Config.DialContext, adds
// TLS for mqtts, and watches the connection, so that the messages awaiting
// their acknowledgement on it fail as soon as it ends.
func (p *Publisher) dial(_ *url.URL, _ paho.ClientOptions) (net.Conn, error) {
	ctx, cancel := context.WithTimeout(context.Background(), p.cfg.ConnectTimeout)
	defer cancel()
	nc, err := p.dialConn(ctx)
	if err != nil {
		return nil, err
	}
	c := p.next.Load()
	if c == nil {
		nc.Close()
		return nil, errors.New("mqtt: connection opened outside Publish") // never: paho reconnects only when asked
	}
	return watchedConn{nc, c}, nil
}

// dialConn opens a connection to the broker with Config.DialContext, and
// adds TLS for mqtts.
func (p *Publisher) dialConn(ctx context.Context) (net.Conn, error) {
	dial := p.cfg.DialContext
	if dial == nil {
		dial = (&net.Dialer{}).DialContext
	}
	nc, err := dial(ctx, "tcp", p.server.addr)
	if err != nil {
		return nil, err
	}
	if p.server.tls {
		conf := &tls.Config{MinVersion: tls.VersionTLS12}
		if p.cfg.TLSConfig != nil {
			conf = p.cfg.TLSConfig.Clone()
		}
		if conf.ServerName == "" {
			conf.ServerName = p.server.host
		}
		tc := tls.Client(nc, conf)
		if err := tc.HandshakeContext(ctx); err != nil {
			nc.Close()
			return nil, fmt.Errorf("TLS handshake: %w", err)
		}
		nc = tc
	}
	return nc, nil
}

// watchedConn ends its connection at the first read error or Close.
type watchedConn struct {
	net.Conn
	c *connection
}

func (w watchedConn) Read(b []byte) (int, error) {
	n, err := w.Conn.Read(b)
	if err != nil {
		w.c.end()
	}
	return n, err
}

func (w watchedConn) Close() error {
	w.c.end()
	return w.Conn.Close()
}

// connect returns the open connection, connecting first if there is none.
// It waits for the CONNACK until ctx ends or ConnectTimeout passes; an attempt
// that ctx gave up on goes on, and the next call waits for it.
func (p *Publisher) connect(ctx context.Context) (*connection, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil, errors.New("mqtt: publisher closed")
	}
	if c := p.conn; c != nil && !c.isLost() && p.client.IsConnectionOpen() {
		return c, nil
	}
	if p.clean != nil {
		if err := p.discardSession(ctx); err != nil {
			return nil, err
		}
	}
	if p.pending == nil {
		if p.conn != nil {
			// Lost: let paho finish with the old connection before the next.
			p.client.Disconnect(0)
			p.conn = nil
			p.log.Warn("mqtt: connection lost; reconnecting")
		}
		c := &connection{lost: make(chan struct{})}
		p.next.Store(c)
		p.pending = &attempt{c, p.client.Connect().(*paho.ConnectToken)}
	}
	a := p.pending
	select {
	case <-a.tok.Done(): // bounded by ConnectTimeout
	case <-ctx.Done():
		return nil, broker.Unavailable(fmt.Errorf("mqtt: connect to %s: %w", p.server.display, ctx.Err()))
	}
	p.pending = nil
	if err := a.tok.Error(); err != nil {
		a.c.end()
		return nil, p.connectError(a.tok.ReturnCode(), err)
	}
	p.conn = a.c
	p.log.Info("mqtt: connected", "client_id", p.cfg.ClientID, "session_present", a.tok.SessionPresent())
	return a.c, nil
}

// discardSession ends the session a previous process may have left under
// the client id, with a connection that asks for a clean session, before the
// first persistent one. That session's state lives in the process that left
// it: resumed without it, a half-finished QoS 2 flow's packet identifier
// would make the broker drop a new message that reuses it as a repeat while
// acknowledging it. Nothing is lost by ending it: the relay publishes again
// every event whose acknowledgement it did not see.
func (p *Publisher) discardSession(ctx context.Context) error {
	c := &connection{lost: make(chan struct{})}
	p.next.Store(c)
	tok := p.clean.Connect().(*paho.ConnectToken)
	select {
	case <-tok.Done(): // bounded by ConnectTimeout
	case <-ctx.Done():
		// Let the attempt finish, so that it cannot take the client id over
		// from the persistent connection that comes next.
		<-tok.Done()
		p.clean.Disconnect(0)
		c.end()
		return broker.Unavailable(fmt.Errorf("mqtt: connect to %s: %w", p.server.display, ctx.Err()))
	}
	if err := tok.Error(); err != nil {
		c.end()
		return p.connectError(tok.ReturnCode(), err)
	}
	p.clean.Disconnect(0)
	c.end()
	p.clean = nil
	p.log.Info("mqtt: ended the session left under the client id", "client_id", p.cfg.ClientID, "session_present", tok.SessionPresent())
	return nil
}

// attempt is a connect under way.
type attempt struct {
	c   *connection
	tok *paho.ConnectToken
}

func (p *Publisher) connectError(code byte, err error) error {
	err = fmt.Errorf("mqtt: connect to %s: %w", p.server.display, err)
	switch code {
	case packets.ErrRefusedBadProtocolVersion, packets.ErrRefusedIDRejected,
		packets.ErrRefusedBadUsernameOrPassword, packets.ErrRefusedNotAuthorised:
		return broker.Misconfigured(err)
	}
	return broker.Unavailable(err)
}

// Publish implements broker.Publisher.
func (p *Publisher) Publish(ctx context.Context, msgs []broker.Message) []error {
	return broker.PublishLanesInOrder(ctx, msgs, p.cfg.MaxInFlight, p.send)
}

func (p *Publisher) send(ctx context.Context, m *broker.Message) (broker.AckFunc, error) {
	topic, err := p.topic.ExpandChecked(m)
	if err != nil {
		return nil, broker.Permanent(fmt.Errorf("mqtt: event %s: %w", m.EventID, err))
	}
	if err := CheckTopic(topic); err != nil {
		return nil, fmt.Errorf("mqtt: event %s: %w", m.EventID, err)
	}
	if p.v5 != nil {
		return p.send5(ctx, m, topic)
	}
	payload, err := Encode(p.cfg.Encoding, m)
	if err != nil {
		return nil, err
	}
	if len(payload) > p.cfg.MaxPayloadBytes {
		return nil, broker.Permanent(fmt.Errorf("mqtt: event %s refused: MQTT payload of %d bytes, above the maximum of %d",
			m.EventID, len(payload), p.cfg.MaxPayloadBytes))
	}
	c, err := p.connect(ctx)
	if err != nil {
		return nil, err
	}
	tok := p.client.Publish(topic, byte(p.cfg.QoS), false, payload)
	return func(ctx context.Context) error {
		timeout, stop := p.ackTimer()
		defer stop()
		select {
		case <-timeout:
			return p.noAck(m)
		case <-tok.Done():
			if err := tok.Error(); err != nil {
				return broker.Unavailable(fmt.Errorf("mqtt: publish event %s: %w", m.EventID, err))
			}
			return nil
		case <-c.lost:
			return broker.Unavailable(fmt.Errorf("mqtt: event %s: the connection to %s ended before the broker acknowledged it", m.EventID, p.server.display))
		case <-ctx.Done():
			return fmt.Errorf("mqtt: event %s: waiting for the acknowledgement: %w", m.EventID, ctx.Err())
		}
	}, nil
}

// ackTimer returns a channel that fires after Config.AckTimeout (nil, never
// firing, when there is none) and the function that stops it.
func (p *Publisher) ackTimer() (<-chan time.Time, func() bool) {
	if p.cfg.AckTimeout <= 0 {
		return nil, func() bool { return false }
	}
	t := time.NewTimer(p.cfg.AckTimeout)
	return t.C, t.Stop
}

// noAck is the error of a message whose acknowledgement ackTimer gave up on.
func (p *Publisher) noAck(m *broker.Message) error {
	return broker.Unavailable(fmt.Errorf("mqtt: event %s: no acknowledgement within %s", m.EventID, p.cfg.AckTimeout))
}

// Ping connects if needed and reports whether the broker accepted the
// connection.
func (p *Publisher) Ping(ctx context.Context) error {
	if p.v5 != nil {
		_, _, err := p.connect5(ctx)
		return err
	}
	_, err := p.connect(ctx)
	return err
}

// Close disconnects. Messages awaiting their acknowledgement fail; the broker
// keeps the session, so a publisher with the same client id resends them.
func (p *Publisher) Close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil
	}
	p.closed = true
	if p.v5 != nil {
		p.close5()
		return nil
	}
	if p.pending != nil {
		p.pending.tok.WaitTimeout(p.cfg.ConnectTimeout) // so that it does not outlive Close
		p.pending = nil
	}
	if p.client.IsConnectionOpen() {
		p.client.Disconnect(250)
	}
	if p.conn != nil {
		p.conn.end()
	}
	return nil
}

// checkClientID refuses a client id that is not valid UTF-8 or holds NUL:
// MQTT strings may not.
func checkClientID(id string) error {
	for i, r := range id {
		if r == 0 || r == '\uFFFD' {
			return fmt.Errorf("mqtt: client id: invalid character at byte %d (want UTF-8 without NUL)", i)
		}
	}
	return nil
}
