package rabbitmq

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"regexp"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/pgoutbox/pgoutbox/broker"
)

// link is one AMQP connection. It outlives the sessions opened on it when only
// a channel fails.
type link struct {
	conn     *amqp.Connection
	frameMax int // negotiated; 0 for no limit
	// blocked holds the server's reason while it blocks publishing on this
	// connection (a memory or disk alarm), nil otherwise.
	blocked atomic.Pointer[string]
}

// session is one channel in confirm mode and the messages awaiting its
// confirms. A session does not recover: when its channel or connection fails,
// every message awaiting a confirm fails, and the publisher opens a new session.
//
// Delivery tags. In confirm mode the server numbers the messages of a channel
// 1, 2, 3, … in the order it receives them, and amqp091-go hands the confirms
// to NotifyPublish listeners in that order, one per message, even when the
// server confirms several at once or out of order. So the messages awaiting
// their confirm form a queue in publish order, and every confirmation is for
// the head of the queue. Keeping the queue in publish order needs the tag
// reading and the publish to be one step: pubLock makes them one, for all the
// goroutines that publish on the session (the workers of concurrent Publish
// calls). It is held only while the frames are written, not while a confirm is
// awaited, so one channel carries the whole publisher's pipeline; a channel per
// Publish call would add a round trip to open it and would not be faster.
type session struct {
	p    *Publisher
	link *link
	ch   *amqp.Channel

	slots   chan struct{} // a token per message awaiting its confirm
	pubLock chan struct{} // held from reading the next tag to the end of the publish

	confirms <-chan amqp.Confirmation
	returns  <-chan amqp.Return
	closes   <-chan *amqp.Error

	mu    sync.Mutex
	queue []*pending // awaiting their confirm, in delivery-tag order
	ended bool       // fail ran: no more publishes

	failOnce sync.Once
	err      error         // why the session ended; set before dead closes
	dead     chan struct{} // closed when the session has ended
}

// pending is one message awaiting its confirm.
type pending struct {
	tag      uint64
	eventID  string
	key      string
	size     int // body bytes
	deadline time.Time
	returned *amqp.Return // the server's basic.return, if it could not route the message
	result   chan error   // gets the outcome, once
}

// openSession opens a channel on l, puts it in confirm mode and starts the
// goroutine that dispatches its confirms and returns.
func (p *Publisher) openSession(l *link) (*session, error) {
	ch, err := l.conn.Channel()
	if err != nil {
		return nil, fmt.Errorf("rabbitmq: open channel: %w", err)
	}
	s := &session{
		p:       p,
		link:    l,
		ch:      ch,
		slots:   make(chan struct{}, p.cfg.MaxPending),
		pubLock: make(chan struct{}, 1),
		// Both listeners get at most one notification per message awaiting
		// its confirm, so with this capacity amqp091-go's reader goroutine
		// never waits on them (after 5s it would drop the notification).
		confirms: ch.NotifyPublish(make(chan amqp.Confirmation, p.cfg.MaxPending)),
		returns:  ch.NotifyReturn(make(chan amqp.Return, p.cfg.MaxPending)),
		closes:   ch.NotifyClose(make(chan *amqp.Error, 1)),
		dead:     make(chan struct{}),
	}
	if err := ch.Confirm(false); err != nil {
		_ = ch.Close()
		return nil, fmt.Errorf("rabbitmq: enable publisher confirms: %w", err)
	}
	p.wg.Add(1)
	go s.dispatch()
	return s, nil
}

// publish sends m to the exchange with routing key key and returns how to wait
// for the server's confirm.
func (s *session) publish(ctx context.Context, m *broker.Message, key string, msg amqp.Publishing) (broker.AckFunc, error) {
	if limit := s.link.frameMax; limit > 0 {
		if n := headerFrameSize(&msg); n > limit {
			return nil, broker.Permanent(fmt.Errorf("rabbitmq: event %s: its properties and headers take %d bytes, above the connection's frame size of %d", m.EventID, n, limit))
		}
	}
	if reason := s.link.blocked.Load(); reason != nil {
		// Writes would hang in TCP flow control until the alarm clears.
		return nil, broker.Unavailable(fmt.Errorf("rabbitmq: event %s: the server blocks publishing: %s", m.EventID, *reason))
	}
	select {
	case s.slots <- struct{}{}:
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-s.dead:
		return nil, s.errFor(m.EventID.String())
	}
	select {
	case s.pubLock <- struct{}{}:
	case <-ctx.Done():
		<-s.slots
		return nil, ctx.Err()
	case <-s.dead:
		<-s.slots
		return nil, s.errFor(m.EventID.String())
	}
	pd := &pending{
		eventID:  m.EventID.String(),
		key:      key,
		size:     len(msg.Body),
		deadline: time.Now().Add(s.p.cfg.ConfirmTimeout),
		result:   make(chan error, 1),
	}
	s.mu.Lock()
	if s.ended {
		s.mu.Unlock()
		<-s.pubLock
		<-s.slots
		return nil, s.errFor(pd.eventID)
	}
	// Queued before the publish, so that its confirm cannot arrive first.
	pd.tag = s.ch.GetNextPublishSeqNo()
	s.queue = append(s.queue, pd)
	s.mu.Unlock()

	err := s.ch.PublishWithContext(ctx, s.p.cfg.Exchange, key, true, false, msg)
	<-s.pubLock
	if err != nil {
		// amqp091-go took the tag back; so must the queue, unless fail
		// already emptied it (and freed the slot).
		s.mu.Lock()
		last := len(s.queue) - 1
		mine := last >= 0 && s.queue[last] == pd
		if mine {
			s.queue[last] = nil
			s.queue = s.queue[:last]
		}
		s.mu.Unlock()
		if mine {
			<-s.slots
		}
		if ctx.Err() != nil && errors.Is(err, ctx.Err()) {
			return nil, err
		}
		return nil, broker.Unavailable(fmt.Errorf("rabbitmq: publish event %s: %w", pd.eventID, err))
	}
	return pd.wait, nil
}

// wait returns the outcome of the publish, or ctx's error if it ends first.
func (pd *pending) wait(ctx context.Context) error {
	select {
	case err := <-pd.result:
		return err
	default:
	}
	select {
	case err := <-pd.result:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// The dispatcher looks for overdue confirms overdueChecksPerTimeout times per
// ConfirmTimeout, so a confirm is found overdue at most a quarter of the timeout
// late, but never more often than every minOverdueCheck, so a tiny timeout (a
// test's) does not spin.
const (
	overdueChecksPerTimeout = 4
	minOverdueCheck         = 5 * time.Millisecond
)

// dispatch gives each confirm to its message, marks returned messages, fails
// the session when a confirm is overdue, and, when the channel closes, fails
// the messages still awaiting a confirm. It runs until the channel is closed,
// draining the notifications even after the session failed, so that
// amqp091-go's reader never waits on them.
func (s *session) dispatch() {
	defer s.p.wg.Done()
	tick := time.NewTicker(max(s.p.cfg.ConfirmTimeout/overdueChecksPerTimeout, minOverdueCheck))
	defer tick.Stop()
	returns := s.returns
	for {
		select {
		case r, ok := <-returns:
			if !ok {
				returns = nil
				continue
			}
			s.noteReturn(&r)
		case c, ok := <-s.confirms:
			if !ok {
				s.failClosed()
				return
			}
			// The server sends a message's basic.return before its confirm, and
			// amqp091-go's reader hands both over in that order; but select
			// picks among ready channels at random. Take every return queued so
			// far before judging the confirm.
			for drained := false; !drained; {
				select {
				case r, ok := <-returns:
					if !ok {
						returns = nil
					} else {
						s.noteReturn(&r)
					}
				default:
					drained = true
				}
			}
			s.confirm(c)
		case now := <-tick.C:
			s.mu.Lock()
			overdue := len(s.queue) > 0 && now.After(s.queue[0].deadline)
			s.mu.Unlock()
			if overdue {
				// A server that leaves a message unconfirmed this long is
				// unreachable or stuck; so is the channel's confirm sequence.
				// The supervisor closes the connection and opens a new one.
				s.fail(broker.Unavailable(fmt.Errorf("no confirm from the server within %s", s.p.cfg.ConfirmTimeout)), 0)
			}
		}
	}
}

// noteReturn marks the message the server returned as unroutable. Returns name
// no delivery tag, so the message is found by its message_id, the event id: the
// oldest unreturned message with that id, as the server handles a channel's
// messages in order.
func (s *session) noteReturn(r *amqp.Return) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, pd := range s.queue {
		if pd.eventID == r.MessageId && pd.returned == nil {
			pd.returned = &amqp.Return{ReplyCode: r.ReplyCode, ReplyText: r.ReplyText, Exchange: r.Exchange, RoutingKey: r.RoutingKey}
			return
		}
	}
	// Its message already failed (the session ended), or someone else
	// publishes on the channel: nothing to do.
}

// confirm settles the message at the head of the queue.
func (s *session) confirm(c amqp.Confirmation) {
	s.mu.Lock()
	if len(s.queue) == 0 || s.queue[0].tag > c.DeliveryTag {
		// The message already failed with its session.
		s.mu.Unlock()
		return
	}
	pd := s.queue[0]
	if pd.tag != c.DeliveryTag {
		s.mu.Unlock()
		err := broker.Unavailable(fmt.Errorf("confirm for delivery tag %d while awaiting %d", c.DeliveryTag, pd.tag))
		s.p.cfg.Logger.Error("rabbitmq: confirms out of step with publishes; reconnecting", slog.Any("error", err))
		s.fail(err, 0)
		return
	}
	s.queue[0] = nil
	s.queue = s.queue[1:]
	s.mu.Unlock()
	<-s.slots
	pd.result <- s.outcome(pd, c.Ack)
}

// ErrUnroutable is wrapped by the error of a message the server returned
// because no queue is bound to its routing key (basic.return, 312 NO_ROUTE).
//
// It is neither [broker.Permanent] nor [broker.Unavailable]: nothing is wrong
// with the event, and binding a queue fixes it, so quarantining it at once would
// punish a deployment order (relay before consumers); but the server did answer,
// and a routing key no one ever binds should not be retried silently forever.
// The relay retries it with backoff and quarantines it after its max attempts,
// where an operator can see it and retry it once a queue is bound.
var ErrUnroutable = errors.New("rabbitmq: unroutable: no queue is bound for the routing key")

func (s *session) outcome(pd *pending, ack bool) error {
	switch {
	case !ack:
		// RabbitMQ nacks when a queue refuses the message (a full queue with
		// x-overflow=reject-publish) or fails internally: not the event's fault,
		// and it passes once the queue drains or recovers.
		return broker.Unavailable(fmt.Errorf("rabbitmq: event %s: the server nacked it (a queue refused it or failed)", pd.eventID))
	case pd.returned != nil:
		return fmt.Errorf("rabbitmq: event %s: exchange %q, routing key %q: %w (%d %s)",
			pd.eventID, s.p.cfg.Exchange, pd.key, ErrUnroutable, pd.returned.ReplyCode, pd.returned.ReplyText)
	}
	return nil
}

// failClosed fails the session once its channel has closed, with the reason
// the server or the client gave.
func (s *session) failClosed() {
	var reason *amqp.Error
	select {
	case reason = <-s.closes:
	default:
	}
	s.fail(classifyClose(reason))
}

// fail ends the session: every message awaiting a confirm fails with cause,
// except a body of tooLarge bytes (when above 0), which the server refused:
// that one fails as permanent. New publishes fail with cause. Only the first
// call counts.
func (s *session) fail(cause error, tooLarge int64) {
	s.failOnce.Do(func() {
		s.mu.Lock()
		s.ended = true
		s.err = cause
		q := s.queue
		s.queue = nil
		s.mu.Unlock()
		close(s.dead)
		for _, pd := range q {
			<-s.slots
			if tooLarge > 0 && int64(pd.size) == tooLarge {
				pd.result <- broker.Permanent(fmt.Errorf("rabbitmq: event %s: its body of %d bytes is above the server's max_message_size: %w", pd.eventID, pd.size, cause))
				continue
			}
			pd.result <- s.errFor(pd.eventID)
		}
	})
}

// errFor is the error of event id, not sent or not confirmed because the
// session ended. Call it only once dead is closed.
func (s *session) errFor(id string) error {
	return fmt.Errorf("rabbitmq: event %s: %w", id, s.err)
}

// tooLargeReason is RabbitMQ's text when a body is above max_message_size.
var tooLargeReason = regexp.MustCompile(`message size (\d+) is larger than configured max size (\d+)`)

// classifyClose returns the error for the messages awaiting a confirm on a
// channel that closed for reason (nil when the client closed it), and, when the
// server refused a body as too large, that body's size: the channel closes with
// 406 without saying which message it was, so the size picks it out.
//
//lint:ignore ST1008 the results are fail's arguments, in its order: s.fail(classifyClose(reason)).
func classifyClose(reason *amqp.Error) (err error, tooLarge int64) {
	if reason == nil {
		return broker.Unavailable(errors.New("channel closed")), 0
	}
	what := "channel"
	if !reason.Recover {
		// A hard error (or the client's own): it closed the connection.
		what = "connection"
	}
	err = fmt.Errorf("%s closed: %w", what, reason)
	if !reason.Server {
		// The client's own: the connection broke, or it was not open.
		return broker.Unavailable(err), 0
	}
	switch reason.Code {
	case amqp.PreconditionFailed:
		if m := tooLargeReason.FindStringSubmatch(reason.Reason); m != nil {
			if n, perr := strconv.ParseInt(m[1], 10, 64); perr == nil && n > 0 {
				// The other messages only shared the channel.
				return broker.Unavailable(err), n
			}
		}
		// Some message broke a rule, and which one is unknown: a plain error,
		// so that a message that keeps breaking it ends in quarantine.
		return err, 0
	case amqp.ConnectionForced, amqp.NotFound, amqp.AccessRefused, amqp.NotAllowed,
		amqp.ResourceError, amqp.ResourceLocked, amqp.InternalError:
		// An operator closed the connection, the exchange was deleted, a
		// permission is missing, the server is short of resources: nothing
		// wrong with the messages; they pass once it is put right (a missing
		// exchange is declared again by the next session).
		return broker.Unavailable(err), 0
	}
	// A protocol error: a bug, maybe provoked by one message, so not retried
	// forever.
	return err, 0
}
