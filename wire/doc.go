// Package wire is the codec between an outbox event and the bytes and headers
// that carry it through a broker: the one place that writes a message for a
// transport and reads it back.
//
// Publishers (broker/kafka, broker/nats, broker/rabbitmq, broker/webhook) call
// [Encoding.Encode] and map its [Encoded] headers, body and content type onto
// their transport; subscribers (inbox and its kafkainbox, natsinbox and
// rabbitinbox) call [ParseReceived] and [LaneHeaders]. Two formats exist:
//
//   - [FormatOutbox], the default: the outbox fields in the Outbox-* headers
//     ([HeaderEventID] and the rest; docs/design.md, "Wire headers").
//   - [FormatCloudEvents]: CloudEvents 1.0 in binary content mode, its
//     attributes in the headers of the transport's [CloudEventsBinding].
//
// Header names and the bytes they carry are public contract: a consumer in
// another language reads them.
//
// # Payload formats
//
// The body is the event's payload as the producer wrote it. Its media type is
// [Message.ContentType], empty meaning [DefaultContentType]
// (application/json), today's only payload format. The codec hands the type to
// the adapter ([Encoded.ContentType]), which sets the transport's own
// content-type field, and writes it into the CloudEvents datacontenttype. This
// is where other payload formats plug in: a message that carries another
// content type travels unchanged through every adapter; the decoders
// ([ParseReceived]) and the inbox accept JSON only until a format is added
// here.
//
// # Why a package of its own, and why here
//
// Both sides of the broker share the codec: publishers write with it, inbox
// subscribers read with it. It is a top-level package rather than broker/wire
// because a subscriber has no business with the publish seam, and package
// broker imports it, not the other way round: broker stays the seam (publish,
// acknowledge, classify), and broker.Message is an alias of [Message], the
// message the seam carries and the codec writes. broker keeps deprecated
// aliases of the names that moved here.
//
// Outside the standard library it pulls in only what the root package does: pgx
// and the OpenTelemetry trace API; no broker client.
package wire
