package pipeline

import (
	"github.com/pgoutbox/pgoutbox"
	"github.com/pgoutbox/pgoutbox/broker"
)

// Result is what became of one event of a published batch.
type Result uint8

const (
	// ResultPublished: the broker acknowledged the event; it is marked published.
	ResultPublished Result = iota + 1
	// ResultFailed: the publish failed; the event is retried after a backoff.
	ResultFailed
	// ResultQuarantined: the publish failed and the event is quarantined: its
	// error is permanent or it reached the policy's MaxAttempts.
	ResultQuarantined
	// ResultReleased: the polling relay did not attempt the event (an earlier
	// event of its aggregate failed, or the relay is stopping); its lease was
	// given back without counting an attempt.
	ResultReleased
	// ResultHeld: the CDC source did not attempt the event because an earlier
	// event of its aggregate failed; it is left as it is, and the table path
	// publishes it after its predecessor.
	ResultHeld
)

// String returns "published", "failed", "quarantined", "released" or "held".
func (r Result) String() string {
	switch r {
	case ResultPublished:
		return "published"
	case ResultFailed:
		return "failed"
	case ResultQuarantined:
		return "quarantined"
	case ResultReleased:
		return "released"
	case ResultHeld:
		return "held"
	}
	return "unknown"
}

// EventOutcome is the outcome of one event of a settled batch, as the
// sources' Observers receive it.
type EventOutcome struct {
	EventID       pgoutbox.UUID
	AggregateType string
	EventType     string
	// Result is what became of the event.
	Result Result
	// Attempt is the number of this publish attempt, from 1 (attempt_count
	// after it), for published, failed and quarantined events; 0 for events
	// not attempted (released or held).
	Attempt int
	// Reason classifies Err, for failed and quarantined events.
	Reason FailureReason
	// Err is the publish error, for failed and quarantined events.
	Err error
}

// FailureReason classifies a failed publish: broker.FailureReason, the one
// classification of the relay and the CDC source.
type FailureReason = broker.FailureReason

// The failure reasons (see broker.FailureReason).
const (
	ReasonPermanent   = broker.ReasonPermanent
	ReasonUnavailable = broker.ReasonUnavailable
	ReasonError       = broker.ReasonError
)

// ClassifyFailure returns the reason class of a publish error
// (broker.ClassifyFailure).
func ClassifyFailure(err error) FailureReason { return broker.ClassifyFailure(err) }
