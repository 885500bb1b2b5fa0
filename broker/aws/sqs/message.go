package sqs

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"
	"unicode/utf8"

	"github.com/pgoutbox/pgoutbox/broker"
	"github.com/pgoutbox/pgoutbox/wire"
)

// Limits of SQS and SNS that every message is checked against before it is
// sent, so that a refusal is known and permanent rather than a broker error.
const (
	// MaxMessageBytes is the largest message, body and attributes (names,
	// types and values) together: 256 KiB. A batch call holds at most this
	// much too.
	MaxMessageBytes = 256 << 10
	// MaxBatchEntries is the most entries of one SendMessageBatch or
	// PublishBatch call.
	MaxBatchEntries = 10
	// maxIDLen is the longest MessageGroupId and MessageDeduplicationId.
	maxIDLen = 128
)

// HeadersAttribute is the message attribute that carries the producer's
// headers (traceparent among them), as a JSON object of strings. SQS allows 10
// attributes per message, so the producer's headers share one; it is absent
// when there are none. [Headers] reads it back.
const HeadersAttribute = "Outbox-Headers"

// ContentTypeAttribute is the message attribute that carries the body's media
// type: the payload's in the default format, application/cloudevents+json in
// the CloudEvents format.
const ContentTypeAttribute = "Content-Type"

// cloudEventsJSON is the media type of a structured-mode CloudEvent.
const cloudEventsJSON = "application/cloudevents+json"

// entry is one message ready for a batch call: SQS and SNS map it onto their
// own request types.
type entry struct {
	body  string
	attrs map[string]string // String attributes
	group string            // MessageGroupId; "" for a standard queue or topic
	dedup string            // MessageDeduplicationId; "" likewise
}

// size is what SQS and SNS count against MaxMessageBytes.
func (e *entry) size() int {
	n := len(e.body)
	for k, v := range e.attrs {
		n += len(k) + len("String") + len(v)
	}
	return n
}

// groupID returns the MessageGroupId of an aggregate's lane: the aggregate
// type and id joined by ":" when that fits (at most 128 characters of the set
// SQS allows, and a type without ":" or a leading "~", so that no two lanes
// share one), otherwise "~" and the hex SHA-256 of the length-prefixed pair.
// Distinct lanes could then only share a group by a hash collision, which
// would keep their messages in one order, never lose one.
func groupID(aggregateType, aggregateID string) string {
	plain := aggregateType + ":" + aggregateID
	if len(plain) <= maxIDLen && idChars(plain) && !containsByte(aggregateType, ':') && (aggregateType == "" || aggregateType[0] != '~') {
		return plain
	}
	return hashedID(strconv.Itoa(len(aggregateType)) + ":" + aggregateType + aggregateID)
}

// dedupID returns the MessageDeduplicationId of m: its broker dedup id (the
// event id unless a replay set another) when it fits SQS's rule, otherwise
// "~" and its hex SHA-256.
func dedupID(m *broker.Message) string {
	id := m.BrokerDedupID()
	if len(id) <= maxIDLen && idChars(id) && id[0] != '~' {
		return id
	}
	return hashedID(id)
}

func hashedID(s string) string {
	sum := sha256.Sum256([]byte(s))
	return "~" + hex.EncodeToString(sum[:])
}

// idChars reports whether s is non-empty and holds only what SQS allows in a
// group or deduplication id: printable ASCII without space.
func idChars(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] <= ' ' || s[i] > '~' {
			return false
		}
	}
	return true
}

func containsByte(s string, b byte) bool {
	for i := 0; i < len(s); i++ {
		if s[i] == b {
			return true
		}
	}
	return false
}

// validText reports whether s is valid UTF-8 holding only the characters SQS
// accepts in a body or attribute value: tab, newline, carriage return, and
// U+0020 to U+10FFFF without surrogates and U+FFFE, U+FFFF.
func validText(s string) bool {
	for i, r := range s {
		if r == utf8.RuneError {
			if _, n := utf8.DecodeRuneInString(s[i:]); n <= 1 {
				return false
			}
		}
		switch {
		case r == '\t' || r == '\n' || r == '\r':
		case r < 0x20, r == 0xFFFE, r == 0xFFFF:
			return false
		}
	}
	return true
}

// encode maps m onto an entry in enc's format, or returns why it cannot be
// sent, marked Permanent.
func encode(enc wire.Encoding, m *broker.Message) (entry, error) {
	// CloudEventsHTTP: only its prefix matters, and the attributes go into
	// the body here, unprefixed.
	w, err := enc.Encode(m, wire.CloudEventsHTTP)
	if err != nil {
		return entry{}, broker.Permanent(fmt.Errorf("sqs: %w", err))
	}
	e := entry{attrs: map[string]string{}, group: groupID(m.AggregateType, m.AggregateID), dedup: dedupID(m)}
	if len(m.Headers) > 0 {
		producer := make(map[string]string, len(m.Headers))
		for k, v := range w.Headers {
			if _, own := m.Headers[k]; own {
				producer[k] = v
			}
		}
		if len(producer) > 0 {
			raw, err := json.Marshal(producer)
			if err != nil {
				return entry{}, broker.Permanent(fmt.Errorf("sqs: event %s: headers: %w", m.EventID, err))
			}
			e.attrs[HeadersAttribute] = string(raw)
		}
	}
	if enc.Format == wire.FormatCloudEvents {
		body, err := structuredCloudEvent(enc, m, w)
		if err != nil {
			return entry{}, err
		}
		e.body = body
		e.attrs[ContentTypeAttribute] = cloudEventsJSON
	} else {
		e.body = string(w.Body)
		e.attrs[ContentTypeAttribute] = w.ContentType
		for k, v := range m.AllWireHeaders() {
			if _, own := m.Headers[k]; !own {
				e.attrs[k] = v // the Outbox-* headers
			}
		}
	}
	if e.body == "" {
		return entry{}, broker.Permanent(fmt.Errorf("sqs: event %s: empty body: SQS refuses an empty message", m.EventID))
	}
	if !validText(e.body) {
		return entry{}, broker.Permanent(fmt.Errorf("sqs: event %s: the body holds characters SQS refuses (control characters or invalid UTF-8)", m.EventID))
	}
	for k, v := range e.attrs {
		if v == "" || !validText(v) {
			return entry{}, broker.Permanent(fmt.Errorf("sqs: event %s: attribute %s: empty, or characters SQS refuses", m.EventID, k))
		}
	}
	if n := e.size(); n > MaxMessageBytes {
		return entry{}, broker.Permanent(fmt.Errorf("sqs: event %s: message of %d bytes with its attributes, above the %d SQS and SNS accept",
			m.EventID, n, MaxMessageBytes))
	}
	return e, nil
}

// structuredCloudEvent is m as a CloudEvent in structured content mode (JSON):
// AWS defines no binary binding for SQS or SNS, and a message has too few
// attributes for one. A JSON payload is the data member as it is; another is
// data_base64.
func structuredCloudEvent(enc wire.Encoding, m *broker.Message, w wire.Encoded) (string, error) {
	ev := map[string]any{
		wire.CEAttrSpecVersion:     wire.CloudEventsSpecVersion,
		wire.CEAttrID:              m.EventID.String(),
		wire.CEAttrSource:          enc.Source(m),
		wire.CEAttrType:            m.EventType,
		wire.CEAttrSubject:         m.AggregateType + "/" + m.AggregateID,
		wire.CEAttrTime:            m.OccurredAt.UTC().Format(time.RFC3339Nano),
		wire.CEAttrDataContentType: w.ContentType,
		wire.CEExtAggregateType:    m.AggregateType,
		wire.CEExtAggregateID:      m.AggregateID,
		wire.CEExtSequence:         strconv.FormatInt(m.AggregateSequence, 10),
		wire.CEExtSchemaVersion:    strconv.Itoa(m.SchemaVersion),
	}
	if json.Valid(w.Body) && isJSON(w.ContentType) {
		ev["data"] = json.RawMessage(w.Body)
	} else {
		ev["data_base64"] = w.Body // encoding/json writes []byte as base64
	}
	raw, err := json.Marshal(ev)
	if err != nil {
		return "", broker.Permanent(fmt.Errorf("sqs: event %s: CloudEvent: %w", m.EventID, err))
	}
	return string(raw), nil
}

func isJSON(ct string) bool {
	return ct == wire.DefaultContentType || (len(ct) > 5 && ct[len(ct)-5:] == "+json")
}

// Headers returns the headers of a received message in the default format,
// for wire.ParseReceived: the Outbox-* attributes, Content-Type, and the
// producer's headers out of [HeadersAttribute]. attrs are the message's
// String attributes. A HeadersAttribute that is not a JSON object of strings
// is an error.
func Headers(attrs map[string]string) (map[string]string, error) {
	h := make(map[string]string, len(attrs)+4)
	for k, v := range attrs {
		if k != HeadersAttribute {
			h[k] = v
		}
	}
	if raw, ok := attrs[HeadersAttribute]; ok {
		var producer map[string]string
		if err := json.Unmarshal([]byte(raw), &producer); err != nil {
			return nil, errors.New("sqs: attribute " + HeadersAttribute + " is not a JSON object of strings")
		}
		for k, v := range producer {
			if _, taken := h[k]; !taken {
				h[k] = v
			}
		}
	}
	return h, nil
}
