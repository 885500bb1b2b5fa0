// Package brokertest is the conformance suite every broker adapter must pass.
//
// An adapter's test calls [Run] with a [Harness] that opens a broker instance per
// subtest. The suite checks the contract of [broker.Publisher]: one result per
// message, per-aggregate order, refusals classified as permanent, no message
// reported acknowledged that the broker did not store (also across a broker
// restart), and the wire headers (docs/design.md, "Wire headers").
//
// Outside the standard library (testing) it pulls in only the root package's pgx
// and OpenTelemetry trace API; each adapter's test brings its own broker.
package brokertest

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pgoutbox/pgoutbox"
	"github.com/pgoutbox/pgoutbox/broker"
	"github.com/pgoutbox/pgoutbox/internal/freeport"
	"github.com/pgoutbox/pgoutbox/wire"
)

// Harness connects the suite to one kind of broker.
type Harness struct {
	// Open starts or connects to a broker for one subtest and returns it. Required.
	// Subtests run in parallel, so each call must return an instance whose
	// messages do not mix with other instances' (its own server, stream, topic or
	// queue). Open registers its own cleanup with t.Cleanup, including closing
	// the publisher.
	Open func(t *testing.T, opts Options) *Instance

	// Invalid, when set, changes m so that the broker must refuse it (for NATS, an
	// event type with a space makes the subject invalid). The suite then checks
	// that the refusal is permanent and stops the aggregate's lane.
	Invalid func(m *broker.Message)

	// Dedup reports that the broker stores one copy of messages that share an
	// event id (NATS JetStream's duplicate window). Without it, the suite accepts
	// one or two copies.
	Dedup bool

	// StopAfterRead is how many bytes the publisher's connections read from the
	// broker before the suite stops the broker mid-batch; enough for the first
	// acknowledgements to arrive, far fewer than the whole batch's. Defaults to
	// 16 KiB.
	StopAfterRead int
}

// Options is what the suite asks of an instance when opening it.
type Options struct {
	// WrapConn, when non-nil, must wrap every network connection the publisher
	// dials to the broker (nats.SetCustomDialer, kgo.Dialer, amqp.Config.Dial, an
	// http.Transport's DialContext). The suite uses it to stop the broker at a
	// known point: after the first acknowledgements have been read. It is set only
	// when the instance has Stop and Start.
	WrapConn func(net.Conn) net.Conn
}

// Instance is one broker as seen by one subtest.
type Instance struct {
	// Publisher is the adapter under test, connected to this broker. Required.
	Publisher broker.Publisher

	// Read returns every message the broker has stored, in broker order (stream
	// or partition order; for brokers without a total order, the order within an
	// aggregate must be kept). It waits as needed until acknowledged messages
	// are readable. Required.
	Read func(ctx context.Context) ([]Stored, error)

	// Stop stops the broker, keeping its data; Start starts it again at the same
	// address. Both optional: without them the restart subtest is skipped. The
	// publisher stays open across them, as a relay's would.
	Stop  func(ctx context.Context) error
	Start func(ctx context.Context) error
}

// Stored is one message as the broker stored it.
type Stored struct {
	// Destination is where the message went: subject, topic, routing key or URL.
	Destination string
	// Key is the broker's partition or routing key, if it has one.
	Key string
	// Headers holds the message's headers. Names are compared case-insensitively,
	// as HTTP does not keep their case.
	Headers map[string]string
	// Body is the message body.
	Body []byte
}

func (s *Stored) header(name string) (string, bool) {
	if v, ok := s.Headers[name]; ok {
		return v, true
	}
	for k, v := range s.Headers {
		if strings.EqualFold(k, name) {
			return v, true
		}
	}
	return "", false
}

// Deadlines for a Publish call; generous because -race on two cores is slow.
const (
	publishTimeout = 60 * time.Second
	promptTimeout  = 5 * time.Second
)

// Run runs the conformance suite against the broker h opens.
func Run(t *testing.T, h Harness) {
	if h.Open == nil {
		t.Fatal("brokertest: Harness.Open is required")
	}
	if h.StopAfterRead <= 0 {
		h.StopAfterRead = 16 << 10
	}
	t.Run("PerKeyOrder", func(t *testing.T) { t.Parallel(); testPerKeyOrder(t, h) })
	t.Run("OneResultPerMessage", func(t *testing.T) { t.Parallel(); testOneResultPerMessage(t, h) })
	t.Run("PermanentRefusal", func(t *testing.T) {
		if h.Invalid == nil {
			t.Skip("Harness.Invalid not set")
		}
		t.Parallel()
		testPermanentRefusal(t, h)
	})
	t.Run("BrokerStopMidBatch", func(t *testing.T) { t.Parallel(); testBrokerStopMidBatch(t, h) })
	t.Run("CancelledContext", func(t *testing.T) { t.Parallel(); testCancelledContext(t, h) })
	t.Run("DuplicateEventID", func(t *testing.T) { t.Parallel(); testDuplicateEventID(t, h) })
}

// batch builds msgs for aggregates of one fresh aggregate type, interleaved: one
// message of every aggregate, then the next sequence of every aggregate, and so on.
type batch struct {
	aggType string
	msgs    []broker.Message
	byID    map[string]*broker.Message
}

func newBatch(aggregates, perAggregate int) *batch {
	b := &batch{aggType: uniqueName("agg"), byID: map[string]*broker.Message{}}
	occurred := time.Now().UTC()
	for seq := 1; seq <= perAggregate; seq++ {
		for a := 0; a < aggregates; a++ {
			id := pgoutbox.NewEventID()
			n := len(b.msgs)
			b.msgs = append(b.msgs, broker.Message{
				EventID:           id,
				AggregateType:     b.aggType,
				AggregateID:       fmt.Sprintf("a%03d", a),
				AggregateSequence: int64(seq),
				EventType:         "changed",
				SchemaVersion:     1 + n%3,
				OccurredAt:        occurred.Add(time.Duration(n) * time.Microsecond),
				Payload:           []byte(fmt.Sprintf(`{"n":%d,"text":"caf\u00e9 \"quoted\""}`, n)),
				Headers: map[string]string{
					wire.HeaderTraceParent: fmt.Sprintf("00-%032x-%016x-01", n+1, n+1),
					"Test-Tenant":          "tenant " + strconv.Itoa(n%7),
				},
			})
		}
	}
	for i := range b.msgs {
		b.byID[b.msgs[i].EventID.String()] = &b.msgs[i]
	}
	return b
}

func uniqueName(prefix string) string {
	var r [5]byte
	_, _ = rand.Read(r[:])
	return prefix + "_" + hex.EncodeToString(r[:])
}

// stored is a Stored message of this batch, decoded.
type stored struct {
	*Stored
	eventID string
	aggID   string
	seq     int64
}

// mine reads the instance and keeps the messages of b's aggregate type.
func (b *batch) mine(t *testing.T, inst *Instance) []stored {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), publishTimeout)
	defer cancel()
	all, err := inst.Read(ctx)
	if err != nil {
		t.Fatalf("Read: %v", err)
	}
	var out []stored
	for i := range all {
		s := &all[i]
		if typ, _ := s.header(wire.HeaderAggregateType); typ != b.aggType {
			continue
		}
		id, _ := s.header(wire.HeaderEventID)
		agg, _ := s.header(wire.HeaderAggregateID)
		seqText, _ := s.header(wire.HeaderAggregateSequence)
		seq, err := strconv.ParseInt(seqText, 10, 64)
		if err != nil {
			t.Fatalf("stored message %d: %s header %q: %v", i, wire.HeaderAggregateSequence, seqText, err)
		}
		out = append(out, stored{Stored: s, eventID: id, aggID: agg, seq: seq})
	}
	return out
}

// checkFirstAppearances checks that, per aggregate, the first appearances of
// sequences are 1, 2, 3, … in broker order (re-publishes may repeat a suffix).
// It returns each aggregate's highest sequence stored.
func checkFirstAppearances(t *testing.T, got []stored) map[string]int64 {
	t.Helper()
	seen := map[string]map[int64]bool{}
	next := map[string]int64{}
	for i, s := range got {
		if seen[s.aggID] == nil {
			seen[s.aggID] = map[int64]bool{}
			next[s.aggID] = 1
		}
		if seen[s.aggID][s.seq] {
			continue
		}
		if s.seq != next[s.aggID] {
			t.Errorf("aggregate %s: stored message %d is the first appearance of sequence %d, want %d", s.aggID, i, s.seq, next[s.aggID])
		}
		seen[s.aggID][s.seq] = true
		next[s.aggID] = max(next[s.aggID], s.seq) + 1
	}
	highest := map[string]int64{}
	for agg, n := range next {
		highest[agg] = n - 1
	}
	return highest
}

// checkContent checks that a stored message carries exactly what was published.
func (b *batch) checkContent(t *testing.T, s stored) {
	t.Helper()
	m, ok := b.byID[s.eventID]
	if !ok {
		t.Errorf("stored message with unknown %s %q", wire.HeaderEventID, s.eventID)
		return
	}
	if s.Destination == "" {
		t.Errorf("event %s: empty destination", s.eventID)
	}
	for name, want := range m.WireHeaders() {
		got, ok := s.header(name)
		if !ok {
			t.Errorf("event %s: header %s missing", s.eventID, name)
		} else if got != want {
			t.Errorf("event %s: header %s = %q, want %q", s.eventID, name, got, want)
		}
	}
	if !bytes.Equal(s.Body, m.Payload) {
		t.Errorf("event %s: body = %q, want %q", s.eventID, s.Body, m.Payload)
	}
}

func publish(t *testing.T, p broker.Publisher, msgs []broker.Message) []error {
	t.Helper()
	return Publish(t, p, msgs...)
}

// Publish publishes msgs through p with a generous deadline and fails the test
// unless there is exactly one result per message.
func Publish(t testing.TB, p broker.Publisher, msgs ...broker.Message) []error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), publishTimeout)
	defer cancel()
	results := p.Publish(ctx, msgs)
	if len(results) != len(msgs) {
		t.Fatalf("Publish returned %d results for %d messages", len(results), len(msgs))
	}
	return results
}

// CheckUnreachable publishes msgs through p, whose broker cannot be reached,
// and fails the test unless every result is marked [broker.Unavailable] (or is
// ErrPredecessorFailed behind an unavailable message of its aggregate, for an
// adapter that stops an aggregate at its first failure), and unless Ping,
// when p is a [broker.Pinger], is unavailable too (a ping unanswered within
// 5 s counts: a deadline is unavailable). An unreachable broker must
// never look like a refusal: the relay would quarantine the events.
func CheckUnreachable(t testing.TB, p broker.Publisher, msgs ...broker.Message) {
	t.Helper()
	failed := map[pgoutbox.Lane]bool{}
	for i, err := range Publish(t, p, msgs...) {
		lane := msgs[i].Lane()
		switch {
		case broker.IsUnavailable(err):
			failed[lane] = true
		case errors.Is(err, broker.ErrPredecessorFailed) && failed[lane]:
		default:
			t.Errorf("result %d: %v, want unavailable", i, err)
		}
	}
	pinger, ok := p.(broker.Pinger)
	if !ok {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := pinger.Ping(ctx); !broker.IsUnavailable(err) {
		t.Errorf("Ping: %v, want unavailable", err)
	}
}

// CheckCloudEventsHeaders fails the test unless got, the headers an adapter
// put on its transport for m in the CloudEvents format enc, hold every header
// enc.Headers yields for binding b with its value, no Outbox-* header (the
// default format's, which CloudEvents replaces), and m's producer headers
// Tenant and traceparent as the default format carries them.
func CheckCloudEventsHeaders(t testing.TB, got map[string]string, enc wire.Encoding, m *broker.Message, b wire.CloudEventsBinding) {
	t.Helper()
	for k := range got {
		if strings.HasPrefix(strings.ToLower(k), "outbox-") {
			t.Errorf("header %s in the CloudEvents format", k)
		}
	}
	if got["Tenant"] != m.Headers["Tenant"] || got["traceparent"] != m.Headers["traceparent"] {
		t.Errorf("producer headers %v not carried as in the default format", got)
	}
	for k, v := range enc.Headers(m, b) {
		if g, ok := got[k]; !ok || g != v {
			t.Errorf("header %s = %q, want %q", k, g, v)
		}
	}
}

// FreePort returns a port of 127.0.0.1 that nothing listens on yet: where a
// test starts a broker (or a proxy) after its client dialled it. The port lies
// outside the kernel's ephemeral range, so no outgoing connection's source
// port (nor a client's self-connect) takes it before the server binds, and no
// two calls in one test binary return the same port (package internal/freeport
// says what remains across test binaries).
func FreePort(t testing.TB) int {
	t.Helper()
	port, err := freeport.Pick()
	if err != nil {
		t.Fatal(err)
	}
	return port
}

// Message returns a message of the given aggregate and sequence with a fresh event
// id, a fixed occurred-at, a small JSON payload and two producer headers
// (traceparent and Tenant), for adapters' own tests.
func Message(aggType, aggID string, seq int64) broker.Message {
	return broker.Message{
		EventID:           pgoutbox.NewEventID(),
		AggregateType:     aggType,
		AggregateID:       aggID,
		AggregateSequence: seq,
		EventType:         "created",
		SchemaVersion:     2,
		OccurredAt:        time.Date(2025, 3, 4, 5, 6, 7, 890, time.UTC),
		Payload:           []byte(`{"total":"9.50"}`),
		Headers: map[string]string{
			wire.HeaderTraceParent: "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
			"Tenant":               "acme corp",
		},
	}
}

func testPerKeyOrder(t *testing.T, h Harness) {
	inst := h.Open(t, Options{})
	b := newBatch(50, 20)
	for i, err := range publish(t, inst.Publisher, b.msgs) {
		if err != nil {
			t.Fatalf("result %d (%s seq %d): %v", i, b.msgs[i].AggregateID, b.msgs[i].AggregateSequence, err)
		}
	}
	got := b.mine(t, inst)
	highest := checkFirstAppearances(t, got)
	if len(highest) != 50 {
		t.Errorf("stored messages of %d aggregates, want 50", len(highest))
	}
	for agg, n := range highest {
		if n != 20 {
			t.Errorf("aggregate %s: highest sequence stored is %d, want 20", agg, n)
		}
	}
	ids := map[string]bool{}
	for _, s := range got {
		ids[s.eventID] = true
		b.checkContent(t, s)
	}
	if len(ids) != len(b.msgs) {
		t.Errorf("stored %d distinct events, want %d", len(ids), len(b.msgs))
	}
}

func testOneResultPerMessage(t *testing.T, h Harness) {
	inst := h.Open(t, Options{})
	for _, n := range []int{0, 1, 7} {
		var msgs []broker.Message
		if n > 0 {
			msgs = newBatch(3, n).msgs[:n]
		}
		for i, err := range publish(t, inst.Publisher, msgs) {
			if err != nil {
				t.Errorf("batch of %d: result %d: %v", n, i, err)
			}
		}
	}
	if got := publish(t, inst.Publisher, []broker.Message{}); len(got) != 0 {
		t.Errorf("empty non-nil batch: %d results", len(got))
	}
}

func testPermanentRefusal(t *testing.T, h Harness) {
	inst := h.Open(t, Options{})
	// Aggregates a000, a001, a002 with 4 messages each; a000's second is refused.
	b := newBatch(3, 4)
	bad := -1
	for i := range b.msgs {
		if m := &b.msgs[i]; m.AggregateID == "a000" && m.AggregateSequence == 2 {
			h.Invalid(m)
			bad = i
		}
	}
	results := publish(t, inst.Publisher, b.msgs)
	for i, err := range results {
		m := &b.msgs[i]
		switch {
		case i == bad:
			if err == nil || !broker.IsPermanent(err) {
				t.Errorf("refused message: result %v, want a permanent error", err)
			}
		case m.AggregateID == "a000" && m.AggregateSequence > 2:
			if !errors.Is(err, broker.ErrPredecessorFailed) {
				t.Errorf("%s seq %d after the refused one: result %v, want ErrPredecessorFailed", m.AggregateID, m.AggregateSequence, err)
			}
		default:
			if err != nil {
				t.Errorf("%s seq %d: result %v, want nil", m.AggregateID, m.AggregateSequence, err)
			}
		}
	}
	for _, s := range b.mine(t, inst) {
		if s.aggID == "a000" && s.seq >= 2 {
			t.Errorf("a000 seq %d was stored after its lane failed", s.seq)
		}
	}
}

// tripwire wraps the publisher's connections to cut the broker off at a known
// point. Once they have read limit bytes (the first acknowledgements), the
// connection behaves like a network partition: what the publisher writes is lost,
// and reads wait until the broker has been stopped, then return what the broker
// had sent before it stopped. Messages sent after the trip are never stored, so a
// publisher that reports any of them acknowledged fails the subtest.
type tripwire struct {
	limit    int64
	read     atomic.Int64
	lost     atomic.Int64 // bytes written after the trip
	once     sync.Once
	lostOnce sync.Once
	tripped  chan struct{}
	wrote    chan struct{} // closed at the first write lost in the partition
	stopped  chan struct{}
}

func (w *tripwire) wrap(c net.Conn) net.Conn {
	select {
	case <-w.stopped:
		return c // a connection to the restarted broker
	default:
		return tripConn{c, w}
	}
}

func (w *tripwire) isTripped() bool {
	select {
	case <-w.tripped:
		return true
	default:
		return false
	}
}

type tripConn struct {
	net.Conn
	w *tripwire
}

func (c tripConn) Read(p []byte) (int, error) {
	if c.w.isTripped() {
		select {
		case <-c.w.stopped:
		case <-time.After(publishTimeout): // the suite failed; don't hang forever
		}
	}
	n, err := c.Conn.Read(p)
	if c.w.read.Add(int64(n)) >= c.w.limit {
		c.w.once.Do(func() { close(c.w.tripped) })
	}
	return n, err
}

func (c tripConn) Write(p []byte) (int, error) {
	if c.w.isTripped() {
		c.w.lost.Add(int64(len(p)))
		c.w.lostOnce.Do(func() { close(c.w.wrote) })
		return len(p), nil
	}
	return c.Conn.Write(p)
}

func testBrokerStopMidBatch(t *testing.T, h Harness) {
	w := &tripwire{
		limit:   int64(h.StopAfterRead),
		tripped: make(chan struct{}),
		wrote:   make(chan struct{}),
		stopped: make(chan struct{}),
	}
	var stopOnce sync.Once
	unblock := func() { stopOnce.Do(func() { close(w.stopped) }) }
	defer unblock()
	inst := h.Open(t, Options{WrapConn: w.wrap})
	if inst.Stop == nil || inst.Start == nil {
		t.Skip("Instance.Stop/Start not set")
	}
	b := newBatch(100, 50)

	var results []error
	done := make(chan struct{})
	go func() {
		defer close(done)
		// No deadline: Publish itself must notice the broker has gone.
		results = inst.Publisher.Publish(context.Background(), b.msgs)
	}()
	select {
	case <-w.tripped:
	case <-done:
		t.Fatal("the batch finished before the broker was stopped: does Open apply Options.WrapConn?")
	case <-time.After(publishTimeout):
		t.Fatal("no acknowledgement read within the deadline")
	}
	// The acks read just before the trip let the publisher send more messages,
	// which the partition loses. Wait for one, so the stop finds messages sent and
	// not stored; the wait is bounded because the last read may hold no whole ack.
	select {
	case <-w.wrote:
	case <-time.After(promptTimeout):
		t.Log("no message was sent into the partition before the stop")
	}
	ctx, cancel := context.WithTimeout(context.Background(), publishTimeout)
	defer cancel()
	if err := inst.Stop(ctx); err != nil {
		t.Fatalf("Stop: %v", err)
	}
	unblock()
	select {
	case <-done:
	case <-time.After(publishTimeout):
		t.Fatalf("Publish did not return within %s of the broker stopping", publishTimeout)
	}
	if err := inst.Start(ctx); err != nil {
		t.Fatalf("Start: %v", err)
	}

	if len(results) != len(b.msgs) {
		t.Fatalf("Publish returned %d results for %d messages", len(results), len(b.msgs))
	}
	acked, failed := 0, 0
	for i, err := range results {
		if err == nil {
			acked++
			continue
		}
		failed++
		if broker.IsPermanent(err) {
			t.Errorf("result %d: %v: a broker outage must not be a permanent refusal", i, err)
		}
	}
	t.Logf("acked %d, failed %d of %d; %d bytes lost in the partition", acked, failed, len(results), w.lost.Load())
	if failed == 0 {
		t.Error("every message acked although the broker stopped mid-batch")
	}

	got := b.mine(t, inst)
	checkFirstAppearances(t, got)
	storedIDs := map[string]bool{}
	for _, s := range got {
		storedIDs[s.eventID] = true
		b.checkContent(t, s)
	}
	for i, err := range results {
		if err == nil && !storedIDs[b.msgs[i].EventID.String()] {
			t.Errorf("%s seq %d was acked but is not stored", b.msgs[i].AggregateID, b.msgs[i].AggregateSequence)
		}
	}
}

func testCancelledContext(t *testing.T, h Harness) {
	inst := h.Open(t, Options{})
	b := newBatch(3, 4)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	var results []error
	done := make(chan struct{})
	go func() {
		defer close(done)
		results = inst.Publisher.Publish(ctx, b.msgs)
	}()
	select {
	case <-done:
	case <-time.After(promptTimeout):
		t.Fatalf("Publish with a cancelled context did not return within %s", promptTimeout)
	}
	if len(results) != len(b.msgs) {
		t.Fatalf("Publish returned %d results for %d messages", len(results), len(b.msgs))
	}
	for i, err := range results {
		if err == nil {
			t.Errorf("result %d: nil with a cancelled context", i)
		}
	}
}

func testDuplicateEventID(t *testing.T, h Harness) {
	inst := h.Open(t, Options{})
	b := newBatch(1, 1)
	for round := range 2 {
		for i, err := range publish(t, inst.Publisher, b.msgs) {
			if err != nil {
				t.Fatalf("round %d: result %d: %v", round, i, err)
			}
		}
	}
	got := b.mine(t, inst)
	switch {
	case len(got) == 0 || len(got) > 2:
		t.Fatalf("stored %d copies, want 1 or 2", len(got))
	case h.Dedup && len(got) != 1:
		t.Errorf("stored %d copies, want 1: the broker deduplicates by event id", len(got))
	}
	for _, s := range got {
		b.checkContent(t, s)
	}
}
