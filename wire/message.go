package wire

import (
	"errors"
	"fmt"
	"iter"
	"mime"
	"strconv"
	"strings"
	"time"

	"github.com/pgoutbox/pgoutbox"
)

// Outbox-* header names, part of the public contract (docs/design.md, "Wire
// headers"), and the trace context headers a producer's trace travels in.
const (
	HeaderEventID           = "Outbox-Event-Id"
	HeaderEventType         = "Outbox-Event-Type"
	HeaderAggregateType     = "Outbox-Aggregate-Type"
	HeaderAggregateID       = "Outbox-Aggregate-Id"
	HeaderAggregateSequence = "Outbox-Aggregate-Sequence"
	HeaderSchemaVersion     = "Outbox-Schema-Version"
	HeaderOccurredAt        = "Outbox-Occurred-At"
	HeaderTraceParent       = "traceparent"
	HeaderTraceState        = "tracestate"
)

// DefaultContentType is the media type of a payload whose [Message.ContentType]
// is empty: JSON, the payload format of every outbox event today.
const DefaultContentType = "application/json"

// Message is one outbox event on its way to or from the broker. broker.Message
// is the same type: the publish seam carries it, the codec writes and reads it.
type Message struct {
	EventID           pgoutbox.UUID
	AggregateType     string
	AggregateID       string
	AggregateSequence int64
	EventType         string
	SchemaVersion     int
	OccurredAt        time.Time
	// Payload is the event's payload, sent as the message body.
	Payload []byte
	// ContentType is Payload's media type. Empty means DefaultContentType
	// (application/json), which every outbox event has today; adapters set the
	// transport's content type from it ([Encoded.ContentType]). A message parsed
	// from the wire leaves it empty: the decoders accept JSON only.
	ContentType string
	// Headers are the producer's headers, including traceparent when the producer
	// had a trace context.
	Headers map[string]string
	// DedupID is the id a broker with publish-side deduplication (NATS JetStream's
	// Nats-Msg-Id) drops repeats by. Empty means the event id, which the relay
	// always uses: a re-publish after a crash is then dropped as a duplicate. A
	// replay sets a different one so that a broker inside its duplicate window
	// stores the message again; the Outbox-Event-Id header, which consumers dedup
	// on, stays the event id. Adapters without such a feature ignore it.
	DedupID string
	// Tenant names the outbox the event came from: the relay's Config.Tenant
	// (its schema unless set). Destination templates may use it as {tenant},
	// so that the events of many outboxes served by one relay process stay
	// apart on the wire (relay.Group). It is not a header.
	Tenant string
	// Schema is the PostgreSQL schema of the outbox the event came from, set
	// by everything that reads an outbox (the relay, the CDC source and its
	// recovery, replay). The default CloudEvents source is made from it
	// ([Encoding.Source]). It is not a header.
	Schema string
}

// Lane returns the message's lane: its aggregate, within which messages are
// published in AggregateSequence order.
func (m *Message) Lane() pgoutbox.Lane { return pgoutbox.LaneOf(m.AggregateType, m.AggregateID) }

// BrokerDedupID returns the id a broker's publish-side deduplication should use:
// DedupID, or the event id when DedupID is empty.
func (m *Message) BrokerDedupID() string {
	if m.DedupID != "" {
		return m.DedupID
	}
	return m.EventID.String()
}

// ContentTypeOrDefault returns m.ContentType, or DefaultContentType when it is
// empty.
func (m *Message) ContentTypeOrDefault() string {
	if m.ContentType != "" {
		return m.ContentType
	}
	return DefaultContentType
}

// WireHeaders returns every header the message carries on the wire in the
// default format: the producer's headers and the Outbox-* headers. A producer
// header with a reserved name (pgoutbox.ReservedHeader: Outbox-*, Nats-*,
// Authorization, …) never goes out: the relay refuses such an event before
// publishing (broker.CheckMessage), and should one reach an adapter anyway, it
// is left out here, so the contract cannot be spoofed and the broker cannot be
// steered.
func (m *Message) WireHeaders() map[string]string {
	h := make(map[string]string, m.WireHeaderCount())
	for k, v := range m.AllWireHeaders() {
		h[k] = v
	}
	return h
}

// AllWireHeaders yields the headers of [Message.WireHeaders] one by one, each name
// once, without building a map: the producer's headers first (in no set order),
// then the Outbox-* headers.
func (m *Message) AllWireHeaders() iter.Seq2[string, string] {
	return func(yield func(string, string) bool) {
		for k, v := range m.Headers {
			// Compared without case: HTTP and AMQP peers may fold header names, so a
			// producer's "outbox-event-id" must not travel beside the real one.
			if _, reserved := pgoutbox.ReservedHeader(k); reserved {
				continue
			}
			if !yield(k, v) {
				return
			}
		}
		_ = yield(HeaderEventID, m.EventID.String()) &&
			yield(HeaderEventType, m.EventType) &&
			yield(HeaderAggregateType, m.AggregateType) &&
			yield(HeaderAggregateID, m.AggregateID) &&
			yield(HeaderAggregateSequence, strconv.FormatInt(m.AggregateSequence, 10)) &&
			yield(HeaderSchemaVersion, strconv.Itoa(m.SchemaVersion)) &&
			yield(HeaderOccurredAt, m.OccurredAt.UTC().Format(time.RFC3339Nano))
	}
}

// WireHeaderCount is an upper bound of the headers [Message.AllWireHeaders]
// yields, for sizing what holds them.
func (m *Message) WireHeaderCount() int { return len(m.Headers) + outboxHeaders }

// outboxHeaders is how many Outbox-* headers every message carries.
const outboxHeaders = 7

// CheckHeaders returns why one of m's producer headers must not go out
// (pgoutbox.CheckHeader: a reserved name, an invalid name or value), marked
// [Refused], or nil. [Encoding.Encode] calls it, so that such a header reaching
// an adapter without the relay's check (a direct Publish) is refused rather
// than silently left out. Sizes are left to broker.CheckMessage and to each
// adapter's own limits.
func (m *Message) CheckHeaders() error {
	for k, v := range m.Headers {
		if err := pgoutbox.CheckHeader(k, v); err != nil {
			return Refused(fmt.Errorf("wire: event %s: headers: %w", m.EventID, err))
		}
	}
	return nil
}

// CheckContentType reports why ct cannot be a message's content type: it must
// be empty (DefaultContentType) or a type/subtype media type with optional
// parameters (RFC 2045, as mime.ParseMediaType reads it) of at most 255 bytes, the longest AMQP's
// content-type property holds.
func CheckContentType(ct string) error {
	if ct == "" {
		return nil
	}
	if len(ct) > 255 {
		return fmt.Errorf("wire: content type of %d bytes, above 255", len(ct))
	}
	if strings.ContainsFunc(ct, func(r rune) bool { return r < ' ' || r > '~' }) {
		return fmt.Errorf("wire: content type %.64q: want printable ASCII", ct)
	}
	mt, _, err := mime.ParseMediaType(ct)
	if err != nil {
		return fmt.Errorf("wire: content type %.64q: %w", ct, err)
	}
	if typ, sub, ok := strings.Cut(mt, "/"); !ok || typ == "" || sub == "" {
		return fmt.Errorf("wire: content type %.64q: want type/subtype", ct)
	}
	return nil
}

// ParseOutboxHeaders rebuilds a Message from what a consumer received in the
// default format: the body and a header lookup (get returns "" for a missing
// header; names are the message's header names). Every Outbox-* header must be
// present and well-formed; other headers become Message.Headers.
func ParseOutboxHeaders(body []byte, names []string, get func(name string) string) (Message, error) {
	m := Message{Payload: body, Headers: map[string]string{}}
	var err error
	need := func(name string) string {
		v := get(name)
		if v == "" && err == nil {
			err = fmt.Errorf("wire: message lacks header %s", name)
		}
		return v
	}
	if m.EventID, err = pgoutbox.ParseUUID(need(HeaderEventID)); err != nil {
		return Message{}, fmt.Errorf("wire: header %s: %w", HeaderEventID, err)
	}
	m.EventType = need(HeaderEventType)
	m.AggregateType = need(HeaderAggregateType)
	m.AggregateID = need(HeaderAggregateID)
	seq, version, occurred := need(HeaderAggregateSequence), need(HeaderSchemaVersion), need(HeaderOccurredAt)
	if err != nil {
		return Message{}, err
	}
	if m.AggregateSequence, err = strconv.ParseInt(seq, 10, 64); err != nil || m.AggregateSequence < 1 {
		return Message{}, fmt.Errorf("wire: header %s: invalid sequence %q", HeaderAggregateSequence, seq)
	}
	if m.SchemaVersion, err = strconv.Atoi(version); err != nil || m.SchemaVersion < 1 {
		return Message{}, fmt.Errorf("wire: header %s: invalid version %q", HeaderSchemaVersion, version)
	}
	if m.OccurredAt, err = time.Parse(time.RFC3339Nano, occurred); err != nil {
		return Message{}, fmt.Errorf("wire: header %s: %w", HeaderOccurredAt, err)
	}
	for _, n := range names {
		if !strings.HasPrefix(strings.ToLower(n), "outbox-") {
			m.Headers[n] = get(n)
		}
	}
	return m, nil
}

type refusedError struct{ err error }

func (e refusedError) Error() string { return e.err.Error() }
func (e refusedError) Unwrap() error { return e.err }

// Refused marks err as the codec refusing a message: the message cannot be
// encoded as it is, and will not be on a retry. broker.IsPermanent reports
// true for such an error, so the relay quarantines the event at once.
func Refused(err error) error {
	if err == nil {
		return nil
	}
	return refusedError{err}
}

// IsRefused reports whether err, or an error it wraps, was marked with Refused.
func IsRefused(err error) bool {
	var r refusedError
	return errors.As(err, &r)
}
