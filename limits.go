package pgoutbox

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"unicode"
	"unicode/utf8"
)

// Limits on what an event may hold, so that every event the outbox accepts can be
// published by every shipped broker. The Go API checks them before any SQL runs;
// the SQL function outbox_enqueue (outbox migration 6) checks the same ones, and
// the relay refuses (quarantines) a row written around both, by a raw INSERT.
const (
	// MaxAggregateTypeBytes bounds AggregateType. It is part of the default NATS
	// subject, Kafka topic (at most 249 characters) and AMQP routing key (at most
	// 255 bytes, "<aggregate_type>.<event_type>").
	MaxAggregateTypeBytes = 100
	// MaxAggregateIDBytes bounds AggregateID, well under the ~2,700 bytes a btree
	// entry of the (aggregate_type, aggregate_id, aggregate_sequence) index may take.
	MaxAggregateIDBytes = 255
	// MaxEventTypeBytes bounds EventType (see MaxAggregateTypeBytes).
	MaxEventTypeBytes = 100

	// MaxHeaders bounds how many headers an event carries, the trace context
	// included.
	MaxHeaders = 64
	// MaxHeaderNameBytes bounds one header name (AMQP field names are at most 128
	// bytes).
	MaxHeaderNameBytes = 128
	// MaxHeaderBytes bounds the sum of the lengths of every header name and value
	// of an event.
	MaxHeaderBytes = 16 << 10

	// DefaultMaxPayloadBytes is the payload size limit when Config.MaxPayloadBytes
	// is 0, and of outbox_enqueue when pgoutbox.max_payload_bytes is unset: 1 MiB
	// less 32 KiB, so that a payload of that size, the largest headers and the
	// Outbox-* headers fit the 1 MiB message limit NATS and Kafka have by default.
	DefaultMaxPayloadBytes = 1<<20 - 32<<10
	// HardMaxPayloadBytes is the largest payload limit that can be configured
	// (Config.MaxPayloadBytes, pgoutbox.max_payload_bytes): 64 MiB, the most a
	// NATS server accepts. The relay quarantines a larger payload of a raw INSERT.
	HardMaxPayloadBytes = 64 << 20
)

// Payloads are measured on the form that is published: the text PostgreSQL's jsonb
// stores and the relay sends (keys deduplicated, spacing normalised, numbers
// written out), not the JSON the producer passed. See [JSONBTextLength].

// reservedPrefixes and reservedNames are the header names a broker, HTTP or the
// outbox itself acts on, in lower case. A producer header with such a name could
// steer the broker (Nats-Rollup purges a stream's other messages, Nats-Expected-*
// makes publishes fail, x-delay or CC reroute an AMQP message) or the transport
// (Authorization replaces a webhook's credentials, Content-Length breaks framing),
// so such names are refused everywhere: see [ReservedHeader].
var reservedPrefixes = []struct{ prefix, reason string }{
	{"outbox-", "Outbox-* headers are the outbox's own wire headers"},
	{"nats-", "NATS JetStream acts on Nats-* headers (Nats-Msg-Id, Nats-Rollup, Nats-Expected-*, Nats-TTL, …)"},
	{"content-", "HTTP and the webhook publisher own Content-* headers"},
	{"x-", "RabbitMQ acts on x-* headers (x-delay, x-match, x-death, x-dead-letter-*, x-message-ttl, x-deduplication-header, …); the whole x- prefix is reserved"},
}

var reservedNames = map[string]string{
	"authorization":       "an HTTP credentials header",
	"proxy-authorization": "an HTTP credentials header",
	"proxy-authenticate":  "an HTTP authentication header",
	"www-authenticate":    "an HTTP authentication header",
	"cookie":              "an HTTP credentials header",
	"set-cookie":          "an HTTP credentials header",
	"host":                "an HTTP transport header",
	"transfer-encoding":   "an HTTP transport header",
	"te":                  "an HTTP hop-by-hop header",
	"trailer":             "an HTTP hop-by-hop header",
	"connection":          "an HTTP hop-by-hop header",
	"keep-alive":          "an HTTP hop-by-hop header",
	"proxy-connection":    "an HTTP hop-by-hop header",
	"upgrade":             "an HTTP hop-by-hop header",
	"expect":              "an HTTP transport header",
	"idempotency-key":     "the webhook publisher sets it to the event id",
	"cc":                  "RabbitMQ routes a message to the extra routing keys of a CC header",
	"bcc":                 "RabbitMQ routes a message to the extra routing keys of a BCC header",
}

// ReservedHeaderNames lists the reserved header names, in lower case; a name
// ending in "*" is a prefix. Names are compared without case. traceparent,
// tracestate and baggage are not reserved: they are the producer's trace context.
func ReservedHeaderNames() []string {
	out := make([]string, 0, len(reservedPrefixes)+len(reservedNames))
	for _, p := range reservedPrefixes {
		out = append(out, p.prefix+"*")
	}
	for n := range reservedNames {
		out = append(out, n)
	}
	slices.Sort(out)
	return out
}

// ReservedHeader reports whether a producer header called name would be broker or
// transport control rather than data, and why. Names are compared without case.
// The reserved names are:
//
//	Outbox-*                      the outbox's wire headers (Outbox-Signature included)
//	Nats-*                        NATS JetStream's control headers
//	Content-*                     HTTP body framing (Content-Length, Content-Type, …)
//	x-*                           RabbitMQ's control headers (x-delay, x-match, x-death, …)
//	CC, BCC                       RabbitMQ sender-selected distribution
//	Authorization, Proxy-Authorization, Proxy-Authenticate, WWW-Authenticate,
//	Cookie, Set-Cookie            HTTP credentials
//	Host, Transfer-Encoding, TE, Trailer, Connection, Keep-Alive, Proxy-Connection,
//	Upgrade, Expect               HTTP transport and hop-by-hop headers
//	Idempotency-Key               set by the webhook publisher
//
// Kafka acts on no record header.
func ReservedHeader(name string) (reason string, ok bool) {
	lower := strings.ToLower(name)
	for _, p := range reservedPrefixes {
		if strings.HasPrefix(lower, p.prefix) {
			return p.reason, true
		}
	}
	if r, ok := reservedNames[lower]; ok {
		return r, true
	}
	return "", false
}

// ErrInvalidHeader is matched (errors.Is) by the errors of [CheckHeaders].
var ErrInvalidHeader = errors.New("pgoutbox: invalid header")

// CheckHeaders returns why headers cannot be published, or nil: more than
// MaxHeaders, more than MaxHeaderBytes of names and values, a reserved name (see
// [ReservedHeader]), a name that is not an RFC 9110 token of at most
// MaxHeaderNameBytes, two names that differ only in case, or a value with a control
// character, leading or trailing spaces or invalid UTF-8. Names are checked in
// sorted order, so the answer does not depend on map order. The Go API, the relay
// and (in SQL) outbox_enqueue apply the same rules.
func CheckHeaders(headers map[string]string) error {
	if len(headers) == 0 {
		return nil
	}
	if len(headers) > MaxHeaders {
		return fmt.Errorf("%w: %d headers, above the limit of %d", ErrInvalidHeader, len(headers), MaxHeaders)
	}
	names := make([]string, 0, len(headers))
	total := 0
	for k, v := range headers {
		names = append(names, k)
		total += len(k) + len(v)
	}
	slices.Sort(names)
	for _, k := range names {
		if err := checkHeaderName(k); err != nil {
			return err
		}
	}
	seen := make(map[string]string, len(names))
	for _, k := range names {
		lower := strings.ToLower(k)
		if other, dup := seen[lower]; dup {
			return fmt.Errorf("%w: names %q and %q differ only in case (HTTP and AMQP peers may fold them)", ErrInvalidHeader, other, k)
		}
		seen[lower] = k
	}
	for _, k := range names {
		if reason, ok := ReservedHeader(k); ok {
			return fmt.Errorf("%w: name %q is reserved: %s", ErrInvalidHeader, k, reason)
		}
	}
	for _, k := range names {
		if err := checkHeaderValue(headers[k]); err != "" {
			return fmt.Errorf("%w: value of %q %s", ErrInvalidHeader, k, err)
		}
	}
	if total > MaxHeaderBytes {
		return fmt.Errorf("%w: names and values are %d bytes, above the limit of %d", ErrInvalidHeader, total, MaxHeaderBytes)
	}
	return nil
}

// CheckHeader returns why one header cannot be published, or nil: the rules of
// [CheckHeaders] that concern a single name and value (a reserved name, a name
// that is not a token of at most MaxHeaderNameBytes, a bad value).
func CheckHeader(name, value string) error {
	if err := checkHeaderName(name); err != nil {
		return err
	}
	if reason, ok := ReservedHeader(name); ok {
		return fmt.Errorf("%w: name %q is reserved: %s", ErrInvalidHeader, name, reason)
	}
	if err := checkHeaderValue(value); err != "" {
		return fmt.Errorf("%w: value of %q %s", ErrInvalidHeader, name, err)
	}
	return nil
}

func checkHeaderName(k string) error {
	switch {
	case k == "":
		return fmt.Errorf("%w: a name must not be empty", ErrInvalidHeader)
	case len(k) > MaxHeaderNameBytes:
		return fmt.Errorf("%w: name %.40q… is %d bytes, above the limit of %d", ErrInvalidHeader, k, len(k), MaxHeaderNameBytes)
	}
	for i := 0; i < len(k); i++ {
		if !isTchar(k[i]) {
			return fmt.Errorf("%w: name %.40q has %q, not allowed in a header name (letters, digits and !#$%%&'*+-.^_`|~ only)", ErrInvalidHeader, k, k[i:i+1])
		}
	}
	return nil
}

// isTchar reports whether c may appear in an RFC 9110 token.
func isTchar(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' ||
		strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0
}

// checkHeaderValue returns why v cannot travel unchanged in a NATS, HTTP or AMQP
// header, or "". NATS and HTTP end a header at CR or LF and trim spaces around a
// value.
func checkHeaderValue(v string) string {
	if !utf8.ValidString(v) {
		return "must be valid UTF-8"
	}
	for i := 0; i < len(v); i++ {
		if c := v[i]; c < 0x20 || c == 0x7f {
			return fmt.Sprintf("has the control character %q", c)
		}
	}
	if strings.HasPrefix(v, " ") || strings.HasSuffix(v, " ") {
		return "must not begin or end with a space"
	}
	return ""
}

// checkName returns why s cannot be an aggregate type, aggregate id or event type
// of at most limit bytes, or "". It is the one rule for those names: the Go API
// applies it before any SQL, the relay and the CDC source (through
// [CheckEventFields]) before publishing a row written by a raw INSERT, and
// outbox_enqueue mirrors it in SQL (outbox migration 9; limits_test.go holds both
// to one table of cases and a fuzz target).
//
// Besides its length, a name must be text that travels unchanged in every
// broker's subject, topic, routing key and header: no control character (Unicode
// Cc: C0, DEL and C1, which holds NEL), no line or paragraph separator (U+2028,
// U+2029) anywhere, and no white space (Unicode White_Space) at either end. NATS
// and HTTP end a header at CR or LF and trim spaces around its value, so such an
// id would reach a consumer changed (or not at all, as every broker refuses some
// of them) and the relay would quarantine it.
func checkName(s string, limit int) string {
	switch {
	case s == "":
		return "must not be empty"
	case len(s) > limit:
		return fmt.Sprintf("is %d bytes, above the limit of %d", len(s), limit)
	}
	if reason := checkText(s); reason != "" {
		return reason
	}
	for _, r := range s {
		switch {
		case unicode.Is(unicode.Cc, r):
			return fmt.Sprintf("has the control character %U", r)
		case r == '\u2028' || r == '\u2029':
			return fmt.Sprintf("has the line separator %U", r)
		}
	}
	first, _ := utf8.DecodeRuneInString(s)
	last, _ := utf8.DecodeLastRuneInString(s)
	if unicode.IsSpace(first) || unicode.IsSpace(last) {
		return "must not begin or end with white space"
	}
	return ""
}

// CheckEventFields returns why an event with these names cannot be published, or
// nil: each must be non-empty text of at most its Max…Bytes limit, without
// control characters or line separators, and without white space at either end.
// It is the rule the Go API applies at enqueue (the errors of Producer.Validate
// say the same), and the relay applies it to rows written by a raw INSERT.
func CheckEventFields(aggregateType, aggregateID, eventType string) error {
	for _, f := range []struct {
		name, v string
		limit   int
	}{
		{"aggregate type", aggregateType, MaxAggregateTypeBytes},
		{"aggregate id", aggregateID, MaxAggregateIDBytes},
		{"event type", eventType, MaxEventTypeBytes},
	} {
		if reason := checkName(f.v, f.limit); reason != "" {
			return fmt.Errorf("pgoutbox: %s %s", f.name, reason)
		}
	}
	return nil
}
