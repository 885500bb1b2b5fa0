package adminhttp

import "time"

// SetClock makes h's sign-in limiter read the time from now: tests move it
// instead of waiting. Call it before h serves.
func SetClock(h *Handler, now func() time.Time) { h.auth.limits.now = now }
