package webhook

import "time"

// SetClock makes p read the time from now: for signatures and Retry-After pauses.
// Call it before p is used.
func SetClock(p *Publisher, now func() time.Time) { p.now = now }
