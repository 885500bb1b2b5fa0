package pgoutbox

import (
	"encoding/json"
	"errors"
	"unicode/utf8"
)

// JSONBTextLength returns the length in bytes of the text PostgreSQL's jsonb keeps
// for the JSON document b (payload::text, what the relay publishes): objects lose
// duplicate keys (the last one wins), ", " and ": " separate elements, numbers are
// written as numeric writes them (1e3 is 1000, 1.50 stays 1.50), strings are
// re-escaped. b must be valid JSON that jsonb accepts (see Event.Payload).
func JSONBTextLength(b []byte) (int, error) {
	if !json.Valid(b) {
		return 0, errors.New("pgoutbox: not valid JSON")
	}
	return jsonbTextLength(b)
}

// jsonbTextLength is JSONBTextLength for b already known to be valid JSON.
func jsonbTextLength(b []byte) (int, error) {
	s := jsonbSizer{b: b}
	n := s.value()
	if s.err != nil {
		return 0, s.err
	}
	return n, nil
}

type jsonbSizer struct {
	b   []byte
	i   int
	err error
}

func (s *jsonbSizer) skipSpace() {
	for s.i < len(s.b) {
		switch s.b[s.i] {
		case ' ', '\t', '\n', '\r':
			s.i++
		default:
			return
		}
	}
}

// value returns the jsonb text length of the value at s.i and moves past it.
func (s *jsonbSizer) value() int {
	s.skipSpace()
	if s.i >= len(s.b) {
		s.err = errors.New("pgoutbox: truncated JSON")
		return 0
	}
	switch c := s.b[s.i]; {
	case c == '{':
		return s.object()
	case c == '[':
		s.i++
		n, elems := 2, 0
		for {
			s.skipSpace()
			if s.b[s.i] == ']' {
				s.i++
				return n
			}
			if s.b[s.i] == ',' {
				s.i++
				continue
			}
			if elems > 0 {
				n += 2
			}
			n += s.value()
			elems++
			if s.err != nil {
				return 0
			}
		}
	case c == '"':
		_, n := s.str(false)
		return n
	case c == 't':
		s.i += 4
		return 4
	case c == 'f':
		s.i += 5
		return 5
	case c == 'n':
		s.i += 4
		return 4
	default:
		return s.number()
	}
}

func (s *jsonbSizer) object() int {
	s.i++
	type member struct {
		key string
		n   int // key, ": " and value
	}
	var members []member
	var index map[string]int // for objects with many keys
	for {
		s.skipSpace()
		switch s.b[s.i] {
		case '}':
			s.i++
			n := 2
			for j, m := range members {
				if j > 0 {
					n += 2
				}
				n += m.n
			}
			return n
		case ',':
			s.i++
			continue
		}
		key, kn := s.str(true)
		s.skipSpace()
		s.i++ // ':'
		vn := s.value()
		if s.err != nil {
			return 0
		}
		m := member{key, kn + 2 + vn}
		if index == nil && len(members) >= 16 {
			index = make(map[string]int, 2*len(members))
			for j, m := range members {
				index[m.key] = j
			}
		}
		j := -1
		if index != nil {
			if k, ok := index[key]; ok {
				j = k
			}
		} else {
			for k := range members {
				if members[k].key == key {
					j = k
					break
				}
			}
		}
		if j >= 0 {
			members[j] = m
			continue
		}
		if index != nil {
			index[key] = len(members)
		}
		members = append(members, m)
	}
}

// str reads the string at s.i and returns the length of its jsonb text, and the
// string decoded when key is set: escape_json writes '"', '\\', \b \f \n \r \t
// as two-byte escapes, other control characters as \u00XX, everything else as
// UTF-8.
func (s *jsonbSizer) str(key bool) (string, int) {
	s.i++
	var dec []byte
	n := 2
	add := func(r rune) {
		switch {
		case r == '"' || r == '\\' || r == '\b' || r == '\f' || r == '\n' || r == '\r' || r == '\t':
			n += 2
		case r < 0x20:
			n += 6
		case utf8.RuneLen(r) < 0: // a lone surrogate, which jsonb refuses: as U+FFFD
			n += 3
		default:
			n += utf8.RuneLen(r)
		}
		if key {
			dec = utf8.AppendRune(dec, r)
		}
	}
	for s.b[s.i] != '"' {
		c := s.b[s.i]
		if c != '\\' {
			// Raw bytes (valid JSON has no control characters here) are copied.
			n++
			if key {
				dec = append(dec, c)
			}
			s.i++
			continue
		}
		s.i++
		switch e := s.b[s.i]; e {
		case 'u':
			r := hex4(s.b[s.i+1:])
			s.i += 5
			if r >= 0xd800 && r < 0xdc00 && s.i+6 <= len(s.b) && s.b[s.i] == '\\' && s.b[s.i+1] == 'u' {
				if lo := hex4(s.b[s.i+2:]); lo >= 0xdc00 && lo < 0xe000 {
					r = 0x10000 + (r-0xd800)<<10 + (lo - 0xdc00)
					s.i += 6
				}
			}
			add(r)
		default:
			s.i++
			switch e {
			case 'b':
				add('\b')
			case 'f':
				add('\f')
			case 'n':
				add('\n')
			case 'r':
				add('\r')
			case 't':
				add('\t')
			default: // '"', '\\', '/'
				add(rune(e))
			}
		}
	}
	s.i++
	return string(dec), n
}

// number returns the length numeric_out gives the JSON number at s.i: a sign when
// the value is not zero, the integer digits without leading zeros (at least one),
// and as many decimals as the input had less its exponent.
func (s *jsonbSizer) number() int {
	start := s.i
	for s.i < len(s.b) && isNumberByte(s.b[s.i]) {
		s.i++
	}
	num := s.b[start:s.i]
	neg := num[0] == '-'
	if neg {
		num = num[1:]
	}
	mant, exp := num, 0
	for j, c := range num {
		if c == 'e' || c == 'E' {
			mant = num[:j]
			e, sign := 0, 1
			for _, d := range num[j+1:] {
				switch {
				case d == '-':
					sign = -1
				case d >= '0' && d <= '9':
					if e < 1<<30 {
						e = e*10 + int(d-'0')
					}
				}
			}
			exp = sign * e
			break
		}
	}
	intPart, frac := mant, []byte(nil)
	for j, c := range mant {
		if c == '.' {
			intPart, frac = mant[:j], mant[j+1:]
			break
		}
	}
	digits := len(intPart) + len(frac)
	// The position of the decimal point in intPart+frac once the exponent applies.
	point := len(intPart) + exp
	first := -1 // the first non-zero digit
	for j := 0; j < digits; j++ {
		var d byte
		if j < len(intPart) {
			d = intPart[j]
		} else {
			d = frac[j-len(intPart)]
		}
		if d != '0' {
			first = j
			break
		}
	}
	n := 1 // "0" when the integer part is empty or zero
	if first >= 0 && first < point {
		n = point - first
	}
	if scale := len(frac) - exp; scale > 0 {
		n += 1 + scale
	}
	if neg && first >= 0 {
		n++
	}
	return n
}

func isNumberByte(c byte) bool {
	return c >= '0' && c <= '9' || c == '-' || c == '+' || c == '.' || c == 'e' || c == 'E'
}
