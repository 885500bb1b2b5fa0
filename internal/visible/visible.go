// Package visible shows text that came from outside (producers' ids, types,
// headers and payloads, brokers' errors) so that what a person reads is what
// the text holds: characters that steer a terminal or the direction of text, or
// that cannot be seen, are written as escapes such as \u202e instead.
//
// It is the one place that knows which characters those are; the console
// (admin/adminhttp) and the CLI's dead-letter output (pgoutbox dlq) go through
// it. The escapes are those of JSON and Go (\u202e, \u001b), so applied to a
// JSON document, Block keeps it valid and meaning the same.
package visible

import (
	"fmt"
	"strings"
	"unicode/utf8"
)

// Line returns s with every character that is not plain visible text escaped:
// C0 controls (newlines and tabs too: a field cannot start a forged line),
// DEL, C1 controls, the bidirectional overrides, embeddings and isolates
// (U+202A–U+202E, U+2066–U+2069, U+200E, U+200F, U+061C), the zero-width and
// invisible characters (U+200B–U+200D, U+2060–U+2064, U+FEFF), the line and
// paragraph separators (U+2028, U+2029) and bytes that are not UTF-8 (\xff).
func Line(s string) string { return escape(s, false) }

// Block is Line for text laid out on several lines: newlines and tabs stay.
func Block(s string) string { return escape(s, true) }

// Hidden reports whether r is one of the characters Line escapes.
func Hidden(r rune) bool { return hidden(r, false) }

func hidden(r rune, layout bool) bool {
	switch {
	case r == '\n' || r == '\t':
		return !layout
	case r < 0x20, r >= 0x7f && r <= 0x9f:
		return true
	case r >= 0x200b && r <= 0x200f, r >= 0x202a && r <= 0x202e, r >= 0x2060 && r <= 0x2064, r >= 0x2066 && r <= 0x2069:
		return true
	}
	return r == 0x061c || r == 0x2028 || r == 0x2029 || r == 0xfeff
}

func escape(s string, layout bool) string {
	clean := true
	for i, r := range s {
		if hidden(r, layout) || r == utf8.RuneError && isBadByte(s, i) {
			clean = false
			break
		}
	}
	if clean {
		return s
	}
	var b strings.Builder
	b.Grow(len(s) + 16)
	for i := 0; i < len(s); {
		r, n := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && n == 1:
			fmt.Fprintf(&b, `\x%02x`, s[i])
		case hidden(r, layout):
			fmt.Fprintf(&b, `\u%04x`, r)
		default:
			b.WriteString(s[i : i+n])
		}
		i += n
	}
	return b.String()
}

func isBadByte(s string, i int) bool {
	_, n := utf8.DecodeRuneInString(s[i:])
	return n == 1
}
