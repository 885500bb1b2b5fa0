// Package lanes is the per-aggregate work queue of the inbox subscribers: messages
// of one aggregate are handed out one at a time, in arrival order, while different
// aggregates are processed in parallel, in the order they became ready.
package lanes

import "github.com/pgoutbox/pgoutbox"

// Queue holds items per key (an aggregate's lane). It has no lock of its own: the
// subscriber guards it with the mutex that its workers' condition uses. The zero
// value is ready to use.
type Queue[T any] struct {
	lanes map[pgoutbox.Lane]*lane[T]
	ready []pgoutbox.Lane // keys with items and no worker, in turn
	n     int             // items queued, not taken
}

type lane[T any] struct {
	items []T
	busy  bool // a worker holds one of its items
}

// Push queues v under key and reports whether key just became ready, i.e. a
// worker should be woken.
func (q *Queue[T]) Push(key pgoutbox.Lane, v T) bool {
	if q.lanes == nil {
		q.lanes = map[pgoutbox.Lane]*lane[T]{}
	}
	l := q.lanes[key]
	if l == nil {
		l = &lane[T]{}
		q.lanes[key] = l
	}
	l.items = append(l.items, v)
	q.n++
	if !l.busy && len(l.items) == 1 {
		q.ready = append(q.ready, key)
		return true
	}
	return false
}

// Ready reports whether Take has an item to hand out.
func (q *Queue[T]) Ready() bool { return len(q.ready) > 0 }

// Len is the number of items queued and not yet taken.
func (q *Queue[T]) Len() int { return q.n }

// Take hands out the oldest item of the first ready key, which stays busy (no
// other item of it is handed out) until Done. Call it only when Ready.
func (q *Queue[T]) Take() (key pgoutbox.Lane, v T) {
	key = q.ready[0]
	q.ready[0] = pgoutbox.Lane{}
	q.ready = q.ready[1:]
	l := q.lanes[key]
	v = l.items[0]
	var zero T
	l.items[0] = zero
	l.items = l.items[1:]
	l.busy = true
	q.n--
	return key, v
}

// Done ends the work on key's taken item and reports whether key is ready again.
func (q *Queue[T]) Done(key pgoutbox.Lane) bool {
	l := q.lanes[key]
	l.busy = false
	if len(l.items) > 0 {
		q.ready = append(q.ready, key)
		return true
	}
	delete(q.lanes, key)
	return false
}

// Drop removes the queued (not taken) items for which drop returns true.
func (q *Queue[T]) Drop(drop func(T) bool) {
	var zero T
	for key, l := range q.lanes {
		kept := l.items[:0]
		for _, v := range l.items {
			if !drop(v) {
				kept = append(kept, v)
			}
		}
		for i := len(kept); i < len(l.items); i++ {
			l.items[i] = zero
		}
		q.n -= len(l.items) - len(kept)
		l.items = kept
		if len(l.items) == 0 && !l.busy {
			delete(q.lanes, key)
		}
	}
	ready := q.ready[:0]
	for _, key := range q.ready {
		if l := q.lanes[key]; l != nil && len(l.items) > 0 {
			ready = append(ready, key)
		}
	}
	clear(q.ready[len(ready):])
	q.ready = ready
}

// Drain removes and returns every queued item; taken items are not included.
func (q *Queue[T]) Drain() []T {
	var left []T
	for _, l := range q.lanes {
		left = append(left, l.items...)
	}
	q.lanes, q.ready, q.n = nil, nil, 0
	return left
}
