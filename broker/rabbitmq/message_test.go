package rabbitmq

import (
	"cmp"
	"context"
	"errors"
	"log/slog"
	"net"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"
	"unicode/utf8"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/pgoutbox/pgoutbox"
	"github.com/pgoutbox/pgoutbox/broker"
	"github.com/pgoutbox/pgoutbox/wire"
)

func testMessage() broker.Message {
	return broker.Message{
		EventID:           pgoutbox.NewEventID(),
		AggregateType:     "order",
		AggregateID:       "42",
		AggregateSequence: 3,
		EventType:         "created",
		SchemaVersion:     1,
		OccurredAt:        time.Date(2025, 3, 4, 5, 6, 7, 0, time.UTC),
		Payload:           []byte(`{"total":"9.50"}`),
		Headers:           map[string]string{wire.HeaderTraceParent: "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"},
	}
}

func TestEncode(t *testing.T) {
	t.Parallel()
	m := testMessage()
	p, err := encode(wire.Encoding{}, &m)
	if err != nil {
		t.Fatal(err)
	}
	if p.DeliveryMode != amqp.Persistent || p.ContentType != "application/json" || p.MessageId != m.EventID.String() ||
		p.Type != "created" || !p.Timestamp.Equal(m.OccurredAt) || string(p.Body) != string(m.Payload) {
		t.Errorf("encode = %+v", p)
	}
	if err := p.Headers.Validate(); err != nil {
		t.Errorf("headers: %v", err)
	}
	for k, v := range m.WireHeaders() {
		if p.Headers[k] != v {
			t.Errorf("header %s = %v, want %q", k, p.Headers[k], v)
		}
	}
	m.ContentType = "application/x-protobuf"
	if p, err := encode(wire.Encoding{}, &m); err != nil || p.ContentType != m.ContentType {
		t.Errorf("encode of a %s payload: content type %q, %v", m.ContentType, p.ContentType, err)
	}
}

func TestValidateRoutingKey(t *testing.T) {
	t.Parallel()
	for key, ok := range map[string]bool{
		"order.created":          true,
		"":                       true,
		"a..b":                   true,
		"ordre.été":              true,
		"order.*.#":              true, // literal in a published key
		strings.Repeat("k", 255): true,
		strings.Repeat("k", 256): false,
		strings.Repeat("é", 128): false, // 256 bytes
		"order.\xff":             false,
	} {
		if err := validateRoutingKey(key); (err == nil) != ok {
			t.Errorf("validateRoutingKey(%.20q…) = %v, want ok=%v", key, err, ok)
		}
	}
}

// FuzzRoutingKey checks, for events with any aggregate and event type, that
// what the publisher accepts can be sent as AMQP: a routing key and a type of
// at most 255 bytes, valid UTF-8 keys, and headers amqp091-go can encode.
func FuzzRoutingKey(f *testing.F) {
	for _, s := range [][2]string{{"order", "created"}, {"", ""}, {"a.b", "*"}, {strings.Repeat("x", 250), "created"}, {"\xff", "é"}, {"order", strings.Repeat("t", 256)}} {
		f.Add(s[0], s[1])
	}
	tmpl := broker.MustParseTemplate(DefaultRoutingKey)
	f.Fuzz(func(t *testing.T, aggType, eventType string) {
		m := testMessage()
		m.AggregateType, m.EventType = aggType, eventType
		key := tmpl.Expand(&m)
		if err := validateRoutingKey(key); err == nil {
			if len(key) > maxShortstr || !utf8.ValidString(key) {
				t.Fatalf("accepted routing key %q", key)
			}
		} else if len(key) <= maxShortstr && utf8.ValidString(key) {
			t.Fatalf("refused routing key %q: %v", key, err)
		}
		p, err := encode(wire.Encoding{}, &m)
		if (err == nil) != (len(eventType) <= maxShortstr) {
			t.Fatalf("encode with a %d-byte event type: %v", len(eventType), err)
		}
		if err == nil {
			if err := p.Headers.Validate(); err != nil {
				t.Fatalf("headers: %v", err)
			}
			if n := headerFrameSize(&p); n < 100 {
				t.Fatalf("header frame of %d bytes", n)
			}
		}
	})
}

func TestClassifyClose(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name                   string
		reason                 *amqp.Error
		unavailable, permanent bool
		tooLarge               int64
		says                   string
	}{
		{"closed by the client", nil, true, false, 0, "channel closed"},
		{"connection lost", &amqp.Error{Code: amqp.FrameError, Reason: "EOF"}, true, false, 0, "connection closed"},
		{"closed by an operator", &amqp.Error{Code: amqp.ConnectionForced, Reason: "CONNECTION_FORCED", Server: true}, true, false, 0, "connection closed"},
		{"exchange deleted", &amqp.Error{Code: amqp.NotFound, Reason: "NOT_FOUND - no exchange", Server: true, Recover: true}, true, false, 0, "channel closed"},
		{"no permission", &amqp.Error{Code: amqp.AccessRefused, Reason: "ACCESS_REFUSED", Server: true, Recover: true}, true, false, 0, "channel closed"},
		{"body too large", &amqp.Error{Code: amqp.PreconditionFailed, Reason: "PRECONDITION_FAILED - message size 200 is larger than configured max size 100", Server: true, Recover: true}, true, false, 200, "406"},
		{"other precondition", &amqp.Error{Code: amqp.PreconditionFailed, Reason: "PRECONDITION_FAILED - something", Server: true, Recover: true}, false, false, 0, "406"},
		{"protocol error", &amqp.Error{Code: amqp.UnexpectedFrame, Reason: "UNEXPECTED_FRAME", Server: true}, false, false, 0, "505"},
	} {
		err, tooLarge := classifyClose(c.reason)
		if broker.IsUnavailable(err) != c.unavailable || broker.IsPermanent(err) != c.permanent || tooLarge != c.tooLarge || !strings.Contains(err.Error(), c.says) {
			t.Errorf("%s: %v (too large: %d); want unavailable=%v permanent=%v too large=%d, saying %q",
				c.name, err, tooLarge, c.unavailable, c.permanent, c.tooLarge, c.says)
		}
	}
}

// newTestSession is a session on no channel, for the dispatcher's logic.
func newTestSession(confirms chan amqp.Confirmation, returns chan amqp.Return) *session {
	p := &Publisher{cfg: Config{Exchange: "outbox", ConfirmTimeout: time.Minute, MaxPending: 8, Logger: slog.New(slog.DiscardHandler)}}
	return &session{p: p, slots: make(chan struct{}, 8), confirms: confirms, returns: returns, dead: make(chan struct{})}
}

func (s *session) addPending(tag uint64, id string, size int) *pending {
	pd := &pending{tag: tag, eventID: id, key: "order.created", size: size, deadline: time.Now().Add(time.Minute), result: make(chan error, 1)}
	s.slots <- struct{}{}
	s.queue = append(s.queue, pd)
	return pd
}

// TestReturnBeforeConfirm checks that a return queued before its message's
// confirm always marks the message, however select picks between them.
func TestReturnBeforeConfirm(t *testing.T) {
	t.Parallel()
	for range 200 {
		confirms, returns := make(chan amqp.Confirmation, 4), make(chan amqp.Return, 4)
		s := newTestSession(confirms, returns)
		routed := s.addPending(1, "a", 1)
		unroutable := s.addPending(2, "b", 1)
		// As amqp091-go's reader delivers them: the return, then the confirms.
		returns <- amqp.Return{MessageId: "b", ReplyCode: 312, ReplyText: "NO_ROUTE"}
		confirms <- amqp.Confirmation{DeliveryTag: 1, Ack: true}
		confirms <- amqp.Confirmation{DeliveryTag: 2, Ack: true}
		close(confirms)
		close(returns)
		s.p.wg.Add(1)
		s.dispatch()
		if err := <-routed.result; err != nil {
			t.Fatalf("routed message: %v", err)
		}
		if err := <-unroutable.result; !errors.Is(err, ErrUnroutable) {
			t.Fatalf("returned message: %v, want ErrUnroutable", err)
		}
		if len(s.slots) != 0 {
			t.Fatalf("%d slots still taken", len(s.slots))
		}
	}
}

func TestBodyTooLargeFailsOnlyItsMessage(t *testing.T) {
	t.Parallel()
	s := newTestSession(nil, nil)
	small := s.addPending(1, "a", 100)
	big := s.addPending(2, "b", 200)
	after := s.addPending(3, "c", 300)
	s.fail(classifyClose(&amqp.Error{Code: amqp.PreconditionFailed, Reason: "PRECONDITION_FAILED - message size 200 is larger than configured max size 150", Server: true, Recover: true}))
	if err := <-big.result; !broker.IsPermanent(err) {
		t.Errorf("the body too large: %v, want permanent", err)
	}
	for _, pd := range []*pending{small, after} {
		if err := <-pd.result; !broker.IsUnavailable(err) {
			t.Errorf("message %s on the same channel: %v, want unavailable", pd.eventID, err)
		}
	}
	if len(s.slots) != 0 {
		t.Errorf("%d slots still taken", len(s.slots))
	}
}

// TestHeaderFrameSizeOnTheWire compares headerFrameSize with the bytes the
// client writes, and checks that a message whose header frame is exactly the
// frame size passes while one byte more is refused before it is sent.
func TestHeaderFrameSizeOnTheWire(t *testing.T) {
	t.Parallel()
	url := cmp.Or(os.Getenv("PGOUTBOX_TEST_AMQP_URL"), "amqp://guest:guest@127.0.0.1:5672/")
	conn, err := amqp.Dial(url)
	if err != nil {
		t.Fatalf("connect to the shared RabbitMQ server: %v", err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	ex := "pgotest-frame-" + pgoutbox.NewEventID().String()
	if err := ch.ExchangeDeclare(ex, amqp.ExchangeTopic, false, true, false, false, nil); err != nil {
		t.Fatal(err)
	}
	defer ch.ExchangeDelete(ex, false, false)
	q, err := ch.QueueDeclare("", false, true, true, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := ch.QueueBind(q.Name, "#", ex, false, nil); err != nil {
		t.Fatal(err)
	}

	var written atomic.Int64
	p, err := Dial(t.Context(), url, &Config{
		Exchange: ex,
		Logger:   slog.New(slog.DiscardHandler),
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			var d net.Dialer
			c, err := d.DialContext(ctx, network, addr)
			return countingConn{c, &written}, err
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	publish := func(m broker.Message) error {
		ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
		defer cancel()
		return p.Publish(ctx, []broker.Message{m})[0]
	}

	m := testMessage()
	msg, err := encode(wire.Encoding{}, &m)
	if err != nil {
		t.Fatal(err)
	}
	key := p.cfg.RoutingKey.Expand(&m)
	method := 7 + 2 + 2 + 2 + 1 + len(ex) + 1 + len(key) + 1 + 1
	body := 7 + len(m.Payload) + 1
	// The least of a few tries, in case a heartbeat slips in.
	got := int64(1 << 62)
	for range 3 {
		before := written.Load()
		if err := publish(m); err != nil {
			t.Fatal(err)
		}
		got = min(got, written.Load()-before)
	}
	if want := int64(method + headerFrameSize(&msg) + body); got != want {
		t.Fatalf("a publish wrote %d bytes, want %d (method %d, header %d, body %d)", got, want, method, headerFrameSize(&msg), body)
	}

	s, err := p.session()
	if err != nil {
		t.Fatal(err)
	}
	frameMax := s.link.frameMax
	pad := testMessage()
	pad.Headers["Pad"] = ""
	padMsg, _ := encode(wire.Encoding{}, &pad)
	pad.Headers["Pad"] = strings.Repeat("p", frameMax-headerFrameSize(&padMsg))
	if err := publish(pad); err != nil {
		t.Fatalf("header frame of exactly %d bytes: %v", frameMax, err)
	}
	pad.EventID = pgoutbox.NewEventID()
	pad.Headers["Pad"] += "p"
	if err := publish(pad); !broker.IsPermanent(err) {
		t.Fatalf("header frame of %d bytes: %v, want permanent", frameMax+1, err)
	}
	if err := publish(testMessage()); err != nil {
		t.Fatalf("the connection broke: %v", err)
	}
	if n, err := getCount(ch, q.Name); err != nil || n != 5 {
		t.Errorf("queue holds %d messages (%v), want 5", n, err)
	}
}

func getCount(ch *amqp.Channel, queue string) (int, error) {
	q, err := ch.QueueDeclarePassive(queue, false, true, true, false, nil)
	return q.Messages, err
}

type countingConn struct {
	net.Conn
	n *atomic.Int64
}

func (c countingConn) Write(b []byte) (int, error) {
	n, err := c.Conn.Write(b)
	c.n.Add(int64(n))
	return n, err
}
