// Package cetest checks, with the official CloudEvents Go SDK, what an adapter
// published in the CloudEvents format (wire.FormatCloudEvents): a
// binding.Message over received headers for the bindings whose SDK protocol
// packages target other client libraries or are not at hand (Kafka, AMQP,
// MQTT 5's user properties, with an empty prefix), and a check of every
// attribute of the decoded event against the outbox message.
package cetest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cloudevents/sdk-go/v2/binding"
	"github.com/cloudevents/sdk-go/v2/binding/spec"
	"github.com/cloudevents/sdk-go/v2/event"

	"github.com/pgoutbox/pgoutbox/broker"
	"github.com/pgoutbox/pgoutbox/wire"
)

// HeaderMessage is a binary-mode binding.Message read from string headers: the
// attributes are the headers starting with Prefix (compared without case),
// datacontenttype is ContentType.
type HeaderMessage struct {
	Headers     map[string]string
	Prefix      string
	ContentType string
	Body        []byte
}

var _ binding.Message = (*HeaderMessage)(nil)

// ReadEncoding implements binding.MessageReader.
func (m *HeaderMessage) ReadEncoding() binding.Encoding { return binding.EncodingBinary }

// ReadStructured implements binding.MessageReader: never structured.
func (m *HeaderMessage) ReadStructured(context.Context, binding.StructuredWriter) error {
	return binding.ErrNotStructured
}

// ReadBinary implements binding.MessageReader.
func (m *HeaderMessage) ReadBinary(_ context.Context, w binding.BinaryWriter) error {
	prefix := strings.ToLower(m.Prefix)
	specs := spec.WithPrefix(prefix)
	var version spec.Version
	for k, v := range m.Headers {
		if strings.EqualFold(k, prefix+"specversion") {
			version = specs.Version(v)
		}
	}
	if version == nil {
		return binding.ErrNotBinary
	}
	for _, k := range slices.Sorted(maps.Keys(m.Headers)) {
		lower := strings.ToLower(k)
		if !strings.HasPrefix(lower, prefix) {
			continue
		}
		var err error
		if attr := version.Attribute(lower); attr != nil {
			err = w.SetAttribute(attr, m.Headers[k])
		} else {
			err = w.SetExtension(strings.TrimPrefix(lower, prefix), m.Headers[k])
		}
		if err != nil {
			return err
		}
	}
	if m.ContentType != "" {
		if err := w.SetAttribute(version.AttributeFromKind(spec.DataContentType), m.ContentType); err != nil {
			return err
		}
	}
	return w.SetData(bytes.NewReader(m.Body))
}

// lookup returns the header named name, compared without case.
func (m *HeaderMessage) lookup(name string) string {
	for k, v := range m.Headers {
		if strings.EqualFold(k, name) {
			return v
		}
	}
	return ""
}

// GetAttribute implements binding.MessageMetadataReader.
func (m *HeaderMessage) GetAttribute(kind spec.Kind) (spec.Attribute, any) {
	prefix := strings.ToLower(m.Prefix)
	version := spec.WithPrefix(prefix).Version(m.lookup(prefix + "specversion"))
	if version == nil {
		return nil, nil
	}
	attr := version.AttributeFromKind(kind)
	if attr == nil {
		return nil, nil
	}
	if kind == spec.DataContentType && m.ContentType != "" {
		return attr, m.ContentType
	}
	if v := m.lookup(attr.PrefixedName()); v != "" {
		return attr, v
	}
	return nil, nil
}

// GetExtension implements binding.MessageMetadataReader.
func (m *HeaderMessage) GetExtension(name string) any {
	if v := m.lookup(m.Prefix + name); v != "" {
		return v
	}
	return nil
}

var _ binding.MessageMetadataReader = (*HeaderMessage)(nil)

// Finish implements binding.Message.
func (m *HeaderMessage) Finish(error) error { return nil }

// Decode decodes msg with binding.ToEvent and validates the event.
func Decode(t testing.TB, msg binding.Message) *event.Event {
	t.Helper()
	ev, err := binding.ToEvent(context.Background(), msg)
	if err != nil {
		t.Fatalf("CloudEvents SDK: binding.ToEvent: %v", err)
	}
	if err := ev.Validate(); err != nil {
		t.Fatalf("CloudEvents SDK: the event is not valid: %v", err)
	}
	return ev
}

// Check compares every attribute of ev, as the SDK decoded it, with what the
// relay published for m with the given source, and returns a one-line summary
// of the attributes seen for logs.
func Check(t testing.TB, ev *event.Event, m *broker.Message, source string) string {
	t.Helper()
	errs := Compare(ev, m, source)
	for _, err := range errs {
		t.Error(err)
	}
	return Summary(ev)
}

// Compare returns the differences between ev and m published with source.
func Compare(ev *event.Event, m *broker.Message, source string) []error {
	var errs []error
	eq := func(what, got, want string) {
		if got != want {
			errs = append(errs, fmt.Errorf("CloudEvent %s = %q, want %q", what, got, want))
		}
	}
	eq("specversion", ev.SpecVersion(), "1.0")
	eq("id", ev.ID(), m.EventID.String())
	eq("source", ev.Source(), source)
	eq("type", ev.Type(), m.EventType)
	eq("subject", ev.Subject(), m.AggregateType+"/"+m.AggregateID)
	eq("datacontenttype", ev.DataContentType(), "application/json")
	if !ev.Time().Equal(m.OccurredAt) {
		errs = append(errs, fmt.Errorf("CloudEvent time = %s, want %s", ev.Time().Format(time.RFC3339Nano), m.OccurredAt.Format(time.RFC3339Nano)))
	}
	want := map[string]string{
		wire.CEExtAggregateType: m.AggregateType,
		wire.CEExtAggregateID:   m.AggregateID,
		wire.CEExtSequence:      strconv.FormatInt(m.AggregateSequence, 10),
		wire.CEExtSchemaVersion: strconv.Itoa(m.SchemaVersion),
	}
	got := map[string]string{}
	for k, v := range ev.Extensions() {
		got[k] = fmt.Sprint(v)
	}
	if !maps.Equal(got, want) {
		errs = append(errs, fmt.Errorf("CloudEvent extensions = %v, want %v", got, want))
	}
	if !bytes.Equal(ev.Data(), m.Payload) {
		errs = append(errs, fmt.Errorf("CloudEvent data = %q, want the payload %q", ev.Data(), m.Payload))
	}
	if len(errs) == 0 && ev.DataSchema() != "" {
		errs = append(errs, errors.New("CloudEvent has a dataschema, want none"))
	}
	return errs
}

// Summary lists the attributes of ev on one line.
func Summary(ev *event.Event) string {
	var b strings.Builder
	fmt.Fprintf(&b, "specversion=%s id=%s source=%s type=%s subject=%s time=%s datacontenttype=%s",
		ev.SpecVersion(), ev.ID(), ev.Source(), ev.Type(), ev.Subject(), ev.Time().Format(time.RFC3339Nano), ev.DataContentType())
	for _, k := range slices.Sorted(maps.Keys(ev.Extensions())) {
		fmt.Fprintf(&b, " %s=%v", k, ev.Extensions()[k])
	}
	fmt.Fprintf(&b, " data=%s", ev.Data())
	return b.String()
}
