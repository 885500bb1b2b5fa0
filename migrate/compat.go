package migrate

import (
	"fmt"
	"regexp"
	"strconv"
)

// Compat says whether binaries that do not know a migration may keep running
// against a database that has it. Every migration file states it on a line of
// its own, `-- compat: expand` or `-- compat: contract`, and Up records it in the
// bookkeeping table, so that an older binary can read it for migrations it has
// never seen (CONTRIBUTING.md, "Migrations").
type Compat string

const (
	// CompatExpand: the migration only adds (a table, a nullable column, an
	// index, a function older binaries do not call) or changes nothing they
	// rely on. Binaries that know every migration before it keep working.
	CompatExpand Compat = "expand"
	// CompatContract: binaries that do not know the migration must stop
	// (it drops or changes something they use, or they would break a rule it
	// brings). An older binary refuses a database that has it.
	CompatContract Compat = "contract"
)

var compatLine = regexp.MustCompile(`(?m)^-- compat: ([a-z]+)\s*(?:$|[-:—])`)

// parseCompat finds the one compat statement of a migration file.
func parseCompat(sql string) (Compat, error) {
	found := compatLine.FindAllStringSubmatch(sql, -1)
	if len(found) != 1 {
		return "", fmt.Errorf("want exactly one line `-- compat: expand` or `-- compat: contract` (found %d)", len(found))
	}
	switch c := Compat(found[0][1]); c {
	case CompatExpand, CompatContract:
		return c, nil
	default:
		return "", fmt.Errorf("compat %q: want expand or contract", found[0][1])
	}
}

// Window is the compatibility window of this binary's migrations: for each
// line, the newest contract migration. A binary that knows that version of the
// line (or a newer one) keeps running against a database migrated by this one,
// since every migration after it is an expand step; an older binary refuses it.
func Window(lines ...Line) (map[Line]int, error) {
	all, err := All(lines...)
	if err != nil {
		return nil, err
	}
	w := map[Line]int{}
	for _, m := range all {
		if m.Compat == CompatContract {
			w[m.Line] = max(w[m.Line], m.Version)
		}
	}
	return w, nil
}

// WindowString describes [Window] for people, e.g. "outbox/7+, inbox/2+":
// binaries that know at least these versions run against this schema.
func WindowString(lines ...Line) string {
	w, err := Window(lines...)
	if err != nil {
		return "unknown (" + err.Error() + ")"
	}
	if len(lines) == 0 {
		lines = Lines
	}
	s := ""
	for _, l := range lines {
		if s != "" {
			s += ", "
		}
		s += string(l) + "/" + strconv.Itoa(w[l]) + "+"
	}
	return s
}

// WithinWindow reports whether s, an applied migration this binary does not
// know (Unknown), leaves it working: a newer version of a line it knows,
// recorded as an expand step. A known version under another name, or a
// migration recorded before binaries stated their window (no Compat), is never
// within it. See [CheckCompatible].
func (s Status) WithinWindow() bool {
	v, known := newestKnown()[s.Line]
	return s.Unknown && known && s.Version > v && s.Compat == CompatExpand
}

// newestKnown is this binary's newest version of each line.
func newestKnown() map[Line]int {
	all, err := All()
	if err != nil {
		panic(err) // the embedded files are checked by tests
	}
	newest := map[Line]int{}
	for _, m := range all {
		newest[m.Line] = max(newest[m.Line], m.Version)
	}
	return newest
}
