package pgoutbox

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"
)

// Event is one fact to publish, written to the outbox in the caller's transaction.
type Event struct {
	// AggregateType names the kind of entity the event is about, e.g. "order".
	// Required, at most MaxAggregateTypeBytes. It selects the default subject or
	// topic, so keep it short and stable.
	AggregateType string

	// AggregateID identifies the entity within its type, e.g. an order number.
	// Required, at most MaxAggregateIDBytes, without control characters or line
	// separators and without white space at either end (as AggregateType and
	// EventType; see CheckEventFields). Events of one (AggregateType,
	// AggregateID) are published in the order they were enqueued.
	AggregateID string

	// EventType names what happened, e.g. "order.created". Required, at most
	// MaxEventTypeBytes.
	EventType string

	// Payload is the event body. json.RawMessage and []byte are taken as raw JSON and
	// must be valid; any other value, including a string, is encoded with
	// encoding/json. A nil Payload is stored as JSON null.
	Payload any

	// SchemaVersion is the version of the payload's shape, for consumers that evolve
	// it. Defaults to 1; must not be negative.
	SchemaVersion int

	// Headers are extra key/value pairs published with the event: data for the
	// consumer, never broker control. Names must be RFC 9110 tokens of at most
	// MaxHeaderNameBytes, unique without case and not reserved (see
	// ReservedHeader: Outbox-*, Nats-*, Content-*, x-*, Authorization, Host, …);
	// values must have no control characters and no leading or trailing space; at
	// most MaxHeaders headers and MaxHeaderBytes of names and values. The trace
	// context of the enqueue call's ctx is added as "traceparent" (and
	// "tracestate") unless Headers already has them, in any case.
	Headers map[string]string

	// ID is the event's id. Defaults to a new UUIDv7. Set it to derive ids from your
	// own request ids; it must be unique.
	ID UUID

	// OccurredAt is when the fact happened. Defaults to the transaction's start time
	// (PostgreSQL's now()).
	OccurredAt time.Time
}

// ErrInvalidEvent is matched (errors.Is) by every *ValidationError.
var ErrInvalidEvent = errors.New("pgoutbox: invalid event")

// ErrPayloadTooLarge is matched (errors.Is) by a *ValidationError about a payload above
// the configured limit.
var ErrPayloadTooLarge = errors.New("pgoutbox: payload too large")

// ValidationError reports an event that was rejected before any SQL ran, so the
// caller's transaction is still usable.
type ValidationError struct {
	// Index is the event's position in the Enqueue call.
	Index int
	// Field is the Event field at fault, e.g. "AggregateID".
	Field string
	// Reason says what is wrong.
	Reason string

	tooLarge bool
}

func (e *ValidationError) Error() string {
	return fmt.Sprintf("pgoutbox: invalid event #%d: %s %s", e.Index, e.Field, e.Reason)
}

// Is matches ErrInvalidEvent, and ErrPayloadTooLarge for an oversized payload.
func (e *ValidationError) Is(target error) bool {
	return target == ErrInvalidEvent || (target == ErrPayloadTooLarge && e.tooLarge)
}

// row is an event checked and encoded for the INSERT.
type row struct {
	id            UUID
	aggregateType string
	aggregateID   string
	eventType     string
	schemaVersion int
	payload       string
	headers       string
	occurredAt    *time.Time
}

// encode validates ev and returns it ready to insert. extra holds headers to add
// unless ev.Headers has the key (the trace context).
func encode(i int, ev *Event, maxPayload int, extra map[string]string) (row, error) {
	fail := func(field, format string, args ...any) (row, error) {
		return row{}, &ValidationError{Index: i, Field: field, Reason: fmt.Sprintf(format, args...)}
	}
	for _, f := range []struct {
		name, v string
		limit   int
	}{
		{"AggregateType", ev.AggregateType, MaxAggregateTypeBytes},
		{"AggregateID", ev.AggregateID, MaxAggregateIDBytes},
		{"EventType", ev.EventType, MaxEventTypeBytes},
	} {
		if reason := checkName(f.v, f.limit); reason != "" {
			return fail(f.name, "%s", reason)
		}
	}
	if ev.SchemaVersion < 0 {
		return fail("SchemaVersion", "must be at least 1, got %d", ev.SchemaVersion)
	}

	payload, err := encodePayload(ev.Payload)
	if err != nil {
		return fail("Payload", "%v", err)
	}
	// Measured on the text jsonb keeps, which is what the relay publishes: a payload
	// with numbers like 1e100000 or with duplicate keys can be far longer or
	// shorter than the JSON given.
	size, err := jsonbTextLength(payload) // encodePayload checked it is valid JSON
	if err != nil {
		return fail("Payload", "%v", err)
	}
	if size > maxPayload {
		return row{}, &ValidationError{Index: i, Field: "Payload", tooLarge: true,
			Reason: fmt.Sprintf("is %d bytes as stored (jsonb text), above the limit of %d bytes (Config.MaxPayloadBytes)", size, maxPayload)}
	}

	hdr := []byte("{}") // no headers and no trace context: the common case
	if len(ev.Headers)+len(extra) > 0 {
		headers := make(map[string]string, len(ev.Headers)+len(extra))
		for k, v := range ev.Headers {
			headers[k] = v
		}
		for k, v := range extra {
			if !hasHeaderFold(ev.Headers, k) {
				headers[k] = v
			}
		}
		if err := CheckHeaders(headers); err != nil {
			return fail("Headers", "%s", strings.TrimPrefix(err.Error(), ErrInvalidHeader.Error()+": "))
		}
		if hdr, err = json.Marshal(headers); err != nil {
			return fail("Headers", "cannot be encoded: %v", err)
		}
	}

	r := row{
		id:            ev.ID,
		aggregateType: ev.AggregateType,
		aggregateID:   ev.AggregateID,
		eventType:     ev.EventType,
		schemaVersion: max(ev.SchemaVersion, 1),
		payload:       string(payload),
		headers:       string(hdr),
	}
	if r.id.IsZero() {
		r.id = NewEventID()
	}
	if !ev.OccurredAt.IsZero() {
		t := ev.OccurredAt
		r.occurredAt = &t
	}
	return r, nil
}

// hasHeaderFold reports whether h has a header called name, compared without case.
func hasHeaderFold(h map[string]string, name string) bool {
	if _, ok := h[name]; ok {
		return true
	}
	for k := range h {
		if strings.EqualFold(k, name) {
			return true
		}
	}
	return false
}

// checkText returns why PostgreSQL's text type would reject s, or "".
func checkText(s string) string {
	if !utf8.ValidString(s) {
		return "must be valid UTF-8"
	}
	if strings.IndexByte(s, 0) >= 0 {
		return "must not contain NUL bytes"
	}
	return ""
}

func encodePayload(p any) ([]byte, error) {
	var b []byte
	raw := true // b is the caller's bytes, not json.Marshal's output
	switch v := p.(type) {
	case nil:
		return []byte("null"), nil
	case json.RawMessage:
		b = v
	case []byte:
		b = v
	default:
		var err error
		if b, err = json.Marshal(v); err != nil {
			return nil, fmt.Errorf("cannot be encoded as JSON: %w", err)
		}
		// json.Marshal's output is valid JSON (it checks what MarshalJSON methods
		// return): validating it again took a third of the encode path's time.
		raw = false
	}
	if raw && !json.Valid(b) {
		return nil, errors.New("is not valid JSON")
	}
	if !utf8.Valid(b) {
		// encoding/json accepts invalid UTF-8 inside strings; jsonb does not.
		return nil, errors.New("must be valid UTF-8")
	}
	if reason := jsonbProblem(b); reason != "" {
		return nil, errors.New(reason)
	}
	return b, nil
}

// jsonbProblem returns why PostgreSQL's jsonb would refuse the valid JSON text b, or
// "". encoding/json accepts three things jsonb does not: the escape \u0000, unpaired
// UTF-16 surrogate escapes, and numbers beyond the numeric type's range (at most
// 131072 digits before the decimal point and 16383 after).
func jsonbProblem(b []byte) string {
	for i := 0; i < len(b); i++ {
		switch c := b[i]; {
		case c == '"':
			for i++; b[i] != '"'; i++ {
				if b[i] != '\\' {
					continue
				}
				i++
				if b[i] != 'u' {
					continue
				}
				r := hex4(b[i+1:])
				i += 4
				switch {
				case r == 0:
					return `must not contain \u0000 (PostgreSQL's jsonb cannot store it)`
				case r >= 0xd800 && r < 0xdc00: // high surrogate: a low one must follow
					if i+6 < len(b) && b[i+1] == '\\' && b[i+2] == 'u' {
						if lo := hex4(b[i+3:]); lo >= 0xdc00 && lo < 0xe000 {
							i += 6
							continue
						}
					}
					return "must not contain an unpaired UTF-16 surrogate escape"
				case r >= 0xdc00 && r < 0xe000:
					return "must not contain an unpaired UTF-16 surrogate escape"
				}
			}
		case c == '-' || (c >= '0' && c <= '9'):
			j := i
			for j < len(b) && strings.IndexByte("+-0123456789.eE", b[j]) >= 0 {
				j++
			}
			if !numericFits(b[i:j]) {
				return fmt.Sprintf("has the number %.40s, beyond the range of PostgreSQL's numeric type", b[i:j])
			}
			i = j - 1
		}
	}
	return ""
}

func hex4(b []byte) rune {
	var r rune
	for _, c := range b[:4] {
		switch {
		case c >= '0' && c <= '9':
			c -= '0'
		case c >= 'a' && c <= 'f':
			c -= 'a' - 10
		default:
			c -= 'A' - 10
		}
		r = r<<4 | rune(c)
	}
	return r
}

// numericFits reports whether the JSON number n (valid syntax) is within numeric's
// limits: the most significant digit at most 131072 places left of the point, and at
// most 16383 digits right of it once the exponent is applied (zero included).
func numericFits(n []byte) bool {
	mant, expPart, _ := bytes.Cut(bytes.TrimPrefix(n, []byte("-")), []byte("e"))
	if bytes.IndexByte(mant, 'E') >= 0 {
		mant, expPart, _ = bytes.Cut(mant, []byte("E"))
	}
	exp := 0
	if len(expPart) > 0 {
		e, err := strconv.Atoi(string(expPart))
		if err != nil || e > 1<<30 || e < -(1<<30) {
			return false
		}
		exp = e
	}
	intPart, frac, _ := bytes.Cut(mant, []byte("."))
	if len(frac)-exp > 16383 {
		return false
	}
	if i := bytes.IndexFunc(intPart, func(r rune) bool { return r != '0' }); i >= 0 {
		return len(intPart)-i+exp <= 131072
	}
	if i := bytes.IndexFunc(frac, func(r rune) bool { return r != '0' }); i >= 0 {
		return exp-i <= 131072
	}
	return true // zero
}
