package lanes

import (
	"slices"
	"testing"
)

func TestOneAtATimePerKeyInArrivalOrder(t *testing.T) {
	var q Queue[int]
	if !q.Push("a", 1) || q.Push("a", 2) || !q.Push("b", 10) || q.Len() != 3 {
		t.Fatal("Push: a and b should each become ready once")
	}
	k, v := q.Take()
	if k != "a" || v != 1 {
		t.Fatalf("Take = %s %d, want a 1", k, v)
	}
	k, v = q.Take() // a is busy: b is next
	if k != "b" || v != 10 || q.Ready() {
		t.Fatalf("Take = %s %d (ready %v), want b 10 and nothing else ready", k, v, q.Ready())
	}
	if q.Done("b") {
		t.Fatal("b has nothing left")
	}
	if !q.Done("a") {
		t.Fatal("a has 2 left: ready again")
	}
	if k, v = q.Take(); k != "a" || v != 2 || q.Len() != 0 {
		t.Fatalf("Take = %s %d, len %d", k, v, q.Len())
	}
	q.Done("a")
	if q.Ready() || len(q.lanes) != 0 {
		t.Fatal("empty queue keeps lanes")
	}
}

func TestDropAndDrain(t *testing.T) {
	var q Queue[int]
	for i := range 6 {
		q.Push(string(rune('a'+i%2)), i) // a: 0 2 4, b: 1 3 5
	}
	k, _ := q.Take() // a busy with 0
	q.Drop(func(v int) bool { return v == 2 || v == 4 || v == 1 })
	if q.Len() != 2 {
		t.Fatalf("Len after Drop = %d, want 2", q.Len())
	}
	if q.Done(k) {
		t.Fatal("a has nothing left after Drop")
	}
	if k, v := q.Take(); k != "b" || v != 3 {
		t.Fatalf("Take = %s %d, want b 3", k, v)
	}
	left := q.Drain()
	if !slices.Equal(left, []int{5}) || q.Ready() || q.Len() != 0 {
		t.Fatalf("Drain = %v", left)
	}
}
