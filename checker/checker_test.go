package checker_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/pgoutbox/pgoutbox"
	"github.com/pgoutbox/pgoutbox/checker"
)

// world builds consistent inputs by hand: committed transactions with their outbox
// rows, business rows, broker messages and effects; tests then break one thing.
type world struct {
	in  checker.Input
	ids map[string]pgoutbox.UUID // "a/1" → event id
	seq map[string]int64
}

func newWorld() *world {
	return &world{
		in: checker.Input{Journal: []checker.Attempt{}, Outbox: []checker.OutboxRow{}, Business: []checker.BusinessRow{},
			Broker: []checker.Message{}, Effects: []checker.Effect{}, Consumers: []string{"billing"}},
		ids: map[string]pgoutbox.UUID{}, seq: map[string]int64{},
	}
}

// commit records a committed transaction enqueueing n events of aggregate agg.
func (w *world) commit(agg string, n int) []pgoutbox.UUID {
	return w.attempt(agg, n, checker.Committed, true)
}

func (w *world) attempt(agg string, n int, o checker.Outcome, writes bool) []pgoutbox.UUID {
	var ids []pgoutbox.UUID
	a := checker.Attempt{Tx: fmt.Sprintf("tx%d", len(w.in.Journal)+1), Outcome: o}
	for range n {
		id := pgoutbox.NewEventID()
		ids = append(ids, id)
		key := fmt.Sprintf("%s-%s", agg, id)
		a.Intents = append(a.Intents, checker.Intent{EventID: id, BusinessKey: key})
		if writes {
			w.seq[agg]++
			w.ids[fmt.Sprintf("%s/%d", agg, w.seq[agg])] = id
			w.in.Outbox = append(w.in.Outbox, checker.OutboxRow{EventID: id, AggregateType: "order", AggregateID: agg, Sequence: w.seq[agg], Published: true})
			w.in.Business = append(w.in.Business, checker.BusinessRow{Key: key, EventID: id})
		}
	}
	w.in.Journal = append(w.in.Journal, a)
	return ids
}

func (w *world) msg(id pgoutbox.UUID) checker.Message {
	for _, r := range w.in.Outbox {
		if r.EventID == id {
			return checker.Message{EventID: id, AggregateType: r.AggregateType, AggregateID: r.AggregateID, Sequence: r.Sequence}
		}
	}
	return checker.Message{EventID: id, AggregateType: "order", AggregateID: "rolled", Sequence: 99}
}

func (w *world) publish(ids ...pgoutbox.UUID) {
	for _, id := range ids {
		w.in.Broker = append(w.in.Broker, w.msg(id))
	}
}

func (w *world) apply(ids ...pgoutbox.UUID) {
	for _, id := range ids {
		m := w.msg(id)
		w.in.Effects = append(w.in.Effects, checker.Effect{Consumer: "billing", EventID: id, AggregateType: m.AggregateType, AggregateID: m.AggregateID, Sequence: m.Sequence})
	}
}

// deliverAll publishes and applies every outbox row in sequence order per aggregate.
func (w *world) deliverAll() {
	for _, r := range w.in.Outbox {
		w.publish(r.EventID)
		w.apply(r.EventID)
	}
}

func wantOnly(t *testing.T, v *checker.Verdict, want map[checker.Kind]int) {
	t.Helper()
	for k, n := range want {
		if got := v.Count(k); got != n {
			t.Errorf("%s problems = %d, want %d\n%s", k, got, n, v)
		}
	}
	total := 0
	for _, n := range want {
		total += n
	}
	if len(v.Problems) != total {
		t.Errorf("%d problems, want %d:\n%s", len(v.Problems), total, v)
	}
	if v.OK() != (total == 0) {
		t.Errorf("OK() = %v with %d problems", v.OK(), total)
	}
}

func TestCleanRunIsOK(t *testing.T) {
	w := newWorld()
	w.commit("a", 3)
	w.commit("b", 2)
	w.attempt("a", 2, checker.RolledBack, false)
	w.deliverAll()
	w.publish(w.ids["a/1"]) // a duplicate on the broker is allowed
	v := checker.Check(w.in)
	wantOnly(t, v, nil)
	if v.Committed != 5 || v.RolledBack != 2 || v.Duplicates != 1 || v.BrokerMessages != 6 || v.Applied["billing"] != 5 {
		t.Fatalf("counts wrong: %+v", v)
	}
	if !strings.Contains(v.String(), "checker: OK") || v.Err() != nil {
		t.Fatalf("summary of a clean run: %s", v)
	}
}

// The acceptance cases: a missing event, an out-of-order pair, a double-applied
// effect and a published rollback are each reported, by event id.
func TestMissingEventIsLost(t *testing.T) {
	w := newWorld()
	ids := w.commit("a", 3)
	w.publish(ids[0], ids[2])
	w.apply(ids[0], ids[2])
	v := checker.Check(w.in)
	wantOnly(t, v, map[checker.Kind]int{checker.Lost: 1, checker.NotApplied: 1})
	if p := v.Of(checker.Lost)[0]; p.EventID != ids[1] || p.Sequence != 2 || p.AggregateID != "a" {
		t.Fatalf("lost = %v, want event %s (a #2)", p, ids[1])
	}
	if !strings.Contains(v.String(), "lost: 1") || !strings.Contains(v.String(), ids[1].String()) {
		t.Fatalf("summary does not name the lost event:\n%s", v)
	}
}

func TestOutOfOrderPairOnBrokerAndInConsumer(t *testing.T) {
	w := newWorld()
	ids := w.commit("a", 3)
	other := w.commit("b", 1)
	w.publish(ids[0], ids[2], other[0], ids[1], ids[2])
	w.apply(ids[0], ids[2], ids[1], other[0])
	v := checker.Check(w.in)
	wantOnly(t, v, map[checker.Kind]int{checker.BrokerOrder: 1, checker.ConsumerOrder: 1})
	if p := v.Of(checker.BrokerOrder)[0]; p.EventID != ids[1] || !strings.Contains(p.Detail, "sequence 2 came first after sequence 3") {
		t.Fatalf("broker order problem = %v", p)
	}
	if p := v.Of(checker.ConsumerOrder)[0]; p.EventID != ids[1] || p.Consumer != "billing" {
		t.Fatalf("consumer order problem = %v", p)
	}
}

// A duplicate that re-appears after later sequences is not an order problem: only
// first appearances count.
func TestLateDuplicateIsNotAnOrderProblem(t *testing.T) {
	w := newWorld()
	ids := w.commit("a", 3)
	w.publish(ids[0], ids[1], ids[2], ids[0])
	w.apply(ids...)
	v := checker.Check(w.in)
	wantOnly(t, v, nil)
	if v.Duplicates != 1 {
		t.Fatalf("duplicates = %d, want 1", v.Duplicates)
	}
}

func TestDoubleAppliedEffect(t *testing.T) {
	w := newWorld()
	ids := w.commit("a", 2)
	w.deliverAll()
	w.apply(ids[0])
	v := checker.Check(w.in)
	wantOnly(t, v, map[checker.Kind]int{checker.AppliedTwice: 1})
	if p := v.Of(checker.AppliedTwice)[0]; p.EventID != ids[0] || p.Detail != "applied 2 times" {
		t.Fatalf("applied twice = %v", p)
	}
}

func TestRolledBackEventPublished(t *testing.T) {
	w := newWorld()
	w.commit("a", 1)
	rb := w.attempt("a", 1, checker.RolledBack, false)
	w.deliverAll()
	w.publish(rb[0])
	w.apply(rb[0])
	v := checker.Check(w.in)
	wantOnly(t, v, map[checker.Kind]int{checker.RolledBackPublished: 1, checker.RolledBackApplied: 1})
	if p := v.Of(checker.RolledBackPublished)[0]; p.EventID != rb[0] {
		t.Fatalf("rolled-back-published = %v", p)
	}
}

// A rolled-back transaction that left an outbox row breaks guarantee 2 even before
// anything is published.
func TestRolledBackIntentAndMutation(t *testing.T) {
	w := newWorld()
	w.commit("a", 1)
	rb := w.attempt("a", 1, checker.RolledBack, true) // the rollback "left" its rows
	w.deliverAll()
	v := checker.Check(w.in)
	wantOnly(t, v, map[checker.Kind]int{checker.RolledBackIntent: 1, checker.RolledBackMutation: 1,
		checker.RolledBackPublished: 1, checker.RolledBackApplied: 1})
	if v.Of(checker.RolledBackIntent)[0].EventID != rb[0] {
		t.Fatalf("wrong event: %s", v)
	}
}

func TestUnknownOutcomesAreSettledByTheDatabase(t *testing.T) {
	w := newWorld()
	committed := w.attempt("a", 2, checker.Unknown, true)
	w.attempt("b", 2, checker.Unknown, false)
	w.deliverAll()
	v := checker.Check(w.in)
	wantOnly(t, v, nil)
	if v.UnknownCommitted != 1 || v.UnknownRolledBack != 1 || v.Committed != 2 || v.RolledBack != 2 {
		t.Fatalf("unknown outcomes settled wrong: %s", v)
	}

	// An unknown transaction found committed must be delivered like any other.
	w.in.Broker = w.in.Broker[:1]
	v = checker.Check(w.in)
	if v.Count(checker.Lost) != 1 || v.Of(checker.Lost)[0].EventID != committed[1] {
		t.Fatalf("undelivered unknown-but-committed event not reported lost:\n%s", v)
	}
}

func TestPartialCommit(t *testing.T) {
	w := newWorld()
	ids := w.attempt("a", 2, checker.Unknown, true)
	w.in.Business = w.in.Business[:1]
	w.in.Outbox = w.in.Outbox[:1]
	w.deliverAll()
	v := checker.Check(w.in)
	wantOnly(t, v, map[checker.Kind]int{checker.PartialCommit: 1, checker.Lost: 1, checker.NotApplied: 1, checker.CommitMissing: 1})
	if v.Of(checker.PartialCommit)[0].EventID != ids[1] {
		t.Fatalf("wrong event: %s", v)
	}
}

func TestMutationWithoutIntentAndTheReverse(t *testing.T) {
	w := newWorld()
	ids := w.commit("a", 2)
	w.deliverAll()
	// Drop the outbox row of one event and the business row of the other.
	w.in.Outbox = w.in.Outbox[1:]
	w.in.Business = w.in.Business[:1]
	v := checker.Check(w.in)
	wantOnly(t, v, map[checker.Kind]int{checker.MutationWithoutIntent: 1, checker.IntentWithoutMutation: 1})
	if v.Of(checker.MutationWithoutIntent)[0].EventID != ids[0] || v.Of(checker.IntentWithoutMutation)[0].EventID != ids[1] {
		t.Fatalf("wrong events:\n%s", v)
	}

	// With retention on, a published event whose outbox row was cleaned up is fine.
	w.in.Business = append(w.in.Business, checker.BusinessRow{Key: "k", EventID: ids[1]})
	w.in.Retention = true
	wantOnly(t, checker.Check(w.in), nil)
}

func TestCommittedButAbsent(t *testing.T) {
	w := newWorld()
	ids := w.commit("a", 1)
	w.in.Outbox, w.in.Business = w.in.Outbox[:0], w.in.Business[:0]
	v := checker.Check(w.in)
	wantOnly(t, v, map[checker.Kind]int{checker.CommitMissing: 1, checker.Lost: 1, checker.NotApplied: 1})
	if v.Of(checker.CommitMissing)[0].EventID != ids[0] {
		t.Fatalf("wrong event:\n%s", v)
	}
}

func TestPhantom(t *testing.T) {
	w := newWorld()
	stranger := pgoutbox.NewEventID()
	w.publish(stranger)
	v := checker.Check(w.in)
	wantOnly(t, v, map[checker.Kind]int{checker.Phantom: 1})
}

// Without a journal, business rows or effects, the outbox alone says what must be
// on the broker — and an empty broker is not mistaken for "not recorded".
func TestOutboxAndBrokerOnly(t *testing.T) {
	w := newWorld()
	w.commit("a", 2)
	in := checker.Input{Outbox: w.in.Outbox, Broker: []checker.Message{}}
	wantOnly(t, checker.Check(in), map[checker.Kind]int{checker.Lost: 2})
	in.Broker = nil
	wantOnly(t, checker.Check(in), map[checker.Kind]int{checker.Lost: 2})
}

func TestEveryConsumerMustApplyEverything(t *testing.T) {
	w := newWorld()
	w.commit("a", 2)
	w.deliverAll()
	w.in.Consumers = []string{"billing", "shipping"}
	v := checker.Check(w.in)
	wantOnly(t, v, map[checker.Kind]int{checker.NotApplied: 2})
	for _, p := range v.Of(checker.NotApplied) {
		if p.Consumer != "shipping" {
			t.Fatalf("wrong consumer: %v", p)
		}
	}
}

func TestSummaryListsAtMostFivePerKind(t *testing.T) {
	w := newWorld()
	w.commit("a", 8)
	v := checker.Check(w.in)
	s := v.String()
	if !strings.Contains(s, "lost: 8") || !strings.Contains(s, "… 3 more") || v.Err() == nil {
		t.Fatalf("summary:\n%s", s)
	}
}

func TestJournalRoundTrip(t *testing.T) {
	path := t.TempDir() + "/journal"
	j, err := checker.OpenJournal(path)
	if err != nil {
		t.Fatal(err)
	}
	a, b, c := pgoutbox.NewEventID(), pgoutbox.NewEventID(), pgoutbox.NewEventID()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(j.Begin("t1", []checker.Intent{{EventID: a, BusinessKey: "ka"}, {EventID: b, BusinessKey: "kb"}}))
	must(j.End("t1", checker.Committed))
	must(j.Begin("t2", []checker.Intent{{EventID: c}}))
	must(j.End("t2", checker.RolledBack))
	must(j.Begin("t3", []checker.Intent{{EventID: c}}))
	if err := j.End("t3", "maybe"); err == nil {
		t.Fatal("End accepted an unknown outcome")
	}
	must(j.Close())
	got, err := checker.ReadJournalFiles(path)
	must(err)
	if len(got) != 3 || got[0].Outcome != checker.Committed || len(got[0].Intents) != 2 || got[0].Intents[1].EventID != b ||
		got[0].Intents[1].BusinessKey != "kb" || got[1].Outcome != checker.RolledBack || got[2].Outcome != checker.Unknown {
		t.Fatalf("read back %+v", got)
	}
}

func TestJournalTornLastLineIgnored(t *testing.T) {
	id := pgoutbox.NewEventID()
	text := `{"tx":"t1","op":"begin","events":[{"event_id":"` + id.String() + `"}]}
{"tx":"t1","op":"committed"}
{"tx":"t2","op":"beg`
	got, err := checker.ReadJournal(strings.NewReader(text))
	if err != nil || len(got) != 1 || got[0].Outcome != checker.Committed {
		t.Fatalf("got %+v, %v", got, err)
	}
	// A bad line in the middle is corruption, not a crash.
	if _, err := checker.ReadJournal(strings.NewReader("garbage\n" + text)); err == nil {
		t.Fatal("a bad line before others was accepted")
	}
	if _, err := checker.ReadJournal(strings.NewReader(`{"tx":"t9","op":"committed"}`)); err == nil {
		t.Fatal("an outcome without its begin was accepted")
	}
}

// Per destination: each gets the committed events routed there, in order per
// aggregate; a loss, a reordering, a rolled-back event and an event the rules do
// not route there are each reported at their destination, the others clean.
func TestDestinations(t *testing.T) {
	w := newWorld()
	w.in.Effects, w.in.Consumers = nil, nil // no consumers: the destinations are checked
	a := w.commit("a", 3)
	b := w.commit("b", 2)
	rolled := w.attempt("a", 1, checker.RolledBack, false)
	set := func(ids ...pgoutbox.UUID) map[pgoutbox.UUID]bool {
		m := map[pgoutbox.UUID]bool{}
		for _, id := range ids {
			m[id] = true
		}
		return m
	}
	msgs := func(ids ...pgoutbox.UUID) []checker.Message {
		var out []checker.Message
		for _, id := range ids {
			out = append(out, w.msg(id))
		}
		return out
	}
	all := append(append([]pgoutbox.UUID{}, a...), b...)
	clean := func() []checker.Destination {
		return []checker.Destination{
			{Name: "all", Expected: set(append(all, rolled...)...), Received: msgs(a[0], b[0], a[1], a[1], b[1], a[2])},
			{Name: "only-b", Expected: set(b...), Received: msgs(b...)},
			{Name: "none", Expected: set()},
		}
	}
	w.in.Destinations = clean()
	v := checker.Check(w.in)
	wantOnly(t, v, nil)
	if got := v.Destinations["all"]; got != (checker.DestinationCounts{Expected: 5, Received: 6, Duplicates: 1}) {
		t.Fatalf("counts of all = %+v", got)
	}
	if got := v.Destinations["only-b"]; got.Expected != 2 || got.Received != 2 {
		t.Fatalf("counts of only-b = %+v", got)
	}
	if !strings.Contains(v.String(), "destination only-b: 2 expected, 2 messages") {
		t.Fatalf("summary does not sum up the destinations:\n%s", v)
	}

	for _, c := range []struct {
		name  string
		spoil func(ds []checker.Destination)
		kind  checker.Kind
		dest  string
		id    pgoutbox.UUID
	}{
		{"lost", func(ds []checker.Destination) { ds[1].Received = msgs(b[0]) }, checker.Lost, "only-b", b[1]},
		{"order", func(ds []checker.Destination) { ds[1].Received = msgs(b[1], b[0]) }, checker.BrokerOrder, "only-b", b[0]},
		{"rolled back", func(ds []checker.Destination) { ds[0].Received = append(ds[0].Received, w.msg(rolled[0])) }, checker.RolledBackPublished, "all", rolled[0]},
		{"misrouted", func(ds []checker.Destination) { ds[2].Received = msgs(a[0]) }, checker.Misrouted, "none", a[0]},
	} {
		t.Run(c.name, func(t *testing.T) {
			w.in.Destinations = clean()
			c.spoil(w.in.Destinations)
			v := checker.Check(w.in)
			wantOnly(t, v, map[checker.Kind]int{c.kind: 1})
			if p := v.Of(c.kind)[0]; p.Destination != c.dest || p.EventID != c.id {
				t.Fatalf("problem = %v, want event %s at %s", p, c.id, c.dest)
			}
			if !strings.Contains(v.String(), "destination "+c.dest) {
				t.Fatalf("summary does not name the destination:\n%s", v)
			}
		})
	}
}
