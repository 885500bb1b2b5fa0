// Package webhook publishes outbox events as HTTP POST requests to a webhook
// endpoint, and verifies their signatures on the receiving side.
//
// # The request
//
// Each event is one POST to [Config.URL] (whose path may be a template, see
// [ParseURL]) with the payload as body and these headers:
//
//	Content-Type: <the payload's>           application/json unless Message.ContentType says
//	Outbox-Event-Id, Outbox-Event-Type, …   the wire headers (docs/design.md)
//	traceparent, …                          the producer's headers
//	Idempotency-Key: <event id>             the same on every attempt
//	Outbox-Signature: t=<unix seconds>,v1=<hex HMAC-SHA256>   see Sign
//	Webhook-Id, Webhook-Timestamp, Webhook-Signature        with Config.StandardSecret, see below
//
// plus Config.Header. A producer header with a reserved name
// (pgoutbox.ReservedHeader: Authorization, Cookie, Content-*, Transfer-Encoding,
// Idempotency-Key, Host, Connection, Expect, Outbox-*, …) or one that cannot be
// sent unchanged (a line break, a leading space, a name that is not an HTTP token)
// is refused as permanent, never sent; one that Config.Header also sets is left
// out (Config.Header wins).
//
// # Acknowledgements and errors
//
// Within an aggregate, event k+1 is POSTed only after k was answered 2xx
// ([broker.PublishLanes]); different aggregates are in flight together, up to
// Config.MaxConcurrency requests. The answer decides the event's fate:
//
//	2xx                          acknowledged
//	3xx                          broker.Unavailable: redirects are never followed
//	401, 403                     broker.Misconfigured: the endpoint refuses our configuration, not the event
//	408, 429                     broker.Unavailable
//	409, 425                     retryable (409: the same Idempotency-Key is in flight)
//	other 4xx                    broker.Permanent: the event is quarantined
//	502, 503, 504                broker.Unavailable
//	500, other 5xx               retryable, quarantined after the relay's max attempts
//	connection error, timeout    broker.Unavailable
//
// Unavailable answers never count towards quarantine: they say nothing about the
// event (the endpoint is down, overloaded or moved). 401 and 403 mean a wrong
// signing secret, a clock more than the receiver's tolerance off, or wrong or
// revoked credentials: a configuration error. They are [broker.Misconfigured]
// (a kind of Unavailable): the events are retried with backoff and never
// quarantined — they are fine, the configuration is not — and the relay logs a
// configuration error and fails readiness until a request is acknowledged again;
// [Publisher.Ping] fails with the same reason meanwhile. A 500 may be the receiver
// choking on this very event, so it counts. A timeout is ambiguous — the endpoint
// may have acted on the event — so the retry carries the same Idempotency-Key and
// the receiver must deduplicate on it.
//
// A non-2xx answer fails the event with a [*StatusError], which carries the
// status and a short excerpt of the response body; the relay stores its text as
// the event's last error. The excerpt is bounded (256 bytes) and scrubbed: a
// receiver that echoes the request has the signing secret, the signature, the
// Authorization and Config.Header values, the URL's credentials and tokens, and
// anything else credential-shaped removed (internal/redact), so last_error never
// stores them.
//
// # Plain HTTP
//
// New logs a warning when an http:// endpoint would receive credentials (user
// info in the URL, a token in its query, an Authorization or similar header in
// Config.Header) or signed requests: anyone on the path can read them, and a
// signature proves nothing against a reader who can replay. Use https://.
//
// A redirect is not followed because following one would re-send the event, with
// its signature and Config.Header credentials, to an address nobody configured,
// and 301/302/303 would turn the POST into a GET whose 2xx acknowledges nothing.
// Point Config.URL at the final address instead.
//
// After a 429 or 503 with a Retry-After header, the publisher sends nothing to the
// endpoint for that long (at most Config.RetryAfterMax): every event fails at once
// as unavailable instead.
//
// # Standard Webhooks
//
// With Config.StandardSecret the publisher also signs every request the way of
// the Standard Webhooks specification (https://www.standardwebhooks.com), beside
// Outbox-Signature or instead of it when Config.Secret is empty:
//
//	Webhook-Id: <event id>                   the same on every attempt, like Idempotency-Key
//	Webhook-Timestamp: <unix seconds>        the time of this attempt
//	Webhook-Signature: v1,<base64(HMAC-SHA256(key, id + "." + timestamp + "." + body))>
//
// so receivers can verify events with the off-the-shelf standardwebhooks
// libraries (JavaScript, Python, Go, …), given the secret in its text form
// "whsec_" + base64(key) ([ParseStandardSecret], [FormatStandardSecret]). Such a
// signature covers the id, the timestamp and the exact body bytes sent, not the
// Outbox-* headers, the content type or the path: a receiver of Standard Webhooks
// should act on what the body says. The Webhook-* names are reserved: producer
// headers of those names are dropped and Config.Header may not set them.
//
// # Receiving
//
// [Verifier] checks Outbox-Signature on the receiving side, as a function or as
// net/http middleware, with several secrets for rotation; [StandardVerifier]
// checks the Standard Webhooks headers the same way.
//
// Outside the standard library (net/http) it pulls in only the root package's pgx
// and OpenTelemetry trace API.
package webhook

import (
	"bytes"
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/pgoutbox/pgoutbox/broker"
	"github.com/pgoutbox/pgoutbox/internal/config"
	"github.com/pgoutbox/pgoutbox/internal/redact"
	"github.com/pgoutbox/pgoutbox/wire"
)

// Defaults of Config.
const (
	// DefaultTimeout bounds one request when Config.Timeout is zero.
	DefaultTimeout = 10 * time.Second
	// DefaultMaxConcurrency is the number of requests in flight at once when
	// Config.MaxConcurrency is zero.
	DefaultMaxConcurrency = 64
	// DefaultRetryAfterMax caps the pause a Retry-After header imposes when
	// Config.RetryAfterMax is zero.
	DefaultRetryAfterMax = time.Minute
)

// Config configures a Publisher. URL is required, and Secret unless
// StandardSecret or AllowUnsigned is set, so a nil *Config is not valid; the
// other fields have defaults.
type Config struct {
	// URL is the endpoint every event is POSTed to: http:// or https://, with a
	// host, optionally a port, a path and a query. The path may hold the
	// placeholders of broker.Template, for instance
	// "https://hooks.example.com/outbox/{aggregate_type}/{event_type}"; values are
	// path-escaped, so a "/" in an aggregate id stays inside its segment, and an
	// event whose value is empty, "." or ".." is refused. User info in the URL is
	// sent as basic authentication. See ParseURL. Required.
	URL string

	// Secret is the key of the HMAC-SHA256 signature of every request (see Sign);
	// the receiver's Verifier needs the same bytes. At least MinSecretLen bytes;
	// 32 random bytes are good. Required unless StandardSecret or AllowUnsigned
	// is set.
	Secret []byte

	// StandardSecret, when set, is the key (decoded: see ParseStandardSecret for
	// its "whsec_…" text form) of a Standard Webhooks signature sent beside
	// Outbox-Signature: webhook-id, webhook-timestamp and webhook-signature
	// headers (see SignStandard), which the standardwebhooks libraries and
	// StandardVerifier check. 24 to 64 bytes. With it, Secret may be empty: the
	// requests are then signed the Standard Webhooks way only. Empty means none.
	StandardSecret []byte

	// AllowUnsigned permits an empty Secret and StandardSecret: requests then
	// carry no signature, and the receiver must authenticate them otherwise
	// (mutual TLS, an Authorization header in Header). False means signed.
	AllowUnsigned bool

	// Timeout bounds one request, from dialing to reading the status line and a
	// bounded part of the body. A request without an answer by then fails as
	// unavailable; the endpoint may still have received it (the retry carries the
	// same Idempotency-Key). Zero means DefaultTimeout (10s).
	Timeout time.Duration

	// MaxConcurrency is how many requests may be in flight at once, across all
	// concurrent Publish calls; a request beyond it waits for a slot. Zero
	// means DefaultMaxConcurrency (64).
	MaxConcurrency int

	// RetryAfterMax caps the pause a 429 or 503 answer can impose through its
	// Retry-After header. Negative: Retry-After is ignored. Zero means
	// DefaultRetryAfterMax (1 minute).
	RetryAfterMax time.Duration

	// HTTPClient sends the requests: set it for TLS settings (a private CA,
	// client certificates), a proxy or a custom dialer. The publisher uses a copy
	// whose CheckRedirect refuses every redirect; the client's own Timeout, if
	// any, still applies. Its transport should keep at least MaxConcurrency idle
	// connections per host (http.Transport.MaxIdleConnsPerHost; Go's default is
	// 2), or connections are opened and closed all the time. Close does not close
	// its connections. Nil means a client of the publisher's own, with proxies
	// from the environment (HTTPS_PROXY, NO_PROXY, …).
	HTTPClient *http.Client

	// Header holds headers added to every request, an Authorization header for
	// instance. They win over producer headers of the same name. Names the
	// adapter or HTTP owns (Content-Type, Idempotency-Key, Outbox-*, Host, …) are
	// refused. Empty means none.
	Header http.Header

	// Logger receives the publisher's own events (a Retry-After pause, a dropped
	// producer header); failed requests are reported through Publish's results.
	// Nil means slog.Default().
	Logger *slog.Logger

	// Encoding is the wire format of the messages. The zero value is the
	// default Outbox-* headers; FormatCloudEvents sends CloudEvents binary mode
	// per the HTTP protocol binding (ce-* headers, Content-Type).
	Encoding wire.Encoding
}

// The publisher's own transport (Config.HTTPClient nil) uses the values of
// net/http's DefaultTransport, with room for MaxConcurrency idle connections.
const (
	transportDialTimeout           = 30 * time.Second
	transportKeepAlive             = 30 * time.Second
	transportIdleConnTimeout       = 90 * time.Second
	transportTLSHandshakeTimeout   = 10 * time.Second
	transportExpectContinueTimeout = time.Second
	transportMinIdleConns          = 100
)

const (
	userAgent = "pgoutbox-webhook"

	excerptRead = 4 << 10  // response body bytes read for an error's excerpt
	excerptLen  = 256      // bytes of excerpt kept
	drainLimit  = 64 << 10 // response body bytes read so the connection can be reused
)

// reservedHeaders are the headers the adapter sets or HTTP itself manages; a
// producer header cannot replace them, and Config.Header cannot set them.
var reservedHeaders = map[string]bool{
	"Content-Type":      true,
	"Content-Length":    true,
	"Content-Encoding":  true,
	"Transfer-Encoding": true,
	"Trailer":           true,
	"Te":                true,
	"Host":              true,
	"Connection":        true,
	"Keep-Alive":        true,
	"Proxy-Connection":  true,
	"Upgrade":           true,
	"Expect":            true,
	"Idempotency-Key":   true,
	// Standard Webhooks: only the publisher may set them, whether or not it
	// signs that way, so that no producer can forge them.
	HeaderWebhookID:        true,
	HeaderWebhookTimestamp: true,
	HeaderWebhookSignature: true,
}

// withDefaults returns a copy of cfg with defaults applied and its parsed
// endpoint, or the errors of Validate.
func withDefaults(cfg *Config) (Config, *endpoint, error) {
	if cfg == nil {
		return Config{}, nil, errors.New("webhook: Config is required: Config.URL and Config.Secret have no defaults")
	}
	var ep *endpoint
	c, err := config.Resolve("webhook", cfg, fillDefaults, func(c *Config, p *config.Problems) {
		ep = checkConfig(c, p)
	})
	if err != nil {
		return Config{}, nil, err
	}
	return c, ep, nil
}

func fillDefaults(c *Config) {
	c.Secret = slices.Clone(c.Secret)
	c.StandardSecret = slices.Clone(c.StandardSecret)
	config.Default(&c.Timeout, DefaultTimeout)
	config.Default(&c.MaxConcurrency, DefaultMaxConcurrency)
	config.Default(&c.RetryAfterMax, DefaultRetryAfterMax)
	config.Default(&c.Logger, slog.Default())
	static := make(http.Header, len(c.Header))
	for name, values := range c.Header {
		canon := http.CanonicalHeaderKey(name)
		static[canon] = append(static[canon], values...)
	}
	c.Header = static
}

// checkConfig records c's problems in p and returns its parsed endpoint.
func checkConfig(c *Config, p *config.Problems) *endpoint {
	ep, err := parseEndpoint(c.URL)
	p.Field("Config.URL", err)
	p.Check(len(c.Secret) > 0 || len(c.StandardSecret) > 0 || c.AllowUnsigned,
		"Config.Secret is required (or Config.StandardSecret, or set Config.AllowUnsigned to send unsigned requests)")
	if len(c.StandardSecret) > 0 {
		if err := checkStandardKey(c.StandardSecret); err != nil {
			p.Check(false, "Config.StandardSecret %v", err)
		}
	}
	p.Check(len(c.Secret) == 0 || len(c.Secret) >= MinSecretLen,
		"Config.Secret is %d bytes, want at least %d", len(c.Secret), MinSecretLen)
	p.Check(c.Timeout > 0, "Config.Timeout (%s) must be positive", c.Timeout)
	p.Check(c.MaxConcurrency > 0, "Config.MaxConcurrency (%d) must be positive", c.MaxConcurrency)
	for _, name := range slices.Sorted(maps.Keys(c.Header)) {
		if !isToken(name) {
			p.Check(false, "Config.Header: %q is not a valid header name", name)
			continue
		}
		if reservedHeaders[name] || strings.HasPrefix(name, "Outbox-") ||
			(c.Encoding.Format == wire.FormatCloudEvents && strings.HasPrefix(name, "Ce-")) {
			p.Check(false, "Config.Header: %s is set by the publisher", name)
			continue
		}
		for _, v := range c.Header[name] {
			p.Field("Config.Header: "+name, checkHeaderValue(v))
		}
	}
	p.Field("Config.Encoding", c.Encoding.Validate())
	return ep
}

// Validate reports every invalid field of c, each error naming its field; zero
// fields stand for their defaults. A nil c lacks the required URL and Secret.
func (c *Config) Validate() error {
	_, _, err := withDefaults(c)
	return err
}

// Publisher POSTs outbox events to a webhook endpoint. It implements
// [broker.Publisher] and [broker.Pinger] and is safe for concurrent use.
type Publisher struct {
	cfg       Config
	ep        *endpoint
	client    *http.Client
	transport *http.Transport // the publisher's own, or nil with Config.HTTPClient
	slots     chan struct{}   // a token per request in flight
	now       func() time.Time

	holdUntil atomic.Int64 // Unix nanoseconds; no requests before (Retry-After)

	// refused is the last 401/403 answer's error while no request has been
	// acknowledged since, else nil: Ping reports it.
	refused atomic.Pointer[error]
	secrets []string // request secret material scrubbed from error excerpts

	ctx    context.Context // ends at Close, cancelling requests in flight
	cancel context.CancelFunc

	mu       sync.Mutex
	closed   bool
	inFlight sync.WaitGroup
}

var errClosed = errors.New("webhook: publisher closed")

// ErrTimeout is wrapped by the error of a request that got no answer within
// Config.Timeout. The endpoint may have received the event: the retry carries the
// same Idempotency-Key.
var ErrTimeout = errors.New("no answer within the timeout")

// New returns a publisher configured by cfg, which must give at least the URL
// (and the Secret, unless StandardSecret or AllowUnsigned). It does not contact the endpoint.
func New(config *Config) (*Publisher, error) {
	cfg, ep, err := withDefaults(config)
	if err != nil {
		return nil, err
	}
	p := &Publisher{
		cfg:   cfg,
		ep:    ep,
		slots: make(chan struct{}, cfg.MaxConcurrency),
		now:   time.Now,
	}
	if cfg.HTTPClient != nil {
		c := *cfg.HTTPClient
		p.client = &c
	} else {
		p.transport = &http.Transport{
			Proxy:                 http.ProxyFromEnvironment,
			DialContext:           (&net.Dialer{Timeout: transportDialTimeout, KeepAlive: transportKeepAlive}).DialContext,
			ForceAttemptHTTP2:     true,
			MaxIdleConns:          max(transportMinIdleConns, cfg.MaxConcurrency),
			MaxIdleConnsPerHost:   cfg.MaxConcurrency,
			IdleConnTimeout:       transportIdleConnTimeout,
			TLSHandshakeTimeout:   transportTLSHandshakeTimeout,
			ExpectContinueTimeout: transportExpectContinueTimeout,
		}
		p.client = &http.Client{Transport: p.transport}
	}
	p.client.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	p.ctx, p.cancel = context.WithCancel(context.Background())
	p.secrets = secretMaterial(cfg, ep)
	warnPlaintext(cfg, ep)
	return p, nil
}

// secretMaterial lists what a receiver echoing a request could repeat that must
// not be stored: the signing secret, the URL's credentials and tokens, the basic
// authentication they become, and Config.Header's values.
func secretMaterial(cfg Config, ep *endpoint) []string {
	var s []string
	if len(cfg.Secret) > 0 {
		s = append(s, string(cfg.Secret))
	}
	if len(cfg.StandardSecret) > 0 {
		text := FormatStandardSecret(cfg.StandardSecret)
		s = append(s, string(cfg.StandardSecret), text, strings.TrimPrefix(text, StandardSecretPrefix))
	}
	s = append(s, redact.Secrets(cfg.URL)...)
	if u := ep.base.User; u != nil {
		pass, _ := u.Password()
		basic := u.Username() + ":" + pass
		s = append(s, pass, basic, "Basic "+base64.StdEncoding.EncodeToString([]byte(basic)))
		if pass == "" {
			s = append(s, u.Username()) // https://token@host
		}
	}
	for _, values := range cfg.Header {
		for _, v := range values {
			s = append(s, v)
			if _, cred, ok := strings.Cut(v, " "); ok { // "Bearer <token>"
				s = append(s, cred)
			}
		}
	}
	return s
}

// credentialHeaders are Config.Header names that carry credentials.
var credentialHeaders = []string{"Authorization", "Proxy-Authorization", "Cookie", "X-Api-Key", "Api-Key", "X-Auth-Token"}

// warnPlaintext logs, once at start, that credentials or signed requests would
// travel over plain http://.
func warnPlaintext(cfg Config, ep *endpoint) {
	if ep.base.Scheme != "http" {
		return
	}
	var what []string
	if ep.base.User != nil {
		what = append(what, "the URL's user info (basic authentication)")
	}
	if len(redact.Secrets("http://h/?"+ep.base.RawQuery)) > 0 {
		what = append(what, "a token in the URL's query")
	}
	for _, h := range credentialHeaders {
		if _, ok := cfg.Header[h]; ok {
			what = append(what, "the "+h+" header")
		}
	}
	if len(cfg.Secret) > 0 || len(cfg.StandardSecret) > 0 {
		what = append(what, "signed requests (the signature proves nothing to a reader who can replay them)")
	}
	if len(what) == 0 {
		return
	}
	cfg.Logger.Warn("webhook: plain http:// endpoint: "+strings.Join(what, ", ")+" travel unencrypted; use https://",
		slog.String("endpoint", ep.origin))
}

// StatusError is the error of a request the endpoint answered with a status
// other than 2xx.
type StatusError struct {
	// StatusCode is the HTTP status, 404 say.
	StatusCode int
	// Body is an excerpt of the response body: valid UTF-8, control characters
	// and runs of white space turned into single spaces, cut after 256 bytes
	// with a "…".
	Body string
	// RetryAfter is the delay a 429 or 503 answer asked for with Retry-After, or
	// zero.
	RetryAfter time.Duration
	// Location is the scheme and host of a redirect's target (its path is left
	// out: it may hold a token), or "" for other answers.
	Location string
}

// Error returns the status, the redirect or Retry-After if any, and the excerpt.
func (e *StatusError) Error() string {
	var b strings.Builder
	b.WriteString(strconv.Itoa(e.StatusCode))
	if text := http.StatusText(e.StatusCode); text != "" {
		b.WriteString(" " + text)
	}
	if e.StatusCode >= 300 && e.StatusCode < 400 {
		b.WriteString(", a redirect")
		if e.Location != "" {
			b.WriteString(" to " + e.Location)
		}
		b.WriteString(" (not followed: set the final address as the endpoint URL)")
	}
	if e.RetryAfter > 0 {
		b.WriteString(", Retry-After " + e.RetryAfter.String())
	}
	if e.Body != "" {
		b.WriteString(": " + strconv.Quote(e.Body))
	}
	return b.String()
}

// classifyStatus marks err, the error of a non-2xx answer, as the package doc's
// table says.
func classifyStatus(code int, err error) error {
	switch {
	case code == http.StatusUnauthorized, code == http.StatusForbidden:
		return broker.Misconfigured(fmt.Errorf("%w (a configuration error: check the signing secret, the credentials and the clock)", err))
	case code >= 300 && code < 400,
		code == http.StatusRequestTimeout,
		code == http.StatusTooManyRequests,
		code == http.StatusBadGateway,
		code == http.StatusServiceUnavailable,
		code == http.StatusGatewayTimeout:
		return broker.Unavailable(err)
	case code == http.StatusConflict, code == http.StatusTooEarly:
		// 409: the draft Idempotency-Key standard's answer to a retry that arrives
		// while the first attempt is still being processed.
		return err
	case code >= 400 && code < 500:
		return broker.Permanent(err)
	}
	return err
}

// Publish POSTs msgs and returns one result per message; see [broker.Publisher]
// and the package doc for how answers are classified. ctx bounds the whole call,
// including waiting for a slot under Config.MaxConcurrency; each request is also
// bounded by Config.Timeout.
func (p *Publisher) Publish(ctx context.Context, msgs []broker.Message) []error {
	if p.ctx.Err() != nil {
		return broker.FailAll(msgs, broker.Unavailable(errClosed))
	}
	return broker.PublishLanes(ctx, msgs, p.send)
}

// send starts the POST of m and returns how to wait for its answer.
func (p *Publisher) send(ctx context.Context, m *broker.Message) (broker.AckFunc, error) {
	if p.ctx.Err() != nil {
		return nil, broker.Unavailable(errClosed)
	}
	target, err := p.ep.target(m)
	if err != nil {
		return nil, broker.Permanent(fmt.Errorf("webhook: event %s: %w", m.EventID, err))
	}
	header, err := p.header(m)
	if err != nil {
		return nil, broker.Permanent(fmt.Errorf("webhook: event %s: %w", m.EventID, err))
	}
	if err := p.held(); err != nil {
		return nil, err
	}
	select {
	case p.slots <- struct{}{}:
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-p.ctx.Done():
		return nil, broker.Unavailable(errClosed)
	}
	release := func() { <-p.slots }
	// A pause may have begun while this request waited for its slot.
	if err := p.held(); err != nil {
		release()
		return nil, err
	}
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		release()
		return nil, broker.Unavailable(errClosed)
	}
	p.inFlight.Add(1)
	p.mu.Unlock()

	done := make(chan error, 1)
	go func() {
		defer p.inFlight.Done()
		defer release()
		done <- p.post(ctx, m, target, header)
	}()
	return func(ctx context.Context) error {
		select {
		case err := <-done:
			return err
		case <-ctx.Done():
			return ctx.Err()
		}
	}, nil
}

// header returns the request headers of m, without the signature.
func (p *Publisher) header(m *broker.Message) (http.Header, error) {
	enc, err := p.cfg.Encoding.Encode(m, wire.CloudEventsHTTP)
	if err != nil {
		return nil, err
	}
	headers := make(map[string]string, enc.HeaderCount)
	for k, v := range enc.Headers {
		headers[k] = v
	}
	h := make(http.Header, len(headers)+len(p.cfg.Header)+4)
	for name, values := range p.cfg.Header {
		h[name] = slices.Clone(values)
	}
	sent := make(map[string]string, len(headers)) // canonical name → name as given
	for name, v := range headers {
		if !isToken(name) {
			return nil, fmt.Errorf("header name %q is not an HTTP token", name)
		}
		canon := http.CanonicalHeaderKey(name)
		if reservedHeaders[canon] {
			p.cfg.Logger.Debug("webhook: dropped a producer header the publisher sets",
				slog.String("event_id", m.EventID.String()), slog.String("header", canon))
			continue
		}
		if _, ok := p.cfg.Header[canon]; ok {
			continue // Config.Header wins
		}
		if other, ok := sent[canon]; ok {
			return nil, fmt.Errorf("headers %q and %q are the same HTTP header", other, name)
		}
		if err := checkHeaderValue(v); err != nil {
			return nil, fmt.Errorf("header %s: %w", name, err)
		}
		sent[canon] = name
		h[canon] = []string{v}
	}
	h.Set("Content-Type", enc.ContentType)
	h.Set(HeaderIdempotencyKey, m.EventID.String())
	if h.Get("User-Agent") == "" {
		h.Set("User-Agent", userAgent)
	}
	return h, nil
}

// post sends one request and classifies the outcome.
func (p *Publisher) post(ctx context.Context, m *broker.Message, target string, header http.Header) error {
	rctx, cancel := context.WithTimeout(ctx, p.cfg.Timeout)
	defer cancel()
	stop := context.AfterFunc(p.ctx, cancel) // Close cancels it too
	defer stop()

	what := func() string { return fmt.Sprintf("webhook: POST event %s to %s", m.EventID, p.ep.origin) }
	req, err := http.NewRequestWithContext(rctx, http.MethodPost, target, bytes.NewReader(m.Payload))
	if err != nil {
		return broker.Permanent(fmt.Errorf("%s: %s", what(), parseErrorText(err)))
	}
	req.Header = header
	// Signed as late as possible, so the timestamp is the time of sending.
	now := p.now()
	if len(p.cfg.Secret) > 0 {
		header.Set(HeaderSignature, Sign(p.cfg.Secret, now, req, m.Payload))
	}
	if len(p.cfg.StandardSecret) > 0 {
		setStandardHeaders(header, p.cfg.StandardSecret, m.EventID.String(), now, m.Payload)
	}
	// net/http itself may send the request again on a fresh connection when a
	// kept-alive one turns out dead: it counts a request with an Idempotency-Key
	// as safe to replay, and the receiver deduplicates it like any retry.
	resp, err := p.client.Do(req)
	if err != nil {
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err // ue.URL may hold a token
		}
		switch {
		case p.ctx.Err() != nil:
			return broker.Unavailable(fmt.Errorf("%s: %w", what(), errClosed))
		case ctx.Err() != nil:
			return fmt.Errorf("%s: %w", what(), ctx.Err())
		case rctx.Err() != nil:
			return broker.Unavailable(fmt.Errorf("%s: %w (%s); the retry carries the same %s", what(), ErrTimeout, p.cfg.Timeout, HeaderIdempotencyKey))
		}
		return broker.Unavailable(fmt.Errorf("%s: %w", what(), err))
	}
	defer resp.Body.Close()
	if resp.StatusCode >= 200 && resp.StatusCode < 300 {
		// The status is the ack; the body is read only to reuse the connection.
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, drainLimit))
		p.refused.Store(nil)
		return nil
	}
	// The request's own secrets, the signature included, are scrubbed from the
	// excerpt: a receiver may echo the request.
	_, stdSig, _ := strings.Cut(header.Get(HeaderWebhookSignature), ",")
	se := &StatusError{StatusCode: resp.StatusCode, Body: excerpt(resp.Body, slices.Concat(p.secrets, []string{header.Get(HeaderSignature), stdSig})...)}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, drainLimit))
	if resp.StatusCode >= 300 && resp.StatusCode < 400 {
		if loc, err := resp.Location(); err == nil && loc.Host != "" {
			se.Location = loc.Scheme + "://" + loc.Host
		}
	}
	if resp.StatusCode == http.StatusTooManyRequests || resp.StatusCode == http.StatusServiceUnavailable {
		se.RetryAfter = retryAfter(resp.Header.Get("Retry-After"), p.now())
		p.hold(se.RetryAfter)
	}
	err = classifyStatus(resp.StatusCode, fmt.Errorf("%s: %w", what(), se))
	if broker.IsMisconfigured(err) {
		p.refused.Store(&err)
	}
	return err
}

// excerpt reads the start of a response body and makes it fit for an error
// message: scrubbed of secrets (those given and anything credential-shaped, see
// internal/redact), valid UTF-8, no control characters or line breaks, bounded.
func excerpt(r io.Reader, secrets ...string) string {
	raw, _ := io.ReadAll(io.LimitReader(r, excerptRead))
	text := strings.ToValidUTF8(string(raw), "\uFFFD")
	// Scrubbed before the cut, so that no secret is cut in two and half kept; only
	// a window of the body, growing until what is left after scrubbing amply fills
	// the excerpt (scrubbing costs up to a millisecond per KiB of echoed headers).
	var s string
	for window := 4 * excerptLen; ; window *= 2 {
		part := text
		if len(part) > window {
			part = strings.ToValidUTF8(part[:window], "")
		}
		s = flatten(redact.Text(part, secrets...))
		if len(part) == len(text) || len(s) > 2*excerptLen {
			break
		}
	}
	cut := len(raw) == excerptRead // the read limit may have split a secret
	if len(s) > excerptLen {
		s = s[:excerptLen]
		for !utf8.ValidString(s) {
			s = s[:len(s)-1]
		}
		cut = true
	}
	if cut {
		s = cutSecretPrefix(s, secrets) + "…"
	}
	return s
}

// flatten turns control characters and runs of white space into single spaces.
func flatten(text string) string {
	var b strings.Builder
	space := false
	for _, c := range text {
		if unicode.IsSpace(c) || !unicode.IsPrint(c) {
			space = b.Len() > 0
			continue
		}
		if space {
			b.WriteByte(' ')
			space = false
		}
		b.WriteRune(c)
	}
	return b.String()
}

// cutSecretPrefix drops an end of s that begins one of secrets: what is left of
// a secret that the cut (or the read limit) split.
func cutSecretPrefix(s string, secrets []string) string {
	for _, sec := range secrets {
		for k := min(len(sec)-1, len(s)); k >= 3; k-- {
			if strings.HasSuffix(s, sec[:k]) {
				s = s[:len(s)-k]
				break
			}
		}
	}
	return s
}

// retryAfter parses a Retry-After value, delay-seconds or an HTTP date; 0 when
// absent, malformed or past.
func retryAfter(v string, now time.Time) time.Duration {
	if v == "" {
		return 0
	}
	if secs, err := strconv.ParseInt(v, 10, 64); err == nil {
		if secs <= 0 {
			return 0
		}
		return time.Duration(min(secs, int64(24*time.Hour/time.Second))) * time.Second
	}
	if t, err := http.ParseTime(v); err == nil && t.After(now) {
		return t.Sub(now).Truncate(time.Second)
	}
	return 0
}

// hold pauses requests for d, capped at Config.RetryAfterMax.
func (p *Publisher) hold(d time.Duration) {
	if d <= 0 || p.cfg.RetryAfterMax < 0 {
		return
	}
	d = min(d, p.cfg.RetryAfterMax)
	now := p.now()
	until := now.Add(d).UnixNano()
	for {
		cur := p.holdUntil.Load()
		if cur >= until {
			return
		}
		if p.holdUntil.CompareAndSwap(cur, until) {
			if cur <= now.UnixNano() { // a new pause, not one extended by the next 503
				p.cfg.Logger.Warn("webhook: endpoint asked for a pause (Retry-After); not sending until it ends",
					slog.String("endpoint", p.ep.origin), slog.Duration("pause", d))
			}
			return
		}
	}
}

// held returns an unavailable error while a Retry-After pause lasts.
func (p *Publisher) held() error {
	until := p.holdUntil.Load()
	if until == 0 || p.now().UnixNano() >= until {
		return nil
	}
	return broker.Unavailable(fmt.Errorf("webhook: %s asked to retry after %s (Retry-After); not sent",
		p.ep.origin, time.Unix(0, until).UTC().Format(time.RFC3339)))
}

// Ping reports whether the endpoint answers. While the last POST was refused
// with 401 or 403 and none has been acknowledged since, it returns that error
// (broker.Misconfigured) without a request: the configuration is wrong. Otherwise
// it sends a HEAD request (with Config.Header, without an event or signature) to
// Config.URL, cut before the first placeholder. Any answer shows the endpoint reachable — 405 Method Not
// Allowed included — except 502, 503 and 504; those, a connection error and a
// timeout are returned marked [broker.Unavailable]. ctx and Config.Timeout bound
// the request. A webhook has no cheaper health check: call Ping sparingly.
func (p *Publisher) Ping(ctx context.Context) error {
	if p.ctx.Err() != nil {
		return broker.Unavailable(errClosed)
	}
	if refused := p.refused.Load(); refused != nil {
		return *refused
	}
	rctx, cancel := context.WithTimeout(ctx, p.cfg.Timeout)
	defer cancel()
	stop := context.AfterFunc(p.ctx, cancel)
	defer stop()
	what := "webhook: HEAD " + p.ep.origin
	req, err := http.NewRequestWithContext(rctx, http.MethodHead, p.ep.ping, nil)
	if err != nil {
		return fmt.Errorf("%s: %s", what, parseErrorText(err))
	}
	for name, values := range p.cfg.Header {
		req.Header[name] = slices.Clone(values)
	}
	if req.Header.Get("User-Agent") == "" {
		req.Header.Set("User-Agent", userAgent)
	}
	resp, err := p.client.Do(req)
	if err != nil {
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err
		}
		return broker.Unavailable(fmt.Errorf("%s: %w", what, err))
	}
	_ = resp.Body.Close()
	switch resp.StatusCode {
	case http.StatusBadGateway, http.StatusServiceUnavailable, http.StatusGatewayTimeout:
		return broker.Unavailable(fmt.Errorf("%s: %w", what, &StatusError{StatusCode: resp.StatusCode}))
	}
	return nil
}

// Close cancels the requests in flight, which fail as unavailable, waits for them
// to end and closes the idle connections of the publisher's own client. It is
// safe to call more than once.
func (p *Publisher) Close() error {
	p.mu.Lock()
	already := p.closed
	p.closed = true
	p.mu.Unlock()
	if already {
		return nil
	}
	p.cancel()
	p.inFlight.Wait()
	if p.transport != nil {
		p.transport.CloseIdleConnections()
	}
	return nil
}

// isToken reports whether s is an HTTP token (RFC 9110 §5.6.2), a valid header
// name.
func isToken(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		case strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0:
		default:
			return false
		}
	}
	return true
}

// checkHeaderValue refuses a value that HTTP cannot carry, or that a receiver
// would not see unchanged: control characters, line breaks, leading or trailing
// white space (which servers trim).
func checkHeaderValue(v string) error {
	for i := 0; i < len(v); i++ {
		if c := v[i]; (c < ' ' && c != '\t') || c == 0x7f {
			return fmt.Errorf("value %q holds a control character", v)
		}
	}
	if strings.Trim(v, " \t") != v {
		return fmt.Errorf("value %q has leading or trailing white space", v)
	}
	return nil
}

var (
	_ broker.Publisher = (*Publisher)(nil)
	_ broker.Pinger    = (*Publisher)(nil)
)
