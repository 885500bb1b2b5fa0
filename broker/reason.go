package broker

// FailureReason classifies a failed publish by the error class the broker
// adapter gave it: the label of the relay's and the CDC source's failure
// metrics, and the Reason of their Observers' event outcomes.
type FailureReason string

const (
	// ReasonPermanent: the broker refused the message and will refuse it again
	// (Permanent). The event is quarantined at once.
	ReasonPermanent FailureReason = "permanent"
	// ReasonUnavailable: the broker was unreachable, did not answer in time, or
	// refused the relay's configuration (Unavailable, Misconfigured). Never
	// counts towards quarantine.
	ReasonUnavailable FailureReason = "unavailable"
	// ReasonError: any other error; the event is quarantined after the relay's
	// MaxAttempts.
	ReasonError FailureReason = "error"
)

// ClassifyFailure returns the reason class of a publish error.
func ClassifyFailure(err error) FailureReason {
	switch {
	case IsPermanent(err):
		return ReasonPermanent
	case IsUnavailable(err):
		return ReasonUnavailable
	}
	return ReasonError
}
