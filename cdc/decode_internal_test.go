package cdc

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/pgoutbox/pgoutbox"
)

// outboxRelation is a Relation message of an outbox table with columns the
// decoder does not read between the ones it does, in another order than the
// table's.
func outboxRelation(schema string) *pglogrepl.RelationMessage {
	names := []string{"event_id", "aggregate_type", "claimed_by", "aggregate_id", "aggregate_sequence", "event_type",
		"schema_version", "payload", "attempt_count", "headers", "occurred_at", "published_at"}
	m := &pglogrepl.RelationMessage{RelationID: 7, Namespace: schema, RelationName: "outbox_events"}
	for _, n := range names {
		m.Columns = append(m.Columns, &pglogrepl.RelationMessageColumn{Name: n})
	}
	return m
}

// col is one column of an Insert message: kind 't', 'b', 'n' or 'u'.
type col struct {
	kind byte
	v    string
}

func insertMessage(relID uint32, cols []col) []byte {
	b := []byte{'I'}
	b = binary.BigEndian.AppendUint32(b, relID)
	b = append(b, 'N')
	b = binary.BigEndian.AppendUint16(b, uint16(len(cols)))
	for _, c := range cols {
		b = append(b, c.kind)
		if c.kind == 't' || c.kind == 'b' {
			b = binary.BigEndian.AppendUint32(b, uint32(len(c.v)))
			b = append(b, c.v...)
		}
	}
	return b
}

func validColumns() []col {
	return []col{{'t', "0190a2b4-5c6d-7e8f-9a0b-1c2d3e4f5a6b"}, {'t', "order"}, {'t', "cdc:slot"}, {'t', "o-1"}, {'t', "42"},
		{'t', "order.placed"}, {'t', "3"}, {'t', `{"n": 1}`}, {'t', "0"}, {'t', `{"tenant": "acme"}`},
		{'t', "2026-12-04 17:32:42.123456+00"}, {'n', ""}}
}

// The decoder reads every field the polling relay reads, whatever the order of
// the table's columns, and skips the others.
func TestDecodeInsert(t *testing.T) {
	t.Parallel()
	d := decoder{types: pgtype.NewMap(), schema: "s"}
	rel := d.relation(outboxRelation("s"))
	if !rel.outbox || d.relation(outboxRelation("other")).outbox {
		t.Fatal("the relation's schema and name decide whether it is the outbox")
	}
	relID, tuple, err := parseInsert(insertMessage(7, validColumns()))
	if err != nil || relID != 7 {
		t.Fatalf("parseInsert: %d, %v", relID, err)
	}
	m, refused, err := d.insert(rel, tuple, &arena{})
	if err != nil || refused != nil {
		t.Fatalf("insert: %v, refused %v", err, refused)
	}
	want, _ := pgoutbox.ParseUUID("0190a2b4-5c6d-7e8f-9a0b-1c2d3e4f5a6b")
	at := time.Date(2026, 12, 4, 17, 32, 42, 123456000, time.UTC)
	if m.EventID != want || m.AggregateType != "order" || m.AggregateID != "o-1" || m.AggregateSequence != 42 ||
		m.EventType != "order.placed" || m.SchemaVersion != 3 || string(m.Payload) != `{"n": 1}` ||
		m.Headers["tenant"] != "acme" || len(m.Headers) != 1 || !m.OccurredAt.Equal(at) {
		t.Fatalf("decoded %+v", m)
	}

	// Headers that are not a JSON object of strings: decoded, and refused.
	cols := validColumns()
	cols[9].v = `{"n": 1}`
	_, tuple, _ = parseInsert(insertMessage(7, cols))
	if _, refused, err := d.insert(rel, tuple, &arena{}); err != nil || refused == nil {
		t.Fatalf("headers with a number: err %v, refused %v; want refused", err, refused)
	}
	cols[9].v = "{}"
	_, tuple, _ = parseInsert(insertMessage(7, cols))
	if m, refused, err := d.insert(rel, tuple, &arena{}); err != nil || refused != nil || len(m.Headers) != 0 {
		t.Fatalf("no headers: %v, %v, %v; want none", m.Headers, refused, err)
	}

	// A column read here that is NULL, unchanged TOAST or binary counts as
	// missing; a bad value is an error naming the column.
	for i, c := range []col{{'n', ""}, {'u', ""}, {'b', "order"}} {
		cols := validColumns()
		cols[1] = c
		_, tuple, _ := parseInsert(insertMessage(7, cols))
		if _, _, err := d.insert(rel, tuple, &arena{}); err == nil || !strings.Contains(err.Error(), "lacks columns") {
			t.Errorf("case %d: aggregate_type %q %q: %v, want lacks columns", i, c.kind, c.v, err)
		}
	}
	for i, bad := range map[int]string{0: "not-a-uuid", 4: "4x", 6: "", 10: "yesterday"} {
		cols := validColumns()
		cols[i].v = bad
		_, tuple, _ := parseInsert(insertMessage(7, cols))
		if _, _, err := d.insert(rel, tuple, &arena{}); err == nil || !strings.Contains(err.Error(), "decode column") {
			t.Errorf("column %d = %q: %v, want a decode error", i, bad, err)
		}
	}
}

// Every truncation of a valid message, and bytes changed at random, give an
// error or a message, never a panic or a read past the end.
func TestDecodeInsertHostileBytes(t *testing.T) {
	t.Parallel()
	d := decoder{types: pgtype.NewMap(), schema: "s"}
	rel := d.relation(outboxRelation("s"))
	msg := insertMessage(7, validColumns())
	for n := range len(msg) {
		_, tuple, err := parseInsert(msg[:n])
		if err == nil {
			_, _, err = d.insert(rel, tuple, &arena{})
		}
		if err == nil {
			t.Fatalf("a message cut to %d of %d bytes decoded", n, len(msg))
		}
	}
	rng := rand.New(rand.NewPCG(1, 2))
	for range 20000 {
		b := []byte(string(msg))
		for range 1 + rng.IntN(4) {
			b[rng.IntN(len(b))] = byte(rng.IntN(256))
		}
		decodeAny(&d, rel, b)
	}
	// A column count or a length far beyond the message.
	huge := insertMessage(7, []col{{'t', "x"}})
	binary.BigEndian.PutUint32(huge[9:], 0xFFFFFFFF)
	if _, tuple, err := parseInsert(huge); err != nil || !errors.Is(func() error { _, _, err := d.insert(rel, tuple, &arena{}); return err }(), errShortMessage) {
		t.Fatal("a length past the end is not reported as a truncated message")
	}
	many := insertMessage(7, nil)
	binary.BigEndian.PutUint16(many[6:], 0xFFFF)
	if _, tuple, _ := parseInsert(many); !errors.Is(func() error { _, _, err := d.insert(rel, tuple, &arena{}); return err }(), errShortMessage) {
		t.Fatal("a column count past the end is not reported as a truncated message")
	}
}

func decodeAny(d *decoder, rel *relation, b []byte) {
	if _, tuple, err := parseInsert(b); err == nil {
		_, _, _ = d.insert(rel, tuple, &arena{})
	}
}

func FuzzDecodeInsert(f *testing.F) {
	f.Add(insertMessage(7, validColumns()))
	f.Add(insertMessage(7, nil))
	f.Add([]byte{'I', 0, 0, 0, 7, 'N', 0xFF, 0xFF})
	d := decoder{types: pgtype.NewMap(), schema: "s"}
	rel := d.relation(outboxRelation("s"))
	f.Fuzz(func(t *testing.T, b []byte) { decodeAny(&d, rel, b) })
}

// The timestamp fast path reads what pgx's parser reads, to the nanosecond,
// and leaves every other form to it.
func TestParseISOTimestamptz(t *testing.T) {
	t.Parallel()
	types := pgtype.NewMap()
	slow := func(s string) (time.Time, error) {
		var tm time.Time
		err := types.Scan(pgtype.TimestamptzOID, pgtype.TextFormatCode, []byte(s), &tm)
		return tm, err
	}
	rng := rand.New(rand.NewPCG(3, 4))
	var inputs []string
	for range 2000 {
		tm := time.Unix(rng.Int64N(4e9)-1e9, 0).UTC()
		frac := ""
		if k := rng.IntN(7); k > 0 {
			frac = "." + fmt.Sprintf("%06d", rng.IntN(1e6))[:k]
		}
		off := []string{"+00", "-05", "+05:30", "-03:30", "+14", "-12"}[rng.IntN(6)]
		inputs = append(inputs, tm.Format("2006-01-02 15:04:05")+frac+off)
	}
	inputs = append(inputs, "2024-02-29 23:59:59.999999+00", "1970-01-01 00:00:00+00")
	for _, s := range inputs {
		want, err := slow(s)
		if err != nil {
			t.Fatalf("pgx cannot read %q: %v", s, err)
		}
		got, ok := parseISOTimestamptz([]byte(s))
		if !ok || !got.Equal(want) {
			t.Fatalf("%q: fast path %v (ok %v), pgx %v", s, got, ok, want)
		}
	}
	// Forms left to pgx (which reads some of them, and refuses others).
	for _, s := range []string{"infinity", "-infinity", "0044-03-15 12:00:00+00 BC", "12026-01-01 00:00:00+00",
		"2026-12-04 17:32:42+05:30:15", "2026-12-04T17:32:42Z", "2026-04-31 00:00:00+00", "2026-12-04 17:32:42.1234567+00",
		"2026-12-04 17:32:42.+00", "2026-13-04 17:32:42+00", "2026-12-04 24:00:00+00", "Fri Dec 04 17:32:42 2026 UTC",
		"12/04/2026 17:32:42.12 UTC", "2026-12-04 17:32:42+0a", "2026-12-04 17:32:42", "2026-12-04 17:32:42+00:5"} {
		if got, ok := parseISOTimestamptz([]byte(s)); ok {
			t.Errorf("%q read by the fast path as %v", s, got)
		}
	}
	d := decoder{types: types}
	if got, err := d.timestamptz([]byte("2026-12-04 17:32:42+05:30:15")); err != nil || !got.Equal(time.Date(2026, 12, 4, 12, 2, 27, 0, time.UTC)) {
		t.Errorf("an offset with seconds, through pgx: %v, %v", got, err)
	}
}

// The uuid fast path reads what pgoutbox.ParseUUID reads, and leaves the rest
// (and the error) to it.
func TestParseUUIDText(t *testing.T) {
	t.Parallel()
	for range 1000 {
		id := pgoutbox.NewEventID()
		for _, s := range []string{id.String(), strings.ToUpper(id.String())} {
			got, err := parseUUIDText([]byte(s))
			if err != nil || got != id {
				t.Fatalf("%s: %v, %v", s, got, err)
			}
		}
	}
	for _, s := range []string{"", "0190a2b4-5c6d-7e8f-9a0b-1c2d3e4f5a6g", "0190a2b4x5c6d-7e8f-9a0b-1c2d3e4f5a6b",
		"0190a2b4-5c6d-7e8f-9a0b-1c2d3e4f5a6", "{0190a2b4-5c6d-7e8f-9a0b-1c2d3e4f5a6b}"} {
		want, werr := pgoutbox.ParseUUID(s)
		got, err := parseUUIDText([]byte(s))
		if got != want || (err == nil) != (werr == nil) {
			t.Errorf("%q: %v, %v; ParseUUID %v, %v", s, got, err, want, werr)
		}
	}
}

// Payloads copied into a transaction's arena are each what was received,
// stay intact when the next ones are copied or one of them is appended to,
// and a large one gets its own allocation.
func TestArena(t *testing.T) {
	t.Parallel()
	var a arena
	var got [][]byte
	var want []string
	for i := range 2000 {
		p := []byte(strings.Repeat(string(rune('a'+i%26)), 1+i%700))
		got = append(got, a.clone(p))
		want = append(want, string(p))
		p[0] = '!' // the received buffer is reused
	}
	_ = append(got[0], "overwrite?"...)
	big := a.clone(make([]byte, arenaBlock))
	for i := range got {
		if string(got[i]) != want[i] {
			t.Fatalf("payload %d: %q, want %q", i, got[i], want[i])
		}
	}
	if len(big) != arenaBlock || a.total > 2*2000*700 {
		t.Fatalf("large payload %d bytes; arena blocks %d bytes", len(big), a.total)
	}
	var small arena
	small.clone(make([]byte, 100))
	if small.total > minArenaBlock {
		t.Fatalf("a one-event transaction's arena holds %d bytes", small.total)
	}
}
