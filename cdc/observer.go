package cdc

import (
	"time"

	"github.com/jackc/pglogrepl"

	"github.com/pgoutbox/pgoutbox/internal/pipeline"
)

// Observer is told what a CDC source does, for metrics (package cdc/cdcprom
// implements it for Prometheus). Set it as Config.Observer; nil observes nothing.
//
// Its methods are called on the source's hot path, from the dispatcher, the
// table path and the standby watcher concurrently, once per settled batch, once
// per status report to the server and once per look at the standbys. They must be safe for concurrent use, cheap, and must never block:
// a slow observer slows publishing. They must not keep the slices they receive
// after returning.
type Observer interface {
	// BatchSettled is called once the outcome of a published batch was
	// recorded in the database: acked events are marked published, failed ones
	// scheduled for retry or quarantined. A batch whose outcome could not be
	// recorded (a hard stop came first) is not reported; the restart publishes
	// it again.
	BatchSettled(b SettledBatch)

	// PositionConfirmed is called after each standby status report sent to the
	// server: the slot's confirmed position moved to (or stayed at) p.LSN.
	PositionConfirmed(p Position)

	// StandbyChecked is called after each look at the synchronous standbys'
	// positions (every Config.StandbyPollInterval while transactions are held
	// for them, every few seconds otherwise): w says what is held, and why.
	// Never called with Config.PublishUnreplicated.
	StandbyChecked(w StandbyWait)

	// FailoverChecked is called after each look at the failover slot's
	// readiness (PostgreSQL 17 and later: at start, then every
	// Config.FailoverCheckInterval; failover.go). Never called on older servers.
	FailoverChecked(r FailoverReadiness)
}

// Path is where a batch came from.
type Path uint8

const (
	// PathStream: events received from the replication slot.
	PathStream Path = iota + 1
	// PathTable: events of lanes the table path owns (after a failure, or a
	// backfill), read from the outbox table.
	PathTable
)

// String returns "stream" or "table".
func (p Path) String() string {
	switch p {
	case PathStream:
		return "stream"
	case PathTable:
		return "table"
	}
	return "unknown"
}

// SettledBatch describes one published and settled batch.
type SettledBatch struct {
	// Path is where the batch's events came from.
	Path Path
	// Events holds one outcome per event handed to the broker.
	Events []EventOutcome
	// PublishDuration is how long the broker took to answer for the whole batch.
	PublishDuration time.Duration
	// SettleDuration is how long recording the outcomes took.
	SettleDuration time.Duration
}

// Result is what became of one event of a batch (pipeline.Result, the
// polling relay's too).
type Result = pipeline.Result

// The results of a CDC source's events.
const (
	// ResultPublished: the broker acknowledged the event; it is marked published.
	ResultPublished = pipeline.ResultPublished
	// ResultFailed: the publish failed; the event is retried after a backoff by
	// the table path.
	ResultFailed = pipeline.ResultFailed
	// ResultQuarantined: the publish failed and the event is quarantined: its
	// error is permanent or it reached Config.MaxAttempts.
	ResultQuarantined = pipeline.ResultQuarantined
	// ResultHeld: the event was not attempted because an earlier event of its
	// aggregate failed; it is left as it is, and the table path publishes it
	// after its predecessor.
	ResultHeld = pipeline.ResultHeld
)

// FailureReason classifies a failed publish, the reason label of
// pgoutbox_cdc_publish_failures_by_reason_total (pipeline.FailureReason, that
// is broker.FailureReason: the one classification of the relay and the CDC
// source).
type FailureReason = pipeline.FailureReason

// The failure reasons of a CDC source's events (see broker.FailureReason).
const (
	ReasonPermanent   = pipeline.ReasonPermanent
	ReasonUnavailable = pipeline.ReasonUnavailable
	ReasonError       = pipeline.ReasonError
)

// ClassifyFailure returns the reason class of a publish error
// (pipeline.ClassifyFailure, that is broker.ClassifyFailure).
func ClassifyFailure(err error) FailureReason { return pipeline.ClassifyFailure(err) }

// EventOutcome is the outcome of one event of a settled batch
// (pipeline.EventOutcome): its Attempt is 0 for a held event.
type EventOutcome = pipeline.EventOutcome

// Position is the slot's position as last reported to the server.
type Position struct {
	// LSN is the confirmed position: everything before it is settled, and the
	// server may recycle the WAL before it.
	LSN pglogrepl.LSN
	// Lag is the age of the oldest transaction received from the slot and not
	// yet settled (0 when everything received is settled).
	Lag time.Duration
}
