// Package subscriber is the core that the per-message inbox subscribers
// (natsinbox, rabbitinbox, redisinbox, pubsubinbox, sqsinbox) share: the per-aggregate
// queue of messages pulled but not started, the workers that take them lane by
// lane, the mapping of the inbox Processor's Outcome to the broker's
// settlement, and the hand-back of what was pulled but not started when the
// subscriber stops. The Kafka
// subscriber (kafkainbox), which processes a partition's records in order
// rather than per message, shares the mapping: [Process] and [Judge].
//
// A subscriber is its broker-specific part (consumer set-up, pulling,
// reconnecting) plus a Service: a Core, parameterised by a Broker that settles
// one message, on the subscriber's lifecycle.Lifecycle. Service.Start runs the
// subscriber's set-up, its readers and the workers (Core.Run); its Stopped
// hook releases what Core.Drain returns and logs the counters; Service.Read is
// the loop of a reader that pulls on demand, and Service.Retry its pause
// after a failure, logged. The fields
// every subscriber's Config shares (Concurrency, Logger) are filled and
// checked by Resolve.
//
// # Concurrency
//
// The Core's mutex guards the queue and the stopping flag; its condition wakes
// the workers (a lane became ready, or stopping) and a reader waiting for room
// (WaitRoom). Process and every Broker call run without the mutex.
package subscriber

import (
	"context"
	"sync"
	"time"

	"github.com/pgoutbox/pgoutbox"
	"github.com/pgoutbox/pgoutbox/inbox"
	"github.com/pgoutbox/pgoutbox/inbox/internal/lanes"
	"github.com/pgoutbox/pgoutbox/internal/failpoint"
	"github.com/pgoutbox/pgoutbox/internal/lifecycle"
)

// Broker is the broker-specific part of a subscriber, for its message type M.
// Its settling calls log and count their own failures: the broker redelivers an
// unsettled message, and the inbox makes that safe.
type Broker[M any] interface {
	// Lane returns the aggregate lane of m: its messages are processed one at
	// a time, in arrival order.
	Lane(m M) pgoutbox.Lane
	// Delivery returns m as the inbox reads it; ok false skips m unsettled
	// (its channel is gone: the broker redelivers it).
	Delivery(m M) (d inbox.Delivery, ok bool)
	// Ack settles m as done (applied, or found applied).
	Ack(m M)
	// Nak hands m back for redelivery after delay (gap-rejected, failed); a
	// delay of 0 means at once (the processing was abandoned by a hard stop).
	Nak(m M, delay time.Duration)
	// Term settles m as never to be redelivered (undecodable), and logs o.Err.
	Term(m M, o inbox.Outcome)
	// Release hands back at once a message that was pulled but not started.
	Release(m M)
}

// Core is the shared part of a subscriber. Set its fields before Run.
type Core[M any] struct {
	Broker    Broker[M]
	Processor inbox.Processor
	// ProcessTimeout bounds one Process call.
	ProcessTimeout time.Duration

	lc       *lifecycle.Lifecycle
	mu       sync.Mutex
	wake     *sync.Cond
	stopping bool
	queue    lanes.Queue[M] // pulled, not started, one aggregate at a time
}

// Run starts n workers on lc, and a watcher that stops them (after the message
// each holds) when lc begins to stop. Call it from lc's start function.
func (c *Core[M]) Run(lc *lifecycle.Lifecycle, n int) {
	c.lc = lc
	for range n {
		lc.Go(c.work)
	}
	lc.Go(func() {
		<-lc.Stopping()
		c.lock()
		c.stopping = true
		c.wake.Broadcast()
		c.mu.Unlock()
	})
}

// Push queues m by its lane, or releases it at once when stopping.
func (c *Core[M]) Push(m M) {
	lane := c.Broker.Lane(m)
	c.lock()
	if c.stopping {
		c.mu.Unlock()
		c.Broker.Release(m)
		return
	}
	if c.queue.Push(lane, m) {
		c.wake.Broadcast()
	}
	c.mu.Unlock()
}

// WaitRoom waits until at most low messages are queued, and returns how many
// fit below high; ok is false when stopping.
func (c *Core[M]) WaitRoom(low, high int) (n int, ok bool) {
	c.lock()
	defer c.mu.Unlock()
	for c.queue.Len() > low && !c.stopping {
		c.wake.Wait()
	}
	return high - c.queue.Len(), !c.stopping
}

// Drop removes the queued messages for which drop returns true, unsettled.
func (c *Core[M]) Drop(drop func(M) bool) {
	c.mu.Lock()
	c.queue.Drop(drop)
	c.mu.Unlock()
}

// Drain removes and returns every queued message, for the Stopped hook to
// release.
func (c *Core[M]) Drain() []M {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.queue.Drain()
}

// lock takes the mutex, making the condition on first use.
func (c *Core[M]) lock() {
	c.mu.Lock()
	if c.wake == nil {
		c.wake = sync.NewCond(&c.mu)
	}
}

// work processes ready lanes, one message at a time per lane, until stopping.
func (c *Core[M]) work() {
	c.lock()
	defer c.mu.Unlock()
	for {
		for !c.queue.Ready() && !c.stopping {
			c.wake.Wait()
		}
		// The lifecycle's own state too: the watcher sets stopping a moment
		// after the stop begins, and no delivery may start in between.
		if c.stopping || c.lc.IsStopping() {
			return
		}
		lane, m := c.queue.Take()
		c.wake.Broadcast() // room for a reader

		c.mu.Unlock()
		c.handle(m)
		c.mu.Lock()

		c.queue.Done(lane) // a lane ready again is taken by this loop
	}
}

// handle processes one message and settles it by the outcome, only after the
// consumer transaction has ended.
func (c *Core[M]) handle(m M) {
	d, ok := c.Broker.Delivery(m)
	if !ok {
		return
	}
	hard := c.lc.Hard()
	o := Process(hard, c.Processor, c.ProcessTimeout, d)
	switch Judge(o) {
	case Ack:
		c.Broker.Ack(m)
	case Term:
		c.Broker.Term(m, o)
	default:
		delay := o.RetryAfter
		if hard.Err() != nil {
			delay = 0 // abandoned by a hard stop: let another instance have it now
		}
		c.Broker.Nak(m, delay)
	}
}

// Process runs proc on d, bounded by timeout and by hard, the lifecycle's
// hard-stop context (lifecycle.Lifecycle.Hard): a hard stop abandons the
// consumer transaction, which rolls back.
func Process(hard context.Context, proc inbox.Processor, timeout time.Duration, d inbox.Delivery) inbox.Outcome {
	ctx, cancel := context.WithTimeout(hard, timeout)
	defer cancel()
	return proc.Process(ctx, d)
}

// Verdict is how a subscriber settles a processed message with its broker.
type Verdict int

const (
	// Ack: the event is applied, or was found applied; the broker may forget
	// the message (ack it, commit its offset).
	Ack Verdict = iota
	// Term: the message is not an outbox event and never will be; it is
	// settled without redelivery, and logged.
	Term
	// Retry: the message is processed again later, after Outcome.RetryAfter
	// (gap-rejected, failed), or by another instance at once after a hard stop.
	Retry
)

// Judge returns how to settle a message whose processing ended with o: the
// one mapping of every subscriber from the inbox's Outcome to the broker. It
// is called once the consumer transaction has ended; for an event just
// applied it passes failpoint.ConsumerAfterCommit first, the moment between
// the commit and the settlement that a crash test aims at.
func Judge(o inbox.Outcome) Verdict {
	switch o.Action() {
	case inbox.ActionAck:
		// The transaction has committed (or found the event applied): only now
		// may the broker forget the message. A crash before the settlement
		// reaches it means a redelivery, which the inbox recognises.
		if o.Status == inbox.StatusApplied {
			_ = failpoint.Inject(failpoint.ConsumerAfterCommit) // crash or delay: the commit is done
		}
		return Ack
	case inbox.ActionTerm:
		return Term
	}
	return Retry
}

// Pause waits d, and reports false if lc begins to stop first.
func Pause(lc *lifecycle.Lifecycle, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-lc.Stopping():
		return false
	}
}
