package pgoutbox

import (
	"crypto/rand"
	"database/sql/driver"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"sync"
	"time"
)

// UUID is an event id: 16 bytes, written in the canonical 8-4-4-4-12 hex form.
// It converts to and from PostgreSQL's uuid type with pgx and database/sql.
type UUID [16]byte

// NewEventID returns a new UUIDv7 (RFC 9562): 48 bits of Unix milliseconds, then a
// 12-bit sub-millisecond counter that keeps ids from one process strictly increasing,
// then 62 random bits. Time-ordered ids keep the outbox's primary-key index compact.
func NewEventID() UUID {
	var u UUID
	ms, seq := v7clock.next()
	binary.BigEndian.PutUint64(u[0:8], ms<<16)
	u[6] = 0x70 | byte(seq>>8) // version 7, counter high nibble
	u[7] = byte(seq)
	if _, err := rand.Read(u[8:]); err != nil {
		panic(fmt.Sprintf("pgoutbox: read random bytes: %v", err)) // crypto/rand never fails on supported platforms
	}
	u[8] = 0x80 | u[8]&0x3f // RFC 9562 variant
	return u
}

// v7clock hands out (millisecond, counter) pairs that never repeat or go backwards
// within the process, even when the wall clock steps back.
var v7clock uuidClock

type uuidClock struct {
	sync.Mutex
	ms, seq uint64
}

func (c *uuidClock) next() (uint64, uint64) {
	c.Lock()
	defer c.Unlock()
	now := uint64(time.Now().UnixMilli())
	switch {
	case now > c.ms:
		c.ms, c.seq = now, 0
	case c.seq < 0xfff:
		c.seq++
	default: // 4096 ids in one millisecond: borrow from the next one
		c.ms, c.seq = c.ms+1, 0
	}
	return c.ms, c.seq
}

// ParseUUID parses the canonical form (hyphens optional, case-insensitive).
func ParseUUID(s string) (UUID, error) {
	var u UUID
	b := make([]byte, 0, 32)
	for i := 0; i < len(s); i++ {
		if s[i] != '-' {
			b = append(b, s[i])
		}
	}
	if len(b) != 32 || (len(s) != 32 && len(s) != 36) {
		return u, fmt.Errorf("pgoutbox: invalid UUID %q", s)
	}
	if _, err := hex.Decode(u[:], b); err != nil {
		return u, fmt.Errorf("pgoutbox: invalid UUID %q", s)
	}
	return u, nil
}

// IsZero reports whether u is the nil UUID.
func (u UUID) IsZero() bool { return u == UUID{} }

// String returns the canonical form, e.g. 0190a6e4-7f1c-7b2a-9c3d-1e2f3a4b5c6d.
func (u UUID) String() string {
	var b [36]byte
	hex.Encode(b[0:8], u[0:4])
	b[8] = '-'
	hex.Encode(b[9:13], u[4:6])
	b[13] = '-'
	hex.Encode(b[14:18], u[6:8])
	b[18] = '-'
	hex.Encode(b[19:23], u[8:10])
	b[23] = '-'
	hex.Encode(b[24:], u[10:])
	return string(b[:])
}

// Time returns the creation time encoded in a UUIDv7, and false for other versions.
func (u UUID) Time() (time.Time, bool) {
	if u[6]>>4 != 7 {
		return time.Time{}, false
	}
	ms := int64(binary.BigEndian.Uint64(u[0:8]) >> 16)
	return time.UnixMilli(ms), true
}

// MarshalText implements encoding.TextMarshaler.
func (u UUID) MarshalText() ([]byte, error) { return []byte(u.String()), nil }

// UnmarshalText implements encoding.TextUnmarshaler.
func (u *UUID) UnmarshalText(b []byte) error {
	v, err := ParseUUID(string(b))
	if err != nil {
		return err
	}
	*u = v
	return nil
}

// Value implements driver.Valuer, so a UUID is a query argument for database/sql and pgx.
func (u UUID) Value() (driver.Value, error) { return u.String(), nil }

// Scan implements sql.Scanner for uuid columns read as text or bytes.
func (u *UUID) Scan(src any) error {
	switch v := src.(type) {
	case string:
		return u.UnmarshalText([]byte(v))
	case []byte:
		if len(v) == 16 {
			copy(u[:], v)
			return nil
		}
		return u.UnmarshalText(v)
	case [16]byte:
		*u = v
		return nil
	default:
		return fmt.Errorf("pgoutbox: cannot scan %T into UUID", src)
	}
}
