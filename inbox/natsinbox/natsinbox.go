// Package natsinbox feeds outbox events from NATS JetStream to an inbox consumer.
//
// A Subscriber pulls from a durable pull consumer that every instance of one logical
// consumer shares (JetStream spreads the messages over them), hands each message to
// an [inbox.Processor] — normally an *inbox.Consumer — and settles it by the
// outcome, only after the consumer transaction has ended:
//
//	applied, duplicate   Ack, after the commit
//	gap-rejected, failed NakWithDelay(Outcome.RetryAfter): redelivered later
//	undecodable          Term: never redelivered, logged as an error
//
// A message without valid Outbox-* headers, or whose body is not JSON, is not an
// outbox event and can never be processed, so it is terminated rather than
// redelivered forever; the error log names its subject and stream sequence. A
// crash between commit and ack leaves the message unacknowledged: JetStream
// redelivers it after the consumer's AckWait, and the inbox finds it applied.
//
// Within one Subscriber, messages of one aggregate are processed one at a time in
// arrival order, while up to Config.Concurrency aggregates proceed in parallel.
// Across instances, the inbox's per-aggregate position keeps the order: an event
// that overtook its predecessor is rejected and redelivered (inbox.GapReject).
package natsinbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/pgoutbox/pgoutbox/broker"
	"github.com/pgoutbox/pgoutbox/inbox"
	"github.com/pgoutbox/pgoutbox/inbox/internal/lanes"
	"github.com/pgoutbox/pgoutbox/internal/failpoint"
)

// Config configures a Subscriber. The zero value is usable; each field documents its
// default. Fields marked "when creating" shape the durable consumer only if the
// Subscriber creates it: an existing consumer is used as it is, never modified.
type Config struct {
	// Stream is the JetStream stream holding the events; it must exist (the relay
	// creates it). Defaults to "OUTBOX".
	Stream string

	// Durable is the name of the durable pull consumer, shared by every instance of
	// the inbox consumer. Defaults to the processor's Name(), which must then be a
	// valid NATS consumer name (no '.', '*', '>', '/', '\' or whitespace).
	Durable string

	// FilterSubjects restricts the consumer to these subjects, when creating.
	// Defaults to every subject of the stream.
	FilterSubjects []string

	// DeliverPolicy is where a new consumer starts, when creating. Defaults to
	// jetstream.DeliverAllPolicy: the whole stream. A consumer that starts later
	// than an aggregate's first event finds a gap under inbox.GapReject; seed its
	// positions with inbox.Consumer.SetPosition.
	DeliverPolicy jetstream.DeliverPolicy

	// AckWait is how long JetStream waits for an ack before redelivering, when
	// creating: the delay before a crashed instance's messages go to another.
	// Keep it above the slowest handler. Defaults to 30s.
	AckWait time.Duration

	// MaxAckPending bounds the messages delivered and not yet acked across all
	// instances, when creating. Defaults to 1000.
	MaxAckPending int

	// MaxDeliver is how many times a message is delivered at most, when creating;
	// -1 is unlimited. A message that reaches it is dropped by JetStream (an
	// advisory is published): under inbox.GapReject its aggregate then waits for a
	// reconciliation. Defaults to -1.
	MaxDeliver int

	// Concurrency is how many messages this Subscriber processes at once, each in
	// its own transaction (size the database pool for it). Messages of one
	// aggregate never run at the same time. Defaults to 4.
	Concurrency int

	// Prefetch is how many messages the Subscriber pulls ahead of processing; it
	// holds at most about twice that many unprocessed. Each one's AckWait runs
	// from its delivery, so keep it small next to AckWait × throughput. Defaults to
	// 2 × Concurrency.
	Prefetch int

	// MaxWait is how long one pull request waits on the server for messages.
	// Stop waits for the outstanding request to end before it hands unprocessed
	// messages back (a request left open on the server could receive them and
	// strand them until AckWait), so this bounds Stop's wait; an idle Subscriber
	// sends one request per MaxWait. Defaults to 1s.
	MaxWait time.Duration

	// ProcessTimeout bounds one Process call (the consumer transaction with its
	// handler). Defaults to the consumer's AckWait.
	ProcessTimeout time.Duration

	// Logger receives terminated messages and settling errors. Defaults to
	// slog.Default().
	Logger *slog.Logger
}

func (c *Config) withDefaults(name string) (Config, error) {
	var out Config
	if c != nil {
		out = *c
	}
	if out.Stream == "" {
		out.Stream = "OUTBOX"
	}
	if out.Durable == "" {
		out.Durable = name
	}
	if out.AckWait == 0 {
		out.AckWait = 30 * time.Second
	}
	if out.MaxAckPending == 0 {
		out.MaxAckPending = 1000
	}
	if out.MaxDeliver == 0 {
		out.MaxDeliver = -1
	}
	if out.Concurrency == 0 {
		out.Concurrency = 4
	}
	if out.Prefetch == 0 {
		out.Prefetch = 2 * out.Concurrency
	}
	if out.MaxWait == 0 {
		out.MaxWait = time.Second
	}
	if out.Logger == nil {
		out.Logger = slog.Default()
	}
	var errs []error
	check := func(ok bool, format string, args ...any) {
		if !ok {
			errs = append(errs, fmt.Errorf("natsinbox: "+format, args...))
		}
	}
	check(validName(out.Stream), "Config.Stream %q: a stream name cannot contain '.', '*', '>', '/', '\\' or whitespace", out.Stream)
	if c == nil || c.Durable == "" {
		check(validName(out.Durable), "Config.Durable: the consumer name %q is not a valid NATS consumer name; set Config.Durable", out.Durable)
	} else {
		check(validName(out.Durable), "Config.Durable %q: a consumer name cannot contain '.', '*', '>', '/', '\\' or whitespace", out.Durable)
	}
	check(out.AckWait > 0, "Config.AckWait %s: must be positive", out.AckWait)
	check(out.MaxAckPending > 0, "Config.MaxAckPending %d: must be positive", out.MaxAckPending)
	check(out.MaxDeliver == -1 || out.MaxDeliver > 0, "Config.MaxDeliver %d: want -1 or a positive count", out.MaxDeliver)
	check(out.Concurrency > 0 && out.Concurrency <= 1024, "Config.Concurrency %d: want 1..1024", out.Concurrency)
	check(out.Prefetch > 0, "Config.Prefetch %d: must be positive", out.Prefetch)
	check(out.MaxWait >= 100*time.Millisecond && out.MaxWait < time.Hour, "Config.MaxWait %s: want 100ms..1h", out.MaxWait)
	check(out.ProcessTimeout >= 0, "Config.ProcessTimeout %s: must not be negative", out.ProcessTimeout)
	return out, errors.Join(errs...)
}

func hasPrefixFold(s, prefix string) bool {
	return len(s) >= len(prefix) && strings.EqualFold(s[:len(prefix)], prefix)
}

func validName(s string) bool {
	return s != "" && len(s) <= 255 && !strings.ContainsAny(s, ".*>/\\ \t\r\n")
}

// Stats are a Subscriber's counters since Start.
type Stats struct {
	Acked      int64 // messages acknowledged (applied or duplicate)
	Naked      int64 // messages handed back for redelivery (gap, failure)
	Terminated int64 // undecodable messages terminated
	Released   int64 // messages pulled but not processed when the Subscriber stopped, handed back at once
}

// Subscriber consumes one durable JetStream consumer into an inbox.Processor. Create
// it with New, Start it, and Stop it to shut down gracefully; it is not restartable.
type Subscriber struct {
	cfg  Config
	js   jetstream.JetStream
	proc inbox.Processor
	log  *slog.Logger

	cons       jetstream.Consumer
	hardCtx    context.Context // ends Process calls: Stop's deadline passed, or Start's ctx ended
	hardCancel context.CancelFunc
	loops      sync.WaitGroup // reader and workers
	helpers    sync.WaitGroup // the watcher of Start's ctx

	startOnce, stopOnce sync.Once
	started             atomic.Bool

	mu       sync.Mutex
	wake     *sync.Cond // queue changed, or stopping
	stopping bool
	queue    lanes.Queue[jetstream.Msg] // pulled, not yet handled, one aggregate at a time

	acked, naked, terminated, released atomic.Int64
}

// New returns a Subscriber that reads with js and processes with proc. cfg may be
// nil for all defaults; invalid settings are reported here.
func New(js jetstream.JetStream, proc inbox.Processor, cfg *Config) (*Subscriber, error) {
	if js == nil || proc == nil {
		return nil, errors.New("natsinbox: New needs a JetStream client and a processor")
	}
	c, err := cfg.withDefaults(proc.Name())
	if err != nil {
		return nil, err
	}
	s := &Subscriber{
		cfg:  c,
		js:   js,
		proc: proc,
		log:  c.Logger.With(slog.String("consumer", proc.Name()), slog.String("durable", c.Durable)),
	}
	s.wake = sync.NewCond(&s.mu)
	return s, nil
}

// Stats returns the Subscriber's counters.
func (s *Subscriber) Stats() Stats {
	return Stats{Acked: s.acked.Load(), Naked: s.naked.Load(), Terminated: s.terminated.Load(), Released: s.released.Load()}
}

// Start looks up the durable consumer, creating it if missing, and starts pulling
// and processing; it returns once that is under way. ctx governs the lookup, and
// its end later stops the Subscriber abruptly (in-flight transactions are
// abandoned and rolled back); prefer Stop. Start may be called once.
func (s *Subscriber) Start(ctx context.Context) error {
	err := errors.New("natsinbox: already started")
	s.startOnce.Do(func() { err = s.start(ctx) })
	return err
}

func (s *Subscriber) start(ctx context.Context) error {
	cons, err := s.ensureConsumer(ctx)
	if err != nil {
		return err
	}
	info := cons.CachedInfo()
	if s.cfg.ProcessTimeout == 0 {
		s.cfg.ProcessTimeout = info.Config.AckWait
	}
	s.cons = cons
	s.hardCtx, s.hardCancel = context.WithCancel(context.WithoutCancel(ctx))
	s.started.Store(true)
	s.log.Info("subscriber starting", slog.String("stream", s.cfg.Stream), slog.Int("concurrency", s.cfg.Concurrency),
		slog.Duration("ack_wait", info.Config.AckWait))

	s.loops.Add(1 + s.cfg.Concurrency)
	go s.read()
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

// ensureConsumer returns the durable consumer, creating it if missing. An existing
// consumer is used as is, but it must ack explicitly.
func (s *Subscriber) ensureConsumer(ctx context.Context) (jetstream.Consumer, error) {
	cons, err := s.js.Consumer(ctx, s.cfg.Stream, s.cfg.Durable)
	if errors.Is(err, jetstream.ErrConsumerNotFound) {
		cc := jetstream.ConsumerConfig{
			Durable:       s.cfg.Durable,
			Description:   "pgoutbox inbox consumer " + s.proc.Name(),
			AckPolicy:     jetstream.AckExplicitPolicy,
			AckWait:       s.cfg.AckWait,
			MaxAckPending: s.cfg.MaxAckPending,
			MaxDeliver:    s.cfg.MaxDeliver,
			DeliverPolicy: s.cfg.DeliverPolicy,
		}
		// One filter goes in FilterSubject, which servers before 2.10 understand.
		if len(s.cfg.FilterSubjects) == 1 {
			cc.FilterSubject = s.cfg.FilterSubjects[0]
		} else {
			cc.FilterSubjects = s.cfg.FilterSubjects
		}
		cons, err = s.js.CreateConsumer(ctx, s.cfg.Stream, cc)
		if errors.Is(err, jetstream.ErrConsumerExists) {
			// Another instance created it first.
			cons, err = s.js.Consumer(ctx, s.cfg.Stream, s.cfg.Durable)
		} else if err == nil {
			s.log.Info("created durable consumer", slog.String("stream", s.cfg.Stream))
		}
	}
	if err != nil {
		return nil, fmt.Errorf("natsinbox: consumer %s of stream %s: %w", s.cfg.Durable, s.cfg.Stream, err)
	}
	if p := cons.CachedInfo().Config.AckPolicy; p != jetstream.AckExplicitPolicy {
		return nil, fmt.Errorf("natsinbox: consumer %s of stream %s has ack policy %s; the inbox needs explicit acks",
			s.cfg.Durable, s.cfg.Stream, p)
	}
	return cons, nil
}

// read pulls messages and queues them by aggregate until stopping. One pull request
// is outstanding at a time, and it ends (filled, or expired after MaxWait) before
// read returns, so that no request of this Subscriber is left on the server when
// Stop hands messages back.
func (s *Subscriber) read() {
	defer s.loops.Done()
	defer func() { // wake workers waiting for messages that will not come
		s.mu.Lock()
		s.stopping = true
		s.wake.Broadcast()
		s.mu.Unlock()
	}()
	// Refill when the queue is down to half: fewer, larger requests.
	low := s.cfg.Prefetch / 2
	var pause time.Duration
	for {
		s.mu.Lock()
		for s.queue.Len() > low && !s.stopping {
			s.wake.Wait()
		}
		n, stopping := s.cfg.Prefetch-s.queue.Len(), s.stopping
		s.mu.Unlock()
		if stopping {
			return
		}
		batch, err := s.cons.Fetch(n, jetstream.FetchMaxWait(s.cfg.MaxWait))
		if err == nil {
			for msg := range batch.Messages() {
				s.enqueue(msg)
			}
			err = batch.Error()
		}
		if err == nil {
			pause = 0
			continue
		}
		// The connection is down (nats.go reconnects), or the consumer is gone:
		// try again, more slowly each time.
		pause = min(max(2*pause, 100*time.Millisecond), 5*time.Second)
		s.log.Warn("pull request failed; retrying", slog.Duration("in", pause), slog.Any("error", err))
		if !s.sleep(pause) {
			return
		}
	}
}

// sleep waits d, or less when stopping; it reports whether to go on.
func (s *Subscriber) sleep(d time.Duration) bool {
	t := time.AfterFunc(d, func() {
		s.mu.Lock()
		s.wake.Broadcast()
		s.mu.Unlock()
	})
	defer t.Stop()
	deadline := time.Now().Add(d)
	s.mu.Lock()
	defer s.mu.Unlock()
	for !s.stopping && time.Now().Before(deadline) {
		s.wake.Wait()
	}
	return !s.stopping
}

func (s *Subscriber) enqueue(msg jetstream.Msg) {
	h := msg.Headers()
	key := h.Get(broker.HeaderAggregateType) + "\x00" + h.Get(broker.HeaderAggregateID)
	s.mu.Lock()
	if s.stopping {
		s.mu.Unlock()
		s.release(msg)
		return
	}
	if s.queue.Push(key, msg) {
		s.wake.Broadcast()
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
		key, msg := s.queue.Take()
		s.wake.Broadcast() // room for the reader

		s.mu.Unlock()
		s.handle(msg)
		s.mu.Lock()

		s.queue.Done(key) // a lane ready again is taken by this loop
	}
}

// handle processes one message and settles it with the broker.
func (s *Subscriber) handle(msg jetstream.Msg) {
	d := inbox.Delivery{Body: msg.Data(), Headers: make(map[string]string, len(msg.Headers())), Attempt: 1}
	for k, vs := range msg.Headers() {
		// Nats-* headers (Nats-Msg-Id, …) are the broker's, not the producer's.
		if len(vs) > 0 && !hasPrefixFold(k, "Nats-") {
			d.Headers[k] = vs[0]
		}
	}
	if md, err := msg.Metadata(); err == nil {
		d.Attempt = int(md.NumDelivered)
	}
	ctx, cancel := context.WithTimeout(s.hardCtx, s.cfg.ProcessTimeout)
	o := s.proc.Process(ctx, d)
	cancel()

	var err error
	switch o.Action() {
	case inbox.ActionAck:
		// The transaction has committed (or found the event applied): only now may
		// the broker forget the message. A crash before this line means a
		// redelivery, which the inbox recognises.
		if o.Status == inbox.StatusApplied {
			_ = failpoint.Inject(failpoint.ConsumerAfterCommit) // crash or delay: the commit is done
		}
		err = msg.Ack()
		s.acked.Add(1)
	case inbox.ActionTerm:
		err = msg.Term()
		s.terminated.Add(1)
		attrs := []any{slog.String("subject", msg.Subject()), slog.Any("error", o.Err)}
		if md, mdErr := msg.Metadata(); mdErr == nil {
			attrs = append(attrs, slog.Uint64("stream_sequence", md.Sequence.Stream))
		}
		s.log.Error("terminated a message that is not an outbox event; it will not be redelivered", attrs...)
	default:
		delay := o.RetryAfter
		if s.hardCtx.Err() != nil {
			delay = 0 // abandoned by a hard stop: let another instance have it now
		}
		err = msg.NakWithDelay(delay)
		s.naked.Add(1)
	}
	if err != nil {
		// The broker redelivers after AckWait anyway; the inbox makes that safe.
		s.log.Warn("could not settle message", slog.String("action", o.Action().String()),
			slog.String("subject", msg.Subject()), slog.Any("error", err))
	}
}

// release hands an unprocessed message back for immediate redelivery elsewhere.
func (s *Subscriber) release(msg jetstream.Msg) {
	if err := msg.Nak(); err != nil {
		s.log.Debug("could not release message; it is redelivered after AckWait", slog.Any("error", err))
	}
	s.released.Add(1)
}

func (s *Subscriber) signalStop() {
	s.stopOnce.Do(func() {
		s.mu.Lock()
		s.stopping = true
		s.wake.Broadcast()
		s.mu.Unlock()
	})
}

// Stop shuts the Subscriber down gracefully: it stops pulling, lets the messages
// being processed finish (commit and ack, or roll back and nak), and hands every
// message pulled but not started back to JetStream for immediate redelivery to
// another instance. If ctx ends first, in-flight transactions are abandoned (rolled
// back, their messages nacked without delay) and ctx's error is returned. Stop is
// safe to call more than once, and before Start.
func (s *Subscriber) Stop(ctx context.Context) error {
	if !s.started.Load() {
		s.startOnce.Do(func() {}) // a later Start fails
		return nil
	}
	s.signalStop()
	done := make(chan struct{})
	go func() { s.loops.Wait(); close(done) }()
	var err error
	select {
	case <-done:
	case <-ctx.Done():
		err = fmt.Errorf("natsinbox: stop: %w", ctx.Err())
		s.hardCancel()
		<-done
	}
	s.hardCancel()
	s.helpers.Wait()
	s.mu.Lock()
	left := s.queue.Drain()
	s.mu.Unlock()
	for _, m := range left {
		s.release(m)
	}
	st := s.Stats()
	s.log.Info("subscriber stopped", slog.Int64("acked", st.Acked), slog.Int64("naked", st.Naked),
		slog.Int64("terminated", st.Terminated), slog.Int64("released", st.Released))
	return err
}
