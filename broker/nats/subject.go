package nats

import (
	"errors"
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/pgoutbox/pgoutbox/broker"
)

// validateSubject checks that s is a literal subject a publisher may use. The
// server would refuse some of these itself, but only after an ack round trip, and
// a wildcard would be taken as a literal token by some servers and as a pattern by
// consumers: refusing up front makes a bad template or event type fail fast.
func validateSubject(s string) error {
	if s == "" {
		return errors.New("empty subject")
	}
	if !utf8.ValidString(s) {
		return fmt.Errorf("subject %q is not valid UTF-8", s)
	}
	for i, tok := range strings.Split(s, ".") {
		if tok == "" {
			return fmt.Errorf("subject %q has an empty token at position %d", s, i+1)
		}
		for _, r := range tok {
			switch {
			case r == '*' || r == '>':
				return fmt.Errorf("subject %q contains wildcard %q", s, r)
			case unicode.IsSpace(r) || unicode.IsControl(r):
				return fmt.Errorf("subject %q contains whitespace or control character %q", s, r)
			}
		}
	}
	return nil
}

// templatePattern is the subject pattern of every subject t can produce, each
// token holding a placeholder a '*' (a value with a '.' adds tokens; such an
// event is checked on its own when it is published).
func templatePattern(t broker.Template) string {
	const mark = "\x00"
	toks := strings.Split(t.ExpandFunc(func(string) string { return mark }), ".")
	for i, tok := range toks {
		if strings.Contains(tok, mark) {
			toks[i] = "*"
		}
	}
	return strings.Join(toks, ".")
}

// patternOverlaps reports whether some subject matched by pattern (literal
// tokens and '*') is matched by filter, a stream subject with '*' and a final
// '>'.
func patternOverlaps(filter, pattern string) bool {
	for {
		ftok, frest, fmore := strings.Cut(filter, ".")
		ptok, prest, pmore := strings.Cut(pattern, ".")
		switch {
		case ftok == ">" && !fmore:
			return true
		case ftok != "*" && ptok != "*" && ftok != ptok:
			return false
		case !fmore || !pmore:
			return fmore == pmore
		}
		filter, pattern = frest, prest
	}
}

// SubjectsError is the error of a stream whose subjects cannot hold any subject
// of the subject template: publishing would refuse (and the relay quarantine) every event, so
// New and Dial fail with it, and Publish fails every message as unavailable (the
// events wait, readiness fails) until the stream or the template is fixed.
type SubjectsError struct {
	Stream   string
	Subjects []string
	// Template is the subject template, Pattern the subjects it produces.
	Template, Pattern string
	// Created reports that the stream does not exist and would have been created
	// with Subjects (Config.StreamSubjects); it was not created.
	Created bool
}

func (e *SubjectsError) Error() string {
	what := "has subjects"
	if e.Created {
		what = "would be created with subjects (Config.StreamSubjects, --nats-stream-subjects)"
	}
	return fmt.Sprintf("nats: stream %s %s %v, which do not hold the subjects %s of template %q: every event would be refused",
		e.Stream, what, e.Subjects, e.Pattern, e.Template)
}

// checkSubjects returns a *SubjectsError when none of subjects matches any
// subject the template can produce (one token per placeholder). A stream that
// holds only some of them (say one per aggregate type) is accepted: the events
// outside it are refused one by one, with the reason.
func checkSubjects(stream string, subjects []string, t broker.Template, created bool) error {
	pattern := templatePattern(t)
	for _, f := range subjects {
		if patternOverlaps(f, pattern) {
			return nil
		}
	}
	return &SubjectsError{Stream: stream, Subjects: subjects, Template: t.String(), Pattern: pattern, Created: created}
}

// subjectMatches reports whether the literal subject is matched by filter, a
// stream subject that may hold '*' (one token) and a final '>' (one or more).
func subjectMatches(filter, subject string) bool {
	for {
		ftok, frest, fmore := strings.Cut(filter, ".")
		stok, srest, smore := strings.Cut(subject, ".")
		switch {
		case ftok == ">" && !fmore:
			return true
		case ftok != "*" && ftok != stok:
			return false
		case !fmore || !smore:
			return fmore == smore
		}
		filter, subject = frest, srest
	}
}
