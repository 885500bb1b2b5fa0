package subscriber

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/pgoutbox/pgoutbox"
	"github.com/pgoutbox/pgoutbox/inbox"
	"github.com/pgoutbox/pgoutbox/internal/lifecycle"
	"github.com/pgoutbox/pgoutbox/internal/wait"
)

// msg is a fake broker message: its lane and the outcome its processing gets.
type msg struct {
	id      int
	lane    string
	outcome inbox.Outcome
}

// fake records every settlement, in order.
type fake struct {
	mu      sync.Mutex
	settled []string
}

func (f *fake) note(format string, args ...any) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.settled = append(f.settled, fmt.Sprintf(format, args...))
}

func (f *fake) Lane(m *msg) pgoutbox.Lane { return pgoutbox.LaneOf("order", m.lane) }
func (f *fake) Delivery(m *msg) (inbox.Delivery, bool) {
	return inbox.Delivery{Headers: map[string]string{"id": fmt.Sprint(m.id)}}, true
}
func (f *fake) Ack(m *msg)                                                     { f.note("ack %d", m.id) }
func (f *fake) Nak(m *msg, d time.Duration)                                    { f.note("nak %d %s", m.id, d) }
func (f *fake) Term(m *msg, _ inbox.Outcome)                                   { f.note("term %d", m.id) }
func (f *fake) Release(m *msg)                                                 { f.note("release %d", m.id) }
func (f *fake) all() []string                                                  { f.mu.Lock(); defer f.mu.Unlock(); return slices.Clone(f.settled) }
func (p procFunc) Name() string                                                { return "test" }
func (p procFunc) Process(ctx context.Context, d inbox.Delivery) inbox.Outcome { return p(ctx, d) }

type procFunc func(ctx context.Context, d inbox.Delivery) inbox.Outcome

// Each outcome is settled as the inbox asks, and one lane's messages one at a
// time in arrival order.
func TestOutcomesAndLaneOrder(t *testing.T) {
	f := &fake{}
	byID := map[string]*msg{}
	var mu sync.Mutex
	var order []string
	c := &Core[*msg]{Broker: f, ProcessTimeout: time.Minute, Processor: procFunc(func(_ context.Context, d inbox.Delivery) inbox.Outcome {
		mu.Lock()
		order = append(order, d.Headers["id"])
		m := byID[d.Headers["id"]]
		mu.Unlock()
		return m.outcome
	})}
	msgs := []*msg{
		{1, "a", inbox.Outcome{Status: inbox.StatusApplied}},
		{2, "a", inbox.Outcome{Status: inbox.StatusDuplicate}},
		{3, "a", inbox.Outcome{Status: inbox.StatusFailed, Err: errors.New("down"), RetryAfter: time.Second}},
		{4, "a", inbox.Outcome{Status: inbox.StatusUndecodable, Err: errors.New("not an event")}},
	}
	for _, m := range msgs {
		byID[fmt.Sprint(m.id)] = m
	}
	var lc lifecycle.Lifecycle
	if err := lc.Start(context.Background(), func(context.Context) error { c.Run(&lc, 3); return nil }); err != nil {
		t.Fatal(err)
	}
	for _, m := range msgs {
		c.Push(m)
	}
	wait.For(t, 10*time.Second, "four settlements", func() bool { return len(f.all()) == 4 })
	if err := lc.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
	want := []string{"ack 1", "ack 2", "nak 3 1s", "term 4"}
	if got := f.all(); !slices.Equal(got, want) {
		t.Fatalf("settled %v, want %v (one lane: in arrival order)", got, want)
	}
	if !slices.Equal(order, []string{"1", "2", "3", "4"}) {
		t.Fatalf("processed %v", order)
	}
}

// At a hard stop the message in flight is naked without delay; a message pushed
// after stopping is released; Drain returns what was queued.
func TestStopReleasesAndHardNaksAtOnce(t *testing.T) {
	f := &fake{}
	entered := make(chan struct{})
	c := &Core[*msg]{Broker: f, ProcessTimeout: time.Minute, Processor: procFunc(func(ctx context.Context, d inbox.Delivery) inbox.Outcome {
		close(entered)
		<-ctx.Done()
		return inbox.Outcome{Status: inbox.StatusFailed, Err: ctx.Err(), RetryAfter: time.Minute}
	})}
	var lc lifecycle.Lifecycle
	lc.Stopped = func(bool) {
		for _, m := range c.Drain() {
			f.Release(m)
		}
	}
	if err := lc.Start(context.Background(), func(context.Context) error { c.Run(&lc, 1); return nil }); err != nil {
		t.Fatal(err)
	}
	c.Push(&msg{id: 1, lane: "a"})
	c.Push(&msg{id: 2, lane: "a"}) // queued behind 1
	<-entered
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if err := lc.Stop(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Stop = %v, want the deadline", err)
	}
	c.Push(&msg{id: 3, lane: "b"})
	want := []string{"nak 1 0s", "release 2", "release 3"}
	if got := f.all(); !slices.Equal(got, want) {
		t.Fatalf("settled %v, want %v", got, want)
	}
}

// TestJudge: the one mapping from the inbox's outcome to the settlement, which
// the Kafka subscriber shares with the per-message ones.
func TestJudge(t *testing.T) {
	t.Parallel()
	for status, want := range map[inbox.Status]Verdict{
		inbox.StatusApplied:     Ack,
		inbox.StatusDuplicate:   Ack,
		inbox.StatusUndecodable: Term,
		inbox.StatusFailed:      Retry,
		inbox.StatusGapRejected: Retry,
	} {
		if got := Judge(inbox.Outcome{Status: status}); got != want {
			t.Errorf("Judge(%s) = %d, want %d", status, got, want)
		}
	}
}
