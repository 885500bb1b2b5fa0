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
package rabbitinbox

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/pgoutbox/pgoutbox/inbox"
	"github.com/pgoutbox/pgoutbox/inbox/internal/lanes"
	"github.com/pgoutbox/pgoutbox/internal/failpoint"
)

// maxShortstr is the longest AMQP short string: queue and exchange names, routing
// keys and consumer tags.
const maxShortstr = 255

// Config configures a Subscriber. Queue is required; every other field documents
// its default.
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
	// selects one aggregate type. Only with Exchange. Defaults to "#": every event.
	BindingKeys []string

	// QueueArguments are the arguments Queue is declared with when the Subscriber
	// declares it (only with Exchange): "x-queue-type": "quorum" for a replicated
	// queue, "x-dead-letter-exchange" for where rejected messages go. Defaults to
	// none: a classic queue.
	QueueArguments amqp.Table

	// Prefetch is the channel's prefetch count (basic.qos): how many messages the
	// server sends ahead of their acks. A message waiting out its retry delay
	// counts too. Defaults to 64.
	Prefetch int

	// Concurrency is how many messages this Subscriber processes at once, each in
	// its own transaction (size the database pool for it). Messages of one
	// aggregate never run at the same time. Defaults to 4.
	Concurrency int

	// ConsumerTag names the consumer on its channel, as the management UI shows
	// it. Defaults to "pgoutbox-inbox-" followed by the processor's Name().
	ConsumerTag string

	// ProcessTimeout bounds one Process call (the consumer transaction with its
	// handler). Keep it, plus MaxRequeueDelay, well below the server's
	// consumer_timeout (30 minutes by default), after which the server closes a
	// channel whose delivery is not acknowledged. Defaults to 1m.
	ProcessTimeout time.Duration

	// MaxRequeueDelay caps how long a message the inbox wants redelivered
	// (gap-rejected, failed) is held before it is nacked with requeue; see the
	// package doc. Defaults to 10s.
	MaxRequeueDelay time.Duration

	// ConnectionName is the connection's name on the server (the
	// connection_name client property), shown by rabbitmqctl list_connections and
	// the management UI. Defaults to "pgoutbox inbox " followed by the processor's
	// Name().
	ConnectionName string

	// ConnectTimeout bounds each attempt to connect: TCP, TLS and AMQP handshakes,
	// declaring, and starting the consumer. Defaults to 10s.
	ConnectTimeout time.Duration

	// ReconnectBackoff is the wait after the first failed attempt to reconnect
	// (the first attempt after a loss is immediate); it doubles after each further
	// failure, with jitter, up to MaxReconnectBackoff. Defaults to 100ms.
	ReconnectBackoff time.Duration

	// MaxReconnectBackoff caps the wait between attempts to reconnect. Defaults to
	// 30s.
	MaxReconnectBackoff time.Duration

	// TLSConfig is the TLS configuration for amqps:// URLs. Defaults to the one
	// amqp091-go builds from the URL's cacertfile, certfile, keyfile and
	// server_name_indication parameters.
	TLSConfig *tls.Config

	// Logger receives connection events (lost, reconnected), rejected messages and
	// settling errors. Defaults to slog.Default().
	Logger *slog.Logger
}

func (c *Config) withDefaults(name string) (Config, error) {
	var out Config
	if c != nil {
		out = *c
	}
	if out.Exchange != "" && len(out.BindingKeys) == 0 {
		out.BindingKeys = []string{"#"}
	}
	if out.Prefetch == 0 {
		out.Prefetch = 64
	}
	if out.Concurrency == 0 {
		out.Concurrency = 4
	}
	if out.ConsumerTag == "" {
		out.ConsumerTag = "pgoutbox-inbox-" + name
	}
	if out.ProcessTimeout == 0 {
		out.ProcessTimeout = time.Minute
	}
	if out.MaxRequeueDelay == 0 {
		out.MaxRequeueDelay = 10 * time.Second
	}
	if out.ConnectionName == "" {
		out.ConnectionName = "pgoutbox inbox " + name
	}
	if out.ConnectTimeout == 0 {
		out.ConnectTimeout = 10 * time.Second
	}
	if out.ReconnectBackoff == 0 {
		out.ReconnectBackoff = 100 * time.Millisecond
	}
	if out.MaxReconnectBackoff == 0 {
		out.MaxReconnectBackoff = max(30*time.Second, out.ReconnectBackoff)
	}
	if out.Logger == nil {
		out.Logger = slog.Default()
	}

	var errs []error
	check := func(ok bool, format string, args ...any) {
		if !ok {
			errs = append(errs, fmt.Errorf("rabbitinbox: "+format, args...))
		}
	}
	shortstr := func(s string) bool { return len(s) <= maxShortstr && utf8.ValidString(s) }
	check(out.Queue != "", "Config.Queue is required")
	check(shortstr(out.Queue), "Config.Queue: want at most %d bytes of UTF-8", maxShortstr)
	check(shortstr(out.Exchange), "Config.Exchange: want at most %d bytes of UTF-8", maxShortstr)
	check(out.Exchange != "" || (len(out.BindingKeys) == 0 && out.QueueArguments == nil),
		"Config.BindingKeys and Config.QueueArguments need Config.Exchange: without it the queue is the operator's")
	for _, k := range out.BindingKeys {
		check(shortstr(k), "Config.BindingKeys: %q: want at most %d bytes of UTF-8", k, maxShortstr)
	}
	if err := out.QueueArguments.Validate(); err != nil {
		check(false, "Config.QueueArguments: %v", err)
	}
	check(out.Prefetch > 0 && out.Prefetch <= 65535, "Config.Prefetch %d: want 1..65535", out.Prefetch)
	check(out.Concurrency > 0 && out.Concurrency <= 1024, "Config.Concurrency %d: want 1..1024", out.Concurrency)
	check(shortstr(out.ConsumerTag), "Config.ConsumerTag: want at most %d bytes of UTF-8", maxShortstr)
	check(out.ProcessTimeout > 0, "Config.ProcessTimeout %s: must be positive", out.ProcessTimeout)
	check(out.MaxRequeueDelay > 0, "Config.MaxRequeueDelay %s: must be positive", out.MaxRequeueDelay)
	check(out.ConnectTimeout > 0, "Config.ConnectTimeout %s: must be positive", out.ConnectTimeout)
	check(out.ReconnectBackoff > 0 && out.MaxReconnectBackoff >= out.ReconnectBackoff,
		"Config.ReconnectBackoff (%s) must be positive and at most Config.MaxReconnectBackoff (%s)", out.ReconnectBackoff, out.MaxReconnectBackoff)
	return out, errors.Join(errs...)
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

	stopCh     chan struct{}   // closed when stopping
	stopCtx    context.Context // ends when stopping: bounds attempts to reconnect
	stopCancel context.CancelFunc
	hardCtx    context.Context // ends Process calls: Stop's deadline passed, or Start's ctx ended
	hardCancel context.CancelFunc

	loops    sync.WaitGroup // the supervisor and the workers
	helpers  sync.WaitGroup // the watcher of Start's ctx
	settling sync.WaitGroup // delayed requeues not yet sent or dropped

	startOnce, signalOnce, stopOnce sync.Once
	started                         atomic.Bool
	stopped                         chan struct{} // closed when Stop has finished

	mu       sync.Mutex
	wake     *sync.Cond // a lane became ready, or stopping
	stopping bool
	cur      *session              // nil while reconnecting
	queue    lanes.Queue[*item]    // received, not yet handled, one aggregate at a time
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
		stopCh:  make(chan struct{}),
		stopped: make(chan struct{}),
		delayed: map[*item]*time.Timer{},
	}
	s.wake = sync.NewCond(&s.mu)
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
// the Subscriber abruptly: in-flight transactions are abandoned and rolled back,
// and Stop must still be called to close the connection; prefer Stop. If the
// connection Dial opened has been lost meanwhile, Start returns at once and the
// Subscriber reconnects in the background. Start may be called once.
func (s *Subscriber) Start(ctx context.Context) error {
	err := errors.New("rabbitinbox: already started or stopped")
	s.startOnce.Do(func() { err = s.start(ctx) })
	return err
}

func (s *Subscriber) start(ctx context.Context) error {
	s.mu.Lock()
	sess := s.cur
	s.mu.Unlock()
	cctx, cancel := context.WithTimeout(ctx, s.cfg.ConnectTimeout)
	defer cancel()
	if err := bounded(cctx, sess.conn, func() error { return s.consume(sess) }); err != nil {
		if cctx.Err() != nil || !sess.conn.IsClosed() {
			// Refused by the server (the queue was deleted, or is exclusive to
			// another connection), or abandoned: not something to retry.
			return err
		}
		s.log.Warn("connection lost before consuming; reconnecting", slog.Any("error", err))
		sess.lost.Store(true)
		s.mu.Lock()
		s.cur = nil
		s.mu.Unlock()
		sess = nil
	}
	s.hardCtx, s.hardCancel = context.WithCancel(context.WithoutCancel(ctx))
	s.started.Store(true)
	s.log.Info("subscriber starting", slog.Int("concurrency", s.cfg.Concurrency), slog.Int("prefetch", s.cfg.Prefetch),
		slog.String("consumer_tag", s.cfg.ConsumerTag))

	s.loops.Add(1 + s.cfg.Concurrency)
	go s.supervise(sess)
	for range s.cfg.Concurrency {
		go s.work()
	}
	// Start's ctx ending is a hard stop.
	s.helpers.Add(1)
	go func() {
		defer s.helpers.Done()
		select {
		case <-ctx.Done():
			s.signalStop()
			s.hardCancel()
		case <-s.hardCtx.Done():
		}
	}()
	return nil
}

// supervise keeps the Subscriber consuming until it stops: it receives the
// deliveries of the current session, and when the session is lost, opens a new
// one, with backoff while attempts fail.
func (s *Subscriber) supervise(sess *session) {
	defer s.loops.Done()
	var backoff time.Duration // 0: the next attempt is immediate
	failing := false          // a failing streak, logged once
	for {
		if sess == nil {
			if backoff > 0 && !s.pause(backoff/2+rand.N(backoff/2+1)) {
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
				backoff = min(max(2*backoff, s.cfg.ReconnectBackoff), s.cfg.MaxReconnectBackoff)
				continue
			}
			failing, backoff = false, 0
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

// pause waits d; it reports false if the Subscriber stops first.
func (s *Subscriber) pause(d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-s.stopCh:
		return false
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
			s.enqueue(sess, d)
		case <-s.stopCh:
			// basic.cancel: the server confirms after the deliveries already on
			// their way, and amqp091-go then closes the deliveries channel. The
			// channel stays open: the messages in progress are acked on it.
			if err := sess.ch.Cancel(s.cfg.ConsumerTag, false); err != nil {
				s.log.Debug("could not cancel the consumer", slog.Any("error", err))
			}
			for d := range sess.deliveries {
				s.release(&item{sess: sess, d: d})
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
	s.mu.Lock()
	s.cur = nil
	s.queue.Drop(func(it *item) bool { return it.sess == sess })
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

func (s *Subscriber) enqueue(sess *session, d amqp.Delivery) {
	it := &item{sess: sess, d: d, headers: deliveryHeaders(d.Headers)}
	key := laneKey(it.headers)
	s.mu.Lock()
	if s.stopping {
		s.mu.Unlock()
		s.release(it)
		return
	}
	if s.queue.Push(key, it) {
		s.wake.Signal()
	}
	s.mu.Unlock()
}

// work processes ready lanes, one message at a time per lane, until stopping.
func (s *Subscriber) work() {
	defer s.loops.Done()
	s.mu.Lock()
	defer s.mu.Unlock()
	for {
		for !s.queue.Ready() && !s.stopping {
			s.wake.Wait()
		}
		if s.stopping {
			return
		}
		key, it := s.queue.Take()

		s.mu.Unlock()
		s.handle(it)
		s.mu.Lock()

		if s.queue.Done(key) {
			s.wake.Signal()
		}
	}
}

// handle processes one message and settles it with the broker.
func (s *Subscriber) handle(it *item) {
	if it.sess.lost.Load() {
		return // its channel is gone: the server redelivers it
	}
	d := inbox.Delivery{Body: it.d.Body, Headers: it.headers, Attempt: attempt(&it.d)}
	ctx, cancel := context.WithTimeout(s.hardCtx, s.cfg.ProcessTimeout)
	o := s.proc.Process(ctx, d)
	cancel()

	switch o.Action() {
	case inbox.ActionAck:
		// The transaction has committed (or found the event applied): only now
		// may the server forget the message. A crash or a lost connection before
		// the ack reaches it means a redelivery, which the inbox recognises.
		if o.Status == inbox.StatusApplied {
			_ = failpoint.Inject(failpoint.ConsumerAfterCommit) // crash or delay: the commit is done
		}
		s.settle(it, "ack", &s.acked, func() error { return it.d.Ack(false) })
	case inbox.ActionTerm:
		s.settle(it, "reject", &s.rejected, func() error { return it.d.Nack(false, false) })
		s.log.Error("rejected a message that is not an outbox event; it is not requeued (the queue's dead-letter exchange gets it, if there is one)",
			slog.String("exchange", it.d.Exchange), slog.String("routing_key", it.d.RoutingKey),
			slog.String("message_id", it.d.MessageId), slog.Bool("redelivered", it.d.Redelivered), slog.Any("error", o.Err))
	default:
		delay := min(o.RetryAfter, s.cfg.MaxRequeueDelay)
		if s.hardCtx.Err() != nil {
			delay = 0 // abandoned by a hard stop: let another instance have it now
		}
		s.requeueAfter(it, delay)
	}
}

// requeueAfter nacks it with requeue once delay has passed, or at once when
// stopping. Neither the worker nor the aggregate's lane waits for it.
func (s *Subscriber) requeueAfter(it *item, delay time.Duration) {
	s.mu.Lock()
	if delay <= 0 || s.stopping {
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

// release hands a message that was not processed back to the queue at once.
func (s *Subscriber) release(it *item) {
	s.settle(it, "release", &s.released, func() error { return it.d.Nack(false, true) })
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

// signalStop stops intake: the supervisor cancels the consumer, the workers end
// after their current message, and the messages waiting out a retry delay are
// requeued now.
func (s *Subscriber) signalStop() {
	s.signalOnce.Do(func() {
		s.mu.Lock()
		s.stopping = true
		s.wake.Broadcast()
		waiting := s.delayed
		s.delayed = map[*item]*time.Timer{}
		s.mu.Unlock()
		close(s.stopCh)
		s.stopCancel()
		for it, t := range waiting {
			t.Stop()
			s.requeue(it)
			s.settling.Done()
		}
	})
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

// Stop shuts the Subscriber down gracefully: it cancels the consumer, so that the
// server sends nothing more; requeues at once the messages received but not
// started, and those waiting out a retry delay; lets the messages being processed
// finish (commit and ack, or roll back and requeue); and closes the connection.
// If ctx ends first, in-flight transactions are abandoned (rolled back), the
// connection is closed — the server requeues whatever was not acknowledged — and
// ctx's error is returned. Stop is safe to call more than once, and before Start.
func (s *Subscriber) Stop(ctx context.Context) error {
	s.startOnce.Do(func() {}) // a later Start fails
	first := false
	s.stopOnce.Do(func() { first = true })
	if !first {
		select {
		case <-s.stopped:
			return nil
		case <-ctx.Done():
			return fmt.Errorf("rabbitinbox: stop: %w", ctx.Err())
		}
	}
	defer close(s.stopped)
	if !s.started.Load() {
		s.stopCancel()
		s.closeCurrent()
		return nil
	}
	return s.stop(ctx)
}

func (s *Subscriber) stop(ctx context.Context) error {
	s.signalStop()
	done := make(chan struct{})
	go func() { s.loops.Wait(); close(done) }()
	var err error
	select {
	case <-done:
	case <-ctx.Done():
		err = fmt.Errorf("rabbitinbox: stop: %w", ctx.Err())
		s.hardCancel()
		// Also ends a basic.cancel the server does not answer.
		s.closeCurrent()
		<-done
	}
	s.settling.Wait()
	s.hardCancel()
	s.helpers.Wait()

	s.mu.Lock()
	left := s.queue.Drain()
	s.mu.Unlock()
	for _, it := range left {
		if !it.sess.lost.Load() {
			s.release(it)
		}
	}
	s.closeCurrent()
	st := s.Stats()
	s.log.Info("subscriber stopped", slog.Int64("acked", st.Acked), slog.Int64("requeued", st.Requeued),
		slog.Int64("rejected", st.Rejected), slog.Int64("released", st.Released), slog.Int64("reconnects", st.Reconnects))
	return err
}
