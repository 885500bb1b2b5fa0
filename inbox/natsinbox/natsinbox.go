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
//
// Outside the standard library it pulls in nats.go, besides what package inbox
// pulls in (pgx, the OpenTelemetry API); no NATS server code.
package natsinbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/pgoutbox/pgoutbox"
	"github.com/pgoutbox/pgoutbox/inbox"
	"github.com/pgoutbox/pgoutbox/inbox/internal/subscriber"
	"github.com/pgoutbox/pgoutbox/internal/config"
	"github.com/pgoutbox/pgoutbox/wire"
)

// The defaults of Config's fields.
const (
	DefaultStream        = "OUTBOX"
	DefaultAckWait       = 30 * time.Second
	DefaultMaxAckPending = 1000
	DefaultMaxDeliver    = -1 // unlimited
	DefaultConcurrency   = subscriber.DefaultConcurrency
	DefaultMaxWait       = time.Second
)

// Config configures a Subscriber. A nil *Config means all defaults; each field
// names its default. Fields marked "when creating" shape the durable consumer only if the
// Subscriber creates it: an existing consumer is used as it is, never modified.
type Config struct {
	// Stream is the JetStream stream holding the events; it must exist (the relay
	// creates it). Zero means DefaultStream ("OUTBOX").
	Stream string

	// Durable is the name of the durable pull consumer, shared by every instance of
	// the inbox consumer. Zero means the processor's Name(), which must then be a
	// valid NATS consumer name (no '.', '*', '>', '/', '\' or whitespace).
	Durable string

	// FilterSubjects restricts the consumer to these subjects, when creating.
	// Zero means every subject of the stream.
	FilterSubjects []string

	// DeliverPolicy is where a new consumer starts, when creating. Zero means
	// jetstream.DeliverAllPolicy: the whole stream. A consumer that starts later
	// than an aggregate's first event finds a gap under inbox.GapReject; seed its
	// positions with inbox.Consumer.SetPosition.
	DeliverPolicy jetstream.DeliverPolicy

	// AckWait is how long JetStream waits for an ack before redelivering, when
	// creating: the delay before a crashed instance's messages go to another.
	// Keep it above the slowest handler. Zero means DefaultAckWait (30s).
	AckWait time.Duration

	// MaxAckPending bounds the messages delivered and not yet acked across all
	// instances, when creating. Zero means DefaultMaxAckPending (1000).
	MaxAckPending int

	// MaxDeliver is how many times a message is delivered at most, when creating;
	// -1 is unlimited. A message that reaches it is dropped by JetStream (an
	// advisory is published): under inbox.GapReject its aggregate then waits for a
	// reconciliation. Zero means DefaultMaxDeliver (-1).
	MaxDeliver int

	// Concurrency is how many messages this Subscriber processes at once, each in
	// its own transaction (size the database pool for it). Messages of one
	// aggregate never run at the same time. Zero means DefaultConcurrency (4).
	Concurrency int

	// Prefetch is how many messages the Subscriber pulls ahead of processing; it
	// holds at most about twice that many unprocessed. Each one's AckWait runs
	// from its delivery, so keep it small next to AckWait × throughput. Zero means
	// 2 × Concurrency.
	Prefetch int

	// MaxWait is how long one pull request waits on the server for messages.
	// Stop waits for the outstanding request to end before it hands unprocessed
	// messages back (a request left open on the server could receive them and
	// strand them until AckWait), so this bounds Stop's wait; an idle Subscriber
	// sends one request per MaxWait. Zero means DefaultMaxWait (1s).
	MaxWait time.Duration

	// ProcessTimeout bounds one Process call (the consumer transaction with its
	// handler). Zero means the consumer's AckWait.
	ProcessTimeout time.Duration

	// Logger receives terminated messages and settling errors. Nil means
	// slog.Default().
	Logger *slog.Logger
}

// Validate reports what New would reject in c: the config as given, its zero
// fields meaning their defaults. It is safe on a nil receiver (all defaults are
// valid; the consumer name, from the processor, is checked by New). Several
// problems are joined with errors.Join.
func (c *Config) Validate() error {
	_, err := c.withDefaults("")
	return err
}

func (c *Config) withDefaults(name string) (Config, error) {
	return subscriber.Resolve("natsinbox", c, shared, func(out *Config) {
		config.Default(&out.Stream, DefaultStream)
		config.Default(&out.Durable, name)
		config.Default(&out.AckWait, DefaultAckWait)
		config.Default(&out.MaxAckPending, DefaultMaxAckPending)
		config.Default(&out.MaxDeliver, DefaultMaxDeliver)
		config.Default(&out.Prefetch, 2*out.Concurrency)
		config.Default(&out.MaxWait, DefaultMaxWait)
	}, func(out *Config, p *config.Problems) {
		p.Check(validName(out.Stream), "Config.Stream %q: a stream name cannot contain '.', '*', '>', '/', '\\' or whitespace", out.Stream)
		switch {
		case c != nil && c.Durable != "":
			p.Check(validName(out.Durable), "Config.Durable %q: a consumer name cannot contain '.', '*', '>', '/', '\\' or whitespace", out.Durable)
		case name != "": // without a processor (Validate), the name comes at New
			p.Check(validName(out.Durable), "Config.Durable: the consumer name %q is not a valid NATS consumer name; set Config.Durable", out.Durable)
		}
		p.Check(out.AckWait > 0, "Config.AckWait %s: must be positive", out.AckWait)
		p.Check(out.MaxAckPending > 0, "Config.MaxAckPending %d: must be positive", out.MaxAckPending)
		p.Check(out.MaxDeliver == -1 || out.MaxDeliver > 0, "Config.MaxDeliver %d: want -1 or a positive count", out.MaxDeliver)
		p.Check(out.Prefetch > 0, "Config.Prefetch %d: must be positive", out.Prefetch)
		p.Check(out.MaxWait >= 100*time.Millisecond && out.MaxWait < time.Hour, "Config.MaxWait %s: want 100ms..1h", out.MaxWait)
		p.Check(out.ProcessTimeout >= 0, "Config.ProcessTimeout %s: must not be negative", out.ProcessTimeout)
	})
}

func shared(c *Config) subscriber.Shared {
	return subscriber.Shared{Concurrency: &c.Concurrency, Logger: &c.Logger}
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

	svc  subscriber.Service[jetstream.Msg] // the lifecycle, the queue, the workers, the outcome mapping
	cons jetstream.Consumer

	acked, naked, terminated, released atomic.Int64
}

// New returns a Subscriber that reads with js and processes with proc. cfg may be
// nil for all defaults; it is copied, and invalid settings are reported here.
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
	s.svc.Init(subscriber.Setup[jetstream.Msg]{
		Name: "natsinbox", Broker: jsBroker{s}, Processor: proc, Concurrency: c.Concurrency, Log: s.log,
		Counters: func() []any {
			st := s.Stats()
			return []any{slog.Int64("acked", st.Acked), slog.Int64("naked", st.Naked),
				slog.Int64("terminated", st.Terminated), slog.Int64("released", st.Released)}
		},
	})
	return s, nil
}

// Stats returns the Subscriber's counters.
func (s *Subscriber) Stats() Stats {
	return Stats{Acked: s.acked.Load(), Naked: s.naked.Load(), Terminated: s.terminated.Load(), Released: s.released.Load()}
}

// Start looks up the durable consumer, creating it if missing, and starts pulling
// and processing; it returns once that is under way. ctx governs the lookup, and
// its end later stops the Subscriber hard (in-flight transactions are abandoned
// and rolled back); prefer Stop.
//
// Start follows the one rule of pgoutbox's services: a second Start returns an
// error matching lifecycle.ErrAlreadyStarted, a Start after Stop (or after a
// failed Start) one matching lifecycle.ErrStopped; a Subscriber is not
// restartable.
func (s *Subscriber) Start(ctx context.Context) error {
	return s.svc.Start(ctx, s.setup)
}

// setup finds the consumer; the reader pulls from it.
func (s *Subscriber) setup(ctx context.Context) ([]func(), []any, error) {
	cons, err := s.ensureConsumer(ctx)
	if err != nil {
		return nil, nil, err
	}
	info := cons.CachedInfo()
	if s.cfg.ProcessTimeout == 0 {
		s.cfg.ProcessTimeout = info.Config.AckWait
	}
	s.cons = cons
	s.svc.ProcessTimeout = s.cfg.ProcessTimeout
	return []func(){s.read}, []any{slog.String("stream", s.cfg.Stream), slog.Duration("ack_wait", info.Config.AckWait)}, nil
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
	// Refill when the queue is down to half: fewer, larger requests. A failed
	// request (the connection is down and nats.go reconnects, or the consumer
	// is gone) is tried again, more slowly each time.
	s.svc.Read(s.cfg.Prefetch/2, s.cfg.Prefetch, "pull request", func(n int) error {
		batch, err := s.cons.Fetch(n, jetstream.FetchMaxWait(s.cfg.MaxWait))
		if err != nil {
			return err
		}
		for msg := range batch.Messages() {
			s.svc.Push(msg)
		}
		return batch.Error()
	})
}

// jsBroker settles JetStream messages for the core.
type jsBroker struct{ s *Subscriber }

func (b jsBroker) Lane(msg jetstream.Msg) pgoutbox.Lane {
	h := msg.Headers()
	return pgoutbox.LaneOf(wire.LaneHeaders(h.Get))
}

func (b jsBroker) Delivery(msg jetstream.Msg) (inbox.Delivery, bool) {
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
	return d, true
}

func (b jsBroker) Ack(msg jetstream.Msg) {
	b.s.acked.Add(1)
	b.settled(msg, inbox.ActionAck, msg.Ack())
}

func (b jsBroker) Nak(msg jetstream.Msg, delay time.Duration) {
	b.s.naked.Add(1)
	b.settled(msg, inbox.ActionNak, msg.NakWithDelay(delay))
}

func (b jsBroker) Term(msg jetstream.Msg, o inbox.Outcome) {
	err := msg.Term()
	b.s.terminated.Add(1)
	attrs := []any{slog.String("subject", msg.Subject()), slog.Any("error", o.Err)}
	if md, mdErr := msg.Metadata(); mdErr == nil {
		attrs = append(attrs, slog.Uint64("stream_sequence", md.Sequence.Stream))
	}
	b.s.log.Error("terminated a message that is not an outbox event; it will not be redelivered", attrs...)
	b.settled(msg, inbox.ActionTerm, err)
}

func (b jsBroker) settled(msg jetstream.Msg, a inbox.Action, err error) {
	if err != nil {
		// The broker redelivers after AckWait anyway; the inbox makes that safe.
		b.s.log.Warn("could not settle message", slog.String("action", a.String()),
			slog.String("subject", msg.Subject()), slog.Any("error", err))
	}
}

// Release hands an unprocessed message back for immediate redelivery elsewhere.
func (b jsBroker) Release(msg jetstream.Msg) {
	if err := msg.Nak(); err != nil {
		b.s.log.Debug("could not release message; it is redelivered after AckWait", slog.Any("error", err))
	}
	b.s.released.Add(1)
}

// Stopping is closed when the subscriber begins to stop (Stop, or the end of
// Start's context): from then on it starts no new delivery.
func (s *Subscriber) Stopping() <-chan struct{} { return s.svc.Lifecycle.Stopping() }

// Stop shuts the Subscriber down gracefully: it stops pulling, lets the messages
// being processed finish (commit and ack, or roll back and nak), and hands every
// message pulled but not started back to JetStream for immediate redelivery to
// another instance. If ctx ends first, the stop turns hard: in-flight
// transactions are abandoned (rolled back, their messages nacked without delay)
// and ctx's error is returned.
//
// Stop follows the one rule of pgoutbox's services (package internal/lifecycle):
// it may be called any number of times, from any goroutine, each call waiting
// for the same shutdown; before Start it returns nil and the Subscriber can no
// longer start.
func (s *Subscriber) Stop(ctx context.Context) error {
	return s.svc.Lifecycle.Stop(ctx)
}
