// Package pubsubinbox feeds outbox events from a Google Cloud Pub/Sub
// subscription to an inbox consumer.
//
// A Subscriber receives from one subscription that every instance of one
// logical consumer shares (Pub/Sub spreads the messages over them), hands each
// message to an [inbox.Processor] — normally an *inbox.Consumer — and settles
// it by the outcome, only after the consumer transaction has ended:
//
//	applied, duplicate   Ack, after the commit
//	gap-rejected, failed Nack: redelivered (after the subscription's retry
//	                     policy's backoff; Pub/Sub has no per-message delay)
//	undecodable          Ack, logged as an error: it can never be processed
//
// Create the subscription with message ordering enabled (the relay's
// publisher sets each aggregate as the ordering key) and, so that a failing
// handler does not spin, a retry policy with a minimum backoff. A crash
// between commit and ack leaves the message unacknowledged: Pub/Sub
// redelivers it after the ack deadline, and the inbox finds it applied.
//
// An ordered subscription delivers an aggregate's next message only after the
// previous one is acknowledged, in publish order. The relay publishes each
// aggregate in sequence order, so a gap means a missing event (quarantined
// at the relay, say): under inbox.GapReject the aggregate's next message is
// then redelivered until the gap is closed (the event replayed, or the
// position set with inbox.Consumer.SetPosition), holding the aggregate back.
//
// Within one Subscriber, messages of one aggregate are processed one at a
// time in arrival order, while up to Config.Concurrency aggregates proceed in
// parallel. Across instances, the inbox's per-aggregate position keeps the
// order: an event that overtook its predecessor is rejected and redelivered
// (inbox.GapReject).
//
// Outside the standard library it pulls in the Cloud Pub/Sub client
// (cloud.google.com/go/pubsub/v2, with gRPC and google.golang.org/api), the
// adapter broker/pubsub (its message codec), and what package inbox pulls in
// (pgx, the OpenTelemetry API).
package pubsubinbox

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync/atomic"
	"time"

	"cloud.google.com/go/pubsub/v2"

	"github.com/pgoutbox/pgoutbox"
	pubsubbroker "github.com/pgoutbox/pgoutbox/broker/pubsub"
	"github.com/pgoutbox/pgoutbox/inbox"
	"github.com/pgoutbox/pgoutbox/inbox/internal/subscriber"
	"github.com/pgoutbox/pgoutbox/internal/config"
	"github.com/pgoutbox/pgoutbox/internal/retry"
	"github.com/pgoutbox/pgoutbox/wire"
)

// The defaults of Config's fields.
const (
	DefaultConcurrency    = subscriber.DefaultConcurrency
	DefaultPrefetch       = 100
	DefaultAckDeadline    = 10 * time.Second
	DefaultProcessTimeout = time.Minute
)

// Config configures a Subscriber. A nil *Config means all defaults; each field
// names its default.
type Config struct {
	// Subscription is the subscription ID (or its full name
	// projects/<project>/subscriptions/<id>). Zero means the processor's Name().
	Subscription string

	// Concurrency bounds the deliveries in progress at once, one consumer
	// transaction each (the database pool needs as many connections); one
	// aggregate's deliveries never overlap. Zero means DefaultConcurrency (4).
	Concurrency int

	// Prefetch bounds the messages received and not yet settled (the client's
	// MaxOutstandingMessages): those being processed and those waiting. The
	// client extends their ack deadlines while they wait. Messages the
	// client holds back above it when the Subscriber stops are not handed
	// back: Pub/Sub redelivers them after their ack deadline. Zero means
	// DefaultPrefetch (100).
	Prefetch int

	// AckDeadline is the lease the client asks for on each message, renewed
	// while the message is held (MaxDurationPerAckExtension and the stream's
	// ack deadline): the delay before Pub/Sub redelivers a message whose
	// holder crashed, or one that was on its way when the Subscriber stopped.
	// Zero means DefaultAckDeadline (10 s, Pub/Sub's minimum); at most 600 s.
	AckDeadline time.Duration

	// ProcessTimeout is the deadline of each delivery's processing, the
	// handler and its transaction together. Zero means DefaultProcessTimeout
	// (1 min).
	ProcessTimeout time.Duration

	// Logger receives undecodable messages and receive errors. Nil means
	// slog.Default().
	Logger *slog.Logger
}

// Validate reports what New would reject in c, its zero fields meaning their
// defaults. It is safe on a nil receiver. Several problems are joined with
// errors.Join.
func (c *Config) Validate() error {
	_, err := c.withDefaults("x")
	return err
}

func (c *Config) withDefaults(name string) (Config, error) {
	return subscriber.Resolve("pubsubinbox", c, shared, func(out *Config) {
		config.Default(&out.Subscription, name)
		config.Default(&out.Prefetch, max(DefaultPrefetch, out.Concurrency))
		config.Default(&out.ProcessTimeout, DefaultProcessTimeout)
		config.Default(&out.AckDeadline, DefaultAckDeadline)
	}, func(out *Config, p *config.Problems) {
		p.Check(out.Subscription != "" && len(out.Subscription) <= 512, "Config.Subscription %.64q: want a subscription ID or name", out.Subscription)
		p.Check(out.Prefetch >= out.Concurrency, "Config.Prefetch %d: want at least Config.Concurrency", out.Prefetch)
		p.Check(out.AckDeadline >= 10*time.Second && out.AckDeadline <= 600*time.Second, "Config.AckDeadline %s: want 10s..600s", out.AckDeadline)
		p.Check(out.ProcessTimeout > 0, "Config.ProcessTimeout %s: must be positive", out.ProcessTimeout)
	})
}

func shared(c *Config) subscriber.Shared {
	return subscriber.Shared{Concurrency: &c.Concurrency, Logger: &c.Logger}
}

// Stats are a Subscriber's counters since Start.
type Stats struct {
	Acked       int64 // messages acknowledged (applied or duplicate)
	Nacked      int64 // messages handed back for redelivery (gap, failure)
	Undecodable int64 // messages that are not outbox events, acknowledged and logged
	Released    int64 // messages received but not processed when the Subscriber stopped, handed back at once
}

// Subscriber consumes one Pub/Sub subscription into an inbox.Processor.
// Create it with New, Start it, and Stop it to shut down gracefully; it is not
// restartable.
type Subscriber struct {
	cfg    Config
	client *pubsub.Client
	proc   inbox.Processor
	log    *slog.Logger

	svc subscriber.Service[*pubsub.Message] // the lifecycle, the queue, the workers, the outcome mapping
	sub *pubsub.Subscriber

	acked, nacked, undecodable, released atomic.Int64
}

// New returns a Subscriber that receives with client (its project,
// credentials and endpoint are the caller's) and processes with proc. cfg may
// be nil for all defaults; it is copied, and invalid settings are reported
// here.
func New(client *pubsub.Client, proc inbox.Processor, cfg *Config) (*Subscriber, error) {
	if client == nil || proc == nil {
		return nil, errors.New("pubsubinbox: New needs a Pub/Sub client and a processor")
	}
	c, err := cfg.withDefaults(proc.Name())
	if err != nil {
		return nil, err
	}
	s := &Subscriber{
		cfg:    c,
		client: client,
		proc:   proc,
		log:    c.Logger.With(slog.String("consumer", proc.Name()), slog.String("subscription", c.Subscription)),
	}
	s.svc.Init(subscriber.Setup[*pubsub.Message]{
		Name: "pubsubinbox", Broker: psBroker{s}, Processor: proc, ProcessTimeout: c.ProcessTimeout,
		Concurrency: c.Concurrency, Log: s.log,
		Counters: func() []any {
			st := s.Stats()
			return []any{slog.Int64("acked", st.Acked), slog.Int64("nacked", st.Nacked),
				slog.Int64("undecodable", st.Undecodable), slog.Int64("released", st.Released)}
		},
	})
	return s, nil
}

// Stats returns the Subscriber's counters.
func (s *Subscriber) Stats() Stats {
	return Stats{Acked: s.acked.Load(), Nacked: s.nacked.Load(), Undecodable: s.undecodable.Load(), Released: s.released.Load()}
}

// Start starts receiving and processing; it returns once that is under way
// (it does not check that the subscription exists: Receive's errors are
// logged and retried). ctx's end later stops the Subscriber hard (in-flight
// transactions are abandoned and rolled back); prefer Stop.
//
// Start follows the one rule of pgoutbox's services: a second Start returns
// an error matching lifecycle.ErrAlreadyStarted, a Start after Stop (or after
// a failed Start) one matching lifecycle.ErrStopped.
func (s *Subscriber) Start(ctx context.Context) error {
	return s.svc.Start(ctx, s.setup)
}

// setup makes the client's subscriber; the receiver receives with it.
func (s *Subscriber) setup(context.Context) ([]func(), []any, error) {
	s.sub = s.client.Subscriber(s.cfg.Subscription)
	s.sub.ReceiveSettings.MaxOutstandingMessages = s.cfg.Prefetch
	s.sub.ReceiveSettings.NumGoroutines = 1
	s.sub.ReceiveSettings.MinDurationPerAckExtension = s.cfg.AckDeadline
	s.sub.ReceiveSettings.MaxDurationPerAckExtension = s.cfg.AckDeadline
	return []func(){s.receive}, nil, nil
}

// receive runs Receive, queueing each message by aggregate, until stopping.
// Receive shuts down gracefully: it returns once every message it handed
// over is settled, and settlements made after it returned would be lost (the
// stream is closed). So, once stopping, receive keeps handing back what is
// queued (the workers start nothing new) until Receive returns; the message
// a worker holds is settled by the worker.
func (s *Subscriber) receive() {
	// A failed Receive (the subscription is missing, permission is refused,
	// the service is down) is tried again on the reconnect schedule.
	var backoff retry.Backoff
	for {
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() {
			done <- s.sub.Receive(ctx, func(_ context.Context, m *pubsub.Message) {
				if s.svc.Lifecycle.IsStopping() {
					psBroker{s}.Release(m)
					return
				}
				s.svc.Push(m)
			})
		}()
		var err error
		select {
		case err = <-done:
			cancel()
		case <-s.svc.Lifecycle.Stopping():
			cancel()
			s.releaseUntil(done)
			return
		}
		if !s.svc.Retry(&backoff, "receive", err) {
			return
		}
	}
}

// releaseUntil hands back the queued messages until done, Receive's end.
// Checking again covers a message queued in the moment the stop began.
func (s *Subscriber) releaseUntil(done <-chan error) {
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		// Drop, not Drain: the lane a worker holds stays, and Nack only
		// records the settlement (it does not block under the core's lock).
		s.svc.Drop(func(m *pubsub.Message) bool {
			psBroker{s}.Release(m)
			return true
		})
		select {
		case <-done:
			return
		case <-tick.C:
		}
	}
}

// psBroker settles Pub/Sub messages for the core.
type psBroker struct{ s *Subscriber }

func (b psBroker) Lane(m *pubsub.Message) pgoutbox.Lane {
	return pgoutbox.LaneOf(wire.LaneHeaders(func(n string) string { return pubsubbroker.Attribute(m.Attributes, n) }))
}

func (b psBroker) Delivery(m *pubsub.Message) (inbox.Delivery, bool) {
	d := inbox.Delivery{Body: m.Data, Headers: make(map[string]string, len(m.Attributes)), Attempt: 1}
	for k, v := range m.Attributes {
		// goog* attributes are Google's (the client's trace context), not the producer's.
		if !strings.HasPrefix(strings.ToLower(k), "goog") {
			d.Headers[k] = v
		}
	}
	if m.DeliveryAttempt != nil { // set with a dead-letter policy only
		d.Attempt = *m.DeliveryAttempt
	}
	return d, true
}

func (b psBroker) Ack(m *pubsub.Message) {
	b.s.acked.Add(1)
	m.Ack()
}

// Nak hands m back. Pub/Sub has no per-message delay: the subscription's
// retry policy spaces redeliveries.
func (b psBroker) Nak(m *pubsub.Message, _ time.Duration) {
	b.s.nacked.Add(1)
	m.Nack()
}

// Term acknowledges a message that is not an outbox event, so that it does
// not come back forever, and logs it.
func (b psBroker) Term(m *pubsub.Message, o inbox.Outcome) {
	b.s.undecodable.Add(1)
	b.s.log.Error("acknowledged a message that is not an outbox event; it will not be redelivered",
		slog.String("message_id", m.ID), slog.Any("error", o.Err))
	m.Ack()
}

// Release hands an unprocessed message back for immediate redelivery.
func (b psBroker) Release(m *pubsub.Message) {
	b.s.released.Add(1)
	m.Nack()
}

// Stopping is closed once a stop has begun (Stop called, or Start's context
// ended); no delivery starts after it.
func (s *Subscriber) Stopping() <-chan struct{} { return s.svc.Lifecycle.Stopping() }

// Stop ends receiving and waits for the deliveries in progress to commit and
// ack (or roll back and nack); the messages received and not started are
// nacked, so that Pub/Sub redelivers them at once, to another instance. When
// ctx ends first the stop turns hard: the transactions in progress are
// abandoned and rolled back, their messages nacked, and Stop returns ctx's
// error. Like every pgoutbox service (internal/lifecycle), Stop may be
// called any number of times from any goroutine, each call waiting for the
// one shutdown; called before Start, it returns nil and Start can no longer
// succeed.
func (s *Subscriber) Stop(ctx context.Context) error {
	return s.svc.Lifecycle.Stop(ctx)
}
