package checker_test

import (
	"fmt"

	"github.com/pgoutbox/pgoutbox"
	"github.com/pgoutbox/pgoutbox/checker"
)

// Check what a pipeline left behind: here the broker holds sequence 2 of order 42
// before sequence 1, and sequence 3 never arrived.
func ExampleCheck() {
	id := func(s string) pgoutbox.UUID { u, _ := pgoutbox.ParseUUID(s); return u }
	e1, e2, e3 := id("01900000-0000-7000-8000-000000000001"), id("01900000-0000-7000-8000-000000000002"),
		id("01900000-0000-7000-8000-000000000003")
	row := func(e pgoutbox.UUID, seq int64) checker.OutboxRow {
		return checker.OutboxRow{EventID: e, AggregateType: "order", AggregateID: "42", Sequence: seq, Published: true}
	}
	msg := func(e pgoutbox.UUID, seq int64) checker.Message {
		return checker.Message{EventID: e, AggregateType: "order", AggregateID: "42", Sequence: seq}
	}
	v := checker.Check(checker.Input{
		Outbox: []checker.OutboxRow{row(e1, 1), row(e2, 2), row(e3, 3)},
		Broker: []checker.Message{msg(e2, 2), msg(e1, 1), msg(e2, 2)},
	})
	fmt.Println(v.OK())
	for _, p := range v.Problems {
		fmt.Println(p)
	}
	// Output:
	// false
	// broker-order: event 01900000-0000-7000-8000-000000000001 (order/42 #1): sequence 1 came first after sequence 2 (event 01900000-0000-7000-8000-000000000002)
	// lost: event 01900000-0000-7000-8000-000000000003 (order/42 #3): never reached the broker although marked published
}
