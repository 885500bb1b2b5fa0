// Package lifecycletest is the one lifecycle test table that every pgoutbox
// service passes: the rules of package lifecycle, checked against the real
// service with its real dependencies, and the errors users match
// (pgoutbox.ErrAlreadyStarted, pgoutbox.ErrStopped).
package lifecycletest

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/pgoutbox/pgoutbox"
)

// Service is what the table drives.
type Service interface {
	Start(ctx context.Context) error
	Stop(ctx context.Context) error
}

// Harness makes services for the table.
type Harness struct {
	// New returns a fresh, unstarted service with its dependencies ready
	// (schema migrated, stream created…); it is called once per case.
	New func(t *testing.T) Service
	// Busy, if set, gives the running service work in flight that lasts until
	// release is called (a handler that blocks, a broker that does not answer),
	// and returns once that work is in flight. It lets the table check that
	// Stop's deadline makes the stop hard. Without it that case is skipped.
	Busy func(t *testing.T, s Service) (release func())
	// StopWithin bounds how long a stop may take in the cases where nothing is
	// in flight; 0 means 30s.
	StopWithin time.Duration
}

// Run runs the table.
func Run(t *testing.T, h Harness) {
	within := h.StopWithin
	if within == 0 {
		within = 30 * time.Second
	}
	bg := context.Background()
	stop := func(t *testing.T, s Service) error {
		t.Helper()
		ctx, cancel := context.WithTimeout(bg, within)
		defer cancel()
		return s.Stop(ctx)
	}
	mustStart := func(t *testing.T, s Service) {
		t.Helper()
		if err := s.Start(bg); err != nil {
			t.Fatalf("Start: %v", err)
		}
	}

	t.Run("StartThenStop", func(t *testing.T) {
		s := h.New(t)
		mustStart(t, s)
		if err := stop(t, s); err != nil {
			t.Fatalf("Stop: %v", err)
		}
	})
	t.Run("StartTwice", func(t *testing.T) {
		s := h.New(t)
		mustStart(t, s)
		defer stop(t, s)
		err := s.Start(bg)
		if !errors.Is(err, pgoutbox.ErrAlreadyStarted) {
			t.Fatalf("second Start: got %v, want ErrAlreadyStarted", err)
		}
	})
	t.Run("StopTwice", func(t *testing.T) {
		s := h.New(t)
		mustStart(t, s)
		if err := stop(t, s); err != nil {
			t.Fatalf("first Stop: %v", err)
		}
		if err := stop(t, s); err != nil {
			t.Fatalf("second Stop: %v", err)
		}
	})
	t.Run("StopConcurrently", func(t *testing.T) {
		s := h.New(t)
		mustStart(t, s)
		errs := make(chan error, 4)
		for range 4 {
			go func() { errs <- stop(t, s) }()
		}
		for range 4 {
			if err := <-errs; err != nil {
				t.Fatalf("concurrent Stop: %v", err)
			}
		}
	})
	t.Run("StartAfterStop", func(t *testing.T) {
		s := h.New(t)
		mustStart(t, s)
		if err := stop(t, s); err != nil {
			t.Fatalf("Stop: %v", err)
		}
		if err := s.Start(bg); !errors.Is(err, pgoutbox.ErrStopped) {
			t.Fatalf("Start after Stop: got %v, want ErrStopped", err)
		}
	})
	t.Run("StopBeforeStart", func(t *testing.T) {
		s := h.New(t)
		if err := stop(t, s); err != nil {
			t.Fatalf("Stop before Start: %v", err)
		}
		if err := s.Start(bg); !errors.Is(err, pgoutbox.ErrStopped) {
			t.Fatalf("Start after Stop: got %v, want ErrStopped", err)
		}
		if err := stop(t, s); err != nil {
			t.Fatalf("second Stop: %v", err)
		}
	})
	t.Run("StartContextEnds", func(t *testing.T) {
		s := h.New(t)
		ctx, cancel := context.WithCancel(bg)
		if err := s.Start(ctx); err != nil {
			cancel()
			t.Fatalf("Start: %v", err)
		}
		cancel() // a hard stop
		if err := stop(t, s); err != nil {
			t.Fatalf("Stop after Start's context ended: %v", err)
		}
		if err := s.Start(bg); !errors.Is(err, pgoutbox.ErrStopped) {
			t.Fatalf("Start after a hard stop: got %v, want ErrStopped", err)
		}
	})
	t.Run("StopDeadline", func(t *testing.T) {
		if h.Busy == nil {
			t.Skip("the harness has no way to hold work in flight")
		}
		s := h.New(t)
		mustStart(t, s)
		release := h.Busy(t, s)
		defer release()
		ctx, cancel := context.WithTimeout(bg, 100*time.Millisecond)
		defer cancel()
		done := make(chan error, 1)
		go func() { done <- s.Stop(ctx) }()
		select {
		case err := <-done:
			if !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("Stop with work in flight past its deadline: got %v, want DeadlineExceeded", err)
			}
		case <-time.After(within):
			release()
			t.Fatalf("Stop did not return within %s of its deadline: the stop did not turn hard", within)
		}
	})
}
