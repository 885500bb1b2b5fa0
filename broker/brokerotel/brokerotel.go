// Package brokerotel traces publishing with OpenTelemetry: it wraps a
// broker.Publisher so that every message gets a PRODUCER span, tied to the trace
// of the transaction that enqueued the event.
//
// The producer saved its trace context in the event's headers at enqueue time
// (traceparent, tracestate; see pgoutbox.Config.Propagator). The wrapper reads it
// back and, by default, starts the publish span as a child of the producer's span:
// the request that wrote the event, the relay's publish and (with inbox tracing)
// the consumer's processing then form one trace. The message goes out with the
// publish span's traceparent, so a consumer's span becomes its child.
//
// With Config.LinkOnly, publish spans start traces of their own that carry a
// link to the producer's span, and the message keeps the producer's headers.
//
// Messages without a trace context get a root span (subject to the sampler).
//
// Imports the OpenTelemetry API (otel with its global provider, which brings
// go-logr and go.opentelemetry.io/auto/sdk) beside the root package's pgx; no
// SDK and no exporter: the caller brings its TracerProvider.
package brokerotel

import (
	"context"
	"errors"
	"maps"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/pgoutbox/pgoutbox/broker"
	"github.com/pgoutbox/pgoutbox/internal/config"
)

// ScopeName is the instrumentation scope of the spans.
const ScopeName = "github.com/pgoutbox/pgoutbox/broker/brokerotel"

// Config configures the wrapper. A nil *Config means all defaults; each field
// documents its own.
type Config struct {
	// TracerProvider creates the tracer. Nil means otel.GetTracerProvider().
	TracerProvider trace.TracerProvider

	// Propagator reads the producer's trace context from the event headers and
	// writes the publish span's into the message. Nil means W3C Trace Context
	// (traceparent, tracestate), what the producer writes by default.
	Propagator propagation.TextMapPropagator

	// System is the messaging.system attribute: "nats", "kafka", "rabbitmq",
	// "webhook". Empty means none.
	System string

	// Destination names where a message goes (a subject, a topic), for the span
	// name and the messaging.destination.name attribute. Nil means the
	// aggregate type.
	Destination func(m *broker.Message) string

	// LinkOnly makes each publish span the root of a new trace, linked to the
	// producer's span, and leaves the message's trace headers as the producer
	// wrote them. False means publish spans join the producer's trace.
	LinkOnly bool
}

// Validate reports an invalid field of c, naming it. Every field has a usable
// zero value, so only a System that could not be an attribute value (not
// printable UTF-8) is refused; a nil c is valid.
func (c *Config) Validate() error {
	_, err := withDefaults(c)
	return err
}

// withDefaults returns a copy of cfg (nil means all defaults) with defaults
// applied, or the errors of Validate.
func withDefaults(cfg *Config) (Config, error) {
	return config.Resolve("brokerotel", cfg, func(c *Config) {
		if c.TracerProvider == nil {
			c.TracerProvider = otel.GetTracerProvider()
		}
		if c.Propagator == nil {
			c.Propagator = propagation.TraceContext{}
		}
		if c.Destination == nil {
			c.Destination = func(m *broker.Message) string { return m.AggregateType }
		}
	}, func(c *Config, p *config.Problems) {
		p.Check(utf8.ValidString(c.System) && !strings.ContainsFunc(c.System, func(r rune) bool { return !unicode.IsPrint(r) }),
			"Config.System (%q) must be printable UTF-8", c.System)
	})
}

// New wraps pub, configured by cfg (nil means all defaults). The result
// implements broker.Pinger when pub does.
func New(pub broker.Publisher, cfg *Config) (broker.Publisher, error) {
	if pub == nil {
		return nil, errors.New("brokerotel: New: nil publisher")
	}
	c, err := withDefaults(cfg)
	if err != nil {
		return nil, err
	}
	p := &publisher{inner: pub, cfg: c, tracer: c.TracerProvider.Tracer(ScopeName)}
	if pinger, ok := pub.(broker.Pinger); ok {
		return &pingingPublisher{publisher: p, pinger: pinger}, nil
	}
	return p, nil
}

type publisher struct {
	inner  broker.Publisher
	cfg    Config
	tracer trace.Tracer
}

type pingingPublisher struct {
	*publisher
	pinger broker.Pinger
}

// Ping implements broker.Pinger.
func (p *pingingPublisher) Ping(ctx context.Context) error { return p.pinger.Ping(ctx) }

// Publish starts one span per message, publishes the batch through the wrapped
// publisher, and ends each span with its message's result. Spans end when the
// whole batch has its results: broker.Publisher reports no per-message times.
func (p *publisher) Publish(ctx context.Context, msgs []broker.Message) []error {
	spans := make([]trace.Span, len(msgs))
	out := make([]broker.Message, len(msgs))
	for i := range msgs {
		m := &msgs[i]
		dest := p.cfg.Destination(m)
		producer := p.cfg.Propagator.Extract(context.Background(), propagation.MapCarrier(m.Headers))
		attrs := []attribute.KeyValue{
			attribute.String("messaging.operation.type", "send"),
			attribute.String("messaging.operation.name", "publish"),
			attribute.String("messaging.destination.name", dest),
			attribute.String("messaging.message.id", m.EventID.String()),
			attribute.Int("messaging.message.body.size", len(m.Payload)),
			attribute.String("pgoutbox.event_type", m.EventType),
			attribute.String("pgoutbox.aggregate_type", m.AggregateType),
			attribute.String("pgoutbox.aggregate_id", m.AggregateID),
			attribute.Int64("pgoutbox.aggregate_sequence", m.AggregateSequence),
		}
		if p.cfg.System != "" {
			attrs = append(attrs, attribute.String("messaging.system", p.cfg.System))
		}
		opts := []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindProducer), trace.WithAttributes(attrs...)}
		parent := ctx
		if sc := trace.SpanContextFromContext(producer); sc.IsValid() {
			if p.cfg.LinkOnly {
				opts = append(opts, trace.WithLinks(trace.Link{SpanContext: sc}), trace.WithNewRoot())
			} else {
				parent = trace.ContextWithRemoteSpanContext(ctx, sc)
			}
		}
		sctx, span := p.tracer.Start(parent, "publish "+dest, opts...)
		spans[i] = span
		out[i] = *m
		if !p.cfg.LinkOnly && span.SpanContext().IsValid() {
			// The consumer continues from the publish span. The relay's message is
			// not touched: a copy of its headers goes out.
			h := make(map[string]string, len(m.Headers)+2)
			maps.Copy(h, m.Headers)
			p.cfg.Propagator.Inject(sctx, propagation.MapCarrier(h))
			out[i].Headers = h
		}
	}
	results := p.inner.Publish(ctx, out)
	for i, span := range spans {
		var err error
		if i < len(results) {
			err = results[i]
		}
		switch {
		case err == nil && i < len(results):
		case errors.Is(err, broker.ErrPredecessorFailed):
			span.SetAttributes(attribute.Bool("pgoutbox.not_sent", true))
			span.SetStatus(codes.Error, "not sent: an earlier event of the aggregate failed")
		case err != nil:
			span.RecordError(err)
			span.SetAttributes(attribute.String("error.type", errorType(err)))
			span.SetStatus(codes.Error, err.Error())
		default:
			span.SetStatus(codes.Error, "publisher returned "+strconv.Itoa(len(results))+" results for "+strconv.Itoa(len(msgs))+" messages")
		}
		span.End()
	}
	return results
}

// errorType is the error.type attribute: the relay's failure class.
func errorType(err error) string {
	switch {
	case broker.IsPermanent(err):
		return "permanent"
	case broker.IsUnavailable(err):
		return "unavailable"
	}
	return "error"
}

// Close implements broker.Publisher.
func (p *publisher) Close() error { return p.inner.Close() }
