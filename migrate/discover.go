package migrate

import (
	"context"
	"errors"
	"fmt"
	"path"
	"strings"

	"github.com/jackc/pgx/v5"
)

// Outboxes lists the schemas of the database that hold an outbox: an
// outbox_events table beside pgoutbox's bookkeeping table (Table), in name
// order. It reads the catalog only, so any role may call it, and it does not
// check that a schema's migrations are complete (CheckMigrated does) nor who
// owns it (CheckTrusted does). System schemas are never listed: pg_catalog,
// information_schema, and every name starting with "pg_", which PostgreSQL
// reserves (TOAST schemas, and the temporary schemas of every session, where
// any role may create tables).
//
// With patterns, only the schemas that match one of them are listed; a pattern
// is a name or a glob of [path.Match] ("tenant_*"). A bad pattern is an error
// wrapping [ErrBadSelector].
//
// A caller that lists again and again (a relay Group, the console) parses its
// selector once, at the edge, and calls SelectOutboxes.
func Outboxes(ctx context.Context, db Querier, patterns ...string) ([]string, error) {
	sel, err := ParseSelector(strings.Join(patterns, ","))
	if err != nil {
		return nil, err
	}
	return SelectOutboxes(ctx, db, sel)
}

// SelectOutboxes is Outboxes for a parsed Selector: the outbox schemas of the
// database that sel chooses (the zero Selector: all of them), in name order.
func SelectOutboxes(ctx context.Context, db Querier, sel Selector) ([]string, error) {
	rows, err := db.Query(ctx, `
SELECT n.nspname FROM pg_catalog.pg_namespace n
 WHERE n.nspname NOT LIKE 'pg\_%' AND n.nspname <> 'information_schema'
   AND EXISTS (SELECT 1 FROM pg_catalog.pg_class c WHERE c.relnamespace = n.oid AND c.relname = $1 AND c.relkind IN ('r', 'p'))
   AND EXISTS (SELECT 1 FROM pg_catalog.pg_class c WHERE c.relnamespace = n.oid AND c.relname = 'outbox_events' AND c.relkind IN ('r', 'p'))
 ORDER BY n.nspname COLLATE "C"`, Table)
	if err != nil {
		return nil, fmt.Errorf("migrate: list outboxes: %w", err)
	}
	all, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("migrate: list outboxes: %w", err)
	}
	out := all[:0]
	for _, s := range all {
		if sel.Match(s) {
			out = append(out, s)
		}
	}
	return out, nil
}

// ErrBadSelector is wrapped by the errors of ParseSelector.
var ErrBadSelector = errors.New("migrate: bad schema selector")

// maxSelectorPatterns bounds the patterns of one selector.
const maxSelectorPatterns = 1000

// Selector chooses schemas by name: a list of names and [path.Match] globs. The
// zero Selector matches every schema.
type Selector struct {
	patterns []string
}

// ParseSelector parses a comma-separated list of schema names and globs
// ("tenant_*,billing"). Blank items are ignored; an empty list selects every
// schema. Each item must be a valid schema name (ValidateSchema) and a valid
// glob, and there are at most 1000 items.
func ParseSelector(s string) (Selector, error) {
	var sel Selector
	for item := range strings.SplitSeq(s, ",") {
		item = strings.TrimSpace(item)
		if item == "" {
			continue
		}
		if err := ValidateSchema(item); err != nil {
			return Selector{}, fmt.Errorf("%w: %w", ErrBadSelector, err)
		}
		if _, err := path.Match(item, ""); err != nil {
			return Selector{}, fmt.Errorf("%w: %q: %w", ErrBadSelector, item, err)
		}
		if len(sel.patterns) == maxSelectorPatterns {
			return Selector{}, fmt.Errorf("%w: more than %d items", ErrBadSelector, maxSelectorPatterns)
		}
		sel.patterns = append(sel.patterns, item)
	}
	return sel, nil
}

// Match reports whether schema is selected.
func (s Selector) Match(schema string) bool {
	if len(s.patterns) == 0 {
		return true
	}
	for _, p := range s.patterns {
		if ok, _ := path.Match(p, schema); ok {
			return true
		}
	}
	return false
}

// String returns the selector as a comma-separated list ("" selects all).
func (s Selector) String() string { return strings.Join(s.patterns, ",") }
