package mqtt

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"unicode/utf8"

	"github.com/pgoutbox/pgoutbox/broker"
	"github.com/pgoutbox/pgoutbox/wire"
)

// MaxTopicBytes is the longest topic MQTT allows: its length is a 16-bit
// prefix.
const MaxTopicBytes = 65535

// CheckTopic returns why topic cannot be a PUBLISH topic, marked
// broker.Permanent, or nil: MQTT 3.1.1 (section 4.7) wants a non-empty UTF-8
// string of at most 65535 bytes without NUL and without the wildcards + and #;
// a leading $ is reserved for the server's own topics ($SYS).
func CheckTopic(topic string) error {
	reason := ""
	switch {
	case topic == "":
		reason = "it is empty"
	case len(topic) > MaxTopicBytes:
		reason = fmt.Sprintf("it is %d bytes, above MQTT's %d", len(topic), MaxTopicBytes)
	case !utf8.ValidString(topic):
		reason = "it is not valid UTF-8"
	case strings.ContainsRune(topic, 0):
		reason = "it contains NUL"
	case strings.ContainsAny(topic, "+#"):
		reason = "it contains a wildcard (+ or #), which only subscriptions may use"
	case topic[0] == '$':
		reason = "it starts with $, reserved for the server's topics"
	}
	if reason == "" {
		return nil
	}
	return broker.Permanent(fmt.Errorf("mqtt: topic %.80q refused: %s", topic, reason))
}

// Envelope member names (the layout is documented in the package doc).
const (
	memberHeaders     = "headers"
	memberContentType = "datacontenttype"
	memberData        = "data"
	memberDataBase64  = "data_base64"
	memberHeadersCE   = "pgoutboxheaders"
)

// ceStructured lets wire.Encoding.Headers name the CloudEvents attributes with
// a prefix that is stripped again: structured mode has no headers, the
// attributes are members of the JSON object.
var ceStructured = wire.CloudEventsBinding{Prefix: "ce-"}

// Encode returns the MQTT payload a Publisher sends for m in enc's format
// (see the package doc): the envelope, or a CloudEvents structured-mode event.
// A message the codec refuses gets an error marked wire.Refused. It does not
// check the payload's size.
func Encode(enc wire.Encoding, m *wire.Message) ([]byte, error) {
	e, err := enc.Encode(m, ceStructured)
	if err != nil {
		return nil, err
	}
	var b bytes.Buffer
	b.WriteByte('{')
	if enc.Format == wire.FormatCloudEvents {
		producer := map[string]string{}
		for k, v := range e.Headers {
			if attr, ok := strings.CutPrefix(k, ceStructured.Prefix); ok {
				writeMember(&b, attr, v)
			} else if k == wire.HeaderTraceParent || k == wire.HeaderTraceState {
				// The distributed tracing extension's attribute names.
				writeMember(&b, k, v)
			} else {
				producer[k] = v
			}
		}
		if len(producer) > 0 {
			h, err := json.Marshal(producer)
			if err != nil {
				return nil, fmt.Errorf("mqtt: event %s: headers: %w", m.EventID, err)
			}
			writeMember(&b, memberHeadersCE, string(h))
		}
	} else {
		h, err := json.Marshal(maps.Collect(e.Headers))
		if err != nil {
			return nil, fmt.Errorf("mqtt: event %s: headers: %w", m.EventID, err)
		}
		writeKey(&b, memberHeaders)
		b.Write(h)
		b.WriteByte(',')
	}
	writeMember(&b, memberContentType, e.ContentType)
	if isJSON(e.ContentType) && json.Valid(e.Body) {
		writeKey(&b, memberData)
		b.Write(e.Body) // verbatim, so a subscriber gets the payload's exact bytes
	} else {
		writeKey(&b, memberDataBase64)
		s, _ := json.Marshal(base64.StdEncoding.EncodeToString(e.Body))
		b.Write(s)
	}
	b.WriteByte('}')
	return b.Bytes(), nil
}

func writeKey(b *bytes.Buffer, k string) {
	s, _ := json.Marshal(k)
	b.Write(s)
	b.WriteByte(':')
}

func writeMember(b *bytes.Buffer, k, v string) {
	writeKey(b, k)
	s, _ := json.Marshal(v)
	b.Write(s)
	b.WriteByte(',')
}

func isJSON(ct string) bool {
	mt, _, _ := strings.Cut(ct, ";")
	mt = strings.ToLower(strings.TrimSpace(mt))
	return mt == "application/json" || (strings.HasPrefix(mt, "application/") && strings.HasSuffix(mt, "+json"))
}

// ErrNotEnvelope is wrapped by the errors of [ParseReceived] for a payload
// that is not a JSON object of either layout.
var ErrNotEnvelope = errors.New("mqtt: payload is not a pgoutbox envelope or a CloudEvent")

// Decoded is a received MQTT payload taken apart: its headers (the Outbox-*
// headers and the producer's, or the CloudEvents attributes under the "ce-"
// names of wire's HTTP binding) and the payload's bytes.
type Decoded struct {
	Headers map[string]string
	Body    []byte
}

// Get returns the header named name, or "".
func (d *Decoded) Get(name string) string { return d.Headers[name] }

// Names returns the header names.
func (d *Decoded) Names() []string { return slices.Collect(maps.Keys(d.Headers)) }

// Decode takes apart a message written by a Publisher in either format and
// either protocol version, without checking the outbox fields
// ([ParseReceived] does): props are the MQTT 5 properties the message came
// with, nil for MQTT 3.1.1. A message with user properties is read as MQTT 5
// carries an event (headers or CloudEvents attributes as user properties, the
// payload as it is); one without, as the JSON layout in the payload. A
// subscriber bounds what it reads (the broker's maximum packet size); Decode
// itself reads what it is given, refusing repeated or too many user
// properties.
func Decode(payload []byte, props *Properties) (Decoded, error) {
	if props != nil && len(props.User) > 0 {
		return decode5(payload, props)
	}
	var obj map[string]json.RawMessage
	if err := json.Unmarshal(payload, &obj); err != nil {
		return Decoded{}, fmt.Errorf("%w: %w", ErrNotEnvelope, err)
	}
	d := Decoded{Headers: map[string]string{}}
	str := func(k string) (string, error) {
		var s string
		if err := json.Unmarshal(obj[k], &s); err != nil {
			return "", fmt.Errorf("%w: member %q: %w", ErrNotEnvelope, k, err)
		}
		return s, nil
	}
	ct := ""
	for k, raw := range obj {
		var err error
		switch k {
		case memberData:
			d.Body = []byte(raw) // json.Unmarshal copies a RawMessage as it was
		case memberDataBase64:
			var s string
			if s, err = str(k); err == nil {
				d.Body, err = base64.StdEncoding.DecodeString(s)
			}
		case memberContentType:
			ct, err = str(k)
		case memberHeaders:
			if _, ce := obj["specversion"]; !ce {
				err = json.Unmarshal(raw, &d.Headers)
			}
		}
		if err != nil {
			return Decoded{}, fmt.Errorf("%w: member %q: %w", ErrNotEnvelope, k, err)
		}
	}
	if _, ce := obj["specversion"]; ce {
		for k := range obj {
			switch k {
			case memberData, memberDataBase64:
				continue
			case memberHeadersCE:
				s, err := str(k)
				var producer map[string]string
				if err == nil {
					err = json.Unmarshal([]byte(s), &producer)
				}
				if err != nil {
					return Decoded{}, fmt.Errorf("%w: member %q: %w", ErrNotEnvelope, k, err)
				}
				for name, v := range producer {
					// An attribute's header name would pose as the attribute.
					if strings.HasPrefix(strings.ToLower(name), ceStructured.Prefix) {
						return Decoded{}, fmt.Errorf("%w: member %q: header %.64q", ErrNotEnvelope, k, name)
					}
					d.Headers[name] = v
				}
				continue
			}
			v, err := str(k)
			if err != nil {
				return Decoded{}, err
			}
			if k == wire.HeaderTraceParent || k == wire.HeaderTraceState {
				d.Headers[k] = v
			} else {
				d.Headers[ceStructured.Prefix+k] = v
			}
		}
	} else if _, ok := obj[memberHeaders]; !ok {
		return Decoded{}, fmt.Errorf("%w: no %q member", ErrNotEnvelope, memberHeaders)
	}
	if ct != "" && !isJSON(ct) {
		if _, ok := obj[memberDataBase64]; !ok {
			return Decoded{}, fmt.Errorf("%w: content type %.64q without %q", ErrNotEnvelope, ct, memberDataBase64)
		}
	}
	return d, nil
}

// ParseReceived rebuilds a Message from an MQTT message a Publisher sent, in
// either format and either protocol version, as wire.ParseReceived does for
// transports with headers: every Outbox-* header (or CloudEvents attribute)
// must be present and well-formed, and the payload must be JSON. props are
// the message's MQTT 5 properties (Content Type and user properties), nil for
// MQTT 3.1.1 (see [Decode]). An inbox subscriber calls it on each message it
// receives.
func ParseReceived(payload []byte, props *Properties) (wire.Message, error) {
	d, err := Decode(payload, props)
	if err != nil {
		return wire.Message{}, err
	}
	m, err := wire.ParseReceived(d.Body, d.Names(), d.Get)
	if err != nil {
		return wire.Message{}, fmt.Errorf("mqtt: %w", err)
	}
	return m, nil
}
