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
// outbox_events table beside pgoutbox's bookkeeping table (Table), chosen by
// sel (the zero Selector: all of them), in name order. It reads the catalog
// only, so any role may call it, and it does not check that a schema's
// migrations are complete (CheckMigrated does) nor who owns it (CheckTrusted
// does). System schemas are never listed: pg_catalog, information_schema, and
// every name starting with "pg_", which PostgreSQL reserves (TOAST schemas,
// and the temporary schemas of every session, where any role may create
// tables).
//
// The selector is parsed once, where its text comes in (ParseSelector: a
// flag, a file), and passed as a Selector from there on.
func Outboxes(ctx context.Context, db Querier, sel Selector) ([]string, error) {
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

// SelectOutboxes is Outboxes.
//
// Deprecated: use Outboxes, which takes a Selector.
func SelectOutboxes(ctx context.Context, db Querier, sel Selector) ([]string, error) {
	return Outboxes(ctx, db, sel)
}

// ErrBadSelector is wrapped by the errors of ParseSelector.
var ErrBadSelector = errors.New("migrate: bad schema selector")

// MaxSelectorItems bounds the names and globs of one Selector.
const MaxSelectorItems = 1000

// Selector chooses schemas by name: a list of names and [path.Match] globs
// ("tenant_*"). Make one with ParseSelector where the text comes in (a flag, a
// file) and pass the Selector from there on: nothing parses it again.
//
// The zero Selector matches every schema; each configuration holding one says
// what its zero value means there (adminhttp.Config keeps "public").
type Selector struct {
	patterns []string
}

// DefaultSchemaSelector returns the Selector of the one schema DefaultSchema
// ("public").
func DefaultSchemaSelector() Selector { return Selector{patterns: []string{DefaultSchema}} }

// ParseSelector parses a comma-separated list of schema names and globs
// ("tenant_*,billing"). Blank items are ignored; an empty list is the zero
// Selector, which selects every schema. Each item must be a valid schema name
// (ValidateSchema) and a valid glob, and there are at most MaxSelectorItems
// items. An error wraps ErrBadSelector and names the bad item by its position,
// never by its value, so that it may be shown whatever the text held
// ("migrate: bad schema selector: item 2 is longer than 63 bytes").
func ParseSelector(s string) (Selector, error) {
	var sel Selector
	n := 0
	for item := range strings.SplitSeq(s, ",") {
		n++
		item = strings.TrimSpace(item)
		if item == "" {
			continue
		}
		if why := badSelectorItem(item); why != "" {
			return Selector{}, fmt.Errorf("%w: item %d %s", ErrBadSelector, n, why)
		}
		if len(sel.patterns) == MaxSelectorItems {
			return Selector{}, fmt.Errorf("%w: more than %d items", ErrBadSelector, MaxSelectorItems)
		}
		sel.patterns = append(sel.patterns, item)
	}
	return sel, nil
}

// badSelectorItem says what is wrong with one item of a selector, without
// quoting it, or "".
func badSelectorItem(item string) string {
	switch _, globErr := path.Match(item, ""); {
	case len(item) > maxSchemaName:
		return fmt.Sprintf("is longer than %d bytes", maxSchemaName)
	case ValidateSchema(item) != nil:
		return "must be valid UTF-8 without NUL bytes"
	case globErr != nil:
		return "is not a valid glob (path.Match)"
	}
	return ""
}

// IsZero reports whether s is the zero Selector (an empty list), which
// Outboxes and Match read as every schema.
func (s Selector) IsZero() bool { return len(s.patterns) == 0 }

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
