// Package redisinbox feeds outbox events from a Redis stream to an inbox
// consumer.
//
// A Subscriber reads one stream through a consumer group that every instance
// of one logical consumer shares (XREADGROUP: Redis spreads the entries over
// the group's consumers), hands each entry to an [inbox.Processor] — normally
// an *inbox.Consumer — and settles it by the outcome, only after the consumer
// transaction has ended:
//
//	applied, duplicate   XACK, after the commit
//	gap-rejected, failed left pending, made claimable after Outcome.RetryAfter
//	undecodable          XACK, logged as an error: never redelivered
//
// Redis has no negative acknowledgement: an entry that is not acknowledged
// stays in the group's pending list. Every instance claims, with XAUTOCLAIM,
// the pending entries idle for at least [Config.MinIdle] — those of a
// consumer that died, and its own handed back — so a crash between commit and
// XACK means a redelivery, which the inbox recognises as a duplicate. A retry
// is handed back by setting the entry's idle time (XCLAIM … IDLE) so that it
// becomes claimable after the outcome's delay; a graceful Stop hands back what
// it read but did not start the same way, claimable at once.
//
// Entries are read in the layout of package broker/redisstream: one field per
// header, "content-type" and "body". Within one Subscriber, entries of one
// aggregate are processed one at a time in arrival order, up to
// Config.Concurrency aggregates in parallel; across instances the inbox's
// per-aggregate position keeps the order (inbox.GapReject).
//
// Outside the standard library it pulls in go-redis, besides what package
// inbox pulls in (pgx, the OpenTelemetry API).
package redisinbox

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pgoutbox/pgoutbox"
	"github.com/pgoutbox/pgoutbox/inbox"
	"github.com/pgoutbox/pgoutbox/inbox/internal/subscriber"
	"github.com/pgoutbox/pgoutbox/internal/config"
	"github.com/pgoutbox/pgoutbox/wire"
)

// The defaults of Config's fields.
const (
	DefaultMinIdle       = 30 * time.Second
	DefaultClaimInterval = time.Second
	DefaultBlock         = time.Second
	DefaultConcurrency   = subscriber.DefaultConcurrency
	DefaultStartID       = "0"
)

// Config configures a Subscriber. A nil *Config is invalid: Stream is
// required.
type Config struct {
	// Stream is the key of the stream to read (the relay's expanded
	// destination, e.g. "outbox.order"). Required.
	Stream string

	// Group is the consumer group every instance shares. It is created if
	// missing (with the stream, if that is missing too). Zero means the
	// processor's Name().
	Group string

	// Consumer names this instance in the group. Zero means the host name,
	// the process id and a random suffix: a fresh name per Subscriber.
	Consumer string

	// StartID is where a group created by the Subscriber starts: "0" the
	// whole stream, "$" only new entries. Zero means DefaultStartID ("0").
	StartID string

	// MinIdle is how long an entry stays pending before any instance claims it:
	// the delay before a crashed instance's entries go to another. Keep it
	// above the slowest handler. Zero means DefaultMinIdle (30s).
	MinIdle time.Duration

	// ClaimInterval is how often the Subscriber looks for claimable entries.
	// Zero means DefaultClaimInterval (1s).
	ClaimInterval time.Duration

	// Block is how long one XREADGROUP waits for entries; it bounds Stop's
	// wait for the reader. Zero means DefaultBlock (1s).
	Block time.Duration

	// Concurrency is how many entries this Subscriber processes at once, each
	// in its own transaction. Zero means DefaultConcurrency (4).
	Concurrency int

	// Prefetch is how many entries the Subscriber reads ahead of processing.
	// Zero means 2 × Concurrency.
	Prefetch int

	// ProcessTimeout bounds one Process call. Zero means MinIdle.
	ProcessTimeout time.Duration

	// Logger receives undecodable entries and settling errors. Nil means
	// slog.Default().
	Logger *slog.Logger
}

// Validate reports what New would reject in c, each error naming its field.
func (c *Config) Validate() error {
	_, err := c.withDefaults("")
	return err
}

func (c *Config) withDefaults(name string) (Config, error) {
	return subscriber.Resolve("redisinbox", c, shared, func(out *Config) {
		config.Default(&out.Group, name)
		config.Default(&out.Consumer, defaultConsumer())
		config.Default(&out.StartID, DefaultStartID)
		config.Default(&out.MinIdle, DefaultMinIdle)
		config.Default(&out.ClaimInterval, DefaultClaimInterval)
		config.Default(&out.Block, DefaultBlock)
		config.Default(&out.Prefetch, 2*out.Concurrency)
		config.Default(&out.ProcessTimeout, out.MinIdle)
	}, func(out *Config, p *config.Problems) {
		p.Check(validName(out.Stream), "Config.Stream %.64q: required, printable, at most 1024 bytes", out.Stream)
		p.Check(name == "" || validName(out.Group), "Config.Group %.64q: want printable, at most 1024 bytes", out.Group)
		p.Check(validName(out.Consumer), "Config.Consumer %.64q: want printable, at most 1024 bytes", out.Consumer)
		p.Check(out.StartID == "0" || out.StartID == "$" || validName(out.StartID), "Config.StartID %.64q: want 0, $ or an entry id", out.StartID)
		p.Check(out.MinIdle >= 100*time.Millisecond, "Config.MinIdle %s: want at least 100ms", out.MinIdle)
		p.Check(out.ClaimInterval > 0, "Config.ClaimInterval %s: must be positive", out.ClaimInterval)
		p.Check(out.Block >= 10*time.Millisecond && out.Block < time.Hour, "Config.Block %s: want 10ms..1h", out.Block)
		p.Check(out.Prefetch > 0, "Config.Prefetch %d: must be positive", out.Prefetch)
		p.Check(out.ProcessTimeout > 0, "Config.ProcessTimeout %s: must be positive", out.ProcessTimeout)
	})
}

func shared(c *Config) subscriber.Shared {
	return subscriber.Shared{Concurrency: &c.Concurrency, Logger: &c.Logger}
}

func validName(s string) bool {
	return s != "" && len(s) <= 1024 && !strings.ContainsFunc(s, func(r rune) bool { return r < ' ' || r == 0x7f })
}

func defaultConsumer() string {
	host, _ := os.Hostname()
	var r [4]byte
	_, _ = rand.Read(r[:])
	return fmt.Sprintf("%s-%d-%s", host, os.Getpid(), hex.EncodeToString(r[:]))
}

// Stats are a Subscriber's counters since Start.
type Stats struct {
	Acked      int64 // entries acknowledged (applied or duplicate)
	Retried    int64 // entries left pending for a retry (gap, failure)
	Terminated int64 // undecodable entries acknowledged without processing
	Released   int64 // entries read but not processed when the Subscriber stopped
	Claimed    int64 // pending entries claimed (a dead consumer's, or retries)
}

// entry is one stream entry as read, with whether it was claimed.
type entry struct {
	redis.XMessage
	claimed bool
}

// Subscriber consumes one stream through a consumer group into an
// inbox.Processor. Create it with New, Start it, and Stop it; it is not
// restartable.
type Subscriber struct {
	cfg    Config
	client *redis.Client
	proc   inbox.Processor
	log    *slog.Logger

	svc subscriber.Service[entry] // the lifecycle, the queue, the workers, the outcome mapping

	acked, retried, terminated, released, claimed atomic.Int64
}

// New returns a Subscriber that reads with client and processes with proc.
// cfg is copied; invalid settings are reported here.
func New(client *redis.Client, proc inbox.Processor, cfg *Config) (*Subscriber, error) {
	if client == nil || proc == nil {
		return nil, errors.New("redisinbox: New needs a Redis client and a processor")
	}
	c, err := cfg.withDefaults(proc.Name())
	if err != nil {
		return nil, err
	}
	s := &Subscriber{
		cfg:    c,
		client: client,
		proc:   proc,
		log:    c.Logger.With(slog.String("consumer", proc.Name()), slog.String("group", c.Group), slog.String("stream", c.Stream)),
	}
	s.svc.Init(subscriber.Setup[entry]{
		Name: "redisinbox", Broker: streamBroker{s}, Processor: proc, ProcessTimeout: c.ProcessTimeout,
		Concurrency: c.Concurrency, Log: s.log,
		Counters: func() []any {
			st := s.Stats()
			return []any{slog.Int64("acked", st.Acked), slog.Int64("retried", st.Retried),
				slog.Int64("terminated", st.Terminated), slog.Int64("released", st.Released)}
		},
	})
	return s, nil
}

// Stats returns the Subscriber's counters.
func (s *Subscriber) Stats() Stats {
	return Stats{Acked: s.acked.Load(), Retried: s.retried.Load(), Terminated: s.terminated.Load(),
		Released: s.released.Load(), Claimed: s.claimed.Load()}
}

// Start creates the consumer group if missing and starts reading and
// processing; it returns once that is under way. ctx governs the set-up, and
// its end later stops the Subscriber hard; prefer Stop. A second Start, or a
// Start after Stop, is an error (package internal/lifecycle's rule).
func (s *Subscriber) Start(ctx context.Context) error {
	return s.svc.Start(ctx, s.setup)
}

// setup makes the group; the reader reads from it.
func (s *Subscriber) setup(ctx context.Context) ([]func(), []any, error) {
	if err := s.ensureGroup(ctx); err != nil {
		return nil, nil, err
	}
	return []func(){s.read}, []any{slog.Duration("min_idle", s.cfg.MinIdle)}, nil
}

// ensureGroup creates the group (and the stream) unless it exists.
func (s *Subscriber) ensureGroup(ctx context.Context) error {
	err := s.client.XGroupCreateMkStream(ctx, s.cfg.Stream, s.cfg.Group, s.cfg.StartID).Err()
	if err != nil && !redis.HasErrorPrefix(err, "BUSYGROUP") {
		return fmt.Errorf("redisinbox: create group %q of stream %q: %w", s.cfg.Group, s.cfg.Stream, err)
	}
	return nil
}

// read claims idle pending entries every ClaimInterval and reads new ones,
// queueing them by aggregate, until stopping. Each call ends within Block, so
// the reader returns soon after the stop begins.
func (s *Subscriber) read() {
	ctx := s.svc.Lifecycle.Hard()
	cursor := "0-0"
	var lastClaim time.Time
	s.svc.Read(s.cfg.Prefetch/2, s.cfg.Prefetch, "read", func(n int) error {
		var err error
		if time.Since(lastClaim) >= s.cfg.ClaimInterval {
			lastClaim = time.Now()
			cursor, err = s.claim(ctx, cursor, n)
		} else {
			err = s.readNew(ctx, n)
		}
		if err != nil && redis.HasErrorPrefix(err, "NOGROUP") && !s.svc.Lifecycle.IsStopping() {
			// The stream or the group was deleted: make them again.
			err = errors.Join(err, s.ensureGroup(ctx))
		}
		return err
	})
}

// claim takes up to n pending entries idle for MinIdle, from cursor, and
// returns the next cursor.
func (s *Subscriber) claim(ctx context.Context, cursor string, n int) (string, error) {
	msgs, next, err := s.client.XAutoClaim(ctx, &redis.XAutoClaimArgs{
		Stream: s.cfg.Stream, Group: s.cfg.Group, Consumer: s.cfg.Consumer,
		MinIdle: s.cfg.MinIdle, Start: cursor, Count: int64(n),
	}).Result()
	if err != nil {
		return cursor, err
	}
	s.claimed.Add(int64(len(msgs)))
	for _, m := range msgs {
		s.svc.Push(entry{m, true})
	}
	return next, nil
}

// readNew reads up to n entries never delivered to the group.
func (s *Subscriber) readNew(ctx context.Context, n int) error {
	streams, err := s.client.XReadGroup(ctx, &redis.XReadGroupArgs{
		Group: s.cfg.Group, Consumer: s.cfg.Consumer, Streams: []string{s.cfg.Stream, ">"},
		Count: int64(n), Block: s.cfg.Block,
	}).Result()
	if errors.Is(err, redis.Nil) {
		return nil // nothing within Block
	}
	if err != nil {
		return err
	}
	for _, st := range streams {
		for _, m := range st.Messages {
			s.svc.Push(entry{m, false})
		}
	}
	return nil
}

// streamBroker settles stream entries for the core.
type streamBroker struct{ s *Subscriber }

func field(m entry, name string) string {
	v, _ := m.Values[name].(string)
	return v
}

func (b streamBroker) Lane(m entry) pgoutbox.Lane {
	return pgoutbox.LaneOf(wire.LaneHeaders(func(n string) string { return field(m, n) }))
}

// Delivery returns the entry's body and its other fields as headers. The
// content-type field is the transport's, not the producer's: it is kept only
// for a CloudEvent, whose datacontenttype it carries.
func (b streamBroker) Delivery(m entry) (inbox.Delivery, bool) {
	_, cloudEvent := wire.CloudEventsPrefix(func(n string) string { return field(m, n) })
	d := inbox.Delivery{Headers: make(map[string]string, len(m.Values)), Attempt: 1}
	if m.claimed {
		d.Attempt = 2 // at least: XAUTOCLAIM does not say how many
	}
	for k, v := range m.Values {
		str, _ := v.(string)
		switch {
		case k == "body":
			d.Body = []byte(str)
		case k == "content-type" && !cloudEvent:
		default:
			d.Headers[k] = str
		}
	}
	return d, true
}

// settleCtx bounds a settling call; it runs after the transaction ended, even
// during a hard stop.
func (b streamBroker) settleCtx() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), 10*time.Second)
}

func (b streamBroker) Ack(m entry) {
	b.s.acked.Add(1)
	b.xack(m, inbox.ActionAck)
}

func (b streamBroker) xack(m entry, a inbox.Action) {
	ctx, cancel := b.settleCtx()
	defer cancel()
	if err := b.s.client.XAck(ctx, b.s.cfg.Stream, b.s.cfg.Group, m.ID).Err(); err != nil {
		// The entry stays pending and is claimed again; the inbox makes that safe.
		b.s.log.Warn("could not settle entry", slog.String("action", a.String()), slog.String("id", m.ID), slog.Any("error", err))
	}
}

// Nak leaves the entry pending, with an idle time that makes it claimable
// after delay.
func (b streamBroker) Nak(m entry, delay time.Duration) {
	b.s.retried.Add(1)
	b.handBack(m, delay)
}

func (b streamBroker) handBack(m entry, delay time.Duration) {
	idle := max(b.s.cfg.MinIdle-delay, 0)
	ctx, cancel := b.settleCtx()
	defer cancel()
	err := b.s.client.Do(ctx, "XCLAIM", b.s.cfg.Stream, b.s.cfg.Group, b.s.cfg.Consumer, 0, m.ID,
		"IDLE", idle.Milliseconds(), "JUSTID").Err()
	if err != nil {
		b.s.log.Debug("could not hand back entry; it is claimed after MinIdle", slog.String("id", m.ID), slog.Any("error", err))
	}
}

func (b streamBroker) Term(m entry, o inbox.Outcome) {
	b.s.terminated.Add(1)
	b.s.log.Error("acknowledged an entry that is not an outbox event; it will not be redelivered",
		slog.String("id", m.ID), slog.Any("error", o.Err))
	b.xack(m, inbox.ActionTerm)
}

// Release hands an unprocessed entry back, claimable at once.
func (b streamBroker) Release(m entry) {
	b.handBack(m, 0)
	b.s.released.Add(1)
}

// Stopping is closed when the subscriber begins to stop: from then on it
// starts no new delivery.
func (s *Subscriber) Stopping() <-chan struct{} { return s.svc.Lifecycle.Stopping() }

// Stop shuts the Subscriber down gracefully: it stops reading, lets the
// entries being processed finish (commit and XACK, or roll back and hand
// back), and hands back every entry read but not started, claimable at once
// by another instance. If ctx ends first, the stop turns hard (in-flight
// transactions roll back) and ctx's error is returned. It may be called any
// number of times.
func (s *Subscriber) Stop(ctx context.Context) error {
	return s.svc.Lifecycle.Stop(ctx)
}
