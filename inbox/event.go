package inbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/pgoutbox/pgoutbox"
	"github.com/pgoutbox/pgoutbox/broker"
	"github.com/pgoutbox/pgoutbox/wire"
)

// Event is a delivered outbox event, decoded from the wire headers and upcast to the
// newest payload shape the consumer knows (see [Config.Upcaster]).
type Event struct {
	// EventID is the event's id (Outbox-Event-Id): the same on every delivery, the
	// key of processed_events and the downstream idempotency key.
	EventID pgoutbox.UUID

	// AggregateType and AggregateID name the entity the event is about; its
	// events are applied in AggregateSequence order (see GapPolicy).
	AggregateType string
	AggregateID   string

	// AggregateSequence is the event's position in its aggregate's lane, from 1.
	AggregateSequence int64

	// EventType names what happened, e.g. "order.paid".
	EventType string

	// SchemaVersion is the version of Payload's shape after upcasting: the newest
	// version the upcaster knows for EventType, or the published version when there
	// is no upcaster.
	SchemaVersion int

	// PublishedSchemaVersion is the version the producer wrote (Outbox-Schema-Version).
	PublishedSchemaVersion int

	// OccurredAt is when the producer says the fact happened.
	OccurredAt time.Time

	// Headers are the producer's headers (traceparent, tracestate and any others);
	// the Outbox-* headers are in the fields above.
	Headers map[string]string

	// Payload is the event's JSON, after upcasting.
	Payload json.RawMessage
}

// Delivery is one message as a broker handed it over, in a broker-neutral form: what a
// subscriber passes to [Processor.Process].
type Delivery struct {
	// Body is the message body: the event's JSON payload.
	Body []byte

	// Headers are the message headers. Names are looked up exactly first, then
	// without regard to case (some brokers fold header names).
	Headers map[string]string

	// Attempt is the broker's delivery count for this message, 1 for the first
	// delivery; 0 means unknown and counts as 1. It only scales the retry delay.
	Attempt int
}

// DeliveryOf returns the delivery a broker would hand over for m: its wire headers
// and payload. Tests and in-process pipelines use it to call Process without a
// broker.
func DeliveryOf(m broker.Message) Delivery {
	return Delivery{Body: m.Payload, Headers: m.WireHeaders(), Attempt: 1}
}

// ErrUndecodable is matched (errors.Is) by the error of a delivery that is not an
// outbox event: an Outbox-* header is missing or malformed (the event id the nil
// UUID, a sequence or version below 1, a sequence above MaxSequence), or the body
// is not JSON.
// Such a message can never be processed; subscribers terminate it (no redelivery).
var ErrUndecodable = errors.New("inbox: undecodable delivery")

// MaxSequence is the highest aggregate sequence an inbox accepts: one below
// the largest bigint, so that the next expected sequence (position + 1) of every
// aggregate can be computed. No producer reaches it (outbox sequences count
// events one by one from 1); a delivery above it is hostile or corrupt, and
// taking it would leave the aggregate's position where nothing can follow it.
const MaxSequence = math.MaxInt64 - 1

// ErrSequenceOutOfRange is matched (errors.Is), together with ErrUndecodable, by
// the error of a delivery whose sequence is above MaxSequence, and by the error
// of SetPosition for such a sequence.
var ErrSequenceOutOfRange = errors.New("inbox: aggregate sequence out of range")

// Decode reads the event carried by d, without upcasting. Its errors match
// ErrUndecodable. d may be in the default format (Outbox-* headers) or a
// CloudEvents binary-mode message as the relay's --format cloudevents sends it
// (recognised by its specversion header: see [wire.ParseReceived] and
// docs/consumer.md, "CloudEvents").
func Decode(d Delivery) (Event, error) {
	names := slices.Sorted(maps.Keys(d.Headers))
	get := func(name string) string {
		if v, ok := d.Headers[name]; ok {
			return v
		}
		for _, k := range names {
			if strings.EqualFold(k, name) {
				return d.Headers[k]
			}
		}
		return ""
	}
	m, err := wire.ParseReceived(d.Body, names, get)
	if err != nil {
		return Event{}, fmt.Errorf("%w: %w", ErrUndecodable, err)
	}
	if m.EventID.IsZero() {
		return Event{}, fmt.Errorf("%w: header %s is the nil UUID", ErrUndecodable, wire.HeaderEventID)
	}
	if m.AggregateSequence > MaxSequence {
		return Event{}, fmt.Errorf("%w: event %s: %w: %d is above %d", ErrUndecodable, m.EventID,
			ErrSequenceOutOfRange, m.AggregateSequence, int64(MaxSequence))
	}
	if !json.Valid(d.Body) {
		return Event{}, fmt.Errorf("%w: event %s: body is not valid JSON", ErrUndecodable, m.EventID)
	}
	return Event{
		EventID:                m.EventID,
		AggregateType:          m.AggregateType,
		AggregateID:            m.AggregateID,
		AggregateSequence:      m.AggregateSequence,
		EventType:              m.EventType,
		SchemaVersion:          m.SchemaVersion,
		PublishedSchemaVersion: m.SchemaVersion,
		OccurredAt:             m.OccurredAt,
		Headers:                m.Headers,
		Payload:                json.RawMessage(m.Payload),
	}, nil
}

// UnmarshalPayload decodes ev's JSON payload into a T. Call it in a handler, after
// checking ev.EventType:
//
//	paid, err := inbox.UnmarshalPayload[OrderPaid](ev)
func UnmarshalPayload[T any](ev Event) (T, error) {
	var v T
	if err := json.Unmarshal(ev.Payload, &v); err != nil {
		return v, fmt.Errorf("inbox: event %s (%s v%d): decode payload as %T: %w",
			ev.EventID, ev.EventType, ev.SchemaVersion, v, err)
	}
	return v, nil
}

// HandleJSON adapts fn, which takes the payload decoded into a T, to a Handler. A
// payload that does not decode fails the delivery (it is retried, like any handler
// error): deploy a fix or an upcaster, and the retry succeeds.
func HandleJSON[TX, T any](fn func(ctx context.Context, tx TX, ev Event, payload T) error) Handler[TX] {
	return func(ctx context.Context, tx TX, ev Event) error {
		v, err := UnmarshalPayload[T](ev)
		if err != nil {
			return err
		}
		return fn(ctx, tx, ev, v)
	}
}

// IdempotencyKey returns the key a handler passes to a remote service (a payment
// provider, a mailer, a webhook) so that the service applies the call once however
// often it is made: the event id, the same on every delivery and on every retry of
// the consumer transaction.
//
// The inbox transaction cannot include the remote call: if the consumer crashes
// after the call and before its commit, the event is delivered again and the call is
// repeated. Only the remote side, deduplicating on this key, makes that harmless. A
// handler that makes several distinct calls to one service derives one key per call,
// e.g. IdempotencyKey(ev) + "/charge".
func IdempotencyKey(ev Event) string { return ev.EventID.String() }

type eventKey struct{}

// EventFromContext returns the event being processed when ctx is (derived from) the
// context a Handler received, so code deep in the call stack (an HTTP client
// middleware setting an Idempotency-Key header, say) can find it.
func EventFromContext(ctx context.Context) (Event, bool) {
	ev, ok := ctx.Value(eventKey{}).(Event)
	return ev, ok
}

// Upcaster brings a payload to the newest shape the consumer knows: given the event
// type, the published schema version and the payload, it returns the version and
// payload the handler should see. It returns its input unchanged for versions that
// are already current and for event types it does not know. An error fails the
// delivery, which is retried later (a consumer older than its producer can be
// upgraded meanwhile); it is not terminated.
//
// [Upcasters] builds one from per-version steps; any function with this signature
// works too.
type Upcaster func(eventType string, version int, payload []byte) (int, []byte, error)

// UpcastStep turns a payload of one version into the next version's shape.
type UpcastStep func(payload []byte) ([]byte, error)

// Upcasters is a registry of upcast steps, one per (event type, from-version). Its
// Upcast method, an [Upcaster], applies the steps from the published version
// upwards until no step is registered: a v1 payload goes through 1→2, 2→3, and so on,
// so each schema change adds one small step and old steps never change. The zero
// value is empty and ready to use; it must not be modified once in use.
type Upcasters struct {
	steps map[string]map[int]UpcastStep
}

// Register adds the step from version from to version from+1 of eventType and returns
// u for chaining. It panics if that step is already registered or from is below 1:
// both are programming errors.
func (u *Upcasters) Register(eventType string, from int, step UpcastStep) *Upcasters {
	if from < 1 || step == nil {
		panic(fmt.Sprintf("inbox: Upcasters.Register(%q, %d): need a version ≥ 1 and a step", eventType, from))
	}
	if u.steps == nil {
		u.steps = map[string]map[int]UpcastStep{}
	}
	if u.steps[eventType] == nil {
		u.steps[eventType] = map[int]UpcastStep{}
	}
	if _, dup := u.steps[eventType][from]; dup {
		panic(fmt.Sprintf("inbox: Upcasters.Register(%q, %d): step registered twice", eventType, from))
	}
	u.steps[eventType][from] = step
	return u
}

// Upcast applies the registered steps of eventType from version upwards; see
// [Upcaster].
func (u *Upcasters) Upcast(eventType string, version int, payload []byte) (int, []byte, error) {
	steps := u.steps[eventType]
	for {
		step, ok := steps[version]
		if !ok {
			return version, payload, nil
		}
		next, err := step(payload)
		if err != nil {
			return version, payload, fmt.Errorf("inbox: upcast %s from v%d to v%d: %w", eventType, version, version+1, err)
		}
		payload, version = next, version+1
	}
}

// UpcastJSON builds an UpcastStep from a typed conversion: the payload is decoded as
// From, converted, and encoded again.
func UpcastJSON[From, To any](convert func(From) (To, error)) UpcastStep {
	return func(payload []byte) ([]byte, error) {
		var in From
		if err := json.Unmarshal(payload, &in); err != nil {
			return nil, fmt.Errorf("decode as %T: %w", in, err)
		}
		out, err := convert(in)
		if err != nil {
			return nil, err
		}
		return json.Marshal(out)
	}
}
