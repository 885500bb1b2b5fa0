package relay

import (
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"slices"

	"github.com/pgoutbox/pgoutbox/broker"
)

// Destination is one named place a relay with destinations (Config.Destinations)
// publishes events to: its own broker, and rules choosing which events go there.
// Each destination keeps its own progress per aggregate lane, so per-aggregate
// order, backoff, quarantine and dead letters hold per destination, and a
// destination that is down, slow or quarantining holds back only its own lanes
// (docs/design.md, "Destinations").
type Destination struct {
	// Name identifies the destination in the database (outbox_destinations), in
	// metrics (the destination label), logs, dlq and status: 1 to 63 characters
	// of a-z, 0-9, '_' and '-', starting with a letter or digit. A name is kept
	// across restarts: renaming a destination makes a new one.
	Name string

	// Publisher is the destination's broker, with its own destination template
	// and format. The relay does not close it.
	Publisher broker.Publisher

	// Rules choose the events the destination receives: an event goes to it when
	// any rule matches. At least one rule; Rule{All: true} takes every event.
	Rules []Rule

	// Start is how a destination registered for the first time begins:
	// StartNow (events committed from its registration on) or StartBackfill
	// (every event still in the outbox, in order per aggregate). It must be set;
	// it is ignored once the destination is registered, so that restarting a
	// relay, or adding back a destination removed by mistake, never resends
	// what it already has.
	Start Start
}

// Start says where a new destination begins (Destination.Start).
type Start string

// The ways a destination may start.
const (
	StartNow      Start = "now"
	StartBackfill Start = "backfill"
)

// Rule selects events by what the producer wrote. The fields set must all
// match; a list matches when it holds the event's value.
type Rule struct {
	// All matches every event. It cannot be combined with the other fields.
	All bool `json:"all,omitempty"`
	// AggregateTypes lists the aggregate types the rule takes (empty: any).
	AggregateTypes []string `json:"aggregate_types,omitempty"`
	// EventTypes lists the event types the rule takes (empty: any).
	EventTypes []string `json:"event_types,omitempty"`
	// Headers maps producer header names to the value each must have.
	Headers map[string]string `json:"headers,omitempty"`
}

// Limits of destinations checked by Validate.
const (
	// MaxDestinations bounds Config.Destinations.
	MaxDestinations = 32
	// MaxRules bounds the rules of one destination.
	MaxRules = 100
	// MaxRuleValues bounds the values a rule lists in all (aggregate types,
	// event types and headers together).
	MaxRuleValues = 1000
	// MaxRulesBytes bounds a destination's rules as JSON, the form
	// outbox_destinations keeps them in (its check allows 64 KiB).
	MaxRulesBytes = 64 << 10
	// maxRuleValueBytes bounds one value of a rule.
	maxRuleValueBytes = 200
)

var destinationName = regexp.MustCompile(`^[a-z0-9][a-z0-9_-]{0,62}$`)

// ErrInvalidDestination is wrapped by the errors of Destination.Validate.
var ErrInvalidDestination = errors.New("relay: invalid destination")

// ErrUnservedDestination is reported by Healthy while a destination is
// registered in the outbox that was not when this relay started (another
// relay added it: a rolling change under way) and that it does not serve.
// Until then the relay leases nothing, and marks nothing done and
// quarantines nothing as routed to no destination: both judgements need
// every destination, and a relay with an older destinations file would mark
// done events the new destination still owes, or quarantine events only it
// takes. Restart the relay with the destination in its file, or drop it
// (admin.DropDestination, pgoutbox destinations drop). A destination that was
// registered when the relay started and is not in its configuration counts
// as removed: events are done without it, its progress kept until dropped.
var ErrUnservedDestination = errors.New("relay: a destination registered in the outbox is not served by this relay")

// Validate reports what a relay would refuse in d, naming the destination and
// the field. Values are not quoted when they may be long; names are.
func (d *Destination) Validate() error {
	if !destinationName.MatchString(d.Name) {
		return fmt.Errorf("%w: name %q must be 1 to 63 characters of a-z, 0-9, '_' and '-', starting with a letter or digit",
			ErrInvalidDestination, truncate(d.Name, 80))
	}
	var errs []error
	bad := func(format string, args ...any) {
		errs = append(errs, fmt.Errorf("%w %q: "+format, append([]any{ErrInvalidDestination, d.Name}, args...)...))
	}
	if d.Publisher == nil {
		bad("Publisher is nil")
	}
	switch d.Start {
	case StartNow, StartBackfill:
	case "":
		bad("Start must be set, to %q or %q", StartNow, StartBackfill)
	default:
		bad("Start %q must be %q or %q", truncate(string(d.Start), 40), StartNow, StartBackfill)
	}
	if len(d.Rules) == 0 {
		bad("it needs at least one rule (Rule{All: true} takes every event)")
	}
	if len(d.Rules) > MaxRules {
		bad("%d rules, above the limit of %d", len(d.Rules), MaxRules)
	}
	values := 0
	for i, r := range d.Rules {
		values += len(r.AggregateTypes) + len(r.EventTypes) + len(r.Headers)
		if err := r.validate(); err != nil {
			bad("rule %d: %v", i+1, err)
		}
	}
	if values > MaxRuleValues {
		bad("its rules list %d values, above the limit of %d", values, MaxRuleValues)
	} else if raw, err := json.Marshal(d.Rules); err == nil && len(raw) > MaxRulesBytes {
		bad("its rules take %d bytes as JSON, above the limit of %d (outbox_destinations keeps them)", len(raw), MaxRulesBytes)
	}
	return errors.Join(errs...)
}

func (r *Rule) validate() error {
	empty := len(r.AggregateTypes) == 0 && len(r.EventTypes) == 0 && len(r.Headers) == 0
	switch {
	case r.All && !empty:
		return errors.New("all cannot be combined with aggregate types, event types or headers")
	case !r.All && empty:
		return errors.New("it matches nothing: set aggregate types, event types, headers, or all")
	}
	for _, list := range [][]string{r.AggregateTypes, r.EventTypes} {
		for _, v := range list {
			if v == "" || len(v) > maxRuleValueBytes {
				return fmt.Errorf("a value must be 1 to %d bytes", maxRuleValueBytes)
			}
		}
	}
	for k, v := range r.Headers {
		if k == "" || len(k) > maxRuleValueBytes || len(v) > maxRuleValueBytes {
			return fmt.Errorf("a header name must be 1 to %d bytes, and its value at most %d", maxRuleValueBytes, maxRuleValueBytes)
		}
	}
	return nil
}

// Match reports whether an event with these fields goes to the destination.
func (d *Destination) Match(aggregateType, eventType string, headers map[string]string) bool {
	return slices.ContainsFunc(d.Rules, func(r Rule) bool { return r.Match(aggregateType, eventType, headers) })
}

// Match reports whether the rule takes an event with these fields.
func (r *Rule) Match(aggregateType, eventType string, headers map[string]string) bool {
	if r.All {
		return true
	}
	if len(r.AggregateTypes) > 0 && !slices.Contains(r.AggregateTypes, aggregateType) {
		return false
	}
	if len(r.EventTypes) > 0 && !slices.Contains(r.EventTypes, eventType) {
		return false
	}
	for k, want := range r.Headers {
		if got, ok := headers[k]; !ok || got != want {
			return false
		}
	}
	return true
}

// validateDestinations checks a relay's destinations together: each valid,
// names unique, at most MaxDestinations.
func validateDestinations(ds []Destination) error {
	if len(ds) > MaxDestinations {
		return fmt.Errorf("%w: %d destinations, above the limit of %d", ErrInvalidDestination, len(ds), MaxDestinations)
	}
	var errs []error
	seen := make(map[string]bool, len(ds))
	for i := range ds {
		if err := ds[i].Validate(); err != nil {
			errs = append(errs, err)
			continue
		}
		if seen[ds[i].Name] {
			errs = append(errs, fmt.Errorf("%w %q: the name is used twice", ErrInvalidDestination, ds[i].Name))
		}
		seen[ds[i].Name] = true
	}
	return errors.Join(errs...)
}
