package pgoutbox

import "github.com/pgoutbox/pgoutbox/internal/lifecycle"

// The errors of every long-running service's Start — relay.Relay, cdc.Source,
// the inbox subscribers and admin.Cleaner follow one lifecycle: Start runs
// once; Stop may be called any number of times, also before Start; a stopped
// service (by Stop, by the end of Start's context, or by a failed Start) cannot
// start again. Match them with errors.Is.
var (
	// ErrAlreadyStarted is returned by a second Start.
	ErrAlreadyStarted = lifecycle.ErrAlreadyStarted
	// ErrStopped is returned by Start after the service stopped.
	ErrStopped = lifecycle.ErrStopped
)
