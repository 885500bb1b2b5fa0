// Package retry holds the one failure policy and the one backoff of pgoutbox:
// Policy.Decide says what becomes of an event whose publish failed (the polling
// relay and the CDC source both ask it, through internal/pipeline's Judge), Exponential is the delay schedule of
// every retry and reconnect loop, and MarkDown/MarkUp record an unreachable
// dependency the same way everywhere.
package retry

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"strings"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/pgoutbox/pgoutbox/broker"
	"github.com/pgoutbox/pgoutbox/internal/redact"
)

// UnavailableCap bounds an event's backoff while the broker is unreachable, so that
// a backlog drains promptly once it is back.
const UnavailableCap = 10 * time.Second

// Exponential is the one backoff schedule of pgoutbox: Base doubling with each
// attempt, capped at Max, with jitter between half and all of it, which spreads
// the retries of many clients. The relay's and the CDC source's event retries,
// the inbox's redelivery delays and every reconnect loop use it.
type Exponential struct {
	Base time.Duration // the delay before the second attempt (before jitter); must be > 0
	Max  time.Duration // the cap; must be >= Base
}

// Delay returns the delay after attempt (1 for the first): Base × 2^(attempt-1),
// capped at Max, jittered to [d/2, d].
func (e Exponential) Delay(attempt int) time.Duration {
	d := e.Max
	attempt = max(attempt, 1)
	if attempt <= 62 {
		if b := e.Base << (attempt - 1); b > 0 && b < e.Max && b>>(attempt-1) == e.Base {
			d = b
		}
	}
	if d <= 0 {
		return 0
	}
	return d/2 + rand.N(d/2+1)
}

// AttemptDelay returns the delay before attempt+1 of an event: Exponential from
// base, capped at max (and at UnavailableCap when the broker was unreachable).
func AttemptDelay(attempt int, base, max time.Duration, unavailable bool) time.Duration {
	limit := max
	if unavailable {
		limit = min(limit, UnavailableCap)
	}
	return Exponential{Base: min(base, limit), Max: limit}.Delay(attempt)
}

// Policy is the one failure policy of the relay and the CDC source: what becomes
// of an event whose publish failed.
type Policy struct {
	MaxAttempts int           // attempts before an ordinary failure quarantines the event
	BackoffBase time.Duration // the first retry delay
	BackoffMax  time.Duration // the cap of the retry delay
}

// Verdict is the Policy's decision about one failed publish.
type Verdict struct {
	Attempt       int           // the attempt that failed (1 for the first)
	Quarantine    bool          // quarantine the event: never retried until an operator acts
	Delay         time.Duration // the wait before the next attempt (when not quarantined)
	Unavailable   bool          // the broker was unreachable (an outage, not the event's fault)
	Misconfigured bool          // the broker refused the relay's configuration
	Text          string        // the error as stored in last_error and logged (ErrorText)
}

// Decide classifies err, the failure of attempt (previous attempts + 1) of an
// event:
//   - broker.Permanent: quarantined at once;
//   - broker.Unavailable (including broker.Misconfigured): retried with a
//     backoff capped at UnavailableCap, never quarantined — an outage or a
//     configuration error is not the event's fault;
//   - anything else: retried with backoff, quarantined at MaxAttempts.
func (p Policy) Decide(err error, attempt int) Verdict {
	v := Verdict{Attempt: attempt, Unavailable: broker.IsUnavailable(err), Misconfigured: broker.IsMisconfigured(err), Text: ErrorText(err)}
	v.Quarantine = broker.IsPermanent(err) || (!v.Unavailable && attempt >= p.MaxAttempts)
	v.Delay = AttemptDelay(attempt, p.BackoffBase, p.BackoffMax, v.Unavailable)
	return v
}

// ErrWrongResultCount is the failure of every event of a batch for which the
// publisher returned a result count that does not match the messages.
var ErrWrongResultCount = errors.New("the publisher returned the wrong number of results")

// CheckResults returns results unchanged if there is one per message (n), else
// n broker.Unavailable(ErrWrongResultCount) results and false: the relay cannot
// know which events the broker took, so all are retried with backoff (a
// duplicate at worst, never a loss) and none is quarantined for a publisher's bug.
func CheckResults(results []error, n int) ([]error, bool) {
	if len(results) == n {
		return results, true
	}
	out := make([]error, n)
	for i := range out {
		out[i] = broker.Unavailable(fmt.Errorf("%w (%d for %d messages)", ErrWrongResultCount, len(results), n))
	}
	return out, false
}

// ErrorText makes err storable in last_error and fit for logs: credentials a
// broker's error may echo (URLs, passwords, tokens) removed, valid UTF-8, no NUL,
// at most 2,000 bytes.
func ErrorText(err error) string {
	s := redact.Text(strings.ToValidUTF8(err.Error(), "?"))
	s = strings.ReplaceAll(s, "\x00", "")
	if len(s) > 2000 {
		s = s[:2000]
		for !utf8.ValidString(s) {
			s = s[:len(s)-1]
		}
	}
	return s
}

// Reconnect is the schedule for reconnecting to the database, the listener or
// the replication stream, and for an inbox subscriber's reads that keep
// failing: 100ms doubling to 5s.
var Reconnect = Exponential{Base: 100 * time.Millisecond, Max: 5 * time.Second}

// Backoff walks an Exponential schedule, one failure at a time. The zero value
// follows Reconnect.
type Backoff struct {
	Schedule Exponential // the zero value means Reconnect
	n        int
}

// Next returns the delay after one more failure.
func (b *Backoff) Next() time.Duration {
	s := b.Schedule
	if s == (Exponential{}) {
		s = Reconnect
	}
	b.n++
	return s.Delay(b.n)
}

// Reset starts the schedule over after a success.
func (b *Backoff) Reset() { b.n = 0 }

// Sleep waits for d, and reports false if ctx ended first.
func Sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// MarkDown records that a dependency (what: "database", "broker") is unreachable,
// logging only the change, not every failure.
func MarkDown(down *atomic.Bool, log *slog.Logger, what string, err error) {
	if down.CompareAndSwap(false, true) {
		log.Warn(what+" unreachable; retrying with backoff", slog.Any("error", err))
	}
}

// MarkUp records that a dependency is reachable again, logging only the change.
func MarkUp(down *atomic.Bool, log *slog.Logger, what string) {
	if down.CompareAndSwap(true, false) {
		log.Info(what + " reachable again")
	}
}
