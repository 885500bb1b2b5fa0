package lifecycle_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pgoutbox/pgoutbox/internal/lifecycle"
	"github.com/pgoutbox/pgoutbox/internal/lifecycle/lifecycletest"
)

// worker is the smallest service: one goroutine that holds work until released
// or hard-stopped.
type worker struct {
	lc      lifecycle.Lifecycle
	busy    chan struct{}
	release chan struct{}
	stopped atomic.Int32
}

func newWorker() *worker {
	// busy is unbuffered: Busy's send returns only once the worker holds the
	// work, so a Stop that follows cannot find it idle and stop gracefully.
	w := &worker{busy: make(chan struct{}), release: make(chan struct{})}
	w.lc.Name = "worker"
	w.lc.Stopped = func(bool) { w.stopped.Add(1) }
	return w
}

func (w *worker) Start(ctx context.Context) error {
	return w.lc.Start(ctx, func(context.Context) error {
		w.lc.Go(func() {
			select {
			case <-w.busy: // work in flight until released or hard stop
				select {
				case <-w.release:
				case <-w.lc.Hard().Done():
				}
			case <-w.lc.Stopping():
			}
		})
		return nil
	})
}

func (w *worker) Stop(ctx context.Context) error { return w.lc.Stop(ctx) }

func TestLifecycleTable(t *testing.T) {
	var made []*worker
	lifecycletest.Run(t, lifecycletest.Harness{
		New: func(t *testing.T) lifecycletest.Service {
			w := newWorker()
			made = append(made, w)
			return w
		},
		Busy: func(t *testing.T, s lifecycletest.Service) func() {
			w := s.(*worker)
			w.busy <- struct{}{}
			var once atomic.Bool
			return func() {
				if once.CompareAndSwap(false, true) {
					close(w.release)
				}
			}
		},
	})
	for i, w := range made {
		if n := w.stopped.Load(); n > 1 {
			t.Errorf("service %d: Stopped ran %d times", i, n)
		}
	}
}

func TestFailedStartIsStopped(t *testing.T) {
	w := newWorker()
	ran := make(chan struct{})
	err := w.lc.Start(context.Background(), func(context.Context) error {
		w.lc.Go(func() { <-w.lc.Hard().Done(); close(ran) })
		return context.Canceled
	})
	if err != context.Canceled {
		t.Fatalf("Start: %v", err)
	}
	<-ran // the goroutine it launched was hard-stopped
	if w.stopped.Load() != 1 {
		t.Fatalf("Stopped ran %d times, want 1", w.stopped.Load())
	}
	if err := w.Start(context.Background()); err == nil {
		t.Fatal("Start after a failed Start succeeded")
	}
	if err := w.Stop(context.Background()); err != nil {
		t.Fatalf("Stop: %v", err)
	}
}

func TestWake(t *testing.T) {
	w := lifecycle.NewWake()
	w.Poke()
	w.Poke() // never blocks
	<-w
	select {
	case <-w:
		t.Fatal("two pokes woke twice")
	default:
	}
}

// Grace ends an attempt a grace period after the stop began, so a graceful
// stop is not held up by work whose dependency hangs; before the stop it does
// not end.
func TestGrace(t *testing.T) {
	var lc lifecycle.Lifecycle
	lc.Name = "grace"
	attempt := make(chan context.Context, 1)
	ended := make(chan error, 1)
	err := lc.Start(context.Background(), func(context.Context) error {
		lc.Go(func() {
			ctx, cancel := lc.Grace(context.Background(), 20*time.Millisecond)
			defer cancel()
			attempt <- ctx
			<-ctx.Done() // a call to a database that hangs
			ended <- ctx.Err()
		})
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx := <-attempt
	select {
	case <-ctx.Done():
		t.Fatal("the attempt ended before the stop began")
	default:
	}
	stopCtx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := lc.Stop(stopCtx); err != nil {
		t.Fatalf("Stop: %v (the stop turned hard: the grace did not end the attempt)", err)
	}
	if err := <-ended; !errors.Is(err, context.Canceled) {
		t.Fatalf("the attempt ended with %v, want context.Canceled", err)
	}
}
