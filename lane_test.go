package pgoutbox_test

import (
	"slices"
	"testing"

	"github.com/pgoutbox/pgoutbox"
)

func TestLaneCompare(t *testing.T) {
	lanes := []pgoutbox.Lane{
		{AggregateType: "order", AggregateID: "b"},
		{AggregateType: "invoice", AggregateID: "z"},
		{AggregateType: "order", AggregateID: "a"},
		{AggregateType: "order", AggregateID: "B"},
		{AggregateType: "orde", AggregateID: "zz"},
	}
	slices.SortFunc(lanes, pgoutbox.Lane.Compare)
	want := []string{"invoice/z", "orde/zz", "order/B", "order/a", "order/b"}
	for i, l := range lanes {
		if l.String() != want[i] {
			t.Fatalf("sorted lanes = %v, want %v", lanes, want)
		}
	}
	a := pgoutbox.LaneOf("order", "a")
	if a.Compare(a) != 0 || pgoutbox.CompareInLane(a, 2, a, 1) != 1 || pgoutbox.CompareInLane(a, 1, pgoutbox.LaneOf("order", "b"), 0) != -1 {
		t.Fatal("CompareInLane does not order by lane, then sequence")
	}
}
