package cdc

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/pgoutbox/pgoutbox"
	"github.com/pgoutbox/pgoutbox/broker"
	"github.com/pgoutbox/pgoutbox/internal/pipeline"
)

// The outbox columns an insert is decoded from, in the order of fieldNames.
const (
	fieldEventID = iota
	fieldAggregateType
	fieldAggregateID
	fieldAggregateSequence
	fieldEventType
	fieldSchemaVersion
	fieldPayload
	fieldHeaders
	fieldOccurredAt
	fieldCount
)

var fieldNames = [fieldCount]string{"event_id", "aggregate_type", "aggregate_id", "aggregate_sequence", "event_type",
	"schema_version", "payload", "headers", "occurred_at"}

// relation is what the stream keeps of a Relation message: whether it is the
// schema's outbox table and, per column, the field it holds (-1: none read).
// The column-to-field map is made once per Relation message, not per row.
type relation struct {
	outbox bool
	fields []int8
}

// decoder turns pgoutput inserts into broker messages, field for field what the
// polling relay reads from the table. It decodes the Insert messages itself,
// straight from the received bytes into the message: pglogrepl's decoder
// allocates and copies every column of every row first, which was a tenth of
// the source's CPU in a drain.
//
// What a transaction holds in memory is what its events cost: the payloads
// share the transaction's arena (a few large blocks, which the garbage
// collector need not scan, instead of one allocation per event), and the
// aggregate and event types, few and repeated, are interned.
type decoder struct {
	types  *pgtype.Map // for timestamps not in the ISO form fast path reads
	schema string
	names  map[string]string // interned aggregate and event types, at most maxInterned
}

// maxInterned bounds the decoder's interned names: past it, names are
// allocated per event (a schema with that many aggregate and event types
// gains little from interning).
const maxInterned = 4096

// A transaction arena's blocks grow with the transaction, from minArenaBlock
// to arenaBlock: a one-event transaction allocates little more than its
// payload, a large one a block per hundreds of events.
const (
	minArenaBlock = 512
	arenaBlock    = 64 << 10
)

// arena holds the payloads of one transaction's events: a payload is a
// capped slice of a block (appending to it copies), and the blocks live as
// long as the transaction's events.
type arena struct {
	block []byte
	total int // bytes of the blocks allocated so far
}

// clone copies b into the arena.
func (a *arena) clone(b []byte) []byte {
	if len(b) > arenaBlock/4 {
		return bytes.Clone(b) // a large payload gets its own allocation
	}
	if cap(a.block)-len(a.block) < len(b) {
		size := min(max(a.total, 2*len(b), minArenaBlock), arenaBlock)
		a.block = make([]byte, 0, size)
		a.total += size
	}
	off := len(a.block)
	a.block = append(a.block, b...)
	return a.block[off:len(a.block):len(a.block)]
}

// intern returns b as a string, shared with earlier equal names.
func (d *decoder) intern(b []byte) string {
	if s, ok := d.names[string(b)]; ok { // no allocation: the compiler's map lookup by []byte
		return s
	}
	s := string(b)
	if len(d.names) < maxInterned {
		if d.names == nil {
			d.names = map[string]string{}
		}
		d.names[s] = s
	}
	return s
}

// relation records a Relation message.
func (d *decoder) relation(m *pglogrepl.RelationMessage) *relation {
	r := &relation{outbox: m.Namespace == d.schema && m.RelationName == "outbox_events", fields: make([]int8, len(m.Columns))}
	for i, c := range m.Columns {
		r.fields[i] = -1
		for f, name := range fieldNames {
			if c.Name == name {
				r.fields[i] = int8(f)
			}
		}
	}
	return r
}

// errShortMessage reports an Insert message that ends before its declared
// contents.
var errShortMessage = errors.New("cdc: truncated insert message")

// parseInsert splits an Insert message of pgoutput protocol 1 ('I', the
// relation's id, 'N', the new tuple) into the relation id and the tuple.
func parseInsert(b []byte) (relID uint32, tuple []byte, err error) {
	if len(b) < 6 || b[0] != 'I' {
		return 0, nil, errShortMessage
	}
	relID = binary.BigEndian.Uint32(b[1:5])
	if b[5] != 'N' {
		return 0, nil, fmt.Errorf("cdc: insert into relation %d: tuple kind %q, want 'N'", relID, b[5])
	}
	return relID, b[6:], nil
}

// insert decodes an insert's tuple into a message. refused is why the row
// cannot be published although it decoded (its headers are not a JSON object
// of strings). Text values only (the source asks for no binary ones); a NULL
// or an unchanged TOAST value of a column read here counts as missing.
func (d *decoder) insert(rel *relation, tuple []byte, mem *arena) (m broker.Message, refused error, err error) {
	if len(tuple) < 2 {
		return m, nil, errShortMessage
	}
	n := int(binary.BigEndian.Uint16(tuple))
	p := tuple[2:]
	m.Tenant, m.Schema = d.schema, d.schema // as the polling relay fills them
	var seen int
	var headers []byte
	for i := range n {
		if len(p) < 1 {
			return m, nil, errShortMessage
		}
		kind := p[0]
		p = p[1:]
		var v []byte
		switch kind {
		case 't', 'b':
			if len(p) < 4 {
				return m, nil, errShortMessage
			}
			size := binary.BigEndian.Uint32(p)
			if uint64(size) > uint64(len(p)-4) {
				return m, nil, errShortMessage
			}
			v, p = p[4:4+size], p[4+size:]
		case 'n', 'u':
			continue
		default:
			return m, nil, fmt.Errorf("cdc: insert into %s.outbox_events: unknown column kind %q", d.schema, kind)
		}
		if i >= len(rel.fields) || rel.fields[i] < 0 || kind != 't' {
			continue
		}
		f := rel.fields[i]
		switch f {
		case fieldEventID:
			m.EventID, err = parseUUIDText(v)
		case fieldAggregateType:
			m.AggregateType = d.intern(v)
		case fieldAggregateID:
			m.AggregateID = string(v)
		case fieldAggregateSequence:
			m.AggregateSequence, err = strconv.ParseInt(string(v), 10, 64)
		case fieldEventType:
			m.EventType = d.intern(v)
		case fieldSchemaVersion:
			m.SchemaVersion, err = strconv.Atoi(string(v))
		case fieldPayload:
			m.Payload = mem.clone(v)
		case fieldHeaders:
			headers = v // decoded once the event's id is known
		case fieldOccurredAt:
			m.OccurredAt, err = d.timestamptz(v)
		}
		if err != nil {
			return m, nil, fmt.Errorf("cdc: decode column %s of an insert into %s.outbox_events: %w", fieldNames[f], d.schema, err)
		}
		seen++
	}
	if seen < fieldCount {
		return m, nil, fmt.Errorf("cdc: an insert into %s.outbox_events lacks columns (got %d of %d): is the table migrated?", d.schema, seen, fieldCount)
	}
	m.Headers, refused = pipeline.DecodeHeaders("cdc", m.EventID, headers)
	return m, refused, nil
}

// parseUUIDText reads a uuid in PostgreSQL's output form (8-4-4-4-12 lower-case
// hex) without converting it to a string first; anything else goes through
// pgoutbox.ParseUUID, which says what is wrong.
func parseUUIDText(v []byte) (pgoutbox.UUID, error) {
	var u pgoutbox.UUID
	if len(v) != 36 || v[8] != '-' || v[13] != '-' || v[18] != '-' || v[23] != '-' {
		return pgoutbox.ParseUUID(string(v))
	}
	j := 0
	for i := 0; i < 36; i += 2 {
		if i == 8 || i == 13 || i == 18 || i == 23 {
			i++
		}
		hi, ok1 := unhex(v[i])
		lo, ok2 := unhex(v[i+1])
		if !ok1 || !ok2 {
			return pgoutbox.ParseUUID(string(v))
		}
		u[j] = hi<<4 | lo
		j++
	}
	return u, nil
}

func unhex(c byte) (byte, bool) {
	switch {
	case c >= '0' && c <= '9':
		return c - '0', true
	case c >= 'a' && c <= 'f':
		return c - 'a' + 10, true
	case c >= 'A' && c <= 'F':
		return c - 'A' + 10, true
	}
	return 0, false
}

// timestamptz reads a timestamptz in its text form. The form pgoutput sends
// under DateStyle ISO, "2006-01-02 15:04:05[.ffffff]+hh[:mm]", is read here
// without allocating; any other (another DateStyle, BC dates, years past 9999,
// infinity, offsets with seconds) goes through pgx's parser.
func (d *decoder) timestamptz(v []byte) (time.Time, error) {
	if t, ok := parseISOTimestamptz(v); ok {
		return t, nil
	}
	var t time.Time
	err := d.types.Scan(pgtype.TimestamptzOID, pgtype.TextFormatCode, v, &t)
	return t, err
}

// parseISOTimestamptz reads "YYYY-MM-DD HH:MM:SS[.f{1,6}]±HH[:MM]"; ok is false
// for anything else.
func parseISOTimestamptz(v []byte) (time.Time, bool) {
	num := func(b []byte) (int, bool) {
		n := 0
		for _, c := range b {
			if c < '0' || c > '9' {
				return 0, false
			}
			n = n*10 + int(c-'0')
		}
		return n, true
	}
	if len(v) < 22 || v[4] != '-' || v[7] != '-' || v[10] != ' ' || v[13] != ':' || v[16] != ':' {
		return time.Time{}, false
	}
	year, ok1 := num(v[0:4])
	month, ok2 := num(v[5:7])
	day, ok3 := num(v[8:10])
	hour, ok4 := num(v[11:13])
	minute, ok5 := num(v[14:16])
	sec, ok6 := num(v[17:19])
	if !(ok1 && ok2 && ok3 && ok4 && ok5 && ok6) || month < 1 || month > 12 || day < 1 || day > 31 || hour > 23 || minute > 59 || sec > 59 {
		return time.Time{}, false
	}
	p := v[19:]
	nsec := 0
	if p[0] == '.' {
		k := 1
		for k < len(p) && p[k] >= '0' && p[k] <= '9' {
			k++
		}
		digits := k - 1
		if digits < 1 || digits > 6 {
			return time.Time{}, false
		}
		f, _ := num(p[1:k])
		for range 9 - digits {
			f *= 10
		}
		nsec, p = f, p[k:]
	}
	if len(p) != 3 && len(p) != 6 || (p[0] != '+' && p[0] != '-') {
		return time.Time{}, false
	}
	oh, ok := num(p[1:3])
	if !ok {
		return time.Time{}, false
	}
	om := 0
	if len(p) == 6 {
		if p[3] != ':' {
			return time.Time{}, false
		}
		if om, ok = num(p[4:6]); !ok || om > 59 {
			return time.Time{}, false
		}
	}
	offset := time.Duration(oh)*time.Hour + time.Duration(om)*time.Minute
	if p[0] == '-' {
		offset = -offset
	}
	t := time.Date(year, time.Month(month), day, hour, minute, sec, nsec, time.UTC)
	if t.Day() != day {
		return time.Time{}, false // no such date (31 April): the slow path says so
	}
	return t.Add(-offset), true
}
