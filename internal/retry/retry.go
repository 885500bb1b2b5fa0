// Package retry holds the retry and failure-recording rules shared by the polling
// relay and the CDC source, so that both treat a failing event or an unreachable
// dependency the same way.
package retry

import (
	"context"
	"log/slog"
	"math/rand/v2"
	"strings"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/pgoutbox/pgoutbox/internal/redact"
)

// UnavailableCap bounds an event's backoff while the broker is unreachable, so that
// a backlog drains promptly once it is back.
const UnavailableCap = 10 * time.Second

// AttemptDelay returns the delay before attempt+1 of an event: exponential from
// base, capped at max (and at UnavailableCap when the broker was unreachable), with
// jitter between half and all of it, which spreads the retries of many events.
func AttemptDelay(attempt int, base, max time.Duration, unavailable bool) time.Duration {
	limit := max
	if unavailable {
		limit = min(limit, UnavailableCap)
	}
	d := base
	for i := 1; i < attempt && d < limit; i++ {
		d *= 2
	}
	d = min(d, limit)
	return d/2 + rand.N(d/2+1)
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

// Backoff is the delay schedule for reconnecting to the database, the listener or
// the replication stream: 100ms doubling to 5s. The zero value is ready to use.
type Backoff struct{ d time.Duration }

// Next returns the next delay.
func (b *Backoff) Next() time.Duration {
	b.d = min(max(b.d*2, 100*time.Millisecond), 5*time.Second)
	return b.d
}

// Reset starts the schedule over.
func (b *Backoff) Reset() { b.d = 0 }

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
