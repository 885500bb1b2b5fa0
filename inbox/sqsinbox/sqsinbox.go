// Package sqsinbox feeds outbox events from an Amazon SQS FIFO queue to an
// inbox consumer.
//
// A Subscriber long-polls one queue (ReceiveMessage with
// [Config.WaitTime], up to [Config.MaxMessages] a call), hands each message to
// an [inbox.Processor] — normally an *inbox.Consumer — and settles it by the
// outcome, only after the consumer transaction has ended:
//
//	applied, duplicate   DeleteMessage, after the commit
//	gap-rejected, failed ChangeMessageVisibility to the outcome's retry
//	                     delay (whole seconds, rounded up): SQS redelivers it then
//	undecodable          DeleteMessage, logged as an error: never redelivered
//
// The visibility timeout ([Config.VisibilityTimeout]) is the lease: a received
// message is hidden from every other consumer until it ends, and the
// Subscriber extends it while it holds the message (queued or in process). A
// crash between commit and delete leaves the message to reappear after the
// visibility timeout, and the inbox finds it applied.
//
// # Order
//
// The relay's publisher (package broker/aws/sqs) sets each aggregate as the
// MessageGroupId. A FIFO queue delivers a group's messages in order and holds
// the group while one of them is in flight. Within one Subscriber, messages of
// one aggregate are processed one at a time in arrival order, up to
// Config.Concurrency aggregates in parallel. When one message of a group is
// handed back for a retry, the messages of that group received with it are
// handed back too, unprocessed, so that SQS delivers the group again from the
// one that failed: a group is never applied out of order. Across instances
// the inbox's per-aggregate position keeps the order (inbox.GapReject).
//
// # Wire format and trust
//
// Messages are read in either format of broker/aws/sqs. In the default one
// the Outbox-* String attributes and the producer's headers in its
// Outbox-Headers attribute ([sqs.Headers]) are the headers and the body is
// the payload; in the CloudEvents format the body is a structured-mode JSON
// CloudEvent, whose attributes the subscriber hands the inbox as the HTTP
// binding's ce- headers. Everything in a message is untrusted: the inbox
// decodes and checks it (wire.ParseReceived), and a message that is not an
// outbox event is deleted and logged as undecodable, as every subscriber
// terminates poison.
//
// Credentials and the endpoint are the caller's: New takes an SQS client,
// normally built from config.LoadDefaultConfig (environment, shared files,
// instance role); for an emulator set aws.Config.BaseEndpoint. The package
// never reads credentials itself.
//
// Outside the standard library it pulls in aws-sdk-go-v2 (its SQS client) and
// smithy-go, the adapter broker/aws/sqs (its attribute layout), and what
// package inbox pulls in (pgx, the OpenTelemetry API).
package sqsinbox

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awssqs "github.com/aws/aws-sdk-go-v2/service/sqs"
	sqstypes "github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/pgoutbox/pgoutbox"
	"github.com/pgoutbox/pgoutbox/broker/aws/sqs"
	"github.com/pgoutbox/pgoutbox/inbox"
	"github.com/pgoutbox/pgoutbox/inbox/internal/subscriber"
	"github.com/pgoutbox/pgoutbox/internal/config"
	"github.com/pgoutbox/pgoutbox/wire"
)

// The defaults of Config's fields.
const (
	DefaultConcurrency       = subscriber.DefaultConcurrency
	DefaultWaitTime          = 10 * time.Second
	DefaultMaxMessages       = 10
	DefaultVisibilityTimeout = 30 * time.Second
)

// SQS's own bounds.
const (
	maxWaitTime   = 20 * time.Second
	maxVisibility = 12 * time.Hour
	maxBatch      = 10 // entries of one ChangeMessageVisibilityBatch, messages of one receive
)

// settleTimeout bounds one settling call; it runs after the transaction
// ended, even during a hard stop.
const settleTimeout = 30 * time.Second

// Config configures a Subscriber. A nil *Config is invalid: Queue is required.
type Config struct {
	// Queue is the queue's URL (https://… or http://…) or its name (looked up
	// with GetQueueUrl at Start). Required.
	Queue string

	// AllowStandard accepts a standard (non-FIFO) queue, which keeps no order:
	// the inbox's positions then reject what arrives early (inbox.GapReject)
	// until its predecessor came. False (the default) refuses it at Start.
	AllowStandard bool

	// WaitTime is how long one ReceiveMessage waits for messages (long
	// polling); it bounds a graceful Stop's wait for the receive in progress,
	// whose messages are then handed back. Zero means DefaultWaitTime (10 s);
	// at most 20 s, whole seconds.
	WaitTime time.Duration

	// MaxMessages is the most messages one receive returns. Zero means
	// DefaultMaxMessages (10, SQS's maximum).
	MaxMessages int

	// VisibilityTimeout is the lease of a received message: how long it stays
	// hidden from other consumers, extended while the Subscriber holds it. It
	// is the delay before a message whose holder crashed is redelivered.
	// Zero means DefaultVisibilityTimeout (30 s); whole seconds, 3 s..12 h.
	VisibilityTimeout time.Duration

	// Concurrency bounds the deliveries in progress at once, one consumer
	// transaction each; one aggregate's deliveries never overlap. Zero means
	// DefaultConcurrency (4).
	Concurrency int

	// Prefetch bounds the messages received and not yet settled. Zero means
	// the larger of MaxMessages and 2 × Concurrency.
	Prefetch int

	// ProcessTimeout is the deadline of each delivery's processing, the
	// handler and its transaction together. Zero means VisibilityTimeout.
	ProcessTimeout time.Duration

	// Logger receives undecodable messages, receive and settling errors. Nil
	// means slog.Default().
	Logger *slog.Logger
}

// Validate reports what New would reject in c, each error naming its field,
// several joined with errors.Join.
func (c *Config) Validate() error {
	_, err := c.withDefaults()
	return err
}

func (c *Config) withDefaults() (Config, error) {
	return subscriber.Resolve("sqsinbox", c, shared, func(out *Config) {
		config.Default(&out.WaitTime, DefaultWaitTime)
		config.Default(&out.MaxMessages, DefaultMaxMessages)
		config.Default(&out.VisibilityTimeout, DefaultVisibilityTimeout)
		config.Default(&out.Prefetch, max(out.MaxMessages, 2*out.Concurrency))
		config.Default(&out.ProcessTimeout, out.VisibilityTimeout)
	}, func(out *Config, p *config.Problems) {
		p.Check(validQueue(out.Queue), "Config.Queue %.64q: required, a queue URL or name, printable, at most 1024 bytes", out.Queue)
		p.Check(out.WaitTime >= time.Second && out.WaitTime <= maxWaitTime && out.WaitTime%time.Second == 0,
			"Config.WaitTime %s: want whole seconds, 1s..20s", out.WaitTime)
		p.Check(out.MaxMessages >= 1 && out.MaxMessages <= maxBatch, "Config.MaxMessages %d: want 1..10", out.MaxMessages)
		p.Check(out.VisibilityTimeout >= 3*time.Second && out.VisibilityTimeout <= maxVisibility && out.VisibilityTimeout%time.Second == 0,
			"Config.VisibilityTimeout %s: want whole seconds, 3s..12h", out.VisibilityTimeout)
		p.Check(out.Prefetch >= out.MaxMessages, "Config.Prefetch %d: want at least Config.MaxMessages", out.Prefetch)
		p.Check(out.ProcessTimeout > 0, "Config.ProcessTimeout %s: must be positive", out.ProcessTimeout)
	})
}

func shared(c *Config) subscriber.Shared {
	return subscriber.Shared{Concurrency: &c.Concurrency, Logger: &c.Logger}
}

func validQueue(s string) bool {
	return s != "" && len(s) <= 1024 && !strings.ContainsFunc(s, func(r rune) bool { return r <= ' ' || r == 0x7f })
}

// Stats are a Subscriber's counters since Start.
type Stats struct {
	Deleted     int64 // messages deleted after being applied or found applied
	Retried     int64 // messages handed back for a retry after a delay (gap, failure)
	HeldBack    int64 // messages handed back unprocessed behind a retried one of their group
	Undecodable int64 // messages that are not outbox events, deleted and logged
	Released    int64 // messages received but not processed when the Subscriber stopped, handed back at once
}

// message is one received message, decoded once at receipt, with the state
// its group shares within the receive that returned it.
type message struct {
	sqstypes.Message
	d   inbox.Delivery // what the inbox reads, unless err
	err error          // why the message is undecodable
	run *groupRun
}

// groupRun is one group's messages of one receive: once one is handed back
// for a retry, the later ones are handed back unprocessed.
type groupRun struct{ failed atomic.Bool }

// Subscriber consumes one SQS queue into an inbox.Processor. Create it with
// New, Start it, and Stop it; it is not restartable.
type Subscriber struct {
	cfg    Config
	client *awssqs.Client
	proc   inbox.Processor
	log    *slog.Logger
	url    string // the queue's URL, from Start

	svc subscriber.Service[*message] // the lifecycle, the queue, the workers, the outcome mapping

	heldMu sync.Mutex // held, and the visibility changes of held messages
	held   map[*message]struct{}

	deleted, retried, heldBack, undecodable, released atomic.Int64
}

// New returns a Subscriber that receives with client (its credentials, region
// and endpoint are the caller's) and processes with proc. cfg is copied;
// invalid settings are reported here.
func New(client *awssqs.Client, proc inbox.Processor, cfg *Config) (*Subscriber, error) {
	if client == nil || proc == nil {
		return nil, errors.New("sqsinbox: New needs an SQS client and a processor")
	}
	c, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	s := &Subscriber{
		cfg:    c,
		client: client,
		proc:   proc,
		log:    c.Logger.With(slog.String("consumer", proc.Name()), slog.String("queue", c.Queue)),
		held:   map[*message]struct{}{},
	}
	s.svc.Init(subscriber.Setup[*message]{
		Name: "sqsinbox", Broker: queueBroker{s}, Processor: proc, ProcessTimeout: c.ProcessTimeout,
		Concurrency: c.Concurrency, Log: s.log,
		Counters: func() []any {
			st := s.Stats()
			return []any{slog.Int64("deleted", st.Deleted), slog.Int64("retried", st.Retried), slog.Int64("held_back", st.HeldBack),
				slog.Int64("undecodable", st.Undecodable), slog.Int64("released", st.Released)}
		},
	})
	return s, nil
}

// Stats returns the Subscriber's counters.
func (s *Subscriber) Stats() Stats {
	return Stats{Deleted: s.deleted.Load(), Retried: s.retried.Load(), HeldBack: s.heldBack.Load(),
		Undecodable: s.undecodable.Load(), Released: s.released.Load()}
}

// ErrNotFIFO is wrapped by Start's error for a standard queue when
// Config.AllowStandard is not set.
var ErrNotFIFO = errors.New("not a FIFO queue")

// Start looks the queue up (its URL, and that it is FIFO) and starts receiving
// and processing; it returns once that is under way. ctx governs the look-up,
// and its end later stops the Subscriber hard; prefer Stop. A second Start, or
// a Start after Stop, is an error (package internal/lifecycle's rule).
func (s *Subscriber) Start(ctx context.Context) error {
	return s.svc.Start(ctx, s.setup)
}

func (s *Subscriber) setup(ctx context.Context) ([]func(), []any, error) {
	url := s.cfg.Queue
	if !strings.HasPrefix(url, "https://") && !strings.HasPrefix(url, "http://") {
		out, err := s.client.GetQueueUrl(ctx, &awssqs.GetQueueUrlInput{QueueName: aws.String(url)})
		if err != nil {
			return nil, nil, fmt.Errorf("sqsinbox: look up Config.Queue: %w", err)
		}
		url = aws.ToString(out.QueueUrl)
	}
	a, err := s.client.GetQueueAttributes(ctx, &awssqs.GetQueueAttributesInput{QueueUrl: aws.String(url),
		AttributeNames: []sqstypes.QueueAttributeName{sqstypes.QueueAttributeNameFifoQueue}})
	if err != nil {
		return nil, nil, fmt.Errorf("sqsinbox: Config.Queue attributes: %w", err)
	}
	fifo := a.Attributes[string(sqstypes.QueueAttributeNameFifoQueue)] == "true"
	if !fifo {
		if !s.cfg.AllowStandard {
			return nil, nil, fmt.Errorf("sqsinbox: Config.Queue: %w: a standard queue keeps no order (set Config.AllowStandard to accept it)", ErrNotFIFO)
		}
		s.log.Warn("the queue is a standard queue: it keeps no order, the inbox rejects what arrives before its predecessor")
	}
	s.url = url
	return []func(){s.receive, s.extend}, []any{slog.Duration("visibility_timeout", s.cfg.VisibilityTimeout), slog.Bool("fifo", fifo)}, nil
}

// receive long-polls the queue, queueing each message by aggregate, until
// stopping. A stop, even a hard one, lets the receive in progress end (within
// WaitTime) and hands its messages back: a receive cancelled by the client
// may still take messages on the server, which would then stay hidden for
// the visibility timeout (the emulator was seen doing so).
func (s *Subscriber) receive() {
	s.svc.Read(s.cfg.Prefetch-s.cfg.MaxMessages, s.cfg.Prefetch, "receive", func(n int) error {
		return s.receiveOnce(min(n, s.cfg.MaxMessages))
	})
}

func (s *Subscriber) receiveOnce(n int) error {
	// Bounded: the long poll, and the SDK's retries of a lost answer.
	ctx, cancel := context.WithTimeout(context.Background(), s.cfg.WaitTime+settleTimeout)
	defer cancel()
	out, err := s.client.ReceiveMessage(ctx, &awssqs.ReceiveMessageInput{
		QueueUrl:            aws.String(s.url),
		MaxNumberOfMessages: int32(n),
		WaitTimeSeconds:     int32(s.cfg.WaitTime / time.Second),
		VisibilityTimeout:   int32(s.cfg.VisibilityTimeout / time.Second),
		// The SDK's retries of this call then return the same messages.
		ReceiveRequestAttemptId: aws.String(attemptID()),
		MessageAttributeNames:   []string{"All"},
		MessageSystemAttributeNames: []sqstypes.MessageSystemAttributeName{
			sqstypes.MessageSystemAttributeNameMessageGroupId, sqstypes.MessageSystemAttributeNameApproximateReceiveCount},
	})
	if err != nil {
		return err
	}
	runs := map[string]*groupRun{}
	msgs := make([]*message, 0, len(out.Messages))
	for _, m := range out.Messages {
		g := m.Attributes[string(sqstypes.MessageSystemAttributeNameMessageGroupId)]
		r := runs[g]
		if r == nil {
			r = &groupRun{}
			runs[g] = r
		}
		d, err := decode(m)
		msgs = append(msgs, &message{Message: m, d: d, err: err, run: r})
	}
	s.heldMu.Lock()
	for _, m := range msgs {
		s.held[m] = struct{}{}
	}
	s.heldMu.Unlock()
	for _, m := range msgs {
		s.svc.Push(m)
	}
	return nil
}

func attemptID() string {
	var r [16]byte
	_, _ = rand.Read(r[:])
	return hex.EncodeToString(r[:])
}

// extend renews the visibility timeout of the held messages every third of
// it, until stopping; the stop's hand-back then settles what is held.
func (s *Subscriber) extend() {
	every := s.cfg.VisibilityTimeout / 3
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-s.svc.Lifecycle.Stopping():
			return
		case <-t.C:
		}
		s.heldMu.Lock()
		batch := make([]*message, 0, len(s.held))
		for m := range s.held {
			batch = append(batch, m)
		}
		for len(batch) > 0 {
			k := min(len(batch), maxBatch)
			s.changeVisibilityBatch(batch[:k], s.cfg.VisibilityTimeout)
			batch = batch[k:]
		}
		s.heldMu.Unlock()
	}
}

// changeVisibilityBatch sets the visibility timeout of msgs (at most 10);
// failures are logged: a message whose lease ran out is redelivered, which
// the inbox makes safe.
func (s *Subscriber) changeVisibilityBatch(msgs []*message, d time.Duration) {
	entries := make([]sqstypes.ChangeMessageVisibilityBatchRequestEntry, len(msgs))
	for i, m := range msgs {
		entries[i] = sqstypes.ChangeMessageVisibilityBatchRequestEntry{Id: aws.String(strconv.Itoa(i)),
			ReceiptHandle: m.ReceiptHandle, VisibilityTimeout: int32(d / time.Second)}
	}
	ctx, cancel := context.WithTimeout(context.Background(), settleTimeout)
	defer cancel()
	out, err := s.client.ChangeMessageVisibilityBatch(ctx, &awssqs.ChangeMessageVisibilityBatchInput{QueueUrl: aws.String(s.url), Entries: entries})
	if err != nil {
		s.log.Warn("could not extend the visibility of held messages", slog.Int("messages", len(msgs)), slog.Any("error", err))
		return
	}
	for _, f := range out.Failed {
		s.log.Warn("could not extend the visibility of a held message", slog.String("code", aws.ToString(f.Code)))
	}
}

// queueBroker settles SQS messages for the core.
type queueBroker struct{ s *Subscriber }

func (b queueBroker) Lane(m *message) pgoutbox.Lane {
	return pgoutbox.LaneOf(wire.LaneHeaders(func(n string) string { return m.d.Headers[n] }))
}

// Delivery returns m as the inbox reads it (see decode). A message behind a
// retried one of its group is handed back unprocessed; one that decode
// refused is undecodable.
func (b queueBroker) Delivery(m *message) (inbox.Delivery, bool) {
	if m.run.failed.Load() {
		b.s.heldBack.Add(1)
		b.s.unhold(m)
		b.s.changeVisibility(m, 0, "hand back")
		return inbox.Delivery{}, false
	}
	if m.err != nil {
		b.Term(m, inbox.Outcome{Status: inbox.StatusUndecodable, Err: m.err})
		return inbox.Delivery{}, false
	}
	return m.d, true
}

// decode returns m as the inbox reads it. In the default format: its String
// attributes as headers (the producer's out of sqs.HeadersAttribute),
// Content-Type (the transport's) left out, the body as it is. A structured-mode
// CloudEvent (Content-Type application/cloudevents+json, what the publisher's
// CloudEvents format sends) becomes the binary-mode message the inbox reads:
// each attribute member a ce- header, data (or the bytes of data_base64) the
// body, the producer's headers beside. A headers attribute that is not a JSON
// object of strings, and a CloudEvent that is not an object of string members
// with one data member, are errors: the message is undecodable.
func decode(m sqstypes.Message) (inbox.Delivery, error) {
	a := make(map[string]string, len(m.MessageAttributes))
	for k, v := range m.MessageAttributes {
		if v.StringValue != nil { // String and Number; a Binary attribute is no header
			a[k] = *v.StringValue
		}
	}
	ct := a[sqs.ContentTypeAttribute]
	delete(a, sqs.ContentTypeAttribute)
	h, err := sqs.Headers(a)
	if err != nil {
		return inbox.Delivery{}, err
	}
	d := inbox.Delivery{Body: []byte(aws.ToString(m.Body)), Headers: h, Attempt: 1}
	if n, err := strconv.Atoi(m.Attributes[string(sqstypes.MessageSystemAttributeNameApproximateReceiveCount)]); err == nil && n > 0 {
		d.Attempt = n
	}
	if mt, _, _ := strings.Cut(ct, ";"); strings.EqualFold(strings.TrimSpace(mt), cloudEventsJSON) {
		return structured(d)
	}
	return d, nil
}

// cloudEventsJSON is the media type of a structured-mode CloudEvent.
const cloudEventsJSON = "application/cloudevents+json"

// structured turns d, whose body is a structured-mode CloudEvent, into the
// binary-mode delivery of the HTTP binding (ce- headers).
func structured(d inbox.Delivery) (inbox.Delivery, error) {
	var obj map[string]json.RawMessage
	if err := json.Unmarshal(d.Body, &obj); err != nil {
		return inbox.Delivery{}, fmt.Errorf("sqsinbox: structured CloudEvent: %w", err)
	}
	for name := range d.Headers {
		// A producer header named like an attribute would pose as one.
		if strings.HasPrefix(strings.ToLower(name), wire.CloudEventsHTTP.Prefix) {
			return inbox.Delivery{}, fmt.Errorf("sqsinbox: structured CloudEvent: producer header %.64q", name)
		}
	}
	out := inbox.Delivery{Headers: d.Headers, Attempt: d.Attempt}
	_, hasData := obj["data"]
	_, hasBase64 := obj["data_base64"]
	if hasData == hasBase64 {
		return inbox.Delivery{}, errors.New("sqsinbox: structured CloudEvent: want exactly one of data and data_base64")
	}
	for k, raw := range obj {
		switch k {
		case "data":
			out.Body = raw
			continue
		case "data_base64":
			var b []byte // encoding/json reads base64 into []byte
			if err := json.Unmarshal(raw, &b); err != nil {
				return inbox.Delivery{}, fmt.Errorf("sqsinbox: structured CloudEvent: member data_base64: %w", err)
			}
			out.Body = b
			continue
		}
		var v string
		if err := json.Unmarshal(raw, &v); err != nil {
			return inbox.Delivery{}, fmt.Errorf("sqsinbox: structured CloudEvent: member %.64q is not a string", k)
		}
		out.Headers[wire.CloudEventsHTTP.Prefix+k] = v
	}
	return out, nil
}

// unhold removes m from the held messages; it waits for an extension in
// progress, so that a settlement is never overwritten by one.
func (s *Subscriber) unhold(m *message) {
	s.heldMu.Lock()
	delete(s.held, m)
	s.heldMu.Unlock()
}

func (s *Subscriber) changeVisibility(m *message, d time.Duration, action string) {
	ctx, cancel := context.WithTimeout(context.Background(), settleTimeout)
	defer cancel()
	_, err := s.client.ChangeMessageVisibility(ctx, &awssqs.ChangeMessageVisibilityInput{QueueUrl: aws.String(s.url),
		ReceiptHandle: m.ReceiptHandle, VisibilityTimeout: int32(d / time.Second)})
	if err != nil {
		// It comes back after the visibility timeout instead.
		s.log.Warn("could not settle message", slog.String("action", action), slog.String("message_id", aws.ToString(m.MessageId)), slog.Any("error", err))
	}
}

func (s *Subscriber) delete(m *message, action string) {
	s.unhold(m)
	ctx, cancel := context.WithTimeout(context.Background(), settleTimeout)
	defer cancel()
	_, err := s.client.DeleteMessage(ctx, &awssqs.DeleteMessageInput{QueueUrl: aws.String(s.url), ReceiptHandle: m.ReceiptHandle})
	if err != nil {
		// The message comes back after its visibility timeout; the inbox finds it applied.
		s.log.Warn("could not settle message", slog.String("action", action), slog.String("message_id", aws.ToString(m.MessageId)), slog.Any("error", err))
	}
}

// Ack deletes m, after the commit.
func (b queueBroker) Ack(m *message) {
	b.s.deleted.Add(1)
	b.s.delete(m, inbox.ActionAck.String())
}

// Nak makes m visible again after delay, rounded up to whole seconds, and
// holds back the rest of its group's run.
func (b queueBroker) Nak(m *message, delay time.Duration) {
	b.s.retried.Add(1)
	m.run.failed.Store(true)
	b.s.unhold(m)
	secs := min((delay+time.Second-1)/time.Second*time.Second, maxVisibility)
	b.s.changeVisibility(m, secs, "retry")
}

// Term deletes a message that is not an outbox event, so that it does not
// come back forever, and logs it.
func (b queueBroker) Term(m *message, o inbox.Outcome) {
	b.s.undecodable.Add(1)
	b.s.log.Error("deleted a message that is not an outbox event; it will not be redelivered",
		slog.String("message_id", aws.ToString(m.MessageId)), slog.Any("error", o.Err))
	b.s.delete(m, inbox.ActionTerm.String())
}

// Release makes an unprocessed message visible again at once.
func (b queueBroker) Release(m *message) {
	b.s.released.Add(1)
	m.run.failed.Store(true) // the rest of its run goes back too
	b.s.unhold(m)
	b.s.changeVisibility(m, 0, "release")
}

// Stopping is closed once a stop has begun (Stop called, or Start's context
// ended); no delivery starts after it.
func (s *Subscriber) Stopping() <-chan struct{} { return s.svc.Lifecycle.Stopping() }

// Stop ends receiving (the receive in progress ends within WaitTime, its
// messages handed back; a hard stop waits for it too) and
// waits for the deliveries in progress to commit and delete (or roll back and
// be handed back); the messages received and not started are made visible
// again at once, for another instance. When ctx ends first the stop turns
// hard: the transactions in progress are abandoned and rolled back, their
// messages handed back, and Stop returns ctx's error. It may be called any
// number of times, from any goroutine.
func (s *Subscriber) Stop(ctx context.Context) error {
	return s.svc.Lifecycle.Stop(ctx)
}
