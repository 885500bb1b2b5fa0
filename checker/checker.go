// Package checker verifies pgoutbox's guarantees after the fact, from what each
// part of a pipeline left behind: the producer's journal of attempted transactions,
// the outbox and business rows in the database, the messages the broker stored, and
// the effects a consumer applied. It reports, by event id, every event that was
// lost, published although its transaction rolled back, written without its
// business row (or the reverse), applied more than once, or delivered out of its
// aggregate's order; broker duplicates are counted, since delivery is
// at-least-once.
//
// The fault-injection suite (internal/faulttest) runs it after every crash; run it
// against your own deployment the same way: journal what your producers attempt
// ([Journal]), record each applied effect in a table without a unique constraint
// (one row per application, so a double application shows), stop producing, let
// the relays and consumers drain, then read everything ([ReadOutbox],
// [ReadBusiness], [ReadEffects], [ReadJetStream], [ReadJournal]) and call [Check].
//
// What is checked (the guarantees of the README, as docs/design.md
// "Verification" reads them):
//
//  1. every committed business mutation has exactly one outbox intent;
//  2. a rolled-back mutation has none, and nothing of it is published or applied;
//  3. every committed intent reached the broker and every consumer (lost otherwise),
//     or, for a relay with several destinations ([Input.Destinations]), every
//     destination its rules route it to, and no other;
//  4. no consumer applied an event twice;
//  5. per aggregate, first appearances on the broker (at each destination) and first
//     applications in each consumer follow aggregate_sequence.
//
// Outside the standard library it pulls in nats.go (it reads a JetStream stream),
// besides the root package's pgx and OpenTelemetry trace API; no NATS server code.
package checker

import (
	"cmp"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/pgoutbox/pgoutbox"
)

// Outcome is what a producer knows of one transaction it attempted.
type Outcome string

const (
	// Committed: the commit returned without error.
	Committed Outcome = "committed"
	// RolledBack: the producer rolled back (or the transaction failed before its
	// commit was sent).
	RolledBack Outcome = "rolled_back"
	// Unknown: the producer died, or its commit call failed, after the transaction
	// began: the database alone knows. The checker decides from the business rows
	// (or, without them, the outbox rows) whether it committed.
	Unknown Outcome = "unknown"
)

// Intent is one event a producer transaction enqueued, with the key of the
// business row written beside it.
type Intent struct {
	EventID     pgoutbox.UUID `json:"event_id"`
	BusinessKey string        `json:"key,omitempty"`
}

// Attempt is one producer transaction as its journal recorded it.
type Attempt struct {
	Tx      string   // the producer's name for the transaction
	Outcome Outcome  // what the producer knows
	Intents []Intent // the events it enqueued, in call order
}

// OutboxRow is one row of outbox_events.
type OutboxRow struct {
	EventID       pgoutbox.UUID
	AggregateType string
	AggregateID   string
	Sequence      int64
	Published     bool // published_at is set
}

// BusinessRow is one business mutation and the event id it was written with.
type BusinessRow struct {
	Key     string
	EventID pgoutbox.UUID
}

// Message is one message the broker stored, in the broker's order.
type Message struct {
	EventID       pgoutbox.UUID
	AggregateType string
	AggregateID   string
	Sequence      int64
	// OccurredAt is the event's occurred_at and StoredAt when the broker stored
	// the message, where the reader knows them (ReadJetStream does): the
	// latency from commit to broker, for reports. Check ignores them.
	OccurredAt, StoredAt time.Time
}

// Effect is one application of an event's business effect by a consumer, in the
// order of application.
type Effect struct {
	Consumer      string
	EventID       pgoutbox.UUID
	AggregateType string
	AggregateID   string
	Sequence      int64
}

// Input is everything the checker looks at. Broker and Outbox are always checked;
// a nil Journal, Business or Effects means that source was not recorded and its
// checks are skipped (the loaders return non-nil slices, even when empty).
type Input struct {
	// Journal lists the producers' attempted transactions.
	Journal []Attempt
	// Outbox is the content of outbox_events.
	Outbox []OutboxRow
	// Business lists the business rows that carry an event id.
	Business []BusinessRow
	// Broker is what the broker stored, in stream (or partition) order.
	Broker []Message
	// Effects are the consumers' applications, in application order per consumer.
	Effects []Effect
	// Consumers must each apply every committed event. Defaults to the consumers
	// named in Effects.
	Consumers []string
	// Retention says cleanup may have deleted published outbox rows: a committed
	// event without its outbox row is then fine if the broker has it.
	Retention bool
	// Destinations, when set, checks delivery per destination of a relay with
	// several (relay.Config.Destinations) instead of on Broker: each committed
	// event its rules route there must have arrived there at least once, in
	// order per aggregate within the destination, and nothing rolled back or
	// not routed there may have. Broker may then be empty; whatever it holds is
	// still checked for rolled-back events and order, but not for losses.
	Destinations []Destination
}

// Destination is what one destination of a relay with several should have had
// and what it received.
type Destination struct {
	// Name names the destination in problems and in the verdict.
	Name string
	// Expected holds every event the destination's rules route there, as
	// computed from the rules (committed or not: the checker keeps the
	// committed ones). A received event outside it is Misrouted.
	Expected map[pgoutbox.UUID]bool
	// Received is what the destination stored (or was handed), in its order.
	Received []Message
}

// DestinationCounts sums up one destination in a Verdict.
type DestinationCounts struct {
	Expected   int // committed events routed there
	Received   int // messages it received
	Duplicates int // messages repeating an event already received there (allowed)
}

// Kind classifies a problem.
type Kind string

// The kinds of problems. Every one of them breaks a guarantee; broker duplicates
// are not a problem and are only counted (Verdict.Duplicates).
const (
	Lost                  Kind = "lost"                    // a committed intent never reached the broker (or a destination it is routed to)
	Misrouted             Kind = "misrouted"               // a destination received an event its rules do not route there
	NotApplied            Kind = "not-applied"             // a consumer never applied a committed intent
	RolledBackIntent      Kind = "rolled-back-intent"      // an outbox row of a rolled-back transaction
	RolledBackMutation    Kind = "rolled-back-mutation"    // a business row of a rolled-back transaction
	RolledBackPublished   Kind = "rolled-back-published"   // a rolled-back event on the broker
	RolledBackApplied     Kind = "rolled-back-applied"     // a rolled-back event applied by a consumer
	MutationWithoutIntent Kind = "mutation-without-intent" // a business row without its outbox row
	IntentWithoutMutation Kind = "intent-without-mutation" // an outbox row without its business row
	DuplicateIntent       Kind = "duplicate-intent"        // more than one outbox row (or business row) for one event
	PartialCommit         Kind = "partial-commit"          // a transaction whose writes are only partly in the database
	CommitMissing         Kind = "commit-missing"          // the producer saw a commit the database does not have
	Phantom               Kind = "phantom"                 // published or applied, never enqueued by anyone known
	AppliedTwice          Kind = "applied-twice"           // a consumer applied one event more than once
	BrokerOrder           Kind = "broker-order"            // a first appearance on the broker (or at a destination) after a higher sequence
	ConsumerOrder         Kind = "consumer-order"          // a first application after a higher sequence
)

// Problem is one broken guarantee about one event.
type Problem struct {
	Kind          Kind
	EventID       pgoutbox.UUID
	Consumer      string // for the consumer kinds
	Destination   string // for a problem at one destination (Input.Destinations)
	AggregateType string // when known
	AggregateID   string
	Sequence      int64
	Detail        string
}

// String describes the problem on one line.
func (p Problem) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s: event %s", p.Kind, p.EventID)
	if p.AggregateID != "" || p.AggregateType != "" {
		fmt.Fprintf(&b, " (%s/%s #%d)", p.AggregateType, p.AggregateID, p.Sequence)
	}
	if p.Consumer != "" {
		fmt.Fprintf(&b, " consumer %s", p.Consumer)
	}
	if p.Destination != "" {
		fmt.Fprintf(&b, " destination %s", p.Destination)
	}
	if p.Detail != "" {
		b.WriteString(": " + p.Detail)
	}
	return b.String()
}

// Verdict is the checker's report.
type Verdict struct {
	Attempts          int            // journal transactions
	UnknownCommitted  int            // Unknown attempts found committed
	UnknownRolledBack int            // Unknown attempts found rolled back
	Committed         int            // committed events (intents that must be delivered)
	RolledBack        int            // events of rolled-back transactions
	BrokerMessages    int            // messages on the broker
	Duplicates        int            // broker messages repeating an event already there (allowed)
	Applied           map[string]int // per consumer: distinct events applied
	// Destinations sums up each destination of Input.Destinations, by name.
	Destinations map[string]DestinationCounts
	Problems     []Problem // broken guarantees, by kind then event
}

// OK reports whether no guarantee was broken.
func (v *Verdict) OK() bool { return len(v.Problems) == 0 }

// Count returns the number of problems of kind k.
func (v *Verdict) Count(k Kind) int {
	n := 0
	for _, p := range v.Problems {
		if p.Kind == k {
			n++
		}
	}
	return n
}

// Of returns the problems of kind k.
func (v *Verdict) Of(k Kind) []Problem {
	var out []Problem
	for _, p := range v.Problems {
		if p.Kind == k {
			out = append(out, p)
		}
	}
	return out
}

// maxListed bounds the problems String lists per kind.
const maxListed = 5

// String summarises the verdict: the counts, then up to five problems per kind.
func (v *Verdict) String() string {
	var b strings.Builder
	status := "OK"
	if !v.OK() {
		status = fmt.Sprintf("FAILED (%d problems)", len(v.Problems))
	}
	fmt.Fprintf(&b, "checker: %s: %d committed events, %d rolled back (%d transactions; unknown outcomes: %d committed, %d rolled back); broker: %d messages, %d duplicates",
		status, v.Committed, v.RolledBack, v.Attempts, v.UnknownCommitted, v.UnknownRolledBack, v.BrokerMessages, v.Duplicates)
	for _, c := range slices.Sorted(maps.Keys(v.Applied)) {
		fmt.Fprintf(&b, "; %s applied %d", c, v.Applied[c])
	}
	for _, d := range slices.Sorted(maps.Keys(v.Destinations)) {
		n := v.Destinations[d]
		fmt.Fprintf(&b, "; destination %s: %d expected, %d messages, %d duplicates", d, n.Expected, n.Received, n.Duplicates)
	}
	kinds := map[Kind][]Problem{}
	for _, p := range v.Problems {
		kinds[p.Kind] = append(kinds[p.Kind], p)
	}
	for _, k := range slices.Sorted(maps.Keys(kinds)) {
		ps := kinds[k]
		fmt.Fprintf(&b, "\n  %s: %d", k, len(ps))
		for i, p := range ps {
			if i == maxListed {
				fmt.Fprintf(&b, "\n    … %d more", len(ps)-maxListed)
				break
			}
			b.WriteString("\n    " + p.String())
		}
	}
	return b.String()
}

// Err returns nil for a verdict without problems, else an error carrying String.
func (v *Verdict) Err() error {
	if v.OK() {
		return nil
	}
	return fmt.Errorf("%s", v.String())
}

// Check compares the sources and returns the verdict.
func Check(in Input) *Verdict {
	c := &check{in: in, v: &Verdict{Applied: map[string]int{}}}
	c.run()
	slices.SortStableFunc(c.v.Problems, func(a, b Problem) int {
		return cmp.Or(strings.Compare(string(a.Kind), string(b.Kind)), strings.Compare(a.Consumer, b.Consumer),
			strings.Compare(a.Destination, b.Destination),
			pgoutbox.CompareInLane(pgoutbox.LaneOf(a.AggregateType, a.AggregateID), a.Sequence,
				pgoutbox.LaneOf(b.AggregateType, b.AggregateID), b.Sequence))
	})
	return c.v
}

type check struct {
	in Input
	v  *Verdict

	outbox     map[pgoutbox.UUID]OutboxRow
	business   map[pgoutbox.UUID][]BusinessRow
	onBroker   map[pgoutbox.UUID]int
	committed  map[pgoutbox.UUID]bool // must be delivered
	rolledBack map[pgoutbox.UUID]bool // must leave nothing
	where      map[pgoutbox.UUID]Message
}

func (c *check) problem(k Kind, id pgoutbox.UUID, consumer, detail string) {
	m := c.where[id]
	c.v.Problems = append(c.v.Problems, Problem{Kind: k, EventID: id, Consumer: consumer,
		AggregateType: m.AggregateType, AggregateID: m.AggregateID, Sequence: m.Sequence, Detail: detail})
}

func (c *check) run() {
	in := c.in
	c.outbox = make(map[pgoutbox.UUID]OutboxRow, len(in.Outbox))
	c.where = make(map[pgoutbox.UUID]Message, len(in.Outbox))
	c.committed = map[pgoutbox.UUID]bool{}
	c.rolledBack = map[pgoutbox.UUID]bool{}
	c.onBroker = make(map[pgoutbox.UUID]int, len(in.Broker))

	// Where each event belongs, for readable reports: the outbox, else the broker,
	// else the effects.
	for _, e := range in.Effects {
		c.where[e.EventID] = Message{EventID: e.EventID, AggregateType: e.AggregateType, AggregateID: e.AggregateID, Sequence: e.Sequence}
	}
	for _, d := range in.Destinations {
		for _, m := range d.Received {
			c.where[m.EventID] = m
		}
	}
	for _, m := range in.Broker {
		c.where[m.EventID] = m
	}
	outboxCount := map[pgoutbox.UUID]int{}
	for _, r := range in.Outbox {
		outboxCount[r.EventID]++
		c.outbox[r.EventID] = r
		c.where[r.EventID] = Message{EventID: r.EventID, AggregateType: r.AggregateType, AggregateID: r.AggregateID, Sequence: r.Sequence}
	}
	for id, n := range outboxCount {
		if n > 1 {
			c.problem(DuplicateIntent, id, "", fmt.Sprintf("%d outbox rows", n))
		}
	}
	if in.Business != nil {
		c.business = map[pgoutbox.UUID][]BusinessRow{}
		for _, b := range in.Business {
			c.business[b.EventID] = append(c.business[b.EventID], b)
		}
		for id, bs := range c.business {
			if len(bs) > 1 {
				c.problem(DuplicateIntent, id, "", fmt.Sprintf("%d business rows", len(bs)))
			}
		}
	}
	for _, m := range in.Broker {
		c.onBroker[m.EventID]++
	}
	c.v.BrokerMessages = len(in.Broker)
	c.v.Duplicates = len(in.Broker) - len(c.onBroker)

	c.classify()
	c.v.Committed = len(c.committed)
	c.v.RolledBack = len(c.rolledBack)
	c.guarantee12()
	c.delivery()
	c.order()
}

// inDB reports whether the database holds any trace of the event's write: its
// outbox row or its business row.
func (c *check) inDB(id pgoutbox.UUID) bool {
	_, ok := c.outbox[id]
	return ok || len(c.business[id]) > 0
}

// classify decides which events committed and which rolled back: the journal's
// word, with Unknown settled by the database; every outbox or business row is a
// committed intent whatever the journal says.
func (c *check) classify() {
	in := c.in
	c.v.Attempts = len(in.Journal)
	journaled := map[pgoutbox.UUID]bool{}
	for _, a := range in.Journal {
		outcome := a.Outcome
		if outcome == Unknown {
			present := 0
			for _, it := range a.Intents {
				if c.inDB(it.EventID) {
					present++
				}
			}
			switch {
			case present == 0:
				outcome = RolledBack
				c.v.UnknownRolledBack++
			default:
				outcome = Committed
				c.v.UnknownCommitted++
				if present < len(a.Intents) {
					for _, it := range a.Intents {
						if !c.inDB(it.EventID) {
							c.problem(PartialCommit, it.EventID, "", fmt.Sprintf("transaction %s: %d of its %d events are in the database", a.Tx, present, len(a.Intents)))
						}
					}
				}
			}
		}
		for _, it := range a.Intents {
			journaled[it.EventID] = true
			switch outcome {
			case Committed:
				c.committed[it.EventID] = true
				if !c.inDB(it.EventID) && !(in.Retention && c.onBroker[it.EventID] > 0) {
					c.problem(CommitMissing, it.EventID, "", fmt.Sprintf("transaction %s committed, but the database has no row of it", a.Tx))
				}
			default:
				c.rolledBack[it.EventID] = true
			}
		}
	}
	// Rows the journal does not know (or a run without a journal) are committed
	// intents: only a commit writes them.
	for id := range c.outbox {
		if !c.rolledBack[id] {
			c.committed[id] = true
		}
	}
	for id := range c.business {
		if !c.rolledBack[id] {
			c.committed[id] = true
		}
	}
	// Published or applied events nobody is known to have enqueued.
	unknown := func(id pgoutbox.UUID) bool { return !c.committed[id] && !c.rolledBack[id] }
	seen := map[pgoutbox.UUID]bool{}
	for _, m := range in.Broker {
		if unknown(m.EventID) && !seen[m.EventID] {
			seen[m.EventID] = true
			if in.Retention && (in.Journal == nil || journaled[m.EventID]) {
				// Its outbox row may be gone; without a journal there is nothing to
				// say it was not committed.
				c.committed[m.EventID] = true
				continue
			}
			c.problem(Phantom, m.EventID, "", "on the broker, but in no journal, outbox or business row")
		}
	}
	for _, d := range in.Destinations {
		for _, m := range d.Received {
			if unknown(m.EventID) && !seen[m.EventID] {
				seen[m.EventID] = true
				c.problem(Phantom, m.EventID, "", "at destination "+d.Name+", but in no journal, outbox or business row")
			}
		}
	}
	for _, e := range in.Effects {
		if unknown(e.EventID) && !seen[e.EventID] {
			seen[e.EventID] = true
			c.problem(Phantom, e.EventID, e.Consumer, "applied, but in no journal, outbox, business row or broker message")
		}
	}
}

// guarantee12: one intent per committed mutation, none for a rolled-back one.
func (c *check) guarantee12() {
	for id := range c.rolledBack {
		if _, ok := c.outbox[id]; ok {
			c.problem(RolledBackIntent, id, "", "its transaction rolled back, yet the outbox has it")
		}
		if c.business != nil && len(c.business[id]) > 0 {
			c.problem(RolledBackMutation, id, "", "its transaction rolled back, yet its business row exists")
		}
	}
	if c.business == nil {
		return
	}
	for id, bs := range c.business {
		if c.rolledBack[id] {
			continue
		}
		if _, ok := c.outbox[id]; !ok && !(c.in.Retention && c.onBroker[id] > 0) {
			c.problem(MutationWithoutIntent, id, "", fmt.Sprintf("business row %q has no outbox row", bs[0].Key))
		}
	}
	for id := range c.outbox {
		if !c.rolledBack[id] && len(c.business[id]) == 0 {
			c.problem(IntentWithoutMutation, id, "", "outbox row without its business row")
		}
	}
}

// delivery: every committed event on the broker and applied once by every
// consumer; nothing rolled back published or applied.
func (c *check) delivery() {
	in := c.in
	c.destinations()
	for id := range c.committed {
		if in.Destinations != nil {
			break // delivery is checked per destination
		}
		if c.onBroker[id] == 0 {
			detail := "never reached the broker"
			if r, ok := c.outbox[id]; ok && r.Published {
				detail += " although marked published"
			}
			c.problem(Lost, id, "", detail)
		}
	}
	for id, n := range c.onBroker {
		if c.rolledBack[id] {
			c.problem(RolledBackPublished, id, "", fmt.Sprintf("its transaction rolled back, yet the broker has it %d time(s)", n))
		}
	}
	if in.Effects == nil && len(in.Consumers) == 0 {
		return
	}
	applied := map[string]map[pgoutbox.UUID]int{}
	for _, name := range in.Consumers {
		applied[name] = map[pgoutbox.UUID]int{}
	}
	for _, e := range in.Effects {
		if applied[e.Consumer] == nil {
			applied[e.Consumer] = map[pgoutbox.UUID]int{}
		}
		applied[e.Consumer][e.EventID]++
	}
	for name, got := range applied {
		c.v.Applied[name] = len(got)
		for id, n := range got {
			if n > 1 {
				c.problem(AppliedTwice, id, name, fmt.Sprintf("applied %d times", n))
			}
			if c.rolledBack[id] {
				c.problem(RolledBackApplied, id, name, "its transaction rolled back, yet it was applied")
			}
		}
		for id := range c.committed {
			if got[id] == 0 {
				c.problem(NotApplied, id, name, "never applied")
			}
		}
	}
}

// destinations: every committed event routed to a destination arrived there,
// nothing else did.
func (c *check) destinations() {
	if len(c.in.Destinations) == 0 {
		return
	}
	c.v.Destinations = map[string]DestinationCounts{}
	for _, d := range c.in.Destinations {
		got := make(map[pgoutbox.UUID]int, len(d.Received))
		for _, m := range d.Received {
			got[m.EventID]++
		}
		n := DestinationCounts{Received: len(d.Received), Duplicates: len(d.Received) - len(got)}
		for id := range d.Expected {
			if !c.committed[id] {
				continue
			}
			n.Expected++
			if got[id] == 0 {
				c.problemAt(Lost, id, d.Name, "never reached the destination")
			}
		}
		for id, k := range got {
			switch {
			case c.rolledBack[id]:
				c.problemAt(RolledBackPublished, id, d.Name, fmt.Sprintf("its transaction rolled back, yet the destination has it %d time(s)", k))
			case !d.Expected[id]:
				c.problemAt(Misrouted, id, d.Name, "its rules do not route it there")
			}
		}
		c.v.Destinations[d.Name] = n
	}
}

func (c *check) problemAt(k Kind, id pgoutbox.UUID, destination, detail string) {
	m := c.where[id]
	c.v.Problems = append(c.v.Problems, Problem{Kind: k, EventID: id, Destination: destination,
		AggregateType: m.AggregateType, AggregateID: m.AggregateID, Sequence: m.Sequence, Detail: detail})
}

// order: per aggregate, first appearances (first applications) ascend, on the
// broker, at each destination and in each consumer.
func (c *check) order() {
	firsts := func(kind Kind, consumer, destination string, seq func(yield func(Message) bool)) {
		seen := map[pgoutbox.UUID]bool{}
		high := map[pgoutbox.Lane]Message{}
		for m := range seq {
			if seen[m.EventID] {
				continue
			}
			seen[m.EventID] = true
			k := pgoutbox.LaneOf(m.AggregateType, m.AggregateID)
			h, ok := high[k]
			if ok && m.Sequence <= h.Sequence {
				c.v.Problems = append(c.v.Problems, Problem{Kind: kind, EventID: m.EventID, Consumer: consumer, Destination: destination,
					AggregateType: m.AggregateType, AggregateID: m.AggregateID, Sequence: m.Sequence,
					Detail: fmt.Sprintf("sequence %d came first after sequence %d (event %s)", m.Sequence, h.Sequence, h.EventID)})
				continue
			}
			high[k] = m
		}
	}
	firsts(BrokerOrder, "", "", func(yield func(Message) bool) {
		for _, m := range c.in.Broker {
			if !yield(m) {
				return
			}
		}
	})
	for _, d := range c.in.Destinations {
		firsts(BrokerOrder, "", d.Name, func(yield func(Message) bool) {
			for _, m := range d.Received {
				if !yield(m) {
					return
				}
			}
		})
	}
	byConsumer := map[string][]Effect{}
	for _, e := range c.in.Effects {
		byConsumer[e.Consumer] = append(byConsumer[e.Consumer], e)
	}
	for name, effects := range byConsumer {
		firsts(ConsumerOrder, name, "", func(yield func(Message) bool) {
			for _, e := range effects {
				if !yield(Message{EventID: e.EventID, AggregateType: e.AggregateType, AggregateID: e.AggregateID, Sequence: e.Sequence}) {
					return
				}
			}
		})
	}
}
