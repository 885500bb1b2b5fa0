package retry

import (
	"errors"
	"strings"
	"testing"
	"time"
	"unicode/utf8"
)

func TestAttemptDelay(t *testing.T) {
	for _, c := range []struct {
		attempt     int
		unavailable bool
		lo, hi      time.Duration
	}{
		{1, false, 500 * time.Millisecond, time.Second},
		{3, false, 2 * time.Second, 4 * time.Second},
		{20, false, 30 * time.Second, time.Minute},     // capped at max
		{20, true, UnavailableCap / 2, UnavailableCap}, // capped while the broker is down
	} {
		for range 50 {
			if d := AttemptDelay(c.attempt, time.Second, time.Minute, c.unavailable); d < c.lo || d > c.hi {
				t.Fatalf("AttemptDelay(%d, unavailable=%v) = %s, want within [%s, %s]", c.attempt, c.unavailable, d, c.lo, c.hi)
			}
		}
	}
}

func TestErrorText(t *testing.T) {
	long := strings.Repeat("é", 1500) // 3,000 bytes
	got := ErrorText(errors.New("a\x00b\xffc " + long))
	if !utf8.ValidString(got) || strings.ContainsRune(got, 0) || len(got) > 2000 || !strings.HasPrefix(got, "ab?c ") {
		t.Fatalf("ErrorText = %q (%d bytes)", got[:10], len(got))
	}
}

func TestBackoff(t *testing.T) {
	var b Backoff
	want := []time.Duration{100, 200, 400, 800, 1600, 3200, 5000, 5000}
	for i, w := range want {
		if got := b.Next(); got != w*time.Millisecond {
			t.Fatalf("step %d: %s, want %s", i, got, w*time.Millisecond)
		}
	}
	b.Reset()
	if got := b.Next(); got != 100*time.Millisecond {
		t.Fatalf("after Reset: %s", got)
	}
}
