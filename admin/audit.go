package admin

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/pgoutbox"
)

// Actions recorded in the operator audit (table outbox_operator_audit).
const (
	ActionRetry  = "dlq_retry"
	ActionSkip   = "dlq_skip"
	ActionReplay = "replay"
)

// DefaultReason is recorded for a retry or a replay given no reason. A skip
// always needs one (ErrNoReason).
const DefaultReason = "(no reason given)"

// AuditEntry is one operator action as recorded in outbox_operator_audit: who
// (Actor as given, DBUser the database role), when, why and what.
type AuditEntry struct {
	ID     int64  `json:"audit_id"`
	Action string `json:"action"`
	Actor  string `json:"actor"`
	DBUser string `json:"db_user"`
	Reason string `json:"reason"`
	// Selection says how the events were chosen (ids, filter, all; a replay's
	// run id and destination too).
	Selection map[string]any `json:"selection"`
	// EventIDs are the events acted on (for a replay, only when chosen by id),
	// EventCount how many.
	EventIDs   []pgoutbox.UUID `json:"event_ids"`
	EventCount int64           `json:"event_count"`
	// Outcome is a replay's result (published, error), filled in when it ends.
	Outcome map[string]any `json:"outcome,omitempty"`
	At      time.Time      `json:"at"`
}

// auditRecord is what an action writes to the audit table.
type auditRecord struct {
	action, actor, reason string
	selection             map[string]any
	ids                   []pgoutbox.UUID
	count                 int64
}

func auditTable(schema string) string {
	return pgx.Identifier{schema, "outbox_operator_audit"}.Sanitize()
}

// MaxAuditText is the longest actor or reason recorded, in bytes.
const MaxAuditText = 4096

// ErrInvalidAuditText is returned for an actor or reason that is not valid
// UTF-8, holds a NUL (which PostgreSQL text cannot store) or is longer than
// MaxAuditText. Nothing is done.
var ErrInvalidAuditText = errors.New("admin: actor and reason must be valid UTF-8 without NUL bytes, at most 4096 bytes")

// operator returns the actor and reason to record, with their defaults, or an
// error wrapping ErrInvalidAuditText.
func operator(actor, reason string) (string, string, error) {
	for what, v := range map[string]string{"actor": actor, "reason": reason} {
		if !utf8.ValidString(v) || strings.ContainsRune(v, 0) || len(v) > MaxAuditText {
			return "", "", fmt.Errorf("%w: the %s is not", ErrInvalidAuditText, what)
		}
	}
	actor, reason = strings.TrimSpace(actor), strings.TrimSpace(reason)
	if actor == "" {
		actor = DefaultActor()
	}
	if reason == "" {
		reason = DefaultReason
	}
	return actor, reason, nil
}

// writeAudit inserts r through q (the action's transaction) and returns its id.
func writeAudit(ctx context.Context, q DB, schema string, r auditRecord) (int64, error) {
	sel, err := json.Marshal(r.selection)
	if err != nil {
		return 0, fmt.Errorf("audit: %w", err)
	}
	ids := r.ids
	if ids == nil {
		ids = []pgoutbox.UUID{}
	}
	var id int64
	err = queryRow(ctx, q, `INSERT INTO `+auditTable(schema)+` (action, actor, reason, selection, event_ids, event_count)
VALUES ($1, $2, $3, $4::jsonb, $5::uuid[], $6) RETURNING audit_id`,
		[]any{r.action, r.actor, r.reason, string(sel), ids, r.count}, &id)
	if err != nil {
		return 0, fmt.Errorf("audit: record %s: %w", r.action, err)
	}
	return id, nil
}

// Audit returns the most recent operator actions (retry, skip, replay), newest
// first; limit caps how many (0: 50).
func (a *Admin) Audit(ctx context.Context, limit int) ([]AuditEntry, error) {
	return a.AuditWithin(ctx, 0, limit)
}

// AuditWithin is Audit restricted to the actions recorded in the last window
// by the database's clock (0: all of them).
func (a *Admin) AuditWithin(ctx context.Context, window time.Duration, limit int) ([]AuditEntry, error) {
	if limit <= 0 {
		limit = 50
	}
	if window < 0 {
		return nil, fmt.Errorf("admin: audit: window %s is negative", window)
	}
	var secs any // NULL: no lower bound
	if window > 0 {
		secs = window.Seconds()
	}
	rows, err := a.db.Query(ctx, `SELECT audit_id, action, actor, db_user, reason, selection, event_ids, event_count, outcome, at
  FROM `+auditTable(a.schema)+`
 WHERE $2::float8 IS NULL OR at >= now() - $2::float8 * interval '1 second'
 ORDER BY audit_id DESC LIMIT $1`, limit, secs)
	if err != nil {
		return nil, fmt.Errorf("admin: audit: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (AuditEntry, error) {
		var e AuditEntry
		err := row.Scan(&e.ID, &e.Action, &e.Actor, &e.DBUser, &e.Reason, &e.Selection, &e.EventIDs, &e.EventCount, &e.Outcome, &e.At)
		return e, err
	})
	if err != nil {
		return nil, fmt.Errorf("admin: audit: %w", err)
	}
	return out, nil
}
