package admin

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/pgoutbox"
)

// MaxPage bounds the events one ListRetrying or ListQuarantinedPage call returns.
const MaxPage = 1000

// Page asks for one page of a list in its stable order, by a time and then
// the event id: at most Limit (1..MaxPage) events after the position After
// (the zero Cursor: from the start). The order of the events left does not
// change while others are retried or skipped, so the last event's Cursor is
// the next page's After.
type Page struct {
	After Cursor
	Limit int
}

// Cursor is a position in a paged list: the ordering time of an event (its
// occurrence in ListRetrying, its quarantine in ListQuarantinedPage) and its id.
type Cursor struct {
	At time.Time
	ID pgoutbox.UUID
}

// IsZero reports whether c is the start of a list.
func (c Cursor) IsZero() bool { return c.At.IsZero() && c.ID == (pgoutbox.UUID{}) }

func (p Page) check(what string) error {
	if p.Limit < 1 || p.Limit > MaxPage {
		return fmt.Errorf("admin: %s: limit %d must be in 1..%d", what, p.Limit, MaxPage)
	}
	return nil
}

// where is the condition (" AND ...") of the rows after p.After in a list
// ordered by the column at (of alias e), then the event id, numbering its
// parameters after args; empty at the start of the list.
func (p Page) where(at string, args []any) (string, []any) {
	if p.After.IsZero() {
		return "", args
	}
	args = append(args, p.After.At, p.After.ID)
	return fmt.Sprintf(" AND (%s, e.event_id) > ($%d, $%d)", at, len(args)-1, len(args)), args
}

// ListRetrying returns the events that failed and will be tried again: not
// published, not quarantined, attempt_count above zero — those backing off
// (Status.BackingOff) and those whose next attempt (AvailableAt) is due. Each
// carries its attempts and its last error, without payload and headers. They
// come in a stable order (occurrence, then id), one page at a time; it reads
// only unpublished rows, through their partial index.
func (a *Admin) ListRetrying(ctx context.Context, p Page) ([]Event, error) {
	if err := p.check("list retrying"); err != nil {
		return nil, err
	}
	after, args := p.where("e.occurred_at", []any{p.Limit})
	return a.queryEvents(ctx, "list retrying", `
 WHERE e.published_at IS NULL AND e.quarantined_at IS NULL AND e.attempt_count > 0`+after+`
 ORDER BY e.occurred_at, e.event_id LIMIT $1`, args...)
}

// queryEvents returns the events (without payload and headers) that the
// clause after the FROM of alias e selects, its errors prefixed with what.
func (a *Admin) queryEvents(ctx context.Context, what, clause string, args ...any) ([]Event, error) {
	rows, err := a.db.Query(ctx, `SELECT `+eventColumns+`
  FROM `+a.events+` e LEFT JOIN `+a.skipped+` s ON s.event_id = e.event_id`+clause, args...)
	if err != nil {
		return nil, fmt.Errorf("admin: %s: %w", what, err)
	}
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (Event, error) { return scanEvent(row) })
	if err != nil {
		return nil, fmt.Errorf("admin: %s: %w", what, err)
	}
	return out, nil
}

// ListQuarantinedPage returns one page of the quarantined events matching f
// (its Limit is ignored: p's counts), oldest quarantine first, then by id;
// Cursor.At is the quarantine time.
func (a *Admin) ListQuarantinedPage(ctx context.Context, f Filter, p Page) ([]Event, error) {
	if err := p.check("list quarantined"); err != nil {
		return nil, err
	}
	cond, args := f.where(nil)
	after, args := p.where("e.quarantined_at", args)
	cond += after
	args = append(args, p.Limit)
	return a.queryEvents(ctx, "list quarantined", `
 WHERE e.published_at IS NULL AND e.quarantined_at IS NOT NULL`+cond+`
 ORDER BY e.quarantined_at, e.event_id
 LIMIT $`+fmt.Sprint(len(args)), args...)
}
