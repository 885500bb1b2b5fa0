package brokertest

import (
	"context"
	"errors"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pgoutbox/pgoutbox"
	"github.com/pgoutbox/pgoutbox/broker"
)

// Recorder is an in-process broker.Publisher that stores every message it accepts,
// in send order, and acks at once. It honours the Publisher contract (per aggregate,
// the next message goes only after the previous one's ack), so tests of a relay's
// ordering logic can run without a network in between.
type Recorder struct {
	// Fail, when set, decides an error per message; a message it fails is not
	// stored. Set it before the first Publish.
	Fail func(m *broker.Message) error
	// Jitter, when set, delays each send by up to that long: a broker's latency,
	// which widens the windows in which a wrong claim would overtake a lane.
	Jitter time.Duration
	// Down, while true, makes every send fail as unreachable (broker.Unavailable).
	Down atomic.Bool

	mu      sync.Mutex
	got     []broker.Message
	calls   int
	refused map[pgoutbox.UUID]bool
}

// Publish implements broker.Publisher.
func (r *Recorder) Publish(ctx context.Context, msgs []broker.Message) []error {
	r.mu.Lock()
	r.calls++
	r.mu.Unlock()
	return broker.PublishLanes(ctx, msgs, func(ctx context.Context, m *broker.Message) (broker.AckFunc, error) {
		if r.Jitter > 0 {
			time.Sleep(rand.N(r.Jitter))
		}
		if r.Down.Load() {
			return nil, broker.Unavailable(errors.New("brokertest: recorder is down"))
		}
		r.mu.Lock()
		defer r.mu.Unlock()
		if r.refused[m.EventID] {
			return nil, broker.Permanent(errors.New("brokertest: refused " + m.AggregateID))
		}
		if r.Fail != nil {
			if err := r.Fail(m); err != nil {
				return nil, err
			}
		}
		r.got = append(r.got, *m)
		return func(context.Context) error { return nil }, nil
	})
}

// Close implements broker.Publisher.
func (r *Recorder) Close() error { return nil }

// Messages returns a copy of the stored messages, in send order.
func (r *Recorder) Messages() []broker.Message {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]broker.Message(nil), r.got...)
}

// Refuse makes the recorder refuse the events ids as a broker refuses a
// poison event: a permanent error (broker.Permanent), until Cure.
func (r *Recorder) Refuse(ids ...pgoutbox.UUID) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.refused == nil {
		r.refused = map[pgoutbox.UUID]bool{}
	}
	for _, id := range ids {
		r.refused[id] = true
	}
}

// Cure makes the recorder accept the event id again after Refuse.
func (r *Recorder) Cure(id pgoutbox.UUID) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.refused, id)
}

// Sequences returns the sequences of aggregate aggID's stored messages, in
// send order.
func (r *Recorder) Sequences(aggID string) []int64 {
	var out []int64
	for _, m := range r.Messages() {
		if m.AggregateID == aggID {
			out = append(out, m.AggregateSequence)
		}
	}
	return out
}

// Calls returns how many times Publish was called: how many batches a relay sent.
func (r *Recorder) Calls() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.calls
}

// CheckStream asserts guarantees 3 and 5 of the specification on what a broker
// stored: every id in want appears, and per aggregate the first appearances of
// sequences are 1..N in order. It returns the number of duplicate deliveries
// (allowed: delivery is at least once).
func CheckStream(t testing.TB, got []broker.Message, want []pgoutbox.UUID) (duplicates int) {
	t.Helper()
	seen := map[pgoutbox.UUID]bool{}
	next := map[pgoutbox.Lane]int64{}
	for _, m := range got {
		if seen[m.EventID] {
			duplicates++
			continue
		}
		seen[m.EventID] = true
		lane := m.Lane()
		if m.AggregateSequence != next[lane]+1 {
			t.Fatalf("order violated on %s: sequence %d first appeared after %d", lane, m.AggregateSequence, next[lane])
		}
		next[lane] = m.AggregateSequence
	}
	lost := 0
	for _, id := range want {
		if !seen[id] {
			lost++
		}
	}
	if lost > 0 {
		t.Fatalf("%d of %d events never reached the broker", lost, len(want))
	}
	return duplicates
}
