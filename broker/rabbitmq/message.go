package rabbitmq

import (
	"fmt"
	"unicode/utf8"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/pgoutbox/pgoutbox/broker"
	"github.com/pgoutbox/pgoutbox/wire"
)

// maxShortstr is the longest AMQP short string: routing keys, header names,
// message ids and types are short strings.
const maxShortstr = 255

// validateRoutingKey checks that key can be sent as a routing key. AMQP carries
// it as a short string, which amqp091-go cannot encode beyond 255 bytes; invalid
// UTF-8 would travel, but no binding or non-Go consumer could name it. Dots,
// empty words, '*' and '#' are all legal in a published key (the wildcards only
// mean something in bindings), so they are not refused.
func validateRoutingKey(key string) error {
	if len(key) > maxShortstr {
		return fmt.Errorf("routing key of %d bytes is longer than AMQP's %d", len(key), maxShortstr)
	}
	if !utf8.ValidString(key) {
		return fmt.Errorf("routing key %q is not valid UTF-8", key)
	}
	return nil
}

// encode returns m as an AMQP message: persistent, with the event id as
// message_id, the event type as type, occurred_at as timestamp, and every wire
// header as a string header. Its errors are about the event and never change on
// a retry. format selects the format of the headers; the content-type property
// is the payload's (wire.Encoded.ContentType).
func encode(format wire.Encoding, m *broker.Message) (amqp.Publishing, error) {
	enc, err := format.Encode(m, wire.CloudEventsAMQP)
	if err != nil {
		return amqp.Publishing{}, err
	}
	if len(m.EventType) > maxShortstr {
		return amqp.Publishing{}, fmt.Errorf("event type of %d bytes is longer than AMQP's %d for the type property", len(m.EventType), maxShortstr)
	}
	headers := make(amqp.Table, enc.HeaderCount)
	for k, v := range enc.Headers {
		if len(k) > maxShortstr {
			return amqp.Publishing{}, fmt.Errorf("header name of %d bytes is longer than AMQP's %d", len(k), maxShortstr)
		}
		headers[k] = v
	}
	return amqp.Publishing{
		Headers:      headers,
		ContentType:  enc.ContentType,
		DeliveryMode: amqp.Persistent,
		MessageId:    m.EventID.String(),
		Timestamp:    m.OccurredAt,
		Type:         m.EventType,
		Body:         enc.Body,
	}, nil
}

// headerFrameSize is the size on the wire of the content header frame that
// carries p's properties. The frame cannot be split, and a server given a frame
// above the negotiated frame_max closes the whole connection (501 FRAME_ERROR),
// failing every message in flight, again on each retry: such a message must be
// refused before it is sent. Only the properties encode sets are counted.
func headerFrameSize(p *amqp.Publishing) int {
	n := 7 + 2 + 2 + 8 + 2 + 1 // frame header, class, weight, body size, flags, frame end
	n += 1 + len(p.ContentType)
	n++ // delivery mode
	n += 1 + len(p.MessageId)
	n += 8 // timestamp
	n += 1 + len(p.Type)
	n += 4 // table length
	for k, v := range p.Headers {
		s, _ := v.(string)
		n += 1 + len(k) + 1 + 4 + len(s) // name, type tag, length, value
	}
	return n
}
