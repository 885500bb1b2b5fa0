package broker

import "github.com/pgoutbox/pgoutbox/wire"

// The codec's names, moved to package wire. Each is the same constant, type,
// variable or function under its old name, so that code written against them
// keeps compiling.

// Wire header names (docs/design.md, "Wire headers").
const (
	// Deprecated: use wire.HeaderEventID.
	HeaderEventID = wire.HeaderEventID
	// Deprecated: use wire.HeaderEventType.
	HeaderEventType = wire.HeaderEventType
	// Deprecated: use wire.HeaderAggregateType.
	HeaderAggregateType = wire.HeaderAggregateType
	// Deprecated: use wire.HeaderAggregateID.
	HeaderAggregateID = wire.HeaderAggregateID
	// Deprecated: use wire.HeaderAggregateSequence.
	HeaderAggregateSequence = wire.HeaderAggregateSequence
	// Deprecated: use wire.HeaderSchemaVersion.
	HeaderSchemaVersion = wire.HeaderSchemaVersion
	// Deprecated: use wire.HeaderOccurredAt.
	HeaderOccurredAt = wire.HeaderOccurredAt
	// Deprecated: use wire.HeaderTraceParent.
	HeaderTraceParent = wire.HeaderTraceParent
	// Deprecated: use wire.HeaderTraceState.
	HeaderTraceState = wire.HeaderTraceState
)

// ParseWireHeaders rebuilds a Message from a message received in the default
// format.
//
// Deprecated: use wire.ParseOutboxHeaders.
func ParseWireHeaders(body []byte, names []string, get func(name string) string) (Message, error) {
	return wire.ParseOutboxHeaders(body, names, get)
}

// Format is how a message's outbox fields travel on the wire.
//
// Deprecated: use wire.Format.
type Format = wire.Format

// Formats and their names.
const (
	// Deprecated: use wire.FormatOutbox.
	FormatOutbox = wire.FormatOutbox
	// Deprecated: use wire.FormatCloudEvents.
	FormatCloudEvents = wire.FormatCloudEvents
	// Deprecated: use wire.FormatNameOutbox.
	FormatNameOutbox = wire.FormatNameOutbox
	// Deprecated: use wire.FormatNameCloudEvents.
	FormatNameCloudEvents = wire.FormatNameCloudEvents
)

// ParseFormat returns the format named s.
//
// Deprecated: use wire.ParseFormat.
func ParseFormat(s string) (Format, error) { return wire.ParseFormat(s) }

// CloudEvents attribute names and values.
const (
	// Deprecated: use wire.CloudEventsSpecVersion.
	CloudEventsSpecVersion = wire.CloudEventsSpecVersion
	// CloudEventsContentType is the datacontenttype of a message whose
	// ContentType is empty.
	//
	// Deprecated: use wire.DefaultContentType, or Message.ContentTypeOrDefault.
	CloudEventsContentType = wire.DefaultContentType
	// Deprecated: use wire.CEAttrID.
	CEAttrID = wire.CEAttrID
	// Deprecated: use wire.CEAttrSource.
	CEAttrSource = wire.CEAttrSource
	// Deprecated: use wire.CEAttrType.
	CEAttrType = wire.CEAttrType
	// Deprecated: use wire.CEAttrSubject.
	CEAttrSubject = wire.CEAttrSubject
	// Deprecated: use wire.CEAttrTime.
	CEAttrTime = wire.CEAttrTime
	// Deprecated: use wire.CEAttrSpecVersion.
	CEAttrSpecVersion = wire.CEAttrSpecVersion
	// Deprecated: use wire.CEAttrDataContentType.
	CEAttrDataContentType = wire.CEAttrDataContentType
	// Deprecated: use wire.CEExtAggregateType.
	CEExtAggregateType = wire.CEExtAggregateType
	// Deprecated: use wire.CEExtAggregateID.
	CEExtAggregateID = wire.CEExtAggregateID
	// Deprecated: use wire.CEExtSequence.
	CEExtSequence = wire.CEExtSequence
	// Deprecated: use wire.CEExtSchemaVersion.
	CEExtSchemaVersion = wire.CEExtSchemaVersion
	// Deprecated: use wire.DefaultCloudEventsSource.
	DefaultCloudEventsSource = wire.DefaultCloudEventsSource
)

// CloudEventsBinding names the headers of one CloudEvents protocol binding.
//
// Deprecated: use wire.CloudEventsBinding.
type CloudEventsBinding = wire.CloudEventsBinding

// The CloudEvents protocol bindings of the shipped adapters.
var (
	// Deprecated: use wire.CloudEventsHTTP.
	CloudEventsHTTP = wire.CloudEventsHTTP
	// Deprecated: use wire.CloudEventsNATS.
	CloudEventsNATS = wire.CloudEventsNATS
	// Deprecated: use wire.CloudEventsKafka.
	CloudEventsKafka = wire.CloudEventsKafka
	// Deprecated: use wire.CloudEventsAMQP.
	CloudEventsAMQP = wire.CloudEventsAMQP
)

// Encoding is the wire format an adapter writes.
//
// Deprecated: use wire.Encoding.
type Encoding = wire.Encoding

// CheckCloudEventsSource reports why s cannot be a source attribute.
//
// Deprecated: use wire.CheckCloudEventsSource.
func CheckCloudEventsSource(s string) error { return wire.CheckCloudEventsSource(s) }

// CloudEventsPrefix returns the attribute prefix of a CloudEvents binary-mode
// message.
//
// Deprecated: use wire.CloudEventsPrefix.
func CloudEventsPrefix(get func(name string) string) (string, bool) {
	return wire.CloudEventsPrefix(get)
}

// LaneHeaders returns the aggregate type and id of a received message.
//
// Deprecated: use wire.LaneHeaders.
func LaneHeaders(get func(name string) string) (aggregateType, aggregateID string) {
	return wire.LaneHeaders(get)
}

// ParseCloudEvent rebuilds a Message from a CloudEvents binary-mode message.
//
// Deprecated: use wire.ParseCloudEvent.
func ParseCloudEvent(body []byte, names []string, get func(name string) string) (Message, error) {
	return wire.ParseCloudEvent(body, names, get)
}

// ParseReceived rebuilds a Message from a received message in either format.
//
// Deprecated: use wire.ParseReceived.
func ParseReceived(body []byte, names []string, get func(name string) string) (Message, error) {
	return wire.ParseReceived(body, names, get)
}
