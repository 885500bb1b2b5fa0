// Package lifecycle is the one start/stop protocol of pgoutbox's long-running
// services: the relay, the CDC source, the inbox subscribers and the cleaner.
//
// Every service embeds a Lifecycle and follows the same rules:
//
//   - Start runs once. A second Start returns ErrAlreadyStarted; a Start after
//     Stop (or after a failed Start) returns ErrStopped. A service is not
//     restartable: make a new one.
//   - Stop before Start returns nil and the service can no longer start.
//   - Stop begins a graceful stop: Stopping is closed, the service's goroutines
//     finish their work in flight and return, the Stopped hook runs, and Stop
//     returns nil. If Stop's ctx ends first, the stop turns hard (Hard is
//     cancelled, in-flight work is abandoned), Stop still waits for the
//     goroutines and the hook, and returns ctx's error wrapped.
//   - Stop may be called any number of times, from any goroutine; every call
//     waits for the same shutdown. A call whose ctx ends first makes it hard.
//   - The context passed to Start carries values to the service's goroutines;
//     its end is a hard stop, as if Stop had been called with an expired
//     context. The Stopped hook still runs; a later Stop returns nil.
//
// The goroutines of a service are started with Go; Stop waits for all of them.
// Helpers that have no work in flight (pollers, listeners) return when Stopping
// is closed; workers finish what they hold and return, and use Hard for the
// calls that must end at a hard stop.
package lifecycle

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"
)

var (
	// ErrAlreadyStarted is returned by a second Start.
	ErrAlreadyStarted = errors.New("already started")
	// ErrStopped is returned by Start after Stop, or after a Start that failed.
	ErrStopped = errors.New("stopped: a service cannot be started again; make a new one")
)

type phase int

const (
	idle phase = iota
	running
	stopped // Stop was called or a Start failed: no Start any more
)

// Lifecycle is the start/stop state of one service. The zero value is ready to
// use; set Name (used in errors) and Stopped before the first Start.
type Lifecycle struct {
	// Name prefixes the errors of Start and Stop ("relay", "natsinbox").
	Name string
	// Stopped, if set, runs once after every goroutine started with Go has
	// returned, before any Stop returns: release what the service still holds,
	// log its totals. Hard reports whether the stop was hard.
	Stopped func(hard bool)

	mu         sync.Mutex
	phase      phase
	stopping   chan struct{} // closed when stopping begins
	stopOnce   sync.Once
	hard       context.Context
	hardCancel context.CancelFunc
	wg         sync.WaitGroup
	done       chan struct{} // closed when fully stopped (after Stopped)
}

func (l *Lifecycle) init() {
	if l.stopping == nil {
		l.stopping = make(chan struct{})
		l.done = make(chan struct{})
	}
}

// Start runs start, which sets the service up (under ctx) and launches its
// goroutines with Go, and returns start's error. If start fails, the goroutines
// it launched are hard-stopped and waited for, Stopped runs, and the service is
// stopped for good.
func (l *Lifecycle) Start(ctx context.Context, start func(ctx context.Context) error) error {
	l.mu.Lock()
	l.init()
	switch l.phase {
	case running:
		l.mu.Unlock()
		return fmt.Errorf("%s: %w", l.Name, ErrAlreadyStarted)
	case stopped:
		l.mu.Unlock()
		return fmt.Errorf("%s: %w", l.Name, ErrStopped)
	}
	l.phase = running
	l.hard, l.hardCancel = context.WithCancel(context.WithoutCancel(ctx))
	l.mu.Unlock()

	if err := start(ctx); err != nil {
		l.mu.Lock()
		l.phase = stopped
		l.mu.Unlock()
		l.beginStop()
		l.hardCancel()
		l.finish(true)
		return err
	}
	// Start's ctx ending is a hard stop.
	go func() {
		select {
		case <-ctx.Done():
			l.beginStop()
			l.hardCancel()
		case <-l.done:
		}
	}()
	go func() {
		<-l.stopping
		l.finish(l.hard.Err() != nil)
	}()
	return nil
}

// finish waits for the goroutines, ends Hard, runs Stopped and marks the
// service stopped.
func (l *Lifecycle) finish(hard bool) {
	l.wg.Wait()
	hard = hard || l.hard.Err() != nil
	l.hardCancel()
	if l.Stopped != nil {
		l.Stopped(hard)
	}
	close(l.done)
}

func (l *Lifecycle) beginStop() {
	l.stopOnce.Do(func() { close(l.stopping) })
}

// Go runs f in a goroutine that Stop waits for. Call it from the start function
// passed to Start, or from a goroutine that Go started.
func (l *Lifecycle) Go(f func()) {
	l.wg.Add(1)
	go func() {
		defer l.wg.Done()
		f()
	}()
}

// Stopping is closed when the service begins to stop (Stop, a hard stop, or a
// failed Start). Goroutines stop taking new work when it is closed.
func (l *Lifecycle) Stopping() <-chan struct{} {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.init()
	return l.stopping
}

// IsStopping reports whether the service has begun to stop.
func (l *Lifecycle) IsStopping() bool {
	select {
	case <-l.Stopping():
		return true
	default:
		return false
	}
}

// Grace returns a context derived from parent that also ends grace after the
// service begins to stop (or at a hard stop): the bound of one attempt at work
// that should finish during a graceful stop if it can, but not hold the stop up
// when its dependency hangs. Call cancel when the attempt is done. Like Hard,
// it is valid only after Start.
func (l *Lifecycle) Grace(parent context.Context, grace time.Duration) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(parent)
	stopping, hard := l.Stopping(), l.Hard()
	go func() {
		select {
		case <-ctx.Done():
			return
		case <-hard.Done():
			cancel()
			return
		case <-stopping:
		}
		t := time.NewTimer(grace)
		defer t.Stop()
		select {
		case <-ctx.Done():
		case <-hard.Done():
			cancel()
		case <-t.C:
			cancel()
		}
	}()
	return ctx, cancel
}

// Hard is the context of work in flight: it carries the values of Start's
// context and is cancelled at a hard stop, and once the service has stopped.
// It is valid only after Start.
func (l *Lifecycle) Hard() context.Context { return l.hard }

// Started reports whether Start has been called successfully (the service may
// since have stopped).
func (l *Lifecycle) Started() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.hard != nil && l.phase != idle
}

// Stop stops the service as the package doc says: gracefully, or hard once ctx
// ends, and returns when it has stopped.
func (l *Lifecycle) Stop(ctx context.Context) error {
	l.mu.Lock()
	l.init()
	if l.phase == idle {
		l.phase = stopped
		l.mu.Unlock()
		l.beginStop()
		close(l.done)
		return nil
	}
	if l.hard == nil { // stopped before it ever started
		l.mu.Unlock()
		return nil
	}
	l.phase = stopped
	l.mu.Unlock()
	l.beginStop()
	select {
	case <-l.done:
		return nil
	case <-ctx.Done():
		l.hardCancel()
		<-l.done
		return fmt.Errorf("%s: stop: %w", l.Name, ctx.Err())
	}
}

// Done is closed once the service has stopped (after Stopped ran).
func (l *Lifecycle) Done() <-chan struct{} {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.init()
	return l.done
}

// Wake is a wake-up signal with a buffer of one: Poke never blocks, and any
// number of pokes before the receiver looks wake it once.
type Wake chan struct{}

// NewWake returns a Wake.
func NewWake() Wake { return make(Wake, 1) }

// Poke wakes the receiver, or does nothing if a wake-up is already pending.
func (w Wake) Poke() {
	select {
	case w <- struct{}{}:
	default:
	}
}
