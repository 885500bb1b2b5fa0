package pipeline

import (
	"context"
	"errors"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/pgoutbox/pgoutbox"
	"github.com/pgoutbox/pgoutbox/broker"
	"github.com/pgoutbox/pgoutbox/internal/retry"
)

// Failure is one failed publish to record: retried after Verdict.Delay, or
// quarantined (Verdict.Quarantine).
type Failure struct {
	// Index is the event's position in the judged batch.
	Index int
	// ID is the event's id.
	ID pgoutbox.UUID
	// Verdict is the policy's decision; its Delay is Config.QuarantineDelay for
	// a quarantined event when that is set.
	Verdict retry.Verdict
}

// Judged is a batch's results sorted for the settle statements.
type Judged struct {
	// Acked are the events the broker acknowledged: to be marked published.
	Acked []pgoutbox.UUID
	// NotAttempted are the events not attempted because an earlier event of
	// their aggregate failed (or, with Judge's abandoned, whose publish a hard
	// stop cut short): no attempt is counted.
	NotAttempted []pgoutbox.UUID
	// Failed are the failed publishes, in batch order.
	Failed []Failure
	// Quarantined counts the Failed that are quarantined.
	Quarantined int
	// RetryIn is the shortest backoff of the Failed not quarantined (0 when
	// none is retried).
	RetryIn time.Duration
	// Broker is what the batch said about the broker (retry.BrokerHealth).
	Broker retry.BatchOutcome
	// Events holds one outcome per event, when Config.Observed.
	Events []EventOutcome
}

// BrokerDown reports whether the batch found the broker unreachable or
// refusing the configuration: failures only, every one an outage.
func (j *Judged) BrokerDown() bool { return !j.Broker.Acked && j.Broker.AllUnavailable }

// Judge sorts a publish's results (one per item, as Publish returned them)
// against c.Policy: acked, not attempted (broker.ErrPredecessorFailed; with
// abandoned, also a context error: a hard stop cut the publish short, not the
// event's fault) or failed with the policy's verdict (retry.Policy.Decide,
// attempt = Event.Attempts + 1). Quarantines are logged.
func Judge[T any, P Item[T]](c *Config, items []T, results []error, abandoned bool) Judged {
	var j Judged
	if c.Observed {
		j.Events = make([]EventOutcome, len(items))
	}
	allUnavailable := true
	for i, err := range results {
		e := P(&items[i]).pipelineEvent()
		o := EventOutcome{EventID: e.Msg.EventID, AggregateType: e.Msg.AggregateType, EventType: e.Msg.EventType}
		switch {
		case err == nil:
			j.Acked = append(j.Acked, e.Msg.EventID)
			o.Result, o.Attempt = ResultPublished, e.Attempts+1
		case errors.Is(err, broker.ErrPredecessorFailed),
			abandoned && (errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)):
			j.NotAttempted = append(j.NotAttempted, e.Msg.EventID)
			o.Result = c.NotAttempted
		default:
			v := c.Policy.Decide(err, e.Attempts+1)
			allUnavailable = allUnavailable && v.Unavailable
			if v.Misconfigured && j.Broker.Refused == "" {
				j.Broker.Refused = v.Text
			}
			o.Result, o.Attempt, o.Reason, o.Err = ResultFailed, v.Attempt, ClassifyFailure(err), err
			if v.Quarantine {
				j.Quarantined++
				c.Log.Warn("event quarantined", slog.String("event_id", e.Msg.EventID.String()),
					slog.String("aggregate", e.Lane().String()),
					slog.Int64("sequence", e.Msg.AggregateSequence), slog.Int("attempts", v.Attempt), slog.String("error", v.Text))
				o.Result = ResultQuarantined
				if c.QuarantineDelay > 0 {
					v.Delay = c.QuarantineDelay
				}
			} else if j.RetryIn == 0 || v.Delay < j.RetryIn {
				j.RetryIn = v.Delay
			}
			j.Failed = append(j.Failed, Failure{Index: i, ID: e.Msg.EventID, Verdict: v})
		}
		if j.Events != nil {
			j.Events[i] = o
		}
	}
	j.Broker.Acked = len(j.Acked) > 0
	j.Broker.AllUnavailable = len(j.Failed) > 0 && allUnavailable
	if len(j.Failed) > 0 {
		j.Broker.FirstError = j.Failed[0].Verdict.Text
	}
	return j
}

// Counters count the settled events of a source, for its Stats.
type Counters struct {
	Published    atomic.Int64 // events acknowledged and marked published
	Failed       atomic.Int64 // failed publish attempts recorded
	Quarantined  atomic.Int64 // events quarantined
	NotAttempted atomic.Int64 // events not attempted (the relay's released leases)
}

// Add counts a batch whose outcome was recorded.
func (c *Counters) Add(j *Judged) {
	c.Published.Add(int64(len(j.Acked)))
	c.Failed.Add(int64(len(j.Failed)))
	c.Quarantined.Add(int64(j.Quarantined))
	c.NotAttempted.Add(int64(len(j.NotAttempted)))
}

// FailColumns are failures as the column arrays of a fail statement
// (unnest($ids, $errors, $delays_ms, $quarantine)).
type FailColumns struct {
	IDs        []pgoutbox.UUID
	Errors     []string // Verdict.Text: the error as stored in last_error
	DelaysMs   []int64  // Verdict.Delay in milliseconds: the backoff through available_at
	Quarantine []bool   // Verdict.Quarantine
}

// FailColumnsOf returns failed as a fail statement's column arrays.
func FailColumnsOf(failed []Failure) FailColumns {
	c := FailColumns{IDs: make([]pgoutbox.UUID, len(failed)), Errors: make([]string, len(failed)),
		DelaysMs: make([]int64, len(failed)), Quarantine: make([]bool, len(failed))}
	for i, f := range failed {
		c.IDs[i], c.Errors[i], c.DelaysMs[i], c.Quarantine[i] = f.ID, f.Verdict.Text, f.Verdict.Delay.Milliseconds(), f.Verdict.Quarantine
	}
	return c
}

// FailAssignments is what every fail statement sets on an outbox row e for its
// failure f, a row of the FailColumns unnested as (event_id, error, delay_ms,
// quarantine): one attempt more, the error, the backoff through available_at,
// and the quarantine when the policy decided it. Each source adds who holds
// the event next.
const FailAssignments = `attempt_count = e.attempt_count + 1,
       last_error = f.error,
       available_at = now() + f.delay_ms * interval '1 millisecond',
       quarantined_at = CASE WHEN f.quarantine THEN now() END`

// AttemptsKept is how many attempt rows (outbox_attempts, outbox migration 13)
// a fail statement keeps per event: the newest.
const AttemptsKept = 20

// FailReturning is what every fail statement's UPDATE of the outbox row e
// returns, for RecordAttempts: the event, its attempt number and its error.
const FailReturning = `RETURNING e.event_id, e.attempt_count, e.last_error`

// RecordAttempts is the tail of every fail statement: the UPDATE of the failed
// events is the WITH query "failed" (ending in FailReturning); this writes one
// row per failed event in the attempts table %[2]s, relay id $5, in the same
// statement (so history and last_error never disagree), and deletes the rows
// of those events older than their AttemptsKept newest (the DELETE sees the
// rows as they were before the statement: it keeps AttemptsKept-1 = 19 of them,
// and the row inserted is the AttemptsKept-th). The statement returns
// the events failed. A happy path runs no fail statement, so it writes nothing
// here.
const RecordAttempts = `, recorded AS (
    INSERT INTO %[2]s (event_id, attempt, relay_id, error)
    SELECT event_id, attempt_count, $5::text, last_error FROM failed
), trimmed AS (
    DELETE FROM %[2]s a
     USING failed f
     WHERE a.event_id = f.event_id
       AND a.attempt_id < (SELECT min(k.attempt_id) FROM (SELECT b.attempt_id FROM %[2]s b
                             WHERE b.event_id = f.event_id ORDER BY b.attempt_id DESC LIMIT 19) k)
)
SELECT event_id FROM failed`
