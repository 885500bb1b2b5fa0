package lanes

import (
	"slices"
	"testing"

	"github.com/pgoutbox/pgoutbox"
)

func k(id string) pgoutbox.Lane { return pgoutbox.LaneOf("order", id) }

func TestOneAtATimePerKeyInArrivalOrder(t *testing.T) {
	var q Queue[int]
	if !q.Push(k("a"), 1) || q.Push(k("a"), 2) || !q.Push(k("b"), 10) || q.Len() != 3 {
		t.Fatal("Push: a and b should each become ready once")
	}
	key, v := q.Take()
	if key != k("a") || v != 1 {
		t.Fatalf("Take = %v %d, want a 1", key, v)
	}
	key, v = q.Take() // a is busy: b is next
	if key != k("b") || v != 10 || q.Ready() {
		t.Fatalf("Take = %v %d (ready %v), want b 10 and nothing else ready", key, v, q.Ready())
	}
	if q.Done(k("b")) {
		t.Fatal("b has nothing left")
	}
	if !q.Done(k("a")) {
		t.Fatal("a has 2 left: ready again")
	}
	if key, v = q.Take(); key != k("a") || v != 2 || q.Len() != 0 {
		t.Fatalf("Take = %v %d, len %d", key, v, q.Len())
	}
	q.Done(k("a"))
	if q.Ready() || len(q.lanes) != 0 {
		t.Fatal("empty queue keeps lanes")
	}
}

func TestDropAndDrain(t *testing.T) {
	var q Queue[int]
	for i := range 6 {
		q.Push(k(string(rune('a'+i%2))), i) // a: 0 2 4, b: 1 3 5
	}
	key, _ := q.Take() // a busy with 0
	q.Drop(func(v int) bool { return v == 2 || v == 4 || v == 1 })
	if q.Len() != 2 {
		t.Fatalf("Len after Drop = %d, want 2", q.Len())
	}
	if q.Done(key) {
		t.Fatal("a has nothing left after Drop")
	}
	if key, v := q.Take(); key != k("b") || v != 3 {
		t.Fatalf("Take = %v %d, want b 3", key, v)
	}
	left := q.Drain()
	if !slices.Equal(left, []int{5}) || q.Ready() || q.Len() != 0 {
		t.Fatalf("Drain = %v", left)
	}
}
