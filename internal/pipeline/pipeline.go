// Package pipeline is the one publish-and-settle pipeline of pgoutbox: the
// polling relay (package relay) and the CDC source (package cdc) both take
// their events through it.
//
// A source finds events its own way (a claim of leased rows, a transaction
// decoded from a replication slot, a lane read from the table) and records
// their outcome with its own statements; between the two, every step is here:
//
//   - the events: Event is what a source hands over (a broker.Message, the
//     attempts made before, and why the row cannot become a message at all,
//     when it cannot); a source's batch item embeds it;
//   - Publish sorts a batch by lane and sequence, refuses invalid messages
//     unsent (broker.PublishValid), publishes the rest within Config.Timeout
//     and checks that the publisher returned one result per message
//     (retry.CheckResults);
//   - Judge sorts the results against the attempts policy (retry.Policy) into
//     acked, not attempted and failed (retried after a backoff, or
//     quarantined), with what the batch said about the broker and, for an
//     Observer, one EventOutcome per event;
//   - Counters counts what was settled, and Health is the one record of the
//     source's dependencies behind Healthy: the database (unreachable,
//     permission denied per statement, outbox unusable, statements stuck at
//     their bounds) and the broker (unreachable, refusing the configuration).
//
// The outcome vocabulary (Result, EventOutcome, FailureReason,
// ClassifyFailure) is public through aliases in relay and cdc. This package is
// the seam where per-destination results (one event, several destinations)
// and any future source plug in: a new source embeds Event in its items, calls
// Publish and Judge, and records Judged with its own statements.
//
// Imports pgx (pgconn, through migrate too), broker and migrate beyond the
// root package; no broker client and no metrics library (internal/promreg
// counts the outcomes for Prometheus).
package pipeline

import (
	"context"
	"log/slog"
	"slices"
	"time"

	"github.com/pgoutbox/pgoutbox"
	"github.com/pgoutbox/pgoutbox/broker"
	"github.com/pgoutbox/pgoutbox/internal/retry"
)

// Event is one event going through the pipeline. A source's batch item embeds
// it, beside what only that source needs (the relay's lease, the CDC source's
// transaction).
type Event struct {
	// Msg is the message to publish.
	Msg broker.Message
	// Attempts is the event's attempt_count before this attempt.
	Attempts int
	// Refused is why the row cannot become a message (headers that are not a
	// JSON object of strings, written by a raw INSERT): the event is
	// quarantined without being sent. Nil for a sendable row.
	Refused error
}

// Lane returns the event's lane.
func (e *Event) Lane() pgoutbox.Lane { return pgoutbox.LaneOf(e.Msg.AggregateType, e.Msg.AggregateID) }

func (e *Event) pipelineEvent() *Event { return e }

// Item is a pointer to a source's batch item: a struct that embeds Event.
type Item[T any] interface {
	*T
	pipelineEvent() *Event
}

// Config is what a source sets once for its pipeline.
type Config struct {
	// Broker publishes the batches.
	Broker broker.Publisher
	// Timeout bounds one batch's publish (the source's PublishTimeout).
	Timeout time.Duration
	// Policy decides retry or quarantine of a failed publish.
	Policy retry.Policy
	// NotAttempted is the Result of an event not attempted because an earlier
	// event of its aggregate failed: ResultReleased (the relay gives its lease
	// back) or ResultHeld (the CDC source leaves it to its table path).
	NotAttempted Result
	// QuarantineDelay, when not zero, is the delay recorded for a quarantined
	// event instead of the policy's backoff (the CDC source looks at a
	// quarantined lane again after its PollInterval, for an operator's retry).
	QuarantineDelay time.Duration
	// Observed makes Judge fill Judged.Events, for a source's Observer.
	Observed bool
	// Log receives the quarantines and a publisher's wrong result count.
	Log *slog.Logger
}

// Publish sorts items in place by lane, then sequence (what
// broker.Publisher.Publish requires), and publishes their messages within
// c.Timeout of ctx: rows written around the producer's checks (a raw INSERT:
// Event.Refused, reserved headers, sizes beyond the limits) are refused
// unsent (broker.PublishValid). It returns one result per item, in the sorted
// order, and how long the broker took to answer for all of them. A publisher
// that returns the wrong number of results fails every item with
// broker.Unavailable (retry.CheckResults). ctx is the source's hard-stop
// context: when it ends, the publish is abandoned.
func Publish[T any, P Item[T]](ctx context.Context, c *Config, items []T) ([]error, time.Duration) {
	slices.SortStableFunc(items, func(a, b T) int {
		ea, eb := P(&a).pipelineEvent(), P(&b).pipelineEvent()
		return pgoutbox.CompareInLane(ea.Lane(), ea.Msg.AggregateSequence, eb.Lane(), eb.Msg.AggregateSequence)
	})
	msgs := make([]broker.Message, len(items))
	var refused []error
	for i := range items {
		e := P(&items[i]).pipelineEvent()
		msgs[i] = e.Msg
		if e.Refused != nil {
			if refused == nil {
				refused = make([]error, len(items))
			}
			refused[i] = e.Refused
		}
	}
	start := time.Now()
	pctx, cancel := context.WithTimeout(ctx, c.Timeout)
	results := broker.PublishValid(pctx, c.Broker, msgs, refused)
	cancel()
	took := time.Since(start)
	checked, ok := retry.CheckResults(results, len(msgs))
	if !ok {
		c.Log.Error("publisher returned the wrong number of results; retrying the batch with backoff",
			slog.Int("messages", len(msgs)), slog.Int("results", len(results)))
	}
	return checked, took
}

// Unavailable returns n results failing with broker.Unavailable(err): a batch
// that could not be handed to the broker at all, retried without counting
// towards quarantine.
func Unavailable(n int, err error) []error {
	results := make([]error, n)
	for i := range results {
		results[i] = broker.Unavailable(err)
	}
	return results
}
