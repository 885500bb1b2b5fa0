package mqtt

import (
	"encoding/json"
	"fmt"
	"strings"
	"unicode/utf8"

	"github.com/pgoutbox/pgoutbox"
	"github.com/pgoutbox/pgoutbox/wire"
)

// MaxPropertyBytes is the longest user property name or value, and content
// type, MQTT 5 can carry: a string's length is a 16-bit prefix.
const MaxPropertyBytes = 65535

// maxUserProperties bounds the user properties a received message may carry
// for [Decode]: the producer's headers at most, the Outbox-* headers or the
// CloudEvents attributes, and some room for a broker's or bridge's own.
const maxUserProperties = pgoutbox.MaxHeaders + 32

// UserProperty is one MQTT 5 user property, a name and value pair; names may
// repeat in MQTT, not in what a Publisher sends.
type UserProperty struct {
	Key, Value string
}

// Properties are the MQTT 5 properties that carry an event beside its payload:
// what a Publisher speaking MQTT 5 sets, and what [ParseReceived] reads back.
type Properties struct {
	// ContentType is the Content Type property: the payload's media type
	// (CloudEvents: datacontenttype).
	ContentType string
	// User are the user properties in the order received.
	User []UserProperty
}

// Encode5 returns the Content Type and user properties a Publisher speaking
// MQTT 5 sends for m in enc's format (see the package doc); the payload is
// m.Payload, unchanged. A message the codec refuses, and a property above
// MaxPropertyBytes, get an error marked wire.Refused. Sizes beyond that are
// the Publisher's to check.
func Encode5(enc wire.Encoding, m *wire.Message) (Properties, error) {
	e, err := enc.Encode(m, ceStructured)
	if err != nil {
		return Properties{}, err
	}
	props := Properties{ContentType: e.ContentType, User: make([]UserProperty, 0, e.HeaderCount+1)}
	if enc.Format == wire.FormatCloudEvents {
		// Named with ceStructured's prefix, which no producer header may
		// have in this format, the attributes are told from the producer's
		// headers, and the prefix dropped: the binding has none.
		producer := map[string]string{}
		for k, v := range e.Headers {
			if attr, ok := strings.CutPrefix(k, ceStructured.Prefix); ok {
				props.User = append(props.User, UserProperty{attr, v})
			} else if k == wire.HeaderTraceParent || k == wire.HeaderTraceState {
				// The distributed tracing extension's attribute names.
				props.User = append(props.User, UserProperty{k, v})
			} else {
				producer[k] = v
			}
		}
		if len(producer) > 0 {
			h, err := json.Marshal(producer)
			if err != nil {
				return Properties{}, fmt.Errorf("mqtt: event %s: headers: %w", m.EventID, err)
			}
			props.User = append(props.User, UserProperty{memberHeadersCE, string(h)})
		}
	} else {
		for k, v := range e.Headers {
			props.User = append(props.User, UserProperty{k, v})
		}
	}
	if len(props.ContentType) > MaxPropertyBytes {
		return Properties{}, wire.Refused(fmt.Errorf("mqtt: event %s: content type of %d bytes, above MQTT's %d", m.EventID, len(props.ContentType), MaxPropertyBytes))
	}
	for _, p := range props.User {
		if len(p.Key) > MaxPropertyBytes || len(p.Value) > MaxPropertyBytes {
			return Properties{}, wire.Refused(fmt.Errorf("mqtt: event %s: user property %.40q of %d+%d bytes: MQTT allows %d each for the name and the value",
				m.EventID, p.Key, len(p.Key), len(p.Value), MaxPropertyBytes))
		}
		if err := checkMQTTString(p.Value); err != "" {
			return Properties{}, wire.Refused(fmt.Errorf("mqtt: event %s: user property %.40q %s", m.EventID, p.Key, err))
		}
	}
	return props, nil
}

// checkMQTTString returns why s cannot be an MQTT UTF-8 string (section
// 1.5.4: valid UTF-8, no NUL), or "".
func checkMQTTString(s string) string {
	switch {
	case !utf8.ValidString(s):
		return "is not valid UTF-8"
	case strings.IndexByte(s, 0) >= 0:
		return "contains NUL"
	}
	return ""
}

// size is how many bytes the properties take in a PUBLISH packet, their
// length prefix included.
func (p *Properties) size() int {
	n := 4 // the properties' length, a variable byte integer of at most 4
	if p.ContentType != "" {
		n += 1 + 2 + len(p.ContentType)
	}
	for _, u := range p.User {
		n += 1 + 2 + len(u.Key) + 2 + len(u.Value)
	}
	return n
}

// decode5 takes apart a message received with MQTT 5 properties: the user
// properties are the headers (or the CloudEvents attributes, returned under
// the "ce-" names of wire's HTTP binding as Decode does for structured mode),
// the payload the body.
func decode5(payload []byte, props *Properties) (Decoded, error) {
	if len(props.User) > maxUserProperties {
		return Decoded{}, fmt.Errorf("%w: %d user properties, above %d", ErrNotEnvelope, len(props.User), maxUserProperties)
	}
	user := make(map[string]string, len(props.User))
	for _, u := range props.User {
		if _, dup := user[u.Key]; dup {
			return Decoded{}, fmt.Errorf("%w: user property %.64q repeated", ErrNotEnvelope, u.Key)
		}
		user[u.Key] = u.Value
	}
	d := Decoded{Headers: make(map[string]string, len(user)), Body: payload}
	_, outbox := user[wire.HeaderEventID]
	if _, ce := user[wire.CEAttrSpecVersion]; !ce || outbox {
		d.Headers = user
		return d, nil
	}
	for k, v := range user {
		switch k {
		case memberHeadersCE:
			var producer map[string]string
			if err := json.Unmarshal([]byte(v), &producer); err != nil {
				return Decoded{}, fmt.Errorf("%w: user property %q: %w", ErrNotEnvelope, k, err)
			}
			for name, hv := range producer {
				// An attribute's header name would pose as the attribute.
				if strings.HasPrefix(strings.ToLower(name), ceStructured.Prefix) {
					return Decoded{}, fmt.Errorf("%w: user property %q: header %.64q", ErrNotEnvelope, k, name)
				}
				d.Headers[name] = hv
			}
		case wire.HeaderTraceParent, wire.HeaderTraceState:
			d.Headers[k] = v
		default:
			d.Headers[ceStructured.Prefix+k] = v
		}
	}
	if _, ok := user[wire.CEAttrDataContentType]; !ok && props.ContentType != "" {
		d.Headers[ceStructured.Prefix+wire.CEAttrDataContentType] = props.ContentType
	}
	return d, nil
}
