//go:build pgoutbox_next_release

package migrate

// This file is compiled only with the build tag pgoutbox_next_release, by the
// mixed-version upgrade test (internal/faulttest, TestRollingUpgrade): it
// stands in for the next release's expand migration until a tagged release
// with the compatibility window exists to build the newer binary from. No
// released binary has it.

func init() {
	nextRelease = func(line Line, version int) ([]Migration, error) {
		if line != LineOutbox {
			return nil, nil
		}
		m := Migration{Line: line, Version: version, Name: "next_release_expand", sql: nextReleaseSQL}
		var err error
		m.Compat, err = parseCompat(m.sql)
		return []Migration{m}, err
	}
}

// nextReleaseSQL is an expand step of the kind a release adds: a nullable
// column older relays never read, and a table of its own.
const nextReleaseSQL = `-- compat: expand: a nullable column and a new table; older binaries use neither.
ALTER TABLE {{schema}}.outbox_events ADD COLUMN IF NOT EXISTS next_release_note text;
CREATE TABLE IF NOT EXISTS {{schema}}.next_release_marks (
    id   bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    note text NOT NULL
);
`
