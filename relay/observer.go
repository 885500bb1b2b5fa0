package relay

import (
	"time"

	"github.com/pgoutbox/pgoutbox/internal/pipeline"
)

// Observer is told what a relay does, for metrics (package relay/relayprom
// implements it for Prometheus). Set it as Config.Observer.
//
// Its methods are called on the relay's hot path, from every worker goroutine
// concurrently, once per claim and once per settled batch. They must be safe for
// concurrent use, cheap, and must never block: a slow observer slows publishing.
// They must not keep the slices they receive after returning.
type Observer interface {
	// BatchClaimed is called after each claim that leased at least one event.
	BatchClaimed(c ClaimedBatch)

	// BatchSettled is called once the outcome of a published batch was recorded
	// in the database: acked events are marked published, failed ones scheduled
	// for retry or quarantined, unattempted ones released. A batch whose outcome
	// could not be recorded (the database stayed unreachable until a hard stop)
	// is not reported; its leases expire and it is published again.
	BatchSettled(s SettledBatch)
}

// ClaimedBatch describes one claim.
type ClaimedBatch struct {
	// Tenant is the relay's Config.Tenant.
	Tenant string
	// Destination is the destination the claim was for, in a relay with
	// destinations (Config.Destinations); empty for a relay with a publisher.
	Destination string
	// Events is how many events the claim leased.
	Events int
	// TakenOver is how many expired leases of another relay the claim took over:
	// that relay died or stalled while holding them. A lease covers a run of one
	// aggregate's events.
	TakenOver int
	// Duration is how long the claim statements took.
	Duration time.Duration
}

// SettledBatch describes one published and settled batch.
type SettledBatch struct {
	// Tenant is the relay's Config.Tenant.
	Tenant string
	// Destination is the destination the batch was published to, in a relay
	// with destinations (Config.Destinations); empty for a relay with a
	// publisher. Its events' outcomes are that destination's alone: the
	// events the destination passed over (not routed to it) are not in Events.
	Destination string
	// Events holds one outcome per event of the batch.
	Events []EventOutcome
	// PublishDuration is how long the broker took to answer for the whole batch:
	// from the Publish call until every message had its ack or error. Messages of
	// one aggregate are sent one after the other's ack, so it is at least the
	// longest such chain. broker.Publisher reports no per-message ack times.
	PublishDuration time.Duration
	// SettleDuration is how long recording the outcomes took (one transaction,
	// two round trips, when the database is healthy).
	SettleDuration time.Duration
}

// Result is what became of one event of a batch (pipeline.Result, the CDC
// source's too).
type Result = pipeline.Result

// The results of a relay's events.
const (
	// ResultPublished: the broker acknowledged the event; it is marked published.
	ResultPublished = pipeline.ResultPublished
	// ResultFailed: the publish failed; the event is retried after a backoff.
	ResultFailed = pipeline.ResultFailed
	// ResultQuarantined: the publish failed and the event is quarantined: its
	// error is permanent or it reached Config.MaxAttempts.
	ResultQuarantined = pipeline.ResultQuarantined
	// ResultReleased: the event was not attempted (an earlier event of its
	// aggregate failed, or the relay is stopping); its lease was given back
	// without counting an attempt.
	ResultReleased = pipeline.ResultReleased
)

// FailureReason classifies a failed publish, the reason label of
// pgoutbox_relay_publish_failures_total (pipeline.FailureReason, that is
// broker.FailureReason).
type FailureReason = pipeline.FailureReason

// The failure reasons of a relay's events (see broker.FailureReason).
const (
	ReasonPermanent   = pipeline.ReasonPermanent
	ReasonUnavailable = pipeline.ReasonUnavailable
	ReasonError       = pipeline.ReasonError
)

// ClassifyFailure returns the reason class of a relay's publish error
// (pipeline.ClassifyFailure).
func ClassifyFailure(err error) FailureReason { return pipeline.ClassifyFailure(err) }

// EventOutcome is the outcome of one event of a settled batch
// (pipeline.EventOutcome): its Attempt is 0 for a released event.
type EventOutcome = pipeline.EventOutcome
