package cdc

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgoutbox/pgoutbox/broker"
	"github.com/pgoutbox/pgoutbox/broker/null"
	"github.com/pgoutbox/pgoutbox/internal/pgtest"
)

// synchronous_standby_names as PostgreSQL accepts it: how many synchronous
// standbys must have a transaction before it is published.
func TestSyncStandbysRequired(t *testing.T) {
	for names, want := range map[string]int{
		"":                        0,
		"   ":                     0,
		"standby1":                1,
		"*":                       1,
		"s1, s2, s3":              1,
		`"My Standby", s2`:        1,
		"2 (s1, s2, s3)":          2,
		"FIRST 2 (s1, s2, s3)":    2,
		"first 3(s1,s2,s3)":       3,
		"ANY 2 (s1, s2, s3)":      2,
		"any 1 (*)":               1,
		"  Any  2  ( s1 , s2 ) ":  2,
		"1":                       1, // a standby named "1"
		"first":                   1, // a standby named first
		"firsts, any_standby":     1,
		`FIRST 2 ("a b", "c(d)")`: 2,
	} {
		got, err := syncStandbysRequired(names)
		if err != nil || got != want {
			t.Errorf("syncStandbysRequired(%q) = %d, %v; want %d", names, got, err, want)
		}
	}
	if _, err := syncStandbysRequired("ANY 0 (s1)"); err == nil {
		t.Error("ANY 0: no error")
	}
}

// The confirmed position is the highest that the required number of
// synchronous standbys have all reached; fewer standbys, or a NULL position
// among those needed, confirm nothing.
func TestStandbyPosition(t *testing.T) {
	for _, c := range []struct {
		required  int
		positions []int64
		want      pglogrepl.LSN
		ok        bool
	}{
		{1, nil, 0, false},
		{1, []int64{100}, 100, true},
		{1, []int64{-1}, 0, false},
		{1, []int64{-1, 300}, 300, true},       // ANY 1: the quorum's best
		{2, []int64{100, 300}, 100, true},      // FIRST 2: both chosen ones
		{2, []int64{300}, 0, false},            // FIRST 2 with one connected: the server's commits wait too
		{2, []int64{100, 500, 300}, 300, true}, // ANY 2 of three: the second best
		{2, []int64{-1, 500, -1}, 0, false},
		{3, []int64{100, 500, 300}, 100, true},
		{0, []int64{100}, 0, false},
	} {
		got, ok := standbyPosition(c.required, c.positions)
		if got != c.want || ok != c.ok {
			t.Errorf("standbyPosition(%d, %v) = %s, %v; want %s, %v", c.required, c.positions, got, ok, c.want, c.ok)
		}
	}
}

// A transaction is held while it ends past the standbys' position, until the
// first look, and never once released; with no synchronous standby (or the
// hold off) nothing is held.
func TestReleasable(t *testing.T) {
	s := &Source{}
	if s.releasableLocked(&txn{end: 100}) {
		t.Error("released before the first look")
	}
	s.sb = standbyState{known: true, pos: 100}
	if !s.releasableLocked(&txn{end: 100}) || s.releasableLocked(&txn{end: 101}) {
		t.Error("position 100: want a transaction ending at 100 released, one ending at 101 held")
	}
	if !s.releasableLocked(&txn{end: 101, released: true}) {
		t.Error("a released transaction held again")
	}
	s.sb = standbyState{known: true, off: true}
	if !s.releasableLocked(&txn{end: 1 << 40}) {
		t.Error("held with no synchronous standby")
	}
}

// The dispatcher takes events only from transactions the standbys have, in
// commit order: a held transaction stops it, and what follows waits too.
func TestAssembleStopsAtAHeldTransaction(t *testing.T) {
	s, err := New(&pgxpool.Pool{}, &null.Publisher{}, &Config{BatchSize: 10})
	pgtest.Must(t, err, "new source")
	msg := func(seq int64) broker.Message {
		return broker.Message{AggregateType: "a", AggregateID: "1", AggregateSequence: seq}
	}
	now := time.Now()
	a := &txn{end: 100, events: []broker.Message{msg(1)}, unsettled: 1, received: now.Add(-3 * time.Second)}
	empty := &txn{end: 150, received: now.Add(-2 * time.Second)}
	b := &txn{end: 200, events: []broker.Message{msg(2), msg(3)}, unsettled: 2, received: now.Add(-time.Second)}
	c := &txn{end: 300, events: []broker.Message{msg(4)}, unsettled: 1, received: now}
	s.queue, s.buffered = []*txn{a, empty, b, c}, 4
	s.sb = standbyState{known: true, pos: 199, required: 1, connected: 1}
	got := s.assemble()
	if len(got) != 1 || got[0].Msg.AggregateSequence != 1 {
		t.Fatalf("position 199: assembled %v, want the first transaction's event only", got)
	}
	s.releaseLanesLocked(got) // acknowledged: the lane may go on
	if n, ev, oldest := s.heldLocked(now); n != 2 || ev != 3 || oldest < time.Second {
		t.Fatalf("held %d transactions, %d events, oldest %s; want 2, 3, ≥1s", n, ev, oldest)
	}
	if got := s.assemble(); len(got) != 0 {
		t.Fatalf("nothing new confirmed: assembled %v", got)
	}
	s.sb.pos = 250
	if got := s.assemble(); len(got) != 2 || got[0].Msg.AggregateSequence != 2 {
		t.Fatalf("position 250: assembled %v, want the second transaction's events", got)
	}
	s.sb.pos = 0 // a standby behind the released ones does not take them back
	if n, _, _ := s.heldLocked(now); n != 1 {
		t.Fatalf("held %d, want the third transaction only", n)
	}
}

// Batches out at once share no lane: the dispatcher takes events in commit
// order up to the first whose lane is in a batch not yet acknowledged, takes
// nothing when that leaves less than a quarter of a batch while more wait,
// and goes on once the lane is given back.
func TestAssembleKeepsALaneInOneBatch(t *testing.T) {
	s, err := New(&pgxpool.Pool{}, &null.Publisher{}, &Config{BatchSize: 8, PublishUnreplicated: true})
	pgtest.Must(t, err, "new source")
	msg := func(id string, seq int64) broker.Message {
		return broker.Message{AggregateType: "a", AggregateID: id, AggregateSequence: seq}
	}
	tx := func(end pglogrepl.LSN, msgs ...broker.Message) *txn {
		return &txn{end: end, events: msgs, unsettled: len(msgs)}
	}
	s.queue = []*txn{
		tx(100, msg("1", 1), msg("2", 1), msg("3", 1), msg("4", 1), msg("5", 1), msg("6", 1), msg("7", 1), msg("8", 1)),
		tx(200, msg("1", 2)),
		tx(300, msg("5", 2), msg("6", 2)),
		tx(400, msg("9", 1), msg("9", 2)),
	}
	s.buffered = 13
	lanes := func(batch []item) []string {
		var out []string
		for _, it := range batch {
			out = append(out, fmt.Sprintf("%s#%d", it.Msg.AggregateID, it.Msg.AggregateSequence))
		}
		return out
	}
	first := s.assemble()
	if len(first) != 8 {
		t.Fatalf("first batch %v, want the first transaction", lanes(first))
	}
	// 1#2 waits for 1#1's ack, and what follows waits with it.
	if got := s.assemble(); len(got) != 0 {
		t.Fatalf("with lane 1 out: assembled %v, want nothing", lanes(got))
	}
	// Lanes 1-4 acknowledged, 5-8 not: 1#2 goes, 5#2 stops the batch there,
	// which is less than a quarter of it (2): nothing.
	s.releaseLanesLocked(first[:4])
	if got := s.assemble(); len(got) != 0 {
		t.Fatalf("one event before lane 5: assembled %v, want nothing (less than a quarter of a batch)", lanes(got))
	}
	s.releaseLanesLocked(first[4:])
	second := s.assemble()
	if got := lanes(second); len(got) != 5 || got[0] != "1#2" || got[3] != "9#1" || got[4] != "9#2" {
		t.Fatalf("all lanes back: assembled %v, want 1#2 5#2 6#2 9#1 9#2", got)
	}
	if len(s.lanesOut) != 4 {
		t.Fatalf("lanes out %v, want the second batch's: 1, 5, 6, 9", s.lanesOut)
	}
}

// With few events waiting, those before a lane that is out go at once rather
// than wait for a quarter of a batch: latency at low rates.
func TestAssembleSendsFewEventsAtOnce(t *testing.T) {
	s, err := New(&pgxpool.Pool{}, &null.Publisher{}, &Config{BatchSize: 40, PublishUnreplicated: true})
	pgtest.Must(t, err, "new source")
	msg := func(id string, seq int64) broker.Message {
		return broker.Message{AggregateType: "a", AggregateID: id, AggregateSequence: seq}
	}
	s.queue, s.buffered = []*txn{{end: 100, events: []broker.Message{msg("1", 1)}, unsettled: 1}}, 1
	if got := s.assemble(); len(got) != 1 {
		t.Fatalf("first batch: %d events, want 1#1", len(got))
	}
	// Received while 1#1 is out.
	s.queue = append(s.queue, &txn{end: 200, events: []broker.Message{msg("2", 1), msg("1", 2)}, unsettled: 2})
	s.buffered += 2
	got := s.assemble()
	if len(got) != 1 || got[0].Msg.AggregateID != "2" {
		t.Fatalf("with lane 1 out and two events waiting: assembled %v, want 2#1 at once", got)
	}
}

// The standbys' positions release a transaction only when the server that
// answers the query is the one the replication stream decodes from: the same
// system, timeline and walsender (the process holding the slot). A promoted
// standby (another timeline), another walsender, or no stream at all release
// nothing, whatever that server's settings say (the test cluster has no
// synchronous standbys: its answer alone would release everything).
func TestStandbyPositionsOfAnotherServerReleaseNothing(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, s := idleSource(t)
	pgtest.Must(t, ensurePublication(ctx, pool, &s.cfg), "publication")
	t.Cleanup(func() {
		_, _ = pool.Exec(context.Background(), "DROP PUBLICATION IF EXISTS "+pgx.Identifier{s.cfg.Publication}.Sanitize())
	})
	conn, err := replConn(ctx, pool)
	pgtest.Must(t, err, "replication connection")
	t.Cleanup(func() { _ = conn.Close(context.Background()) }) // drops the temporary slot
	sys, err := pglogrepl.IdentifySystem(ctx, conn)
	pgtest.Must(t, err, "identify system")
	_, err = pglogrepl.CreateReplicationSlot(ctx, conn, s.cfg.Slot, "pgoutput",
		pglogrepl.CreateReplicationSlotOptions{Temporary: true, Mode: pglogrepl.LogicalReplication})
	pgtest.Must(t, err, "create slot")
	pgtest.Must(t, pglogrepl.StartReplication(ctx, conn, s.cfg.Slot, 0, pglogrepl.StartReplicationOptions{
		PluginArgs: []string{"proto_version '1'", "publication_names " + quoteLiteral(s.cfg.Publication)}}), "start replication")
	stream := serverID{system: sys.SystemID, timeline: int64(sys.Timeline), pid: conn.PID()}

	held := &txn{end: 1, events: []broker.Message{{AggregateType: "a", AggregateID: "1", AggregateSequence: 1}}}
	s.push(held)
	check := func(on serverID) {
		t.Helper()
		s.mu.Lock()
		s.streamOn = on
		s.mu.Unlock()
		pgtest.Must(t, s.checkStandbys(), "check the standbys")
	}
	for _, c := range []struct {
		name string
		on   serverID
	}{
		{"no stream", serverID{}},
		{"another walsender", serverID{system: stream.system, timeline: stream.timeline, pid: stream.pid + 1}},
		{"a promoted standby's timeline", serverID{system: stream.system, timeline: stream.timeline + 1, pid: stream.pid}},
		{"another system", serverID{system: stream.system + "0", timeline: stream.timeline, pid: stream.pid}},
	} {
		check(c.on)
		if got := s.assemble(); len(got) != 0 {
			t.Fatalf("%s: the positions released %d events", c.name, len(got))
		}
		if w := s.StandbyWait(); w.HeldEvents != 1 || (c.on != serverID{} && !errors.Is(w.Err, ErrSyncStandbyOtherServer)) {
			t.Fatalf("%s: StandbyWait %+v: want the event held and ErrSyncStandbyOtherServer", c.name, w)
		}
	}
	if h := s.Healthy(); !errors.Is(h, ErrSyncStandbyOtherServer) {
		t.Fatalf("Healthy = %v, want ErrSyncStandbyOtherServer", h)
	}
	// The stream's own server: no synchronous standbys, nothing to wait for.
	check(stream)
	if got := s.assemble(); len(got) != 1 {
		t.Fatalf("the stream's server: assembled %d events, want the held one", len(got))
	}
	if w := s.StandbyWait(); w.Err != nil || w.Required != 0 {
		t.Fatalf("the stream's server: StandbyWait %+v, want nothing required and no error", w)
	}
}

// When the stream ends, what was held is dropped (and read again from the
// slot by the next connection: positions at or before the last transaction
// kept are taken again), and what was known of the standbys forgotten; the
// transactions released to the dispatcher stay. A connection to another WAL
// history (a promoted standby's timeline) starts positions again: the kept
// transactions confirm nothing there and are looked up before publishing,
// and the new slot's transactions are taken whatever their positions.
func TestStreamEndDropsWhatWasHeld(t *testing.T) {
	s, err := New(&pgxpool.Pool{}, &null.Publisher{}, &Config{BatchSize: 1, Logger: slog.New(slog.DiscardHandler)})
	pgtest.Must(t, err, "new source")
	msg := func(id string, seq int64) broker.Message {
		return broker.Message{AggregateType: "a", AggregateID: id, AggregateSequence: seq}
	}
	primary := serverID{system: "7000", timeline: 1, pid: 100}
	s.streamUp(primary, 50)
	s.confirmed, s.lastPushed = 50, 50
	s.push(&txn{end: 100, events: []broker.Message{msg("1", 1), msg("2", 1)}})
	s.push(&txn{end: 200, events: []broker.Message{msg("1", 2)}})
	s.push(&txn{end: 250})
	s.push(&txn{end: 300, events: []broker.Message{msg("3", 1), msg("3", 2)}})
	s.sb = standbyState{known: true, pos: 150, required: 1, connected: 1}
	if got := s.assemble(); len(got) != 1 { // a batch of one: the first transaction is half handed out
		t.Fatalf("assembled %d events, want 1", len(got))
	}
	if w := s.StandbyWait(); w.HeldTransactions != 2 || w.HeldEvents != 3 {
		t.Fatalf("StandbyWait %+v: want 2 transactions, 3 events held", w)
	}

	s.streamEnded()
	if len(s.queue) != 1 || s.queue[0].end != 100 || s.buffered != 2 || s.lastPushed != 100 {
		t.Fatalf("after the stream ended: %d transactions queued (first ending at %s), %d events buffered, last pushed %s; "+
			"want the released one only, its 2 events, 100", len(s.queue), s.queue[0].end, s.buffered, s.lastPushed)
	}
	if s.sb.known || s.sb.pos != 0 || s.streamOn != (serverID{}) {
		t.Fatalf("after the stream ended: standbys %+v, stream %+v; want both forgotten", s.sb, s.streamOn)
	}
	// The same server again: the held transactions come back, held until its
	// standbys are read again.
	s.streamUp(serverID{system: "7000", timeline: 1, pid: 101}, 300)
	s.push(&txn{end: 200, events: []broker.Message{msg("1", 2)}})
	if len(s.queue) != 2 || s.queue[0].end != 100 || s.confirmed != 50 {
		t.Fatalf("same server: %d transactions queued, first ending at %s, confirmed %s; want 2, 100, 50", len(s.queue), s.queue[0].end, s.confirmed)
	}
	if w := s.StandbyWait(); w.HeldEvents != 1 {
		t.Fatalf("same server, standbys not read yet: %d events held, want 1", w.HeldEvents)
	}

	// A promoted standby: a new timeline, positions below the old primary's.
	s.streamEnded()
	s.checkUntil = 10
	s.streamUp(serverID{system: "7000", timeline: 2, pid: 300}, 90)
	if len(s.queue) != 1 || s.queue[0].end != 0 || s.confirmed != 0 || s.lastPushed != 0 || s.walEnd != 0 || s.checkUntil != 90 {
		t.Fatalf("another history: %d queued (end %s), confirmed %s, last pushed %s, wal end %s, look-up up to %s; want 1 (0), 0, 0, 0, 90",
			len(s.queue), s.queue[0].end, s.confirmed, s.lastPushed, s.walEnd, s.checkUntil)
	}
	s.push(&txn{end: 80, events: []broker.Message{msg("4", 1)}})
	if len(s.queue) != 2 {
		t.Fatalf("another history: a transaction ending at 80 was not queued")
	}
	got := s.assemble()
	if len(got) != 1 || got[0].Msg.AggregateID != "2" || !got[0].check {
		t.Fatalf("another history: assembled %+v; want the released transaction's second event, looked up before publishing", got)
	}
}
