package pgoutbox

import (
	"cmp"
	"strings"
)

// Lane is one aggregate's ordered stream of events: the events of one
// (AggregateType, AggregateID), published and applied in AggregateSequence
// order. It is the one lane key of the relay, the CDC source, the brokers, the
// inbox subscribers and the checker.
type Lane struct {
	AggregateType string
	AggregateID   string
}

// LaneOf returns the lane of an event.
func LaneOf(aggregateType, aggregateID string) Lane {
	return Lane{AggregateType: aggregateType, AggregateID: aggregateID}
}

// Compare orders lanes by aggregate type, then aggregate id (byte order, as
// PostgreSQL's "C" collation): -1 if l sorts before o, 0 if equal, +1 after.
func (l Lane) Compare(o Lane) int {
	return cmp.Or(strings.Compare(l.AggregateType, o.AggregateType), strings.Compare(l.AggregateID, o.AggregateID))
}

// CompareInLane orders events by lane, then by aggregate sequence: the order in
// which they must be published.
func CompareInLane(a Lane, aSeq int64, b Lane, bSeq int64) int {
	return cmp.Or(a.Compare(b), cmp.Compare(aSeq, bSeq))
}

// String returns "type/id", as the logs show a lane.
func (l Lane) String() string { return l.AggregateType + "/" + l.AggregateID }
