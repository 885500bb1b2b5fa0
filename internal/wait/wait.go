// Package wait is the one way tests wait: poll a condition until it holds or a
// deadline passes. Tests never sleep to synchronise.
package wait

import (
	"testing"
	"time"
)

// Interval is how often For and Forf poll.
const Interval = 10 * time.Millisecond

// For polls cond every Interval until it holds, failing the test (Fatalf) if it
// still does not after within. what names the condition in the failure.
func For(tb testing.TB, within time.Duration, what string, cond func() bool) {
	tb.Helper()
	Forf(tb, within, func() string { return what }, cond)
}

// Forf is For with a description made when it fails, so that it can show the
// state the condition was waiting on (a count, a log tail).
func Forf(tb testing.TB, within time.Duration, what func() string, cond func() bool) {
	tb.Helper()
	if !Until(within, cond) {
		tb.Fatalf("timed out after %s waiting for %s", within, what())
	}
}

// Until polls cond every Interval until it holds (true) or within passes (false).
func Until(within time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(Interval)
	}
	return true
}
