package relay_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/pgoutbox/broker"
	"github.com/pgoutbox/pgoutbox/broker/brokertest"
	"github.com/pgoutbox/pgoutbox/internal/lifecycle/lifecycletest"
	"github.com/pgoutbox/pgoutbox/internal/pgtest"
	"github.com/pgoutbox/pgoutbox/internal/wait"
	"github.com/pgoutbox/pgoutbox/relay"
)

// gatePublisher holds every publish until it is released or its context ends
// (a hard stop), as a broker that does not answer would.
type gatePublisher struct {
	inFlight chan struct{} // signalled when a publish is held
	release  chan struct{}
	once     sync.Once
}

func newGatePublisher() *gatePublisher {
	return &gatePublisher{inFlight: make(chan struct{}, 1), release: make(chan struct{})}
}

func (p *gatePublisher) Publish(ctx context.Context, msgs []broker.Message) []error {
	select {
	case p.inFlight <- struct{}{}:
	default:
	}
	results := make([]error, len(msgs))
	select {
	case <-p.release:
	case <-ctx.Done():
		for i := range results {
			results[i] = broker.Unavailable(ctx.Err())
		}
	}
	return results
}

func (p *gatePublisher) Close() error { return nil }

func (p *gatePublisher) open() { p.once.Do(func() { close(p.release) }) }

// relayUnderTest is a relay with its outbox and its publisher.
type relayUnderTest struct {
	*relay.Relay
	o   *outbox
	pub *gatePublisher
}

// The relay follows the one lifecycle rule; a stop whose deadline passes while
// a publish is held turns hard, and the held events' leases are released.
func TestRelayLifecycle(t *testing.T) {
	t.Parallel()
	heldLifecycle(t, func(o *outbox, pub *gatePublisher) (*relay.Relay, error) {
		return relay.New(o.pool, pub, &relay.Config{Schema: o.schema, Logger: quietLogger(), PollInterval: 50 * time.Millisecond})
	}, "the held event's lease released", func(t *testing.T, o *outbox) bool {
		// Stopped hard: the held event was released, not failed.
		return o.count(t, "claim_until IS NULL AND attempt_count = 0") == 1
	})
}

// heldLifecycle runs the lifecycle table on relays that newRelay builds over a
// fresh outbox and a gatePublisher, busy with one event whose publish is held.
// After the hard stop, released (waited for, and described by what) says the
// held work was given back.
func heldLifecycle(t *testing.T, newRelay func(*outbox, *gatePublisher) (*relay.Relay, error), what string, released func(*testing.T, *outbox) bool) {
	lifecycletest.Run(t, lifecycletest.Harness{
		New: func(t *testing.T) lifecycletest.Service {
			o := newOutbox(t, 8)
			pub := newGatePublisher()
			r, err := newRelay(o, pub)
			pgtest.Must(t, err, "relay.New")
			t.Cleanup(func() {
				pub.open()
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				defer cancel()
				if err := r.Stop(ctx); err != nil {
					t.Errorf("stop: %v", err)
				}
			})
			return &relayUnderTest{Relay: r, o: o, pub: pub}
		},
		Busy: func(t *testing.T, s lifecycletest.Service) func() {
			r := s.(*relayUnderTest)
			r.o.enqueue(t, 1, 1)
			select {
			case <-r.pub.inFlight:
			case <-time.After(30 * time.Second):
				t.Fatal("the relay never published the event")
			}
			t.Cleanup(func() {
				wait.For(t, 10*time.Second, what, func() bool { return released(t, r.o) })
			})
			return r.pub.open
		},
	})
}

// miscounting returns the wrong number of results for its first publishes, too
// few and too many in turn, after the broker took the messages.
type miscounting struct {
	broker.Publisher
	mu    sync.Mutex
	wrong int // publishes left to miscount
}

func (p *miscounting) Publish(ctx context.Context, msgs []broker.Message) []error {
	res := p.Publisher.Publish(ctx, msgs)
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.wrong == 0 {
		return res
	}
	p.wrong--
	if p.wrong%2 == 0 {
		return res[:len(res)-1]
	}
	return append(res, nil)
}

// A publisher that returns too few or too many results: the relay cannot know
// which events the broker took, so it retries them all as unavailable, with
// backoff, as the CDC source does. Nothing is lost and nothing is quarantined,
// even with MaxAttempts 1; nothing is released as if unattempted.
func TestWrongResultCountIsRetriedNotQuarantined(t *testing.T) {
	t.Parallel()
	o := newOutbox(t, 8)
	ids := o.enqueue(t, 3, 4)
	rec := &brokertest.Recorder{}
	r := startRelay(t, o, &miscounting{Publisher: rec, wrong: 4}, relay.Config{Workers: 1, MaxAttempts: 1,
		BackoffBase: time.Millisecond, BackoffMax: 5 * time.Millisecond, PollInterval: 20 * time.Millisecond})
	wait.For(t, 30*time.Second, "the backlog to drain", func() bool { return o.count(t, "published_at IS NULL") == 0 })
	dups := brokertest.CheckStream(t, rec.Messages(), ids)
	if dups == 0 {
		t.Error("no duplicates: the miscounted publishes were not retried")
	}
	if n := o.count(t, "quarantined_at IS NOT NULL"); n != 0 {
		t.Fatalf("%d events quarantined for the publisher's wrong result count", n)
	}
	if n := o.count(t, "attempt_count > 1"); n == 0 {
		t.Fatal("no event counts a failed attempt: the wrong count was not retried as a failure")
	}
	s := r.Stats()
	if s.Released != 0 || s.Failed < 4 || s.Quarantined != 0 {
		t.Fatalf("stats %+v: want at least 4 failed attempts, none released or quarantined", s)
	}
	wait.For(t, 10*time.Second, "the relay to report healthy", func() bool { return r.Healthy() == nil })
}

// groupUnderTest is a Group with its one outbox and its publisher.
type groupUnderTest struct {
	*relay.Group
	d      *tenantDB
	schema string
	pub    *gatePublisher
}

// The Group follows the one lifecycle rule too, with its hubs and its
// outboxes' relays; a stop whose deadline passes while a publish is held turns
// hard, and the held event's lease is released.
func TestGroupLifecycle(t *testing.T) {
	t.Parallel()
	lifecycletest.Run(t, lifecycletest.Harness{
		New: func(t *testing.T) lifecycletest.Service {
			d := newTenantDB(t, 8)
			schema := "tenant_a"
			d.migrate(t, schema)
			pub := newGatePublisher()
			g, err := relay.NewGroup(pub, &relay.GroupConfig{
				Config:    relay.Config{Logger: quietLogger(), PollInterval: 50 * time.Millisecond},
				Databases: []relay.Database{{Pool: d.pool}},
			})
			pgtest.Must(t, err, "relay.NewGroup")
			t.Cleanup(func() {
				pub.open()
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				defer cancel()
				if err := g.Stop(ctx); err != nil {
					t.Errorf("stop: %v", err)
				}
			})
			return &groupUnderTest{Group: g, d: d, schema: schema, pub: pub}
		},
		Busy: func(t *testing.T, s lifecycletest.Service) func() {
			g := s.(*groupUnderTest)
			g.d.enqueue(t, g.schema, 1, 1)
			select {
			case <-g.pub.inFlight:
			case <-time.After(30 * time.Second):
				t.Fatal("the group never published the event")
			}
			t.Cleanup(func() {
				// Stopped hard: the held event was released, not failed.
				wait.For(t, 10*time.Second, "the held event's lease released", func() bool {
					var n int
					pgtest.Must(t, g.d.pool.QueryRow(context.Background(), "SELECT count(*) FROM "+
						pgx.Identifier{g.schema, "outbox_events"}.Sanitize()+
						" WHERE claim_until IS NULL AND attempt_count = 0 AND published_at IS NULL").Scan(&n), "count")
					return n == 1
				})
			})
			return g.pub.open
		},
	})
}
