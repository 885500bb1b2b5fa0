package visible_test

import (
	"encoding/json"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/pgoutbox/pgoutbox/internal/visible"
)

func TestLine(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"order-42":                        "order-42",
		"naïve café 東京":                   "naïve café 東京",
		"\x1b]0;pwned\x07":                `\u001b]0;pwned\u0007`,
		"\x1b[2J\x1b[H":                   `\u001b[2J\u001b[H`,
		"ok\nquarantined 0 events":        `ok\u000aquarantined 0 events`,
		"a\r\x1b[Kforged":                 `a\u000d\u001b[Kforged`,
		"tab\there":                       `tab\u0009here`,
		"invoice\u202egpj.exe":            `invoice\u202egpj.exe`,
		"\u2066x\u2069\u2067y\u2068":      `\u2066x\u2069\u2067y\u2068`,
		"a\u200bb\u200cc\u200dd\ufeffe":   `a\u200bb\u200cc\u200dd\ufeffe`,
		"\u200e\u200f\u061c\u2060\u2064":  `\u200e\u200f\u061c\u2060\u2064`,
		"c1\u0085\u009b31m":               `c1\u0085\u009b31m`,
		"del\x7f":                         `del\u007f`,
		"sep\u2028\u2029":                 `sep\u2028\u2029`,
		"bad\xffbyte\xc3":                 `bad\xffbyte\xc3`,
		"nul\x00":                         `nul\u0000`,
		"\ufffd is a real character here": "\ufffd is a real character here",
	} {
		if got := visible.Line(in); got != want {
			t.Errorf("Line(%q) = %q, want %q", in, got, want)
		}
	}
	if got := visible.Block("{\n\t\"a\": \"\u202e\x1b\"\n}"); got != "{\n\t\"a\": \"\\u202e\\u001b\"\n}" {
		t.Errorf("Block keeps layout only: %q", got)
	}
}

// Block applied to JSON keeps it valid, with the same meaning.
func TestBlockKeepsJSON(t *testing.T) {
	t.Parallel()
	v := map[string]string{"id": "a\u202eb\u200b\u0085\u2028", "x": "\x1b[2J"}
	b, _ := json.MarshalIndent(v, "", "  ")
	var back map[string]string
	if err := json.Unmarshal([]byte(visible.Block(string(b))), &back); err != nil || back["id"] != v["id"] || back["x"] != v["x"] {
		t.Fatalf("%v %q", err, back)
	}
}

func FuzzLine(f *testing.F) {
	for _, s := range []string{"", "plain", "\x1b[31mred", "a\u202eb", "\xff\xfe", "a\nb\tc", "\u2028"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		for _, out := range []string{visible.Line(s), visible.Block(s)} {
			if !utf8.ValidString(out) {
				t.Fatalf("invalid UTF-8 out of %q", s)
			}
			for _, r := range out {
				if visible.Hidden(r) && r != '\n' && r != '\t' {
					t.Fatalf("%q still holds %U", out, r)
				}
			}
		}
		if strings.ContainsAny(visible.Line(s), "\n\t\r\x1b") {
			t.Fatalf("Line(%q) holds a control", s)
		}
		if visible.Line(s) == s && strings.ContainsFunc(s, visible.Hidden) {
			t.Fatalf("Line(%q) changed nothing", s)
		}
	})
}
