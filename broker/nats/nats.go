// Package nats publishes outbox events to NATS JetStream, the default broker.
//
// Each event goes to a subject expanded from [Config.Subject], with the wire
// headers (docs/design.md, "Wire headers") as NATS headers, the payload as body, and Nats-Msg-Id set to
// the event id, so the stream's duplicate window drops a re-publish after a relay
// crash. A replay sets [broker.Message.DedupID], which becomes the Nats-Msg-Id
// instead, so that the stream stores it again. Publishes are asynchronous: every
// aggregate in a batch has one message in flight, and the next one of an
// aggregate leaves only after the previous one's ack ([broker.PublishLanesInOrder]:
// JetStream answers one connection's publishes into one stream in order, so acks
// are awaited oldest first, with no goroutine per message).
//
// [New] wraps a JetStream client the caller configured; [Dial] owns its
// connection and reconnects forever. Package natsembed runs an in-process server
// for demos and tests.
//
// Outside the standard library it pulls in nats.go (with nkeys, nuid and
// klauspost/compress) and golang.org/x/sync, besides the root package's pgx and
// OpenTelemetry trace API; no server code.
package nats

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/textproto"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	natsgo "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"golang.org/x/sync/semaphore"

	"github.com/pgoutbox/pgoutbox/broker"
	"github.com/pgoutbox/pgoutbox/internal/config"
	"github.com/pgoutbox/pgoutbox/wire"
)

// Defaults of Config.
const (
	// DefaultStream is the stream name when Config.Stream is empty.
	DefaultStream = "OUTBOX"
	// DefaultStreamSubject is the one subject of the stream when
	// Config.StreamSubjects is empty: it covers DefaultSubject.
	DefaultStreamSubject = "outbox.>"
	// DefaultSubject is the subject template when Config.Subject is unset.
	DefaultSubject = "outbox.{aggregate_type}.{event_type}"
	// DefaultAckTimeout is the wait for one message's ack when
	// Config.AckTimeout is zero.
	DefaultAckTimeout = 5 * time.Second
	// DefaultMaxPending is the number of messages that may await their ack
	// when Config.MaxPending is zero.
	DefaultMaxPending = 4000
)

// Config configures a Publisher. A nil *Config means all defaults.
type Config struct {
	// Stream is the JetStream stream the events are stored in. It is created if
	// missing; an existing stream is used as is, never modified. Empty means
	// DefaultStream ("OUTBOX").
	Stream string

	// StreamSubjects are the subjects of the stream, used only when creating it.
	// They must cover every subject Subject expands to. Empty means
	// [DefaultStreamSubject] ("outbox.>").
	StreamSubjects []string

	// Subject is the template of each event's subject. Unset means
	// DefaultSubject ("outbox.{aggregate_type}.{event_type}").
	Subject broker.Template

	// AckTimeout bounds the wait for the server's ack of one message; a message
	// without an ack by then fails as unavailable (it may still be stored: the
	// retry is then dropped as a duplicate). Zero means DefaultAckTimeout (5s).
	AckTimeout time.Duration

	// MaxPending is how many messages may await their ack at once, across all
	// concurrent Publish calls of this publisher: each call reserves a share of
	// it (up to its number of messages) and waits until the share is free.
	// Zero means DefaultMaxPending (4000).
	MaxPending int

	// Logger receives connection and stream events. Nil means slog.Default().
	Logger *slog.Logger

	// DialOptions are extra connection options for Dial (credentials, TLS, a
	// custom dialer); they are applied after the publisher's own, so they win.
	// New ignores them. Empty means none.
	DialOptions []natsgo.Option

	// Encoding is the wire format of the messages. The zero value is the
	// default Outbox-* headers; FormatCloudEvents sends CloudEvents binary mode
	// per the NATS protocol binding (ce-* headers, a content-type header).
	Encoding wire.Encoding
}

// Validate reports every invalid field of c — a Stream or StreamSubjects
// JetStream would refuse, a negative AckTimeout or MaxPending, an unusable
// Encoding — each error naming its field. Zero fields stand for their
// defaults, and a nil c (all defaults) is valid.
func (c *Config) Validate() error {
	_, err := withDefaults(c)
	return err
}

// withDefaults returns a copy of cfg (nil means all defaults) with defaults
// applied, or the errors of Validate.
func withDefaults(cfg *Config) (Config, error) {
	return config.Resolve("nats", cfg, fillDefaults, checkConfig)
}

func fillDefaults(c *Config) {
	config.Default(&c.Stream, DefaultStream)
	if len(c.StreamSubjects) == 0 {
		c.StreamSubjects = []string{DefaultStreamSubject}
	} else {
		c.StreamSubjects = slices.Clone(c.StreamSubjects)
	}
	if c.Subject.String() == "" {
		c.Subject = broker.MustParseTemplate(DefaultSubject)
	}
	config.Default(&c.AckTimeout, DefaultAckTimeout)
	config.Default(&c.MaxPending, DefaultMaxPending)
	config.Default(&c.Logger, slog.Default())
	c.DialOptions = slices.Clone(c.DialOptions)
}

func checkConfig(c *Config, p *config.Problems) {
	p.Check(!strings.ContainsAny(c.Stream, ".*> \t\r\n/\\"),
		"Config.Stream (%q): a stream name cannot contain '.', '*', '>', '/', '\\' or whitespace", c.Stream)
	for _, s := range c.StreamSubjects {
		p.Check(!(s == "" || strings.ContainsAny(s, " \t\r\n") || strings.Contains(s, "..") || strings.HasPrefix(s, ".") || strings.HasSuffix(s, ".")),
			"Config.StreamSubjects: invalid subject %q", s)
	}
	p.Check(c.AckTimeout > 0, "Config.AckTimeout (%s) must be positive", c.AckTimeout)
	p.Check(c.MaxPending > 0, "Config.MaxPending (%d) must be positive", c.MaxPending)
	p.Field("Config.Encoding", c.Encoding.Validate())
}

// Publisher publishes outbox events to a JetStream stream. It implements
// [broker.Publisher] and [broker.Pinger] and is safe for concurrent use.
type Publisher struct {
	cfg  Config
	js   jetstream.JetStream
	nc   *natsgo.Conn
	owns bool // Close closes nc (Dial)

	window *semaphore.Weighted // a token per message that may await its ack

	mu     sync.Mutex
	stream *streamState // nil until ensured, and again after a failure

	closeOnce sync.Once
	closed    chan struct{}
}

// streamState is what the publisher knows of the stream.
type streamState struct {
	subjects []string
}

func (s *streamState) covers(subject string) bool {
	for _, f := range s.subjects {
		if subjectMatches(f, subject) {
			return true
		}
	}
	return false
}

var errClosed = errors.New("nats: publisher closed")

// New returns a publisher on js, configured by cfg (nil means all defaults), a client the caller configured and keeps owning:
// Close does not close its connection. If js is connected, New ensures the
// stream now, governed by ctx, and returns an error if the server refuses to
// create it (for instance, its subjects overlap another stream's); if js is not
// connected, or the server does not answer, the stream is ensured on first use.
//
// JetStream's own async-publish options of js (WithPublishAsyncTimeout,
// WithPublishAsyncMaxPending) still apply beneath Config.AckTimeout and
// Config.MaxPending; set WithPublishAsyncTimeout so that acks the server never
// sends are dropped from the client's table.
func New(ctx context.Context, js jetstream.JetStream, cfg *Config) (*Publisher, error) {
	c, err := withDefaults(cfg)
	if err != nil {
		return nil, err
	}
	return newPublisher(ctx, js, c, false)
}

// Dial connects to the NATS servers at url (comma-separated nats://, tls://,
// ws:// or wss:// URLs) and returns a publisher that owns the connection. It
// reconnects forever: a server that is unreachable at start-up is not an error;
// publishes fail as [broker.Unavailable] until the server is reachable, and the
// stream is ensured once it is. A malformed url is an error. ctx governs the
// first attempt to ensure the stream, if the server is reachable at once.
func Dial(ctx context.Context, url string, config *Config) (*Publisher, error) {
	cfg, err := withDefaults(config)
	if err != nil {
		return nil, err
	}
	if err := validateURLs(url); err != nil {
		return nil, err
	}
	log := cfg.Logger
	opts := []natsgo.Option{
		natsgo.Name("pgoutbox relay"),
		natsgo.MaxReconnects(-1),
		// No buffering while reconnecting: a publish then fails at once as
		// unavailable instead of waiting out its ack timeout in a buffer.
		natsgo.ReconnectBufSize(-1),
		natsgo.DisconnectErrHandler(func(_ *natsgo.Conn, err error) {
			if err != nil {
				log.Warn("nats: disconnected", slog.Any("error", err))
			}
		}),
		natsgo.ReconnectHandler(func(nc *natsgo.Conn) {
			log.Info("nats: reconnected", slog.String("url", nc.ConnectedUrlRedacted()))
		}),
		natsgo.ErrorHandler(func(_ *natsgo.Conn, _ *natsgo.Subscription, err error) {
			log.Warn("nats: async error", slog.Any("error", err))
		}),
	}
	nc, err := connect(url, opts, cfg.DialOptions)
	if err != nil {
		return nil, err
	}
	js, err := jetstream.New(nc,
		jetstream.WithPublishAsyncTimeout(cfg.AckTimeout),
		jetstream.WithPublishAsyncMaxPending(cfg.MaxPending),
	)
	if err != nil {
		nc.Close()
		return nil, fmt.Errorf("nats: jetstream: %w", err)
	}
	p, err := newPublisher(ctx, js, cfg, true)
	if err != nil {
		nc.Close()
		return nil, err
	}
	return p, nil
}

// connect dials url. The first attempt is made without RetryOnFailedConnect, so
// that a server turning the credentials away says so synchronously: that is a
// configuration error (it would refuse every reconnect too), not an outage to
// wait out. (With RetryOnFailedConnect, nats.go reports the refusal only through
// LastError, which its reconnect loop clears at its next attempt: a race.) A
// server that cannot be reached is an outage: the connection is made again with
// RetryOnFailedConnect, and publishes fail as Unavailable until it is up.
func connect(url string, opts, extra []natsgo.Option) (*natsgo.Conn, error) {
	first := append(slices.Clone(opts), extra...)
	first = append(first, natsgo.RetryOnFailedConnect(false))
	nc, err := natsgo.Connect(url, first...)
	switch {
	case err == nil:
		return nc, nil
	case isAuthError(err):
		return nil, fmt.Errorf("nats: connect: the server refused the credentials: %w", err)
	}
	nc, err = natsgo.Connect(url, append(append(slices.Clone(opts), natsgo.RetryOnFailedConnect(true)), extra...)...)
	if err != nil {
		return nil, fmt.Errorf("nats: connect: %w", err)
	}
	return nc, nil
}

// isAuthError reports whether err is the server refusing the connection's
// credentials.
func isAuthError(err error) bool {
	return errors.Is(err, natsgo.ErrAuthorization) || errors.Is(err, natsgo.ErrAuthExpired) ||
		errors.Is(err, natsgo.ErrAuthRevoked) || errors.Is(err, natsgo.ErrAccountAuthExpired)
}

// validateURLs catches what nats.go would only find when it first dials, which
// with RetryOnFailedConnect is never reported.
func validateURLs(s string) error {
	if strings.TrimSpace(s) == "" {
		return errors.New("nats: empty server URL")
	}
	for _, raw := range strings.Split(s, ",") {
		raw = strings.TrimSpace(raw)
		if !strings.Contains(raw, "://") {
			raw = "nats://" + raw
		}
		u, err := url.Parse(raw)
		if err != nil {
			var ue *url.Error
			if errors.As(err, &ue) {
				err = ue.Err // ue.URL may hold a password
			}
			return fmt.Errorf("nats: malformed server URL: %w", err)
		}
		switch u.Scheme {
		case "nats", "tls", "ws", "wss":
		default:
			return fmt.Errorf("nats: server URL %s: scheme %q, want nats, tls, ws or wss", u.Redacted(), u.Scheme)
		}
		if u.Hostname() == "" {
			return fmt.Errorf("nats: server URL %s: no host", u.Redacted())
		}
		if port := u.Port(); port != "" {
			if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
				return fmt.Errorf("nats: server URL %s: invalid port %q", u.Redacted(), port)
			}
		}
	}
	return nil
}

func newPublisher(ctx context.Context, js jetstream.JetStream, cfg Config, owns bool) (*Publisher, error) {
	p := &Publisher{
		cfg:    cfg,
		js:     js,
		nc:     js.Conn(),
		owns:   owns,
		window: semaphore.NewWeighted(int64(cfg.MaxPending)),
		closed: make(chan struct{}),
	}
	if p.nc.IsConnected() {
		if _, err := p.ensureStream(ctx); err != nil {
			var se *SubjectsError
			if errors.As(err, &se) || broker.IsPermanent(classify(err)) {
				return nil, err
			}
			cfg.Logger.Warn("nats: stream not ensured yet, will retry on first publish",
				slog.String("stream", cfg.Stream), slog.Any("error", err))
		}
	}
	return p, nil
}

// ensureStream looks the stream up, creating it if missing, and caches what the
// publisher needs to know of it. Its errors are not classified: a stream the
// server refuses to create is a refusal for New but an outage for Publish, which
// must not quarantine events over a stream's configuration.
func (p *Publisher) ensureStream(ctx context.Context) (*streamState, error) {
	if !p.nc.IsConnected() {
		return nil, fmt.Errorf("nats: ensure stream %s: %w", p.cfg.Stream, connErr(p.nc))
	}
	s, err := p.js.Stream(ctx, p.cfg.Stream)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		if err := checkSubjects(p.cfg.Stream, p.cfg.StreamSubjects, p.cfg.Subject, true); err != nil {
			return nil, err
		}
		s, err = p.js.CreateStream(ctx, jetstream.StreamConfig{
			Name:     p.cfg.Stream,
			Subjects: p.cfg.StreamSubjects,
			Storage:  jetstream.FileStorage,
		})
		if errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
			// Another relay created it first, maybe with other settings: use theirs.
			s, err = p.js.Stream(ctx, p.cfg.Stream)
		} else if err == nil {
			p.cfg.Logger.Info("nats: created stream", slog.String("stream", p.cfg.Stream),
				slog.Any("subjects", p.cfg.StreamSubjects))
		}
	}
	if err != nil {
		return nil, fmt.Errorf("nats: ensure stream %s: %w", p.cfg.Stream, err)
	}
	st := &streamState{subjects: s.CachedInfo().Config.Subjects}
	if len(st.subjects) == 0 {
		// A stream created without subjects listens on its own name.
		st.subjects = []string{p.cfg.Stream}
	}
	if err := checkSubjects(p.cfg.Stream, st.subjects, p.cfg.Subject, false); err != nil {
		return nil, err
	}
	p.mu.Lock()
	p.stream = st
	p.mu.Unlock()
	return st, nil
}

// currentStream returns the cached stream state, ensuring the stream first if
// nothing is cached (at start-up, or after a failure).
func (p *Publisher) currentStream(ctx context.Context) (*streamState, error) {
	p.mu.Lock()
	st := p.stream
	p.mu.Unlock()
	if st != nil {
		return st, nil
	}
	return p.ensureStream(ctx)
}

// forgetStream makes the next Publish look the stream up again: after a failure
// it may have been deleted, or recreated with other subjects.
func (p *Publisher) forgetStream() {
	p.mu.Lock()
	p.stream = nil
	p.mu.Unlock()
}

// Publish publishes msgs and returns one result per message; see
// [broker.Publisher]. ctx bounds the whole call, including waiting for a slot in
// the MaxPending window and for the acks.
func (p *Publisher) Publish(ctx context.Context, msgs []broker.Message) []error {
	if len(msgs) == 0 {
		return []error{}
	}
	if err := ctx.Err(); err != nil {
		return broker.FailAll(msgs, err)
	}
	select {
	case <-p.closed:
		return broker.FailAll(msgs, broker.Unavailable(errClosed))
	default:
	}
	st, err := p.currentStream(ctx)
	if err != nil {
		return broker.FailAll(msgs, broker.Unavailable(err))
	}
	// A subject outside the stream is refused permanently, so first make sure the
	// cached subjects are not stale.
	for i := range msgs {
		if subj := p.cfg.Subject.Expand(&msgs[i]); validateSubject(subj) == nil && !st.covers(subj) {
			if st, err = p.ensureStream(ctx); err != nil {
				return broker.FailAll(msgs, broker.Unavailable(err))
			}
			break
		}
	}

	// A call reserves its whole share of the window at once, so concurrent calls
	// never hold part of it while waiting for more. JetStream answers the publishes
	// of one connection into one stream in order: acks are awaited oldest first.
	share := min(len(msgs), p.cfg.MaxPending)
	if err := p.reserve(ctx, share); err != nil {
		return broker.FailAll(msgs, err)
	}
	results := broker.PublishLanesInOrder(ctx, msgs, share, func(ctx context.Context, m *broker.Message) (broker.AckFunc, error) {
		return p.send(st, m)
	})
	p.window.Release(int64(share))
	for _, err := range results {
		if err != nil && !broker.IsPermanent(err) && !errors.Is(err, broker.ErrPredecessorFailed) {
			p.forgetStream()
			break
		}
	}
	return results
}

// reserve takes n tokens of the window, waiting for them until ctx ends or the
// publisher is closed.
func (p *Publisher) reserve(ctx context.Context, n int) error {
	if p.window.TryAcquire(int64(n)) {
		return nil
	}
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		select {
		case <-p.closed:
			cancel()
		case <-wctx.Done():
		}
	}()
	if err := p.window.Acquire(wctx, int64(n)); err != nil {
		select {
		case <-p.closed:
			return broker.Unavailable(errClosed)
		default:
			return err
		}
	}
	return nil
}

// send publishes m asynchronously and returns how to wait for its ack.
func (p *Publisher) send(st *streamState, m *broker.Message) (broker.AckFunc, error) {
	enc, err := p.cfg.Encoding.Encode(m, wire.CloudEventsNATS)
	if err != nil {
		return nil, err
	}
	subj, err := p.cfg.Subject.ExpandChecked(m)
	if err != nil {
		return nil, broker.Permanent(fmt.Errorf("nats: event %s: %w", m.EventID, err))
	}
	if err := validateSubject(subj); err != nil {
		return nil, broker.Permanent(fmt.Errorf("nats: event %s: %w", m.EventID, err))
	}
	if !st.covers(subj) {
		return nil, broker.Permanent(fmt.Errorf("nats: event %s: subject %q is not in stream %s (subjects %v)",
			m.EventID, subj, p.cfg.Stream, st.subjects))
	}
	// Room for the Nats-Msg-Id and Nats-Expected-Stream headers the client adds: a
	// map that has to grow for them costs more than the rest of the headers.
	// NATS messages have no content-type field: the CloudEvents binding
	// carries it as a header, the default format leaves it out.
	n := enc.HeaderCount
	msg := &natsgo.Msg{Subject: subj, Data: enc.Body, Header: make(natsgo.Header, n+2)}
	values := make([]string, 0, n) // one allocation for every header's value slice
	for k, v := range enc.Headers {
		// nats.go trims values and turns line breaks into spaces; refuse rather
		// than deliver a header that differs from the event's.
		if v != textproto.TrimString(v) || strings.ContainsAny(v, "\r\n") {
			return nil, broker.Permanent(fmt.Errorf("nats: event %s: header %q: value %q cannot be sent unchanged", m.EventID, k, v))
		}
		values = append(values, v)
		msg.Header[k] = values[len(values)-1 : len(values) : len(values)]
	}
	// Fail fast rather than hand the client a message it cannot send now.
	if !p.nc.IsConnected() {
		return nil, broker.Unavailable(fmt.Errorf("nats: event %s: %w", m.EventID, connErr(p.nc)))
	}
	paf, err := p.js.PublishMsgAsync(msg,
		jetstream.WithMsgID(m.BrokerDedupID()),
		// The server refuses, rather than stores elsewhere, a subject another
		// stream has taken.
		jetstream.WithExpectStream(p.cfg.Stream),
		jetstream.WithStallWait(p.cfg.AckTimeout),
	)
	if err != nil {
		return nil, fmt.Errorf("nats: publish event %s to %s: %w", m.EventID, subj, classify(err))
	}
	deadline := time.Now().Add(p.cfg.AckTimeout)
	return func(ctx context.Context) error {
		err := p.awaitAck(ctx, paf, deadline)
		if err != nil && ctx.Err() == nil {
			return fmt.Errorf("nats: publish event %s to %s: %w", m.EventID, subj, err)
		}
		return err
	}, nil
}

// awaitAck waits for paf's answer until deadline (the ack timeout from the send).
func (p *Publisher) awaitAck(ctx context.Context, paf jetstream.PubAckFuture, deadline time.Time) error {
	select { // most acks have arrived by the time they are awaited: no timer then
	case <-paf.Ok():
		return nil
	case err := <-paf.Err():
		return classify(err)
	default:
	}
	timer := time.NewTimer(time.Until(deadline))
	defer timer.Stop()
	select {
	case <-paf.Ok():
		return nil
	case err := <-paf.Err():
		return classify(err)
	case <-timer.C:
		return broker.Unavailable(fmt.Errorf("no ack within %s", p.cfg.AckTimeout))
	case <-ctx.Done():
		return ctx.Err()
	case <-p.closed:
		return broker.Unavailable(errClosed)
	}
}

// connErr says why nc cannot publish now.
func connErr(nc *natsgo.Conn) error {
	switch nc.Status() {
	case natsgo.CLOSED:
		return natsgo.ErrConnectionClosed
	case natsgo.RECONNECTING:
		return natsgo.ErrConnectionReconnecting
	case natsgo.DRAINING_PUBS, natsgo.DRAINING_SUBS:
		return natsgo.ErrConnectionDraining
	default:
		return natsgo.ErrDisconnected
	}
}

// classify marks err as permanent when the message itself was refused and as
// unavailable when the server could not be reached or did not answer.
func classify(err error) error {
	if err == nil || broker.IsPermanent(err) || broker.IsUnavailable(err) {
		return err
	}
	switch {
	case errors.Is(err, context.Canceled):
		return err
	case errors.Is(err, natsgo.ErrMaxPayload),
		errors.Is(err, natsgo.ErrBadSubject),
		errors.Is(err, natsgo.ErrBadHeaderMsg),
		errors.Is(err, natsgo.ErrHeadersNotSupported),
		errors.Is(err, jetstream.ErrInvalidSubject),
		errors.Is(err, jetstream.ErrStreamMessageExceedsMaximum):
		return broker.Permanent(err)
	case errors.Is(err, natsgo.ErrNoResponders),
		errors.Is(err, jetstream.ErrNoStreamResponse),
		errors.Is(err, natsgo.ErrConnectionClosed),
		errors.Is(err, natsgo.ErrConnectionReconnecting),
		errors.Is(err, natsgo.ErrConnectionDraining),
		errors.Is(err, natsgo.ErrDisconnected),
		errors.Is(err, natsgo.ErrReconnectBufExceeded),
		errors.Is(err, natsgo.ErrTimeout),
		errors.Is(err, natsgo.ErrInvalidConnection),
		errors.Is(err, jetstream.ErrAsyncPublishTimeout),
		errors.Is(err, jetstream.ErrTooManyStalledMsgs),
		errors.Is(err, jetstream.ErrJetStreamNotEnabled),
		errors.Is(err, jetstream.ErrJetStreamNotEnabledForAccount),
		errors.Is(err, jetstream.ErrJetStreamPublisherClosed):
		return broker.Unavailable(err)
	}
	// Any other answer of the JetStream API: 4xx is about the request itself
	// (the message, or a stream config the server will not accept), 5xx about the
	// server's state, and so are the 4xx answers that say "not now".
	var apiErr *jetstream.APIError
	if errors.As(err, &apiErr) {
		if isTransientAPIError(apiErr) {
			return broker.Unavailable(err)
		}
		if apiErr.Code >= 400 && apiErr.Code < 500 {
			return broker.Permanent(err)
		}
		return broker.Unavailable(err)
	}
	return err
}

// JetStream API error codes that come with a 4xx status but describe the
// server's state, not the message (the server's errors.json).
const (
	// errCodeDuplicateInProcess (409, "duplicate message id is in process"): a
	// replicated stream is still proposing an earlier publish with the same
	// Nats-Msg-Id, typically the relay's own publish whose ack was lost when
	// the stream's leader changed. Once the proposal is applied, or dropped
	// with a leader change, the retry gets the duplicate's ack or is stored.
	errCodeDuplicateInProcess jetstream.ErrorCode = 10158
	// errCodeTooManyRequests (429): the stream sheds load.
	errCodeTooManyRequests jetstream.ErrorCode = 10167
)

// isTransientAPIError reports whether a JetStream API error with a 4xx
// status says "not now" rather than "never": retried as unavailable, it must
// never quarantine an event.
func isTransientAPIError(e *jetstream.APIError) bool {
	switch {
	case e.ErrorCode == errCodeDuplicateInProcess, e.ErrorCode == errCodeTooManyRequests:
		return true
	default:
		return e.Code == 408 || e.Code == 429
	}
}

// Ping reports whether the publisher can publish: the server is reachable and the
// stream exists (Ping creates it if missing). ctx bounds the check. Its errors
// are marked [broker.Unavailable].
func (p *Publisher) Ping(ctx context.Context) error {
	select {
	case <-p.closed:
		return broker.Unavailable(errClosed)
	default:
	}
	if _, err := p.ensureStream(ctx); err != nil {
		return broker.Unavailable(err)
	}
	return nil
}

// Close fails in-flight publishes and, for a publisher from Dial, closes its
// connection. It is safe to call more than once.
func (p *Publisher) Close() error {
	p.closeOnce.Do(func() {
		close(p.closed)
		if p.owns {
			p.nc.Close()
		}
	})
	return nil
}

var (
	_ broker.Publisher = (*Publisher)(nil)
	_ broker.Pinger    = (*Publisher)(nil)
)
