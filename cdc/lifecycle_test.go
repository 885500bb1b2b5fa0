package cdc_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/pgoutbox/pgoutbox/broker"
	"github.com/pgoutbox/pgoutbox/cdc"
	"github.com/pgoutbox/pgoutbox/internal/lifecycle/lifecycletest"
	"github.com/pgoutbox/pgoutbox/internal/pgtest"
)

// holdingPublisher acks everything at once until hold is called; from then on
// Publish blocks until the release function is called or its context ends (a
// hard stop), reporting the context's error for every message.
type holdingPublisher struct {
	mu      sync.Mutex
	held    chan struct{} // closed to release; nil while not holding
	entered chan struct{} // receives once per Publish call while holding
}

func (p *holdingPublisher) hold() (entered <-chan struct{}, release func()) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.held, p.entered = make(chan struct{}), make(chan struct{}, 1)
	held := p.held
	var once sync.Once
	return p.entered, func() { once.Do(func() { close(held) }) }
}

func (p *holdingPublisher) Publish(ctx context.Context, msgs []broker.Message) []error {
	p.mu.Lock()
	held, entered := p.held, p.entered
	p.mu.Unlock()
	results := make([]error, len(msgs))
	if held == nil {
		return results
	}
	select {
	case entered <- struct{}{}:
	default:
	}
	select {
	case <-held:
		return results
	case <-ctx.Done():
		for i := range results {
			results[i] = broker.Unavailable(ctx.Err())
		}
		return results
	}
}

// lifecycleSource is a Source with its environment, for the lifecycle table.
type lifecycleSource struct {
	*cdc.Source
	env *env
	pub *holdingPublisher
}

// TestSourceLifecycle runs the one lifecycle table against a real Source on
// real PostgreSQL. Not parallel: each case holds a replication slot, and the
// server has few.
func TestSourceLifecycle(t *testing.T) {
	lifecycletest.Run(t, lifecycletest.Harness{
		New: func(t *testing.T) lifecycletest.Service {
			e := newEnv(t)
			pub := &holdingPublisher{}
			src, err := cdc.New(e.pool, pub, &e.cfg)
			pgtest.Must(t, err, "cdc.New")
			// Whatever a case did, the source is stopped before its slot is dropped.
			t.Cleanup(func() {
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				defer cancel()
				_ = src.Stop(ctx)
			})
			return &lifecycleSource{Source: src, env: e, pub: pub}
		},
		Busy: func(t *testing.T, s lifecycletest.Service) func() {
			ls := s.(*lifecycleSource)
			entered, release := ls.pub.hold()
			ls.env.enqueue(t, 1, 1, 1)
			select {
			case <-entered:
			case <-time.After(30 * time.Second):
				release()
				t.Fatal("the source did not publish the event within 30s")
			}
			return release
		},
	})
}

func (p *holdingPublisher) Close() error { return nil }
