package retry

import (
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
)

// BrokerHealth is what the relay and the CDC source know of their broker after
// each batch: reachable or not, and whether it refuses their configuration
// (credentials, signing secret, permissions). It logs only the changes. The zero
// value is a healthy broker.
type BrokerHealth struct {
	down    atomic.Bool
	refused atomic.Pointer[string] // why the broker refuses (broker.Misconfigured), or nil
}

// BatchOutcome is what one batch's publish said about the broker.
type BatchOutcome struct {
	Acked          bool   // the broker acknowledged at least one event
	AllUnavailable bool   // some events failed, and every failure was an outage
	Refused        string // the first broker.Misconfigured failure's text, if any
	FirstError     string // the first failure's text, logged when the broker goes down
}

// Settled records the outcome of a batch, logging a change of state.
func (b *BrokerHealth) Settled(log *slog.Logger, o BatchOutcome) {
	switch {
	case o.Acked:
		MarkUp(&b.down, log, "broker")
		if b.refused.Swap(nil) != nil {
			log.Info("the broker accepts the relay's configuration again")
		}
	case o.AllUnavailable && o.Refused != "":
		b.down.Store(false) // it answers: not an outage
		reason := o.Refused
		if b.refused.Swap(&reason) == nil {
			log.Error("the broker refuses the relay's configuration (credentials, signing secret, permissions): "+
				"fix the configuration; events are retried with backoff and none is quarantined", slog.String("error", reason))
		}
	case o.AllUnavailable:
		b.refused.Store(nil)
		MarkDown(&b.down, log, "broker", errors.New(o.FirstError))
	}
}

// Down reports whether the last batch found the broker unreachable.
func (b *BrokerHealth) Down() bool { return b.down.Load() }

// Errors returns unreachable when the broker is down and misconfigured (with
// the broker's answer) when it refuses the configuration, for Healthy.
func (b *BrokerHealth) Errors(unreachable, misconfigured error) []error {
	var errs []error
	if b.down.Load() {
		errs = append(errs, unreachable)
	}
	if reason := b.refused.Load(); reason != nil {
		errs = append(errs, fmt.Errorf("%w: %s", misconfigured, *reason))
	}
	return errs
}
