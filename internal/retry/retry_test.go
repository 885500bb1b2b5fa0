package retry

import (
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/pgoutbox/pgoutbox/broker"
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
		if got := b.Next(); got < w*time.Millisecond/2 || got > w*time.Millisecond {
			t.Fatalf("step %d: %s, want within [%s, %s]", i, got, w*time.Millisecond/2, w*time.Millisecond)
		}
	}
	b.Reset()
	if got := b.Next(); got > 100*time.Millisecond {
		t.Fatalf("after Reset: %s", got)
	}
}

func TestExponentialNeverOverflows(t *testing.T) {
	e := Exponential{Base: time.Hour, Max: 100 * time.Hour}
	for _, attempt := range []int{-5, 0, 1, 7, 8, 40, 63, 64, 1 << 30} {
		if d := e.Delay(attempt); d <= 0 || d > e.Max {
			t.Fatalf("Delay(%d) = %s, want within (0, %s]", attempt, d, e.Max)
		}
	}
}

func TestDecide(t *testing.T) {
	p := Policy{MaxAttempts: 3, BackoffBase: time.Second, BackoffMax: time.Minute}
	plain := errors.New("boom")
	for _, c := range []struct {
		name       string
		err        error
		attempt    int
		quarantine bool
		maxDelay   time.Duration
	}{
		{"ordinary, first attempt", plain, 1, false, time.Second},
		{"ordinary, last attempt", plain, 3, true, time.Minute},
		{"permanent, first attempt", broker.Permanent(plain), 1, true, time.Minute},
		{"unavailable, past MaxAttempts", broker.Unavailable(plain), 50, false, UnavailableCap},
		{"misconfigured, past MaxAttempts", broker.Misconfigured(plain), 50, false, UnavailableCap},
	} {
		v := p.Decide(c.err, c.attempt)
		if v.Quarantine != c.quarantine || v.Delay > c.maxDelay || v.Attempt != c.attempt || v.Text != "boom" {
			t.Errorf("%s: %+v, want quarantine=%v, delay <= %s", c.name, v, c.quarantine, c.maxDelay)
		}
	}
}

func TestCheckResults(t *testing.T) {
	if out, ok := CheckResults(make([]error, 3), 3); !ok || len(out) != 3 {
		t.Fatal("matching results were rewritten")
	}
	for _, got := range [][]error{nil, make([]error, 2), make([]error, 4)} {
		out, ok := CheckResults(got, 3)
		if ok || len(out) != 3 {
			t.Fatalf("%d results for 3: ok=%v len=%d", len(got), ok, len(out))
		}
		for _, err := range out {
			if !broker.IsUnavailable(err) || !errors.Is(err, ErrWrongResultCount) {
				t.Fatalf("result %v: want Unavailable(ErrWrongResultCount)", err)
			}
		}
	}
}

func TestBrokerHealth(t *testing.T) {
	var b BrokerHealth
	log := slog.New(slog.DiscardHandler)
	down, refused := errors.New("down"), errors.New("refused")
	if errs := b.Errors(down, refused); len(errs) != 0 {
		t.Fatalf("zero value: %v", errs)
	}
	b.Settled(log, BatchOutcome{AllUnavailable: true, FirstError: "dial tcp: refused"})
	if errs := b.Errors(down, refused); len(errs) != 1 || !errors.Is(errs[0], down) {
		t.Fatalf("after an outage: %v", errs)
	}
	b.Settled(log, BatchOutcome{AllUnavailable: true, Refused: "401 Unauthorized"})
	if errs := b.Errors(down, refused); len(errs) != 1 || !errors.Is(errs[0], refused) || !strings.Contains(errs[0].Error(), "401") {
		t.Fatalf("after a refusal: %v", errs)
	}
	b.Settled(log, BatchOutcome{Acked: true})
	if errs := b.Errors(down, refused); len(errs) != 0 || b.Down() {
		t.Fatalf("after an ack: %v", errs)
	}
}
