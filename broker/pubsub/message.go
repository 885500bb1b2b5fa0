package pubsub

import (
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/pgoutbox/pgoutbox/wire"
)

// ParseMessage rebuilds the event of a received Pub/Sub message (its data
// and attributes) in either format: the Outbox-* attributes, or a CloudEvents
// binary-mode message ("ce-" attributes, datacontenttype in Content-Type).
// Attribute names are matched without case, as the CloudEvents binding says.
// It refuses a message beyond Pub/Sub's limits, which a real subscription
// never delivers.
func ParseMessage(data []byte, attrs map[string]string) (wire.Message, error) {
	if len(data) > MaxMessageBytes {
		return wire.Message{}, fmt.Errorf("pubsub: message of %d bytes, above %d", len(data), MaxMessageBytes)
	}
	if len(attrs) > MaxAttributes {
		return wire.Message{}, fmt.Errorf("pubsub: message with %d attributes, above %d", len(attrs), MaxAttributes)
	}
	names := slices.Collect(maps.Keys(attrs))
	m, err := wire.ParseReceived(data, names, func(name string) string { return Attribute(attrs, name) })
	if err != nil {
		return wire.Message{}, fmt.Errorf("pubsub: %w", err)
	}
	return m, nil
}

// Attribute returns the attribute of attrs named name, compared without
// case when no key matches exactly, or "".
func Attribute(attrs map[string]string, name string) string {
	if v, ok := attrs[name]; ok {
		return v
	}
	for k, v := range attrs {
		if strings.EqualFold(k, name) {
			return v
		}
	}
	return ""
}
