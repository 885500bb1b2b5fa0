// Package rabbitinbox feeds outbox events from a RabbitMQ queue to an inbox
// consumer.
//
// A Subscriber consumes one queue with manual acknowledgements, on a connection of
// its own. Every instance of one logical consumer runs a Subscriber on the same
// queue, and RabbitMQ spreads the messages over them. Each message becomes an
// [inbox.Delivery] (the AMQP headers as strings, the body) for an
// [inbox.Processor] — normally an *inbox.Consumer — and is settled by the outcome,
// only after the consumer transaction has ended:
//
//	applied, duplicate   basic.ack, after the commit
//	gap-rejected, failed basic.nack with requeue, after waiting Outcome.RetryAfter
//	undecodable          basic.nack without requeue, logged as an error
//
// # Retries without delayed delivery
//
// RabbitMQ cannot redeliver a message later: a requeued message is back in the
// queue at once, in its original position if possible, else nearer the head, and
// is usually the next one delivered. So the Subscriber itself waits
// Outcome.RetryAfter, capped by Config.MaxRequeueDelay, before it nacks with
// requeue. The message stays unacknowledged meanwhile and keeps its place in the
// prefetch window, but neither a worker nor the aggregate waits: the next message
// of the same aggregate is processed at once — often it is the very event the
// rejected one was waiting for. Stop cuts the wait short and requeues at once. A
// delayed-retry exchange (a TTL queue dead-lettering back) would free the window,
// at the price of topology the operator must manage; the wait is bounded and the
// window is per instance, so the Subscriber does without.
//
// Classic queues only say whether a message was delivered before, so the inbox's
// backoff for failures sees attempt 1 or 2 and a failing message comes back every
// second or two; quorum queues count deliveries (x-delivery-count) and the
// backoff grows up to the cap.
//
// Under inbox.GapReject this is how out-of-order arrivals are put in order: the
// early event is refused, requeued after a delay that grows with the gap, and
// delivered again — to this instance or another — once its predecessor is applied.
//
// A message that is not an outbox event (Outbox-* headers missing or malformed, a
// body that is not JSON) can never be processed: it is nacked without requeue, so
// the server drops it, or routes it to the queue's dead-letter exchange if it has
// one (x-dead-letter-exchange), and the error log names its exchange, routing key
// and message id.
//
// # Order
//
// Within one Subscriber, messages of one aggregate are processed one at a time in
// arrival order, while up to Config.Concurrency aggregates proceed in parallel.
// Across instances, and after requeues, the inbox's per-aggregate position keeps
// the order: an event that overtook its predecessor is refused and requeued
// (inbox.GapReject).
//
// # Connection loss and crashes
//
// When the connection, the channel or the consumer is lost (a network failure, a
// broker restart, an operator closing the connection), the Subscriber drops the
// messages it holds but has not started, lets the ones being processed finish —
// their ack can no longer be sent — and reconnects with backoff, forever:
// connects, declares, consumes again. The server requeues every message that was
// not acknowledged on the lost connection and delivers it again; the inbox finds
// the ones that were committed already and they are acked as duplicates. A crash
// between commit and ack ends the same way. Nothing is lost, nothing is applied
// twice.
//
// Outside the standard library it pulls in amqp091-go, besides what package inbox
// pulls in (pgx, the OpenTelemetry API).
package rabbitinbox

import (
	"context"
	"crypto/tls"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/pgoutbox/pgoutbox"
	"github.com/pgoutbox/pgoutbox/inbox"
	"github.com/pgoutbox/pgoutbox/inbox/internal/subscriber"
	"github.com/pgoutbox/pgoutbox/internal/config"
	"github.com/pgoutbox/pgoutbox/internal/retry"
)

// maxShortstr is the longest AMQP short string: queue and exchange names, routing
// keys and consumer tags.
const maxShortstr = 255

// The defaults of Config's fields.
const (
	DefaultBindingKey          = "#" // every event
	DefaultPrefetch            = 64
	DefaultConcurrency         = subscriber.DefaultConcurrency
	DefaultConsumerTagPrefix   = "pgoutbox-inbox-" // followed by the processor's Name()
	DefaultConnectionPrefix    = "pgoutbox inbox " // followed by the processor's Name()
	DefaultProcessTimeout      = time.Minute
	DefaultMaxRequeueDelay     = 10 * time.Second
	DefaultConnectTimeout      = 10 * time.Second
	DefaultReconnectBackoff    = 100 * time.Millisecond
	DefaultMaxReconnectBackoff = 30 * time.Second
)

// Config configures a Subscriber. Queue is required; every other field names its
// default.
type Config struct {
	// Queue is the queue to consume, shared by every instance of the inbox
	// consumer. Required. Without Exchange it must exist.
	Queue string

	// Exchange, when set, has the Subscriber bind Queue to it with BindingKeys on
	// every connect, declaring the exchange (a durable topic exchange, as the
	// relay's publisher declares it) and the queue (durable, with QueueArguments)
	// if they are missing. An existing exchange or queue is used as it is, never
	// modified. Defaults to none: the queue and its bindings are the operator's.
	Exchange string

	// BindingKeys are the routing keys Queue is bound to Exchange with; the relay
	// publishes with "{aggregate_type}.{event_type}" by default, so "order.*"
	// selects one aggregate type. Only with Exchange. Zero means
	// DefaultBindingKey ("#": every event).
	BindingKeys []string

	// QueueArguments are the arguments Queue is declared with when the Subscriber
	// declares it (only with Exchange): "x-queue-type": "quorum" for a replicated
	// queue, "x-dead-letter-exchange" for where rejected messages go. Defaults to
	// none: a classic queue.
	QueueArguments amqp.Table

	// Prefetch is the channel's prefetch count (basic.qos): how many messages the
	// server sends ahead of their acks. A message waiting out its retry delay
	// counts too. Zero means DefaultPrefetch (64).
	Prefetch int

	// Concurrency is how many messages this Subscriber processes at once, each in
	// its own transaction (size the database pool for it). Messages of one
	// aggregate never run at the same time. Zero means DefaultConcurrency (4).
	Concurrency int

	// ConsumerTag names the consumer on its channel, as the management UI shows
	// it. Zero means DefaultConsumerTagPrefix ("pgoutbox-inbox-") followed by
	// the processor's Name().
	ConsumerTag string

	// ProcessTimeout bounds one Process call (the consumer transaction with its
	// handler). Keep it, plus MaxRequeueDelay, well below the server's
	// consumer_timeout (30 minutes by default), after which the server closes a
	// channel whose delivery is not acknowledged. Zero means
	// DefaultProcessTimeout (1m).
	ProcessTimeout time.Duration

	// MaxRequeueDelay caps how long a message the inbox wants redelivered
	// (gap-rejected, failed) is held before it is nacked with requeue; see the
	// package doc. Zero means DefaultMaxRequeueDelay (10s).
	MaxRequeueDelay time.Duration

	// ConnectionName is the connection's name on the server (the
	// connection_name client property), shown by rabbitmqctl list_connections and
	// the management UI. Zero means DefaultConnectionPrefix ("pgoutbox inbox ")
	// followed by the processor's Name().
	ConnectionName string

	// ConnectTimeout bounds each attempt to connect: TCP, TLS and AMQP handshakes,
	// declaring, and starting the consumer. Zero means DefaultConnectTimeout (10s).
	ConnectTimeout time.Duration

	// ReconnectBackoff is the wait after the first failed attempt to reconnect
	// (the first attempt after a loss is immediate); it doubles after each further
	// failure, with jitter, up to MaxReconnectBackoff (retry.Exponential). Zero
	// means DefaultReconnectBackoff (100ms).
	ReconnectBackoff time.Duration

	// MaxReconnectBackoff caps the wait between attempts to reconnect. Zero means
	// DefaultMaxReconnectBackoff (30s), or ReconnectBackoff if that is longer.
	MaxReconnectBackoff time.Duration

	// TLSConfig is the TLS configuration for amqps:// URLs. Defaults to the one
	// amqp091-go builds from the URL's cacertfile, certfile, keyfile and
	// server_name_indication parameters.
	TLSConfig *tls.Config

	// Logger receives connection events (lost, reconnected), rejected messages and
	// settling errors. Defaults to slog.Default().
	Logger *slog.Logger
}

// Validate reports what Dial would reject in c: the config as given, its zero
// fields meaning their defaults. It is safe on a nil receiver, which lacks the
// required Queue. Several problems are joined with errors.Join.
func (c *Config) Validate() error {
	_, err := c.withDefaults("")
	return err
}

func (c *Config) withDefaults(name string) (Config, error) {
	return subscriber.Resolve("rabbitinbox", c, shared, func(out *Config) {
		if out.Exchange != "" && len(out.BindingKeys) == 0 {
			out.BindingKeys = []string{DefaultBindingKey}
		}
		config.Default(&out.Prefetch, DefaultPrefetch)
		config.Default(&out.ConsumerTag, DefaultConsumerTagPrefix+name)
		config.Default(&out.ProcessTimeout, DefaultProcessTimeout)
		config.Default(&out.MaxRequeueDelay, DefaultMaxRequeueDelay)
		config.Default(&out.ConnectionName, DefaultConnectionPrefix+name)
		config.Default(&out.ConnectTimeout, DefaultConnectTimeout)
		config.Default(&out.ReconnectBackoff, DefaultReconnectBackoff)
		config.Default(&out.MaxReconnectBackoff, max(DefaultMaxReconnectBackoff, out.ReconnectBackoff))
	}, func(out *Config, p *config.Problems) {
		shortstr := func(s string) bool { return len(s) <= maxShortstr && utf8.ValidString(s) }
		p.Check(out.Queue != "", "Config.Queue is required")
		p.Check(shortstr(out.Queue), "Config.Queue: want at most %d bytes of UTF-8", maxShortstr)
		p.Check(shortstr(out.Exchange), "Config.Exchange: want at most %d bytes of UTF-8", maxShortstr)
		p.Check(out.Exchange != "" || (len(out.BindingKeys) == 0 && out.QueueArguments == nil),
			"Config.BindingKeys and Config.QueueArguments need Config.Exchange: without it the queue is the operator's")
		for _, k := range out.BindingKeys {
			p.Check(shortstr(k), "Config.BindingKeys: %q: want at most %d bytes of UTF-8", k, maxShortstr)
		}
		p.Field("Config.QueueArguments", out.QueueArguments.Validate())
		p.Check(out.Prefetch > 0 && out.Prefetch <= 65535, "Config.Prefetch %d: want 1..65535", out.Prefetch)
		p.Check(shortstr(out.ConsumerTag), "Config.ConsumerTag: want at most %d bytes of UTF-8", maxShortstr)
		p.Check(out.ProcessTimeout > 0, "Config.ProcessTimeout %s: must be positive", out.ProcessTimeout)
		p.Check(out.MaxRequeueDelay > 0, "Config.MaxRequeueDelay %s: must be positive", out.MaxRequeueDelay)
		p.Check(out.ConnectTimeout > 0, "Config.ConnectTimeout %s: must be positive", out.ConnectTimeout)
		p.Check(out.ReconnectBackoff > 0 && out.MaxReconnectBackoff >= out.ReconnectBackoff,
			"Config.ReconnectBackoff (%s) must be positive and at most Config.MaxReconnectBackoff (%s)", out.ReconnectBackoff, out.MaxReconnectBackoff)
	})
}

func shared(c *Config) subscriber.Shared {
	return subscriber.Shared{Concurrency: &c.Concurrency, Logger: &c.Logger}
}

// Stats are a Subscriber's counters since Dial.
type Stats struct {
	Acked      int64 // messages acknowledged: applied, or found applied before
	Requeued   int64 // messages nacked with requeue after their retry delay (gap, failure)
	Rejected   int64 // messages that are not outbox events, nacked without requeue
	Released   int64 // messages received but not processed when the Subscriber stopped, requeued at once
	Unsettled  int64 // acks and nacks that could not be sent, their channel being gone: the server redelivers those messages
	Reconnects int64 // sessions opened after a connection, channel or consumer was lost
}

// Subscriber consumes one RabbitMQ queue into an inbox.Processor. Create it with
// Dial, Start it, and Stop it to shut down gracefully; it is not restartable.
type Subscriber struct {
	cfg     Config
	url     string // with its password: only for amqp.DialConfig
	display string // without it
	proc    inbox.Processor
	log     *slog.Logger

	svc subscriber.Service[*item] // the lifecycle, the queue, the workers, the outcome mapping

	stopCtx    context.Context // ends when stopping: bounds attempts to reconnect
	stopCancel context.CancelFunc
	settling   sync.WaitGroup // delayed requeues not yet sent or dropped
	supervised atomic.Bool    // the supervisor has returned

	mu       sync.Mutex
	draining bool                  // stopping: requeue at once, delay nothing
	cur      *session              // nil while reconnecting
	delayed  map[*item]*time.Timer // messages waiting out their retry delay

	acked, requeued, rejected, released, unsettled, reconnects atomic.Int64
}

// item is one delivery and the session it came on: it can only be settled there.
type item struct {
	sess    *session
	d       amqp.Delivery
	headers map[string]string
}

// Dial connects to the RabbitMQ server at url, makes sure the queue exists (and,
// with Config.Exchange, declares and binds it), and returns a Subscriber that owns
// the connection and processes with proc; it consumes nothing before Start. cfg
// holds the queue's name; invalid settings are reported here.
//
// url is amqp://[user:password@]host[:port][/vhost][?params] or amqps://…, as
// amqp091-go reads it (vhost "/" is written %2F). Errors never show the password.
// ctx and Config.ConnectTimeout bound the attempt. Unlike the reconnects that
// follow a loss, this first connection must succeed: a consumer that cannot reach
// its broker at start-up, or whose queue is missing, is misconfigured or early,
// and its supervisor should know.
//
// There is no constructor from an *amqp.Connection: reconnecting means dialling
// again, which only the owner of the connection can do.
func Dial(ctx context.Context, url string, proc inbox.Processor, cfg *Config) (*Subscriber, error) {
	if proc == nil {
		return nil, errors.New("rabbitinbox: Dial needs a processor")
	}
	c, err := cfg.withDefaults(proc.Name())
	if err != nil {
		return nil, err
	}
	display, err := parseURL(url)
	if err != nil {
		return nil, err
	}
	s := &Subscriber{
		cfg:     c,
		url:     url,
		display: display,
		proc:    proc,
		log:     c.Logger.With(slog.String("consumer", proc.Name()), slog.String("queue", c.Queue)),
		delayed: map[*item]*time.Timer{},
	}
	s.svc.Init(subscriber.Setup[*item]{
		Name: "rabbitinbox", Broker: amqpBroker{s}, Processor: proc, ProcessTimeout: c.ProcessTimeout,
		Concurrency: c.Concurrency, Log: s.log,
		Counters: func() []any {
			st := s.Stats()
			return []any{slog.Int64("acked", st.Acked), slog.Int64("requeued", st.Requeued),
				slog.Int64("rejected", st.Rejected), slog.Int64("released", st.Released), slog.Int64("reconnects", st.Reconnects)}
		},
		Halt: s.halt, Close: s.closeCurrent,
	})
	s.stopCtx, s.stopCancel = context.WithCancel(context.Background())
	sess, err := s.open(ctx, false)
	if err != nil {
		s.stopCancel()
		return nil, err
	}
	s.cur = sess
	s.log.Info("connected", slog.String("url", display), slog.String("connection_name", c.ConnectionName))
	return s, nil
}

// Stats returns the Subscriber's counters.
func (s *Subscriber) Stats() Stats {
	return Stats{
		Acked: s.acked.Load(), Requeued: s.requeued.Load(), Rejected: s.rejected.Load(),
		Released: s.released.Load(), Unsettled: s.unsettled.Load(), Reconnects: s.reconnects.Load(),
	}
}

// Start starts consuming and processing; it returns once the server has accepted
// the consumer. ctx and Config.ConnectTimeout bound that. ctx's end later stops
// the Subscriber hard: in-flight transactions are abandoned and rolled back, and
// the connection is closed; prefer Stop. If the connection Dial opened has been
// lost meanwhile, Start returns at once and the Subscriber reconnects in the
// background.
//
// Start follows the one rule of pgoutbox's services: a second Start returns an
// error matching lifecycle.ErrAlreadyStarted, a Start after Stop (or after a
// failed Start) one matching lifecycle.ErrStopped; a Subscriber is not
// restartable.
func (s *Subscriber) Start(ctx context.Context) error {
	return s.svc.Start(ctx, s.setup)
}

// setup starts the consumer on the session Dial opened; the supervisor
// receives from it (and reconnects), and drainOnStop requeues the delayed
// messages when stopping.
func (s *Subscriber) setup(ctx context.Context) ([]func(), []any, error) {
	s.mu.Lock()
	sess := s.cur
	s.mu.Unlock()
	cctx, cancel := context.WithTimeout(ctx, s.cfg.ConnectTimeout)
	defer cancel()
	if err := bounded(cctx, sess.conn, func() error { return s.consume(sess) }); err != nil {
		if cctx.Err() != nil || !sess.conn.IsClosed() {
			// Refused by the server (the queue was deleted, or is exclusive to
			// another connection), or abandoned: not something to retry.
			return nil, nil, err
		}
		s.log.Warn("connection lost before consuming; reconnecting", slog.Any("error", err))
		sess.lost.Store(true)
		s.mu.Lock()
		s.cur = nil
		s.mu.Unlock()
		sess = nil
	}
	// A hard stop also ends a basic.cancel the server does not answer. (Hard also
	// ends after a graceful stop, the supervisor gone: the Stopped hook still
	// needs the connection then.)
	context.AfterFunc(s.svc.Lifecycle.Hard(), func() {
		if !s.supervised.Load() {
			s.closeCurrent()
		}
	})
	supervisor := func() { defer s.supervised.Store(true); s.supervise(sess) }
	return []func(){supervisor, s.drainOnStop},
		[]any{slog.Int("prefetch", s.cfg.Prefetch), slog.String("consumer_tag", s.cfg.ConsumerTag)}, nil
}

// supervise keeps the Subscriber consuming until it stops: it receives the
// deliveries of the current session, and when the session is lost, opens a new
// one, with backoff while attempts fail.
func (s *Subscriber) supervise(sess *session) {
	backoff := retry.Backoff{Schedule: retry.Exponential{Base: s.cfg.ReconnectBackoff, Max: s.cfg.MaxReconnectBackoff}}
	wait := false    // the first attempt after a loss is immediate
	failing := false // a failing streak, logged once
	for {
		if sess == nil {
			if wait && !subscriber.Pause(&s.svc.Lifecycle, backoff.Next()) {
				return
			}
			var err error
			if sess, err = s.open(s.stopCtx, true); err != nil {
				if s.stopCtx.Err() != nil {
					return
				}
				if !failing {
					s.log.Warn("cannot reconnect; retrying with backoff", slog.Any("error", err))
					failing = true
				} else {
					s.log.Debug("cannot reconnect", slog.Any("error", err))
				}
				wait = true
				continue
			}
			failing, wait = false, false
			backoff.Reset()
			s.reconnects.Add(1)
			s.mu.Lock()
			s.cur = sess
			s.mu.Unlock()
			s.log.Info("reconnected", slog.String("url", s.display))
		}
		if s.receive(sess) {
			return // stopping; Stop closes the session
		}
		s.lose(sess)
		sess = nil
	}
}

// receive queues the session's deliveries by aggregate until the session is lost
// (false) or the Subscriber stops (true). On stopping, it cancels the consumer and
// hands back what arrives until the server confirms, so that nothing more comes.
func (s *Subscriber) receive(sess *session) (stopping bool) {
	for {
		select {
		case d, ok := <-sess.deliveries:
			if !ok {
				return false
			}
			it := &item{sess: sess, d: d, headers: deliveryHeaders(d.Headers)}
			s.svc.Push(it)
		case <-s.svc.Lifecycle.Stopping():
			// basic.cancel: the server confirms after the deliveries already on
			// their way, and amqp091-go then closes the deliveries channel. The
			// channel stays open: the messages in progress are acked on it.
			if err := sess.ch.Cancel(s.cfg.ConsumerTag, false); err != nil {
				s.log.Debug("could not cancel the consumer", slog.Any("error", err))
			}
			for d := range sess.deliveries {
				amqpBroker{s}.Release(&item{sess: sess, d: d})
			}
			return true
		}
	}
}

// lose forgets a lost session: its messages that have not started are dropped
// (the server redelivers them), and so are its delayed requeues. Closing the
// connection hands its unacknowledged messages back to the queue when only the
// channel or the consumer was lost.
func (s *Subscriber) lose(sess *session) {
	sess.lost.Store(true)
	reason := sess.reason()
	var timers []*time.Timer
	s.svc.Drop(func(it *item) bool { return it.sess == sess })
	s.mu.Lock()
	s.cur = nil
	for it, t := range s.delayed {
		if it.sess == sess {
			delete(s.delayed, it)
			timers = append(timers, t)
		}
	}
	s.mu.Unlock()
	for _, t := range timers {
		t.Stop()
		s.settling.Done()
	}
	sess.close()
	s.log.Warn("connection lost; reconnecting", slog.Any("error", reason))
}

// amqpBroker settles RabbitMQ deliveries for the core.
type amqpBroker struct{ s *Subscriber }

func (b amqpBroker) Lane(it *item) pgoutbox.Lane {
	return laneKey(it.headers)
}

func (b amqpBroker) Delivery(it *item) (inbox.Delivery, bool) {
	if it.sess.lost.Load() {
		return inbox.Delivery{}, false // its channel is gone: the server redelivers it
	}
	return inbox.Delivery{Body: it.d.Body, Headers: it.headers, Attempt: attempt(&it.d)}, true
}

func (b amqpBroker) Ack(it *item) {
	b.s.settle(it, "ack", &b.s.acked, func() error { return it.d.Ack(false) })
}

func (b amqpBroker) Term(it *item, o inbox.Outcome) {
	b.s.settle(it, "reject", &b.s.rejected, func() error { return it.d.Nack(false, false) })
	b.s.log.Error("rejected a message that is not an outbox event; it is not requeued (the queue's dead-letter exchange gets it, if there is one)",
		slog.String("exchange", it.d.Exchange), slog.String("routing_key", it.d.RoutingKey),
		slog.String("message_id", it.d.MessageId), slog.Bool("redelivered", it.d.Redelivered), slog.Any("error", o.Err))
}

// Nak requeues after the delay, capped by Config.MaxRequeueDelay: RabbitMQ
// cannot redeliver later (see the package doc).
func (b amqpBroker) Nak(it *item, delay time.Duration) {
	b.s.requeueAfter(it, min(delay, b.s.cfg.MaxRequeueDelay))
}

// Release hands a message that was not processed back to the queue at once.
func (b amqpBroker) Release(it *item) {
	b.s.settle(it, "release", &b.s.released, func() error { return it.d.Nack(false, true) })
}

// requeueAfter nacks it with requeue once delay has passed, or at once when
// stopping. Neither the worker nor the aggregate's lane waits for it.
func (s *Subscriber) requeueAfter(it *item, delay time.Duration) {
	s.mu.Lock()
	if delay <= 0 || s.draining {
		s.mu.Unlock()
		s.requeue(it)
		return
	}
	s.settling.Add(1)
	// The timer cannot fire before it is in the map: its function takes s.mu.
	s.delayed[it] = time.AfterFunc(delay, func() {
		s.mu.Lock()
		_, mine := s.delayed[it]
		delete(s.delayed, it)
		s.mu.Unlock()
		if mine { // not taken by Stop or by the loss of its session
			s.requeue(it)
			s.settling.Done()
		}
	})
	s.mu.Unlock()
}

func (s *Subscriber) requeue(it *item) {
	s.settle(it, "requeue", &s.requeued, func() error { return it.d.Nack(false, true) })
}

// settle sends an ack or a nack and counts it.
func (s *Subscriber) settle(it *item, action string, counter *atomic.Int64, send func() error) {
	if err := send(); err != nil {
		// Its channel is gone, and with it the delivery: the server redelivers
		// the message (to this Subscriber once reconnected, or another), and the
		// inbox makes that safe.
		s.unsettled.Add(1)
		s.log.Warn("could not settle message; the server redelivers it", slog.String("action", action),
			slog.String("message_id", it.d.MessageId), slog.Any("error", err))
		return
	}
	counter.Add(1)
}

// drainOnStop, once the Subscriber begins to stop, ends attempts to reconnect
// and requeues at once the messages waiting out a retry delay. (The supervisor
// cancels the consumer, the workers end after their current message.)
func (s *Subscriber) drainOnStop() {
	<-s.svc.Lifecycle.Stopping()
	s.stopCancel()
	s.mu.Lock()
	s.draining = true
	waiting := s.delayed
	s.delayed = map[*item]*time.Timer{}
	s.mu.Unlock()
	for it, t := range waiting {
		t.Stop()
		s.requeue(it)
		s.settling.Done()
	}
}

// closeCurrent closes the current session's connection, if any.
func (s *Subscriber) closeCurrent() {
	s.mu.Lock()
	sess := s.cur
	s.mu.Unlock()
	if sess != nil {
		sess.close()
	}
}

// halt begins the lifecycle's Stopped hook, the supervisor and the workers
// having returned: the delayed requeues are sent, and the messages of a lost
// session are dropped (the server redelivers them). Then the service requeues
// what was received but not started, and the connection is closed (Close).
func (s *Subscriber) halt() {
	s.stopCancel()
	s.settling.Wait()
	s.svc.Drop(func(it *item) bool { return it.sess.lost.Load() })
}

// Stopping is closed when the subscriber begins to stop (Stop, or the end of
// Start's context): from then on it starts no new delivery.
func (s *Subscriber) Stopping() <-chan struct{} { return s.svc.Lifecycle.Stopping() }

// Stop shuts the Subscriber down gracefully: it cancels the consumer, so that the
// server sends nothing more; requeues at once the messages received but not
// started, and those waiting out a retry delay; lets the messages being processed
// finish (commit and ack, or roll back and requeue); and closes the connection.
// If ctx ends first, the stop turns hard: in-flight transactions are abandoned
// (rolled back), the connection is closed — the server requeues whatever was not
// acknowledged — and ctx's error is returned.
//
// Stop follows the one rule of pgoutbox's services (package internal/lifecycle):
// it may be called any number of times, from any goroutine, each call waiting
// for the same shutdown; before Start it closes the connection Dial opened,
// returns nil, and the Subscriber can no longer start.
func (s *Subscriber) Stop(ctx context.Context) error {
	err := s.svc.Lifecycle.Stop(ctx)
	if !s.svc.Lifecycle.Started() { // stopped before Start: no hook ran
		s.stopCancel()
		s.closeCurrent()
	}
	return err
}
