package wire

import (
	"errors"
	"fmt"
	"iter"
	"net/url"
	"strconv"
	"strings"
	"time"
	"unicode"

	"github.com/pgoutbox/pgoutbox"
)

// Format is how a message's outbox fields travel on the wire.
type Format int

const (
	// FormatOutbox, the default, carries the fields in the Outbox-* headers
	// (docs/design.md, "Wire headers").
	FormatOutbox Format = iota
	// FormatCloudEvents carries them as CloudEvents 1.0 attributes in binary
	// content mode: the payload is the body, the attributes are headers named by
	// the transport's protocol binding (see [CloudEventsBinding]). No Outbox-*
	// header is sent.
	FormatCloudEvents
)

// Format names, as --format takes them.
const (
	FormatNameOutbox      = "outbox"
	FormatNameCloudEvents = "cloudevents"
)

// String returns the format's name.
func (f Format) String() string {
	if f == FormatCloudEvents {
		return FormatNameCloudEvents
	}
	return FormatNameOutbox
}

// ParseFormat returns the format named s: "outbox" (or "") or "cloudevents".
func ParseFormat(s string) (Format, error) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "", FormatNameOutbox:
		return FormatOutbox, nil
	case FormatNameCloudEvents:
		return FormatCloudEvents, nil
	}
	return 0, fmt.Errorf("wire: unknown format %q (want %s or %s)", s, FormatNameOutbox, FormatNameCloudEvents)
}

// CloudEvents attribute names and values (CloudEvents 1.0). The extension
// attributes carry what an inbox needs beyond the context attributes; their
// names follow the spec's rule (a-z and 0-9, at most 20 characters).
const (
	CloudEventsSpecVersion = "1.0"

	CEAttrID              = "id"
	CEAttrSource          = "source"
	CEAttrType            = "type"
	CEAttrSubject         = "subject"
	CEAttrTime            = "time"
	CEAttrSpecVersion     = "specversion"
	CEAttrDataContentType = "datacontenttype"
	// CEExtAggregateType is the aggregate type.
	CEExtAggregateType = "pgoutboxaggtype"
	// CEExtAggregateID is the aggregate id (also in subject, after the type and
	// a "/", but the extension needs no parsing).
	CEExtAggregateID = "pgoutboxaggid"
	// CEExtSequence is the aggregate sequence, in decimal (a string: CloudEvents
	// integers are 32-bit).
	CEExtSequence = "pgoutboxseq"
	// CEExtSchemaVersion is the payload's schema version, in decimal.
	CEExtSchemaVersion = "pgoutboxschemaver"

	// DefaultCloudEventsSource is the source attribute when none is configured
	// and the message names no schema; with a schema it is
	// "/pgoutbox/<schema>" ([Encoding.Source]).
	DefaultCloudEventsSource = "/pgoutbox"
)

// CloudEventsBinding names the headers of one CloudEvents protocol binding.
type CloudEventsBinding struct {
	// Prefix is put before an attribute's name to form its header name.
	Prefix string
	// ContentTypeHeader is the header that carries datacontenttype, or "" when
	// the adapter sets it in the transport's own content-type field (an HTTP
	// Content-Type header, an AMQP content-type property).
	ContentTypeHeader string
}

// The CloudEvents protocol bindings of the shipped adapters.
var (
	// CloudEventsHTTP: ce- headers; datacontenttype is Content-Type.
	CloudEventsHTTP = CloudEventsBinding{Prefix: "ce-"}
	// CloudEventsNATS: ce- headers and a content-type header (the NATS binding
	// as the CloudEvents Go SDK reads it).
	CloudEventsNATS = CloudEventsBinding{Prefix: "ce-", ContentTypeHeader: "content-type"}
	// CloudEventsKafka: ce_ headers and a content-type header.
	CloudEventsKafka = CloudEventsBinding{Prefix: "ce_", ContentTypeHeader: "content-type"}
	// CloudEventsAMQP: cloudEvents_ application properties (RabbitMQ message
	// headers); datacontenttype is the content-type property.
	CloudEventsAMQP = CloudEventsBinding{Prefix: "cloudEvents_"}
)

// cloudEventsPrefixes are the attribute prefixes of every binding, lower-cased.
// In the CloudEvents format a producer header starting with one of them is
// refused, whatever the binding, so it cannot pose as an attribute.
var cloudEventsPrefixes = [...]string{"ce-", "ce_", "cloudevents_", "cloudevents:"}

// Encoding is the wire format an adapter writes: its Config embeds one. The
// zero value is the default Outbox-* format.
type Encoding struct {
	// Format selects the format.
	Format Format
	// CloudEventsSource is the source attribute of FormatCloudEvents, a
	// URI-reference. Empty means each event's outbox: see [Encoding.Source].
	CloudEventsSource string
}

// Validate reports an unusable encoding: an unknown format, or a source that is
// not a URI-reference.
func (e Encoding) Validate() error {
	switch e.Format {
	case FormatOutbox:
		return nil
	case FormatCloudEvents:
		if e.CloudEventsSource == "" {
			return nil // each message's Source, valid by construction
		}
		return CheckCloudEventsSource(e.CloudEventsSource)
	}
	return fmt.Errorf("wire: unknown format %d", e.Format)
}

// CheckCloudEventsSource reports why s cannot be a source attribute: it must be
// a non-empty URI-reference of printable ASCII without spaces, at most 1024
// bytes.
func CheckCloudEventsSource(s string) error {
	if s == "" {
		return errors.New("wire: empty CloudEvents source")
	}
	if len(s) > 1024 {
		return fmt.Errorf("wire: CloudEvents source of %d bytes, above 1024", len(s))
	}
	for _, r := range s {
		if r > unicode.MaxASCII || !unicode.IsPrint(r) || r == ' ' {
			return fmt.Errorf("wire: CloudEvents source %q: want printable ASCII without spaces", s)
		}
	}
	if _, err := url.Parse(s); err != nil {
		return fmt.Errorf("wire: CloudEvents source %q is not a URI-reference: %w", s, err)
	}
	return nil
}

// Source returns the CloudEvents source attribute of m: CloudEventsSource
// when set, else "/pgoutbox/<schema>" for the schema of m's outbox
// (Message.Schema, percent-escaped as one path segment), or
// DefaultCloudEventsSource when m names none. It is the one rule of every
// command that publishes (relay, relay --tenants, replay, the CDC source and
// cdc recover), so an event has the same source whichever sends it: the
// tenant name (TenantPrefix + schema) is not part of it, as replay and the
// CDC commands do not know a relay's prefix; destinations tell tenants apart.
func (e Encoding) Source(m *Message) string {
	switch {
	case e.CloudEventsSource != "":
		return e.CloudEventsSource
	case m.Schema == "":
		return DefaultCloudEventsSource
	}
	return DefaultCloudEventsSource + "/" + url.PathEscape(m.Schema)
}

// CheckMessage returns why m cannot be sent in e's format, marked [Refused],
// or nil: a content type that [CheckContentType] refuses, or in the CloudEvents
// format, a producer header named like a CloudEvents attribute of any binding
// (ce-*, ce_*, cloudEvents_*, compared without case). [Encoding.Encode] calls
// it beside [Message.CheckHeaders].
func (e Encoding) CheckMessage(m *Message) error {
	if err := CheckContentType(m.ContentType); err != nil {
		return Refused(fmt.Errorf("wire: event %s: %w", m.EventID, err))
	}
	if e.Format != FormatCloudEvents {
		return nil
	}
	for k := range m.Headers {
		if isCloudEventsHeader(k) {
			return Refused(fmt.Errorf("wire: event %s: header %q: the CloudEvents format reserves ce-*, ce_* and cloudEvents_* names", m.EventID, k))
		}
	}
	return nil
}

func isCloudEventsHeader(name string) bool {
	lower := strings.ToLower(name)
	for _, p := range cloudEventsPrefixes {
		if strings.HasPrefix(lower, p) {
			return true
		}
	}
	return false
}

// HeaderCount is an upper bound of the headers [Encoding.Headers] yields.
func (e Encoding) HeaderCount(m *Message) int { return m.WireHeaderCount() + cloudEventsHeaders }

// cloudEventsHeaders is how many attribute headers a CloudEvents message has.
const cloudEventsHeaders = 11

// Encoded is a message as the codec writes it for one transport: what an
// adapter maps onto its message or request.
type Encoded struct {
	// Headers yields the message's headers, each name once (see
	// [Encoding.Headers]).
	Headers iter.Seq2[string, string]
	// HeaderCount is an upper bound of the headers Headers yields, for sizing
	// what holds them.
	HeaderCount int
	// Body is the message body: the payload, unchanged.
	Body []byte
	// ContentType is Body's media type (Message.ContentType, or
	// DefaultContentType when empty). A transport with a content-type field
	// of its own (HTTP's Content-Type header, AMQP's content-type property)
	// sets it; the CloudEvents bindings whose ContentTypeHeader is set carry
	// it in Headers too, and the others read datacontenttype from that field.
	ContentType string
}

// Encode returns m as e's format writes it for the transport of binding b
// (the binding matters in the CloudEvents format only), or why m cannot be
// sent, marked [Refused]: [Message.CheckHeaders] and [Encoding.CheckMessage].
// Every adapter writes through it, so a format or a payload type is added in
// this package, not in each adapter.
func (e Encoding) Encode(m *Message, b CloudEventsBinding) (Encoded, error) {
	if err := m.CheckHeaders(); err != nil {
		return Encoded{}, err
	}
	if err := e.CheckMessage(m); err != nil {
		return Encoded{}, err
	}
	return Encoded{
		Headers:     e.Headers(m, b),
		HeaderCount: e.HeaderCount(m),
		Body:        m.Payload,
		ContentType: m.ContentTypeOrDefault(),
	}, nil
}

// Headers yields the headers m carries in e's format: [Message.AllWireHeaders]
// for the default format; for CloudEvents, the producer's headers (as the
// default format carries them) then the attributes, named per b. Call
// [Encoding.CheckMessage] first.
func (e Encoding) Headers(m *Message, b CloudEventsBinding) iter.Seq2[string, string] {
	if e.Format != FormatCloudEvents {
		return m.AllWireHeaders()
	}
	return func(yield func(string, string) bool) {
		for k, v := range m.Headers {
			if _, reserved := pgoutbox.ReservedHeader(k); reserved || isCloudEventsHeader(k) {
				continue
			}
			if !yield(k, v) {
				return
			}
		}
		p := b.Prefix
		ok := yield(p+CEAttrSpecVersion, CloudEventsSpecVersion) &&
			yield(p+CEAttrID, m.EventID.String()) &&
			yield(p+CEAttrSource, e.Source(m)) &&
			yield(p+CEAttrType, m.EventType) &&
			yield(p+CEAttrSubject, m.AggregateType+"/"+m.AggregateID) &&
			yield(p+CEAttrTime, m.OccurredAt.UTC().Format(time.RFC3339Nano)) &&
			yield(p+CEExtAggregateType, m.AggregateType) &&
			yield(p+CEExtAggregateID, m.AggregateID) &&
			yield(p+CEExtSequence, strconv.FormatInt(m.AggregateSequence, 10)) &&
			yield(p+CEExtSchemaVersion, strconv.Itoa(m.SchemaVersion))
		if ok && b.ContentTypeHeader != "" {
			yield(b.ContentTypeHeader, m.ContentTypeOrDefault())
		}
	}
}

// CloudEventsPrefix returns the attribute prefix of the CloudEvents binary-mode
// message whose headers get looks up ("ce-", "ce_", "cloudEvents_" or the
// older AMQP "cloudEvents:"), found by its specversion header, or false when
// the message is not one.
func CloudEventsPrefix(get func(name string) string) (string, bool) {
	for _, p := range [...]string{CloudEventsHTTP.Prefix, CloudEventsKafka.Prefix, CloudEventsAMQP.Prefix, "cloudEvents:"} {
		if get(p+CEAttrSpecVersion) != "" {
			return p, true
		}
	}
	return "", false
}

// LaneHeaders returns the aggregate type and id of a received message in either
// format, or empty strings: subscribers use them to process an aggregate's
// messages one at a time.
func LaneHeaders(get func(name string) string) (aggregateType, aggregateID string) {
	if p, ok := CloudEventsPrefix(get); ok {
		return get(p + CEExtAggregateType), get(p + CEExtAggregateID)
	}
	return get(HeaderAggregateType), get(HeaderAggregateID)
}

// ParseCloudEvent rebuilds a Message from a CloudEvents binary-mode message: the
// body and a header lookup (get returns "" for a missing header; names are the
// message's header names). The specversion must be 1.0; id, type, time and the
// pgoutbox extension attributes must be present and well-formed; a
// datacontenttype, if any, must be JSON. Headers other than the attributes,
// content-type and Outbox-* become Message.Headers. Values are checked as
// [ParseOutboxHeaders] checks the Outbox-* headers.
func ParseCloudEvent(body []byte, names []string, get func(name string) string) (Message, error) {
	p, ok := CloudEventsPrefix(get)
	if !ok {
		return Message{}, errors.New("wire: not a CloudEvents binary-mode message: no specversion header")
	}
	if v := get(p + CEAttrSpecVersion); v != CloudEventsSpecVersion {
		return Message{}, fmt.Errorf("wire: header %s%s: unsupported specversion %.32q", p, CEAttrSpecVersion, v)
	}
	m := Message{Payload: body, Headers: map[string]string{}}
	var err error
	need := func(attr string) string {
		v := get(p + attr)
		if v == "" && err == nil {
			err = fmt.Errorf("wire: CloudEvent lacks header %s%s", p, attr)
		}
		return v
	}
	id := need(CEAttrID)
	m.EventType = need(CEAttrType)
	m.AggregateType = need(CEExtAggregateType)
	m.AggregateID = need(CEExtAggregateID)
	seq, version, occurred := need(CEExtSequence), need(CEExtSchemaVersion), need(CEAttrTime)
	if err != nil {
		return Message{}, err
	}
	if m.EventID, err = pgoutbox.ParseUUID(id); err != nil {
		return Message{}, fmt.Errorf("wire: header %s%s: not a UUID: %.40q", p, CEAttrID, id)
	}
	if m.AggregateSequence, err = strconv.ParseInt(seq, 10, 64); err != nil || m.AggregateSequence < 1 {
		return Message{}, fmt.Errorf("wire: header %s%s: invalid sequence %.32q", p, CEExtSequence, seq)
	}
	if m.SchemaVersion, err = strconv.Atoi(version); err != nil || m.SchemaVersion < 1 {
		return Message{}, fmt.Errorf("wire: header %s%s: invalid version %.32q", p, CEExtSchemaVersion, version)
	}
	if m.OccurredAt, err = time.Parse(time.RFC3339Nano, occurred); err != nil {
		return Message{}, fmt.Errorf("wire: header %s%s: invalid time %.40q", p, CEAttrTime, occurred)
	}
	ct := get(p + CEAttrDataContentType)
	if ct == "" {
		ct = get("content-type")
	}
	if ct != "" && !isJSONContentType(ct) {
		return Message{}, fmt.Errorf("wire: CloudEvent datacontenttype %.64q is not JSON", ct)
	}
	for _, n := range names {
		// Outbox-* headers beside the attributes are not the producer's either.
		if !isCloudEventsHeader(n) && !strings.EqualFold(n, "content-type") && !strings.HasPrefix(strings.ToLower(n), "outbox-") {
			m.Headers[n] = get(n)
		}
	}
	return m, nil
}

// ParseReceived rebuilds a Message from a received message in either format:
// [ParseCloudEvent] when it is a CloudEvents binary-mode message (it has a
// specversion header of a binding), [ParseOutboxHeaders] otherwise.
func ParseReceived(body []byte, names []string, get func(name string) string) (Message, error) {
	if _, ok := CloudEventsPrefix(get); ok {
		return ParseCloudEvent(body, names, get)
	}
	return ParseOutboxHeaders(body, names, get)
}

// isJSONContentType reports whether ct is application/json or a +json type,
// with or without parameters.
func isJSONContentType(ct string) bool {
	mt, _, _ := strings.Cut(ct, ";")
	mt = strings.ToLower(strings.TrimSpace(mt))
	return mt == "application/json" || (strings.HasPrefix(mt, "application/") && strings.HasSuffix(mt, "+json"))
}
