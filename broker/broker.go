// Package broker is the seam between the relay and a message broker.
//
// An adapter is a small package (broker/nats, broker/kafka, …) with a type that
// implements [Publisher]: a batch of messages in, one result per message out. The
// relay owns everything else — claiming, leases, retries, quarantine — so an adapter
// only has to publish, wait for the broker's acknowledgements, and classify errors:
//
//   - nil: the broker has durably accepted the message (an ack, a confirm, a 2xx).
//   - an error wrapped with [Permanent]: the broker refused this message and will
//     refuse it again (invalid subject, 4xx, message too large). The relay
//     quarantines the event at once.
//   - an error wrapped with [Unavailable]: the broker could not be reached or did not
//     answer. The event is retried with backoff for as long as it takes; it never
//     counts towards quarantine, so an outage does not turn into poison events.
//   - any other error: retried with backoff, quarantined after the relay's
//     max-attempts.
//
// The package brokertest holds the conformance suite every adapter must pass.
//
// The wire codec — the Outbox-* headers, the CloudEvents bindings, the content
// type, and parsing what a subscriber receives — lives in package wire: an
// adapter encodes each message with wire.Encoding.Encode and maps the result
// onto its transport. The codec's names that used to live here remain as
// deprecated aliases.
//
// Outside the standard library it pulls in only the root package's pgx and
// OpenTelemetry trace API: no broker client.
package broker

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/pgoutbox/pgoutbox"
	"github.com/pgoutbox/pgoutbox/wire"
)

// Message is one outbox event on its way to the broker. The type lives in
// package wire, beside the codec that writes it onto a transport and reads it
// back (wire.Message documents its fields); this is its name at the seam.
// Payload's media type is ContentType, empty meaning application/json
// (wire.DefaultContentType).
type Message = wire.Message

// CheckMessage returns why m must not be published, marked [Permanent], or nil:
// the checks of the Go API and outbox_enqueue (pgoutbox.CheckEventFields,
// pgoutbox.CheckHeaders, a sequence and a schema version of at least 1, a
// payload of at most pgoutbox.HardMaxPayloadBytes), for rows written around both
// by a raw INSERT (the table itself checks only the sequence: outbox migration
// 15). It is the one rule the polling relay and the CDC source apply before
// publishing (see [PublishValid]); every subscriber refuses the same sequence
// and schema version on receipt (wire.ParseReceived).
func CheckMessage(m *Message) error {
	if err := pgoutbox.CheckEventFields(m.AggregateType, m.AggregateID, m.EventType); err != nil {
		return Permanent(fmt.Errorf("broker: event %s refused before publishing: %w", m.EventID, err))
	}
	if m.AggregateSequence < 1 {
		return Permanent(fmt.Errorf("broker: event %s refused before publishing: aggregate sequence %d is below 1", m.EventID, m.AggregateSequence))
	}
	if m.SchemaVersion < 1 {
		return Permanent(fmt.Errorf("broker: event %s refused before publishing: schema version %d is below 1", m.EventID, m.SchemaVersion))
	}
	if err := pgoutbox.CheckHeaders(m.Headers); err != nil {
		return Permanent(fmt.Errorf("broker: event %s refused before publishing: headers: %w", m.EventID, err))
	}
	if len(m.Payload) > pgoutbox.HardMaxPayloadBytes {
		return Permanent(fmt.Errorf("broker: event %s refused before publishing: payload is %d bytes, above the hard maximum of %d",
			m.EventID, len(m.Payload), pgoutbox.HardMaxPayloadBytes))
	}
	return nil
}

// PublishValid publishes msgs through pub, except those that [CheckMessage]
// refuses or whose refused[i] is not nil (an event the caller could not even
// decode): those get that error, marked Permanent, and the later messages of
// their aggregate get ErrPredecessorFailed, as a failed publish would give them.
// refused may be nil. It returns one result per message, like Publisher.Publish.
func PublishValid(ctx context.Context, pub Publisher, msgs []Message, refused []error) []error {
	results := make([]error, len(msgs))
	var failed map[pgoutbox.Lane]bool
	send := make([]Message, 0, len(msgs))
	index := make([]int, 0, len(msgs))
	for i := range msgs {
		m := &msgs[i]
		k := m.Lane()
		if failed[k] {
			results[i] = ErrPredecessorFailed
			continue
		}
		var err error
		if i < len(refused) && refused[i] != nil {
			err = Permanent(refused[i])
		} else {
			err = CheckMessage(m)
		}
		if err != nil {
			results[i] = err
			if failed == nil {
				failed = map[pgoutbox.Lane]bool{}
			}
			failed[k] = true
			continue
		}
		send = append(send, *m)
		index = append(index, i)
	}
	if len(send) == 0 {
		return results
	}
	if len(send) == len(msgs) {
		return pub.Publish(ctx, msgs)
	}
	got := pub.Publish(ctx, send)
	if len(got) != len(send) {
		return got // the caller reports the wrong count
	}
	for j, i := range index {
		results[i] = got[j]
	}
	return results
}

// Publisher publishes batches of messages to one broker. Implementations must be
// safe for concurrent calls to Publish.
type Publisher interface {
	// Publish sends msgs and returns exactly len(msgs) results, results[i] for
	// msgs[i]: nil once the broker acknowledged the message, an error otherwise
	// (see the package doc for how errors are classified). It returns only when
	// every message has its result; when ctx ends first, every message without an
	// acknowledgement gets an error (ctx's, or ErrPredecessorFailed for a message
	// never sent).
	//
	// msgs holds, per aggregate, consecutive sequences in ascending order. The
	// adapter must never let message k+1 of an aggregate be published before k is
	// acknowledged, unless the broker provably keeps their order when k fails (none
	// of the shipped adapters relies on that: even Kafka's idempotent producer, as
	// franz-go implements it, can store k+1 without k after a failure). Once a
	// message fails, the later messages of its aggregate in msgs must not be
	// published: report ErrPredecessorFailed for them. [PublishLanes] implements
	// this for brokers with asynchronous acks.
	Publish(ctx context.Context, msgs []Message) []error

	// Close releases the broker connection. In-flight Publish calls fail.
	Close() error
}

// Pinger is implemented by publishers that can tell whether the broker is
// reachable, for readiness checks.
type Pinger interface {
	Ping(ctx context.Context) error
}

// FailAll returns one result per message of msgs, each err: the answer of a
// Publish that fails before it sends anything (an ended context, a closed
// publisher, a broker that is not connected).
func FailAll(msgs []Message, err error) []error {
	results := make([]error, len(msgs))
	for i := range results {
		results[i] = err
	}
	return results
}

// ErrPredecessorFailed is the result of a message that was not sent because an
// earlier message of its aggregate in the same batch failed. It is not an attempt:
// the relay releases the event without counting it.
var ErrPredecessorFailed = errors.New("broker: not sent: an earlier event of the aggregate failed")

type permanentError struct{ err error }

func (e permanentError) Error() string { return e.err.Error() }
func (e permanentError) Unwrap() error { return e.err }

// Permanent marks err as a refusal that retrying will not change.
func Permanent(err error) error {
	if err == nil {
		return nil
	}
	return permanentError{err}
}

// IsPermanent reports whether err, or an error it wraps, was marked with
// Permanent, or is the codec refusing a message (wire.Refused: a message that
// cannot be encoded never can).
func IsPermanent(err error) bool {
	var p permanentError
	return errors.As(err, &p) || wire.IsRefused(err)
}

type unavailableError struct{ err error }

func (e unavailableError) Error() string { return e.err.Error() }
func (e unavailableError) Unwrap() error { return e.err }

// Unavailable marks err as the broker being unreachable or silent: nothing is wrong
// with the message itself.
func Unavailable(err error) error {
	if err == nil {
		return nil
	}
	return unavailableError{err}
}

// IsUnavailable reports whether err, or an error it wraps, was marked with
// Unavailable, or is a context deadline (an unanswered publish).
func IsUnavailable(err error) bool {
	var u unavailableError
	return errors.As(err, &u) || errors.Is(err, context.DeadlineExceeded)
}

type misconfiguredError struct{ err error }

func (e misconfiguredError) Error() string { return e.err.Error() }
func (e misconfiguredError) Unwrap() error { return e.err }

// Misconfigured marks err as the broker refusing the publisher's configuration —
// credentials, a signing secret, a permission — rather than the message: a webhook's
// 401 or 403, say. It is Unavailable too (never quarantined, retried with the
// capped backoff, claiming paused), and the relay reports it as a configuration
// error: logged as such and failing readiness until a publish succeeds.
func Misconfigured(err error) error {
	if err == nil {
		return nil
	}
	return unavailableError{misconfiguredError{err}}
}

// IsMisconfigured reports whether err, or an error it wraps, was marked with
// Misconfigured.
func IsMisconfigured(err error) bool {
	var m misconfiguredError
	return errors.As(err, &m)
}

// AckFunc waits for the broker's answer to one asynchronous publish.
type AckFunc func(ctx context.Context) error

// PublishLanes publishes msgs through send, an asynchronous publish that returns at
// once with a way to wait for the broker's ack. Messages of different aggregates
// are all in flight together, and acks are awaited concurrently, so a slow ack
// holds back only its own aggregate. Within an aggregate, message k+1 is sent only
// after k's ack, so a failure cannot let k+1 overtake k. After a failure, the rest
// of that aggregate's messages get ErrPredecessorFailed. It returns one result per
// message, like Publisher.Publish.
//
// send may block (to bound the messages in flight, say) as long as the acks of
// earlier sends can still complete: each AckFunc is called from its own goroutine.
func PublishLanes(ctx context.Context, msgs []Message, send func(ctx context.Context, m *Message) (AckFunc, error)) []error {
	results := make([]error, len(msgs))
	lanes := laneIndexes(msgs)

	type outcome struct {
		lane, pos int
		err       error
	}
	done := make(chan outcome, len(msgs))
	inFlight := 0
	fail := func(lane, pos int, err error) {
		results[lanes[lane][pos]] = err
		for _, i := range lanes[lane][pos+1:] {
			results[i] = ErrPredecessorFailed
		}
	}
	start := func(lane, pos int) {
		if err := ctx.Err(); err != nil {
			fail(lane, pos, err)
			return
		}
		ack, err := send(ctx, &msgs[lanes[lane][pos]])
		if err != nil {
			fail(lane, pos, err)
			return
		}
		inFlight++
		go func() { done <- outcome{lane, pos, ack(ctx)} }()
	}
	for li := range lanes {
		start(li, 0)
	}
	for inFlight > 0 {
		o := <-done
		inFlight--
		if o.err != nil {
			fail(o.lane, o.pos, o.err)
			continue
		}
		results[lanes[o.lane][o.pos]] = nil
		if next := o.pos + 1; next < len(lanes[o.lane]) {
			start(o.lane, next)
		}
	}
	return results
}

// PublishLanesInOrder is [PublishLanes] for a broker that answers one connection's
// publishes in the order they were sent (NATS JetStream publishing into one
// stream): it waits for the acks oldest first, from the calling goroutine, so it
// needs no goroutine per message. The lane rule is the same: within an aggregate,
// message k+1 is sent only after k's ack; after a failure, the rest of that
// aggregate's messages get ErrPredecessorFailed. At most maxInFlight messages (at
// least one) await their ack at any time; send must not block waiting for the
// acks of this call.
//
// A slow ack delays the acks queued behind it, which suits a broker that answers
// in order anyway; use PublishLanes where acks of different aggregates complete
// independently.
func PublishLanesInOrder(ctx context.Context, msgs []Message, maxInFlight int, send func(ctx context.Context, m *Message) (AckFunc, error)) []error {
	results := make([]error, len(msgs))
	lanes := laneIndexes(msgs)
	type slot struct{ lane, pos int }
	fail := func(s slot, err error) {
		results[lanes[s.lane][s.pos]] = err
		for _, i := range lanes[s.lane][s.pos+1:] {
			results[i] = ErrPredecessorFailed
		}
	}
	ready := make([]slot, 0, len(lanes)) // FIFO of messages that may be sent now
	for li := range lanes {
		ready = append(ready, slot{li, 0})
	}
	type waiting struct {
		slot
		ack AckFunc
	}
	limit := max(maxInFlight, 1)
	inFlight := make([]waiting, 0, min(len(msgs), limit))
	for len(ready) > 0 || len(inFlight) > 0 {
		for len(ready) > 0 && len(inFlight) < limit {
			s := ready[0]
			ready = ready[1:]
			if err := ctx.Err(); err != nil {
				fail(s, err)
				continue
			}
			ack, err := send(ctx, &msgs[lanes[s.lane][s.pos]])
			if err != nil {
				fail(s, err)
				continue
			}
			inFlight = append(inFlight, waiting{s, ack})
		}
		if len(inFlight) == 0 {
			continue
		}
		w := inFlight[0]
		inFlight = inFlight[1:]
		if err := w.ack(ctx); err != nil {
			fail(w.slot, err)
			continue
		}
		results[lanes[w.lane][w.pos]] = nil
		if next := w.pos + 1; next < len(lanes[w.lane]) {
			ready = append(ready, slot{w.lane, next})
		}
	}
	return results
}

// laneIndexes groups the indexes of msgs by aggregate, lanes in first-appearance
// order and each lane in msgs' order.
func laneIndexes(msgs []Message) [][]int {
	index := map[pgoutbox.Lane]int{}
	var lanes [][]int
	for i := range msgs {
		k := msgs[i].Lane()
		li, ok := index[k]
		if !ok {
			li = len(lanes)
			index[k] = li
			lanes = append(lanes, nil)
		}
		lanes[li] = append(lanes[li], i)
	}
	return lanes
}

// Template expands a destination (a NATS subject, a Kafka topic, an AMQP routing
// key) from a message's fields. Placeholders: {aggregate_type}, {aggregate_id},
// {event_type}, {schema_version}, {tenant}. Other text is kept as is.
type Template struct {
	parts []tmplPart
	raw   string
}

type tmplPart struct {
	lit   string
	field string // "" for a literal
}

var templateFields = []string{"aggregate_type", "aggregate_id", "event_type", "schema_version", "tenant"}

// ParseTemplate parses s. Unknown or unclosed placeholders are errors.
func ParseTemplate(s string) (Template, error) {
	t := Template{raw: s}
	if s == "" {
		return t, errors.New("broker: empty destination template")
	}
	rest := s
	for rest != "" {
		open := strings.IndexByte(rest, '{')
		if open < 0 {
			t.parts = append(t.parts, tmplPart{lit: rest})
			break
		}
		if open > 0 {
			t.parts = append(t.parts, tmplPart{lit: rest[:open]})
		}
		end := strings.IndexByte(rest[open:], '}')
		if end < 0 {
			return Template{}, fmt.Errorf("broker: template %q: unclosed {", s)
		}
		name := rest[open+1 : open+end]
		known := false
		for _, f := range templateFields {
			known = known || f == name
		}
		if !known {
			return Template{}, fmt.Errorf("broker: template %q: unknown placeholder {%s} (want one of {%s})", s, name, strings.Join(templateFields, "}, {"))
		}
		if n := len(t.parts); n > 0 && t.parts[n-1].field != "" && t.parts[n-1].field != name {
			return Template{}, fmt.Errorf("broker: template %q: {%s} follows {%s} with nothing between: "+
				"their values could not be told apart (put a separator such as '.' between them)", s, name, t.parts[n-1].field)
		}
		t.parts = append(t.parts, tmplPart{field: name})
		rest = rest[open+end+1:]
	}
	return t, nil
}

// MustParseTemplate is ParseTemplate for constants; it panics on error.
func MustParseTemplate(s string) Template {
	t, err := ParseTemplate(s)
	if err != nil {
		panic(err)
	}
	return t
}

// String returns the template as written.
func (t Template) String() string { return t.raw }

// Uses reports whether t holds the placeholder {field}.
func (t Template) Uses(field string) bool {
	for _, p := range t.parts {
		if p.field == field {
			return true
		}
	}
	return false
}

// Expand returns the destination for m. Values are substituted as they are;
// publishers use [Template.ExpandChecked], which refuses a destination that
// another (aggregate type, event type, ...) could also produce.
func (t Template) Expand(m *Message) string {
	return t.ExpandFunc(func(field string) string { return fieldValue(m, field) })
}

// ExpandFunc expands t with each placeholder replaced by value(name), name being
// "aggregate_type", "aggregate_id", "event_type", "schema_version" or "tenant". Adapters use
// it to build the pattern of every destination t can produce.
func (t Template) ExpandFunc(value func(field string) string) string {
	var b strings.Builder
	for _, p := range t.parts {
		if p.field == "" {
			b.WriteString(p.lit)
		} else {
			b.WriteString(value(p.field))
		}
	}
	return b.String()
}

func fieldValue(m *Message, field string) string {
	switch field {
	case "aggregate_type":
		return m.AggregateType
	case "aggregate_id":
		return m.AggregateID
	case "event_type":
		return m.EventType
	case "schema_version":
		return strconv.Itoa(m.SchemaVersion)
	case "tenant":
		return m.Tenant
	}
	return ""
}

// ErrAmbiguousDestination is wrapped by the errors of [Template.ExpandChecked].
var ErrAmbiguousDestination = errors.New("the destination would be ambiguous")

// ExpandChecked returns the destination for m, like Expand, or an error
// wrapping ErrAmbiguousDestination when another message's values could produce
// the same destination: distinct (aggregate type, event type, ...) values never
// share a subject, topic or routing key silently.
//
// The rule keeps the expansion injective without changing any value: the
// destination is read back from the left, each placeholder's value ending where
// the literal text after it begins. So a value must be non-empty and must not
// contain the first character of the literal that follows its placeholder ("."
// in outbox.{aggregate_type}.{event_type}: aggregate type "a.b" with event type
// "c" is refused, while "a" with "b.c" is accepted, as "outbox.a.b.c" names
// one pair only). The value of the template's last placeholder may hold any
// character, as the literal after it (if any) is a fixed suffix. Adapters refuse
// such events permanently (they are quarantined with the reason), and their own
// rules (wildcards, allowed characters) still apply to the whole destination.
func (t Template) ExpandChecked(m *Message) (string, error) {
	last := -1
	for i, p := range t.parts {
		if p.field != "" {
			last = i
		}
	}
	var b strings.Builder
	for i, p := range t.parts {
		if p.field == "" {
			b.WriteString(p.lit)
			continue
		}
		v := fieldValue(m, p.field)
		if v == "" {
			return "", fmt.Errorf("broker: template %q: {%s} is empty: %w", t.raw, p.field, ErrAmbiguousDestination)
		}
		if i != last && t.parts[i+1].field == "" {
			// ParseTemplate keeps different placeholders apart, so a literal
			// follows unless the same placeholder does.
			sep, _ := utf8.DecodeRuneInString(t.parts[i+1].lit)
			if strings.ContainsRune(v, sep) {
				return "", fmt.Errorf("broker: template %q: {%s} %q contains %q, which separates it from the next placeholder: %w",
					t.raw, p.field, v, sep, ErrAmbiguousDestination)
			}
		}
		b.WriteString(v)
	}
	return b.String(), nil
}
