package inbox

import (
	"context"
	"strings"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

// TracingScopeName is the instrumentation scope of the consumer's spans.
const TracingScopeName = "github.com/pgoutbox/pgoutbox/inbox"

// Tracing turns on OpenTelemetry tracing of deliveries (Config.Tracing): each
// Process call gets a CONSUMER span, "process <event type>", tied to the trace
// context the message carries (traceparent, tracestate): the producer's, or the
// relay's publish span when the relay traces too (package broker/brokerotel). The
// handler's ctx carries the span, so spans it starts (SQL, HTTP) nest under it.
// The zero value is ready to use.
type Tracing struct {
	// TracerProvider creates the tracer. Defaults to otel.GetTracerProvider().
	TracerProvider trace.TracerProvider

	// Propagator reads the trace context from the message headers. Defaults to
	// W3C Trace Context, what the producer and the relay write.
	Propagator propagation.TextMapPropagator

	// LinkOnly starts each processing span as the root of a new trace, linked to
	// the message's span, instead of as its child. Defaults to false.
	LinkOnly bool
}

type tracer struct {
	t        trace.Tracer
	prop     propagation.TextMapPropagator
	linkOnly bool
	consumer string
}

func newTracer(t *Tracing, consumer string) *tracer {
	if t == nil {
		return nil
	}
	tp, prop := t.TracerProvider, t.Propagator
	if tp == nil {
		tp = otel.GetTracerProvider()
	}
	if prop == nil {
		prop = propagation.TraceContext{}
	}
	return &tracer{t: tp.Tracer(TracingScopeName), prop: prop, linkOnly: t.LinkOnly, consumer: consumer}
}

// headerCarrier reads delivery headers as Decode does: exactly, then without
// regard to case (HTTP and AMQP peers fold names: "Traceparent").
type headerCarrier map[string]string

func (h headerCarrier) Get(key string) string {
	if v, ok := h[key]; ok {
		return v
	}
	for k, v := range h {
		if strings.EqualFold(k, key) {
			return v
		}
	}
	return ""
}
func (h headerCarrier) Set(string, string) {}
func (h headerCarrier) Keys() []string {
	keys := make([]string, 0, len(h))
	for k := range h {
		keys = append(keys, k)
	}
	return keys
}

// start begins the span of one delivery.
func (t *tracer) start(ctx context.Context, d *Delivery) (context.Context, trace.Span) {
	opts := []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindConsumer), trace.WithAttributes(
		attribute.String("messaging.operation.type", "process"),
		attribute.String("messaging.consumer.group.name", t.consumer),
	)}
	parent := ctx
	if sc := trace.SpanContextFromContext(t.prop.Extract(context.Background(), headerCarrier(d.Headers))); sc.IsValid() {
		if t.linkOnly {
			opts = append(opts, trace.WithLinks(trace.Link{SpanContext: sc}), trace.WithNewRoot())
		} else {
			parent = trace.ContextWithRemoteSpanContext(ctx, sc)
		}
	}
	return t.t.Start(parent, "process", opts...)
}

// end records the outcome on the span and ends it.
func (t *tracer) end(span trace.Span, o *Outcome) {
	if o.Status != StatusUndecodable {
		ev := &o.Event
		span.SetName("process " + ev.EventType)
		span.SetAttributes(
			attribute.String("messaging.message.id", ev.EventID.String()),
			attribute.String("pgoutbox.event_type", ev.EventType),
			attribute.String("pgoutbox.aggregate_type", ev.AggregateType),
			attribute.String("pgoutbox.aggregate_id", ev.AggregateID),
			attribute.Int64("pgoutbox.aggregate_sequence", ev.AggregateSequence),
		)
	}
	span.SetAttributes(attribute.String("pgoutbox.outcome", o.Status.String()))
	switch o.Status {
	case StatusFailed, StatusUndecodable:
		span.RecordError(o.Err)
		span.SetStatus(codes.Error, o.Err.Error())
	}
	span.End()
}
