package brokerotel_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"go.uber.org/goleak"

	"github.com/pgoutbox/pgoutbox"
	"github.com/pgoutbox/pgoutbox/broker"
	"github.com/pgoutbox/pgoutbox/broker/brokerotel"
	"github.com/pgoutbox/pgoutbox/inbox"
	"github.com/pgoutbox/pgoutbox/internal/pgtest"
	"github.com/pgoutbox/pgoutbox/internal/wait"
	"github.com/pgoutbox/pgoutbox/relay"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func quiet() *slog.Logger { return slog.New(slog.DiscardHandler) }

// capture acks everything except aggregate "bad", and keeps what it was sent.
type capture struct {
	mu   sync.Mutex
	msgs []broker.Message
}

func (c *capture) Publish(_ context.Context, msgs []broker.Message) []error {
	c.mu.Lock()
	defer c.mu.Unlock()
	res := make([]error, len(msgs))
	for i, m := range msgs {
		if m.AggregateID == "bad" {
			res[i] = broker.Permanent(errors.New("refused"))
			continue
		}
		c.msgs = append(c.msgs, m)
	}
	return res
}
func (c *capture) Close() error { return nil }
func (c *capture) sent() []broker.Message {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]broker.Message(nil), c.msgs...)
}

type pinging struct{ capture }

func (p *pinging) Ping(context.Context) error { return errors.New("pong") }

func traceparentOf(t *testing.T, h map[string]string) trace.SpanContext {
	t.Helper()
	ctx := propagation.TraceContext{}.Extract(context.Background(), propagation.MapCarrier(h))
	return trace.SpanContextFromContext(ctx)
}

// One trace from the producer's request to the consumer: a producer enqueues in a
// traced request, a relay publishes through the wrapper, a traced inbox consumer
// processes what the broker got. The publish span is a child of the producer's
// span (from the traceparent stored in the outbox row), the message carries the
// publish span, and the processing span is its child.
func TestPublishSpanJoinsTheProducersTrace(t *testing.T) {
	t.Parallel()
	pool, schema := pgtest.Migrated(t, 6)
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })

	prod, err := pgoutbox.NewProducer(&pgoutbox.Config{Schema: schema})
	pgtest.Must(t, err, "producer")
	reqCtx, reqSpan := tp.Tracer("app").Start(context.Background(), "POST /orders")
	_, err = prod.EnqueueTx(reqCtx, pool,
		pgoutbox.Event{AggregateType: "order", AggregateID: "7", EventType: "order.placed", Payload: 1},
		pgoutbox.Event{AggregateType: "order", AggregateID: "7", EventType: "order.paid", Payload: 2},
		pgoutbox.Event{AggregateType: "order", AggregateID: "bad", EventType: "order.placed", Payload: 3})
	pgtest.Must(t, err, "enqueue")
	reqSpan.End()
	_, err = prod.EnqueueTx(context.Background(), pool, // no trace context
		pgoutbox.Event{AggregateType: "order", AggregateID: "8", EventType: "order.placed", Payload: 4})
	pgtest.Must(t, err, "enqueue")
	producer := reqSpan.SpanContext()

	// The outbox row keeps the producer's context: that is what the relay reads.
	var stored map[string]string
	pgtest.Must(t, pool.QueryRow(context.Background(), "SELECT headers FROM "+pgx.Identifier{schema, "outbox_events"}.Sanitize()+
		" WHERE aggregate_id = '7' AND aggregate_sequence = 1").Scan(&stored), "read headers")
	if sc := traceparentOf(t, stored); sc.TraceID() != producer.TraceID() || sc.SpanID() != producer.SpanID() {
		t.Fatalf("stored traceparent %q is not the producer's span %s", stored["traceparent"], producer.SpanID())
	}

	inner := &capture{}
	pub, err := brokerotel.New(inner, &brokerotel.Config{TracerProvider: tp, System: "test",
		Destination: broker.MustParseTemplate("outbox.{aggregate_type}").Expand})
	pgtest.Must(t, err, "brokerotel.New")
	if _, ok := pub.(broker.Pinger); ok {
		t.Fatal("wrapper of a publisher without Ping implements broker.Pinger")
	}
	r, err := relay.New(pool, pub, &relay.Config{Schema: schema, Workers: 1, PollInterval: 50 * time.Millisecond, Logger: quiet()})
	pgtest.Must(t, err, "relay")
	pgtest.Must(t, r.Start(context.Background()), "start")
	wait.Forf(t, 30*time.Second, func() string { return fmt.Sprintf("3 published and 1 quarantined (relay stats %+v)", r.Stats()) }, func() bool {
		s := r.Stats()
		return s.Published >= 3 && s.Quarantined >= 1
	})
	sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	pgtest.Must(t, r.Stop(sctx), "stop")

	publish := map[string]sdktrace.ReadOnlySpan{} // by event id
	for _, s := range rec.Ended() {
		if s.SpanKind() != trace.SpanKindProducer {
			continue
		}
		for _, a := range s.Attributes() {
			if a.Key == "messaging.message.id" {
				publish[a.Value.AsString()] = s
			}
		}
	}
	if len(publish) != 4 {
		t.Fatalf("%d publish spans, want 4", len(publish))
	}
	sent := inner.sent()
	for _, m := range sent {
		s := publish[m.EventID.String()]
		onWire := traceparentOf(t, m.Headers)
		if onWire.SpanID() != s.SpanContext().SpanID() || onWire.TraceID() != s.SpanContext().TraceID() {
			t.Errorf("event %s went out with traceparent %q, not its publish span", m.EventID, m.Headers["traceparent"])
		}
		if s.Name() != "publish outbox.order" {
			t.Errorf("span name %q", s.Name())
		}
		switch m.AggregateID {
		case "7":
			if s.SpanContext().TraceID() != producer.TraceID() || s.Parent().SpanID() != producer.SpanID() {
				t.Errorf("publish span of %s#%d: trace %s parent %s, want a child of the producer's span %s/%s",
					m.AggregateID, m.AggregateSequence, s.SpanContext().TraceID(), s.Parent().SpanID(), producer.TraceID(), producer.SpanID())
			}
		case "8":
			if s.Parent().IsValid() || s.SpanContext().TraceID() == producer.TraceID() {
				t.Errorf("untraced event's publish span has parent %s", s.Parent().SpanID())
			}
		}
	}
	for id, s := range publish {
		if s.Status().Code == codes.Error {
			found := false
			for _, a := range s.Attributes() {
				found = found || (a.Key == "error.type" && a.Value.AsString() == "permanent")
			}
			if !found {
				t.Errorf("failed publish %s lacks error.type=permanent: %v", id, s.Attributes())
			}
		}
	}

	// The consumer continues the trace from the publish span.
	c, err := inbox.New(inbox.Pgx(pool), func(context.Context, pgx.Tx, inbox.Event) error { return nil },
		&inbox.Config{Name: "billing", Schema: schema, Logger: quiet(), Tracing: &inbox.Tracing{TracerProvider: tp}})
	pgtest.Must(t, err, "consumer")
	rec.Reset()
	for _, m := range sent {
		if m.AggregateID == "7" {
			if o := c.Process(context.Background(), inbox.DeliveryOf(m)); o.Status != inbox.StatusApplied {
				t.Fatalf("process: %s %v", o.Status, o.Err)
			}
		}
	}
	processed := rec.Ended()
	if len(processed) != 2 {
		t.Fatalf("%d processing spans, want 2", len(processed))
	}
	for _, s := range processed {
		var id string
		for _, a := range s.Attributes() {
			if a.Key == "messaging.message.id" {
				id = a.Value.AsString()
			}
		}
		if s.SpanContext().TraceID() != producer.TraceID() || s.Parent().SpanID() != publish[id].SpanContext().SpanID() {
			t.Errorf("processing span of %s: trace %s parent %s, want the publish span %s in the producer's trace",
				id, s.SpanContext().TraceID(), s.Parent().SpanID(), publish[id].SpanContext().SpanID())
		}
	}
}

// With LinkOnly the publish span starts its own trace, linked to the producer's
// span, and the message keeps the producer's headers. Ping passes through.
func TestLinkOnly(t *testing.T) {
	t.Parallel()
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	inner := &pinging{}
	pub, err := brokerotel.New(inner, &brokerotel.Config{TracerProvider: tp, LinkOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	if p, ok := pub.(broker.Pinger); !ok || p.Ping(context.Background()).Error() != "pong" {
		t.Fatal("Ping does not pass through")
	}
	const tp0 = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
	headers := map[string]string{"traceparent": tp0, "x": "y"}
	msg := broker.Message{EventID: pgoutbox.NewEventID(), AggregateType: "order", AggregateID: "1", AggregateSequence: 1,
		EventType: "order.placed", SchemaVersion: 1, Payload: []byte("{}"), Headers: headers}
	if res := pub.Publish(context.Background(), []broker.Message{msg}); res[0] != nil {
		t.Fatal(res[0])
	}
	if got := inner.sent()[0].Headers["traceparent"]; got != tp0 {
		t.Fatalf("LinkOnly rewrote traceparent to %q", got)
	}
	s := rec.Ended()[0]
	if s.Parent().IsValid() || s.SpanContext().TraceID().String() == "0af7651916cd43dd8448eb211c80319c" {
		t.Fatal("LinkOnly span joined the producer's trace")
	}
	if l := s.Links(); len(l) != 1 || l[0].SpanContext.SpanID().String() != "b7ad6b7169203331" {
		t.Fatalf("links %+v", l)
	}
	if s.Name() != "publish order" {
		t.Fatalf("default destination: span %q", s.Name())
	}
}

func TestConfigValidate(t *testing.T) {
	t.Parallel()
	var nilCfg *brokerotel.Config
	if err := nilCfg.Validate(); err != nil {
		t.Errorf("nil Config: %v", err)
	}
	if err := (&brokerotel.Config{System: "nats"}).Validate(); err != nil {
		t.Errorf("System nats: %v", err)
	}
	if _, err := brokerotel.New(&capture{}, &brokerotel.Config{System: "na\x00ts"}); err == nil || !strings.Contains(err.Error(), "Config.System") {
		t.Errorf("System with a NUL: %v", err)
	}
	if _, err := brokerotel.New(nil, nil); err == nil {
		t.Error("New(nil publisher): no error")
	}
}
