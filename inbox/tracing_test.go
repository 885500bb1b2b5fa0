package inbox_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/pgoutbox/pgoutbox/inbox"
	"github.com/pgoutbox/pgoutbox/internal/pgtest"
)

// With Config.Tracing, each delivery gets a CONSUMER span: a child of the span in
// the message's traceparent (whatever case the broker gave the header name), or
// with LinkOnly a new trace linked to it. The handler's ctx carries the span.
func TestProcessingSpans(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 4)
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })

	const traceID, spanID = "0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331"
	for _, linkOnly := range []bool{false, true} {
		rec.Reset()
		var inHandler trace.SpanContext
		c, err := inbox.New(inbox.Pgx(f.pool), func(ctx context.Context, tx pgx.Tx, ev inbox.Event) error {
			inHandler = trace.SpanContextFromContext(ctx)
			return nil
		}, &inbox.Config{Name: "traced", Schema: f.schema, Logger: quiet,
			Tracing: &inbox.Tracing{TracerProvider: tp, LinkOnly: linkOnly}})
		pgtest.Must(t, err, "inbox.New")

		m := event("t", 1)
		if linkOnly {
			m = event("u", 1)
		}
		d := inbox.DeliveryOf(m)
		delete(d.Headers, "traceparent")
		d.Headers["Traceparent"] = "00-" + traceID + "-" + spanID + "-01" // folded by an HTTP or AMQP peer
		if o := c.Process(context.Background(), d); o.Status != inbox.StatusApplied {
			t.Fatalf("process: %s %v", o.Status, o.Err)
		}
		undecodable := inbox.DeliveryOf(m)
		delete(undecodable.Headers, "Outbox-Event-Id")
		c.Process(context.Background(), undecodable)

		spans := rec.Ended()
		if len(spans) != 2 {
			t.Fatalf("linkOnly=%v: %d spans, want 2", linkOnly, len(spans))
		}
		s := spans[0]
		if s.Name() != "process order.updated" || s.SpanKind() != trace.SpanKindConsumer {
			t.Errorf("span %q kind %v", s.Name(), s.SpanKind())
		}
		if inHandler.SpanID() != s.SpanContext().SpanID() {
			t.Errorf("handler ctx carries span %s, want the processing span %s", inHandler.SpanID(), s.SpanContext().SpanID())
		}
		if !linkOnly {
			if s.SpanContext().TraceID().String() != traceID || s.Parent().SpanID().String() != spanID || !s.Parent().IsRemote() {
				t.Errorf("span is not a child of the message's span: trace %s parent %s", s.SpanContext().TraceID(), s.Parent().SpanID())
			}
		} else {
			if s.SpanContext().TraceID().String() == traceID || s.Parent().IsValid() {
				t.Errorf("LinkOnly span joined the message's trace")
			}
			if l := s.Links(); len(l) != 1 || l[0].SpanContext.TraceID().String() != traceID || l[0].SpanContext.SpanID().String() != spanID {
				t.Errorf("links %+v", l)
			}
		}
		found := false
		for _, a := range s.Attributes() {
			found = found || (string(a.Key) == "messaging.message.id" && a.Value.AsString() == m.EventID.String())
		}
		if !found {
			t.Errorf("no messaging.message.id attribute: %v", s.Attributes())
		}
		if spans[1].Status().Code != codes.Error {
			t.Errorf("undecodable delivery's span status %v", spans[1].Status())
		}
	}
}
