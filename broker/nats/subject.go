package nats

import (
	"errors"
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"
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
