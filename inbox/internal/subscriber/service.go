package subscriber

import (
	"context"
	"log/slog"
	"time"

	"github.com/pgoutbox/pgoutbox/inbox"
	"github.com/pgoutbox/pgoutbox/internal/config"
	"github.com/pgoutbox/pgoutbox/internal/lifecycle"
	"github.com/pgoutbox/pgoutbox/internal/retry"
)

// DefaultConcurrency is the default of every subscriber's Config.Concurrency.
const DefaultConcurrency = 4

// MaxConcurrency bounds every subscriber's Config.Concurrency.
const MaxConcurrency = 1024

// Shared points at the fields that every subscriber's Config has, with one
// meaning and one rule: Concurrency (how many deliveries run at once, zero
// meaning DefaultConcurrency, at most MaxConcurrency) and Logger (nil meaning
// slog.Default()).
type Shared struct {
	Concurrency *int
	Logger      **slog.Logger
}

// Resolve is config.Resolve for a subscriber's Config: before fill it fills
// the fields shared points at, and before check it checks them. fill and check
// do the rest, as config.Resolve's do; fill sees Concurrency filled.
func Resolve[C any](pkg string, c *C, shared func(*C) Shared, fill func(*C), check func(*C, *config.Problems)) (C, error) {
	return config.Resolve(pkg, c, func(out *C) {
		sh := shared(out)
		config.Default(sh.Concurrency, DefaultConcurrency)
		config.Default(sh.Logger, slog.Default())
		fill(out)
	}, func(out *C, p *config.Problems) {
		n := *shared(out).Concurrency
		p.Check(n > 0 && n <= MaxConcurrency, "Config.Concurrency %d: want 1..%d", n, MaxConcurrency)
		check(out, p)
	})
}

// Service is a subscriber's Core on the subscriber's lifecycle: the start
// block (set-up, the "subscriber starting" line, the readers, the workers)
// and the stop tail (what was pulled but not started released, the
// "subscriber stopped" line with the counters). A subscriber keeps only what
// is its own: its set-up and readers, its Broker, its counters. Call Init
// before anything else.
type Service[M any] struct {
	Core[M]
	// Lifecycle is the subscriber's: its Start, Stop and Stopping are the
	// subscriber's, and its readers use Go, Hard and Stopping.
	Lifecycle lifecycle.Lifecycle

	log         *slog.Logger
	concurrency int
	counters    func() []any
	halt, close func()
}

// Setup is what Init needs of a subscriber.
type Setup[M any] struct {
	Name      string // the lifecycle's name: the package's
	Broker    Broker[M]
	Processor inbox.Processor
	// ProcessTimeout bounds one Process call; zero when Start's set-up knows
	// it (it then sets Core.ProcessTimeout).
	ProcessTimeout time.Duration
	Concurrency    int // the workers
	Log            *slog.Logger
	// Counters returns the attributes of the "subscriber stopped" line.
	Counters func() []any
	// Halt, when set, runs first once the readers and the workers have
	// returned: the subscriber's own tasks end there.
	Halt func()
	// Close, when set, runs after what was pulled but not started is
	// released: the subscriber closes its connection there.
	Close func()
}

// Init sets the service up; call it once, from the subscriber's constructor.
func (s *Service[M]) Init(st Setup[M]) {
	s.Lifecycle.Name = st.Name
	s.Lifecycle.Stopped = s.stopped
	s.Broker = st.Broker
	s.Processor = st.Processor
	s.ProcessTimeout = st.ProcessTimeout
	s.log = st.Log
	s.concurrency = st.Concurrency
	s.counters = st.Counters
	s.halt, s.close = st.Halt, st.Close
}

// Start starts the lifecycle (lifecycle.Lifecycle.Start, with its rules):
// setup runs with ctx and returns the subscriber's readers and the attributes
// of its "subscriber starting" line; then each reader runs on the lifecycle,
// and the workers start.
func (s *Service[M]) Start(ctx context.Context, setup func(context.Context) (readers []func(), attrs []any, err error)) error {
	return s.Lifecycle.Start(ctx, func(ctx context.Context) error {
		readers, attrs, err := setup(ctx)
		if err != nil {
			return err
		}
		s.log.Info("subscriber starting", append([]any{slog.Int("concurrency", s.concurrency)}, attrs...)...)
		for _, r := range readers {
			s.Lifecycle.Go(r)
		}
		s.Run(&s.Lifecycle, s.concurrency)
		return nil
	})
}

// stopped is the lifecycle's Stopped hook: the readers and the workers have
// returned; what was pulled but not started goes back to the broker.
func (s *Service[M]) stopped(bool) {
	if s.halt != nil {
		s.halt()
	}
	for _, m := range s.Drain() {
		s.Broker.Release(m)
	}
	if s.close != nil {
		s.close()
	}
	s.log.Info("subscriber stopped", s.counters()...)
}

// Read is the loop of a reader that pulls on demand, run until stopping: it
// waits until at most low messages are queued, then calls pull with the room
// left below high; pull pushes what it gets. A failed pull is tried again
// after a pause of the reconnect schedule (retry.Reconnect, reset by a
// success), logged as what failed ("read", "pull request"), unless the stop
// has begun.
func (s *Service[M]) Read(low, high int, what string, pull func(n int) error) {
	var backoff retry.Backoff
	for {
		n, ok := s.WaitRoom(low, high)
		if !ok {
			return
		}
		err := pull(n)
		if err == nil {
			backoff.Reset()
			continue
		}
		if s.Lifecycle.IsStopping() || !s.Retry(&backoff, what, err) {
			return
		}
	}
}

// Retry logs err, the failure of what a reader did ("receive"), and waits
// the next pause of backoff before the reader tries again; it reports false
// if the stop begins first.
func (s *Service[M]) Retry(backoff *retry.Backoff, what string, err error) bool {
	pause := backoff.Next()
	s.log.Warn(what+" failed; retrying", slog.Duration("in", pause), slog.Any("error", err))
	return Pause(&s.Lifecycle, pause)
}
