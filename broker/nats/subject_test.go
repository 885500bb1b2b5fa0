package nats

import (
	"strings"
	"testing"
	"unicode"
)

func TestValidateSubject(t *testing.T) {
	t.Parallel()
	for s, ok := range map[string]bool{
		"outbox.order.created":   true,
		"outbox.Ordre-été.v2_x":  true,
		"a":                      true,
		"":                       false,
		".a":                     false,
		"a.":                     false,
		"a..b":                   false,
		"a.b c":                  false,
		"a.b\tc":                 false,
		"a.b\u00a0c":             false, // no-break space
		"a.*":                    false,
		"a.>":                    false,
		"a.b*c":                  false,
		"a.\x00":                 false,
		"a.\xff":                 false,
		"outbox.order.\r\ncreat": false,
	} {
		if err := validateSubject(s); (err == nil) != ok {
			t.Errorf("validateSubject(%q) = %v, want ok=%v", s, err, ok)
		}
	}
}

func TestSubjectMatches(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		filter, subject string
		want            bool
	}{
		{"outbox.>", "outbox.order.created", true},
		{"outbox.>", "outbox.order", true},
		{"outbox.>", "outbox", false},
		{"outbox.*", "outbox.order", true},
		{"outbox.*", "outbox.order.created", false},
		{"outbox.*.created", "outbox.order.created", true},
		{"outbox.*.created", "outbox.order.deleted", false},
		{"outbox.order.created", "outbox.order.created", true},
		{"outbox.order", "outbox.order.created", false},
		{"outbox.order.created", "outbox.order", false},
		{">", "anything.at.all", true},
		{"outboxes.>", "outbox.order", false},
	} {
		if got := subjectMatches(c.filter, c.subject); got != c.want {
			t.Errorf("subjectMatches(%q, %q) = %v, want %v", c.filter, c.subject, got, c.want)
		}
	}
}

// FuzzSubject checks that validateSubject never panics and accepts only literal
// subjects a server would take: no whitespace, no wildcard, no empty token.
func FuzzSubject(f *testing.F) {
	for _, s := range []string{"outbox.order.created", "", "a..b", ".a", "a.", "a b", "a.*", "a.>", "é.ü", "a\x00b", "\xff", "a.b\u2028c"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if validateSubject(s) != nil {
			return
		}
		if s == "" || strings.ContainsAny(s, "*>") || strings.IndexFunc(s, unicode.IsSpace) >= 0 {
			t.Fatalf("accepted %q", s)
		}
		for _, tok := range strings.Split(s, ".") {
			if tok == "" {
				t.Fatalf("accepted %q with an empty token", s)
			}
		}
		if !subjectMatches(">", s) || !subjectMatches(s, s) {
			t.Fatalf("accepted %q, which does not match itself or '>'", s)
		}
	})
}

func TestPatternOverlaps(t *testing.T) {
	for _, c := range []struct {
		filter, pattern string
		want            bool
	}{
		{"outbox.>", "outbox.*.*", true},
		{"outbox.order.>", "outbox.*.*", true},
		{"outbox.*.*", "outbox.*.*", true},
		{"outbox.*", "outbox.*.*", false},
		{"foo.>", "outbox.*", false},
		{"outbox.*.created", "outbox.*", false},
		{"outbox.order", "outbox.*.*", false},
		{">", "x.*", true},
		{"x.v1", "x.*", true},
		{"x.>", "x", false},
		{"*", "x", true},
		{"a.b.c", "a.b.c", true},
		{"a.b.c", "a.b.d", false},
	} {
		if got := patternOverlaps(c.filter, c.pattern); got != c.want {
			t.Errorf("patternOverlaps(%q, %q) = %v, want %v", c.filter, c.pattern, got, c.want)
		}
	}
}

// FuzzPatternOverlaps: a subject matched by both the stream subject and the
// template's pattern means they overlap, so a stream the start-up check refuses
// could never have stored an event.
func FuzzPatternOverlaps(f *testing.F) {
	f.Add("outbox.>", "outbox.*.*", "outbox.order.created")
	f.Add("foo.>", "outbox.*", "outbox.x")
	f.Add("a.*.c", "a.b.*", "a.b.c")
	f.Fuzz(func(t *testing.T, filter, pattern, subject string) {
		if validateSubject(subject) != nil || strings.Contains(pattern, ">") {
			return
		}
		for _, s := range []string{filter, pattern} {
			if s == "" || strings.Contains(s, "..") || strings.HasPrefix(s, ".") || strings.HasSuffix(s, ".") {
				return
			}
		}
		if subjectMatches(filter, subject) && subjectMatches(pattern, subject) && !patternOverlaps(filter, pattern) {
			t.Fatalf("%q and %q both match %q, but patternOverlaps says no", filter, pattern, subject)
		}
	})
}
