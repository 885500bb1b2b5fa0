// Package admin holds the operator's actions on an outbox: its health figures
// ([Admin.Status]), the dead letters (list, show, retry, skip with an audited
// reason), replay and cleanup. The pgoutbox CLI is a thin layer over it.
package admin

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/pgoutbox"
	"github.com/pgoutbox/pgoutbox/migrate"
)

// DB is what Admin needs of a database handle: *pgxpool.Pool, *pgx.Conn and pgx.Tx
// have it. Begin is used by actions that must be atomic over several statements
// (Skip); on a pgx.Tx it opens a savepoint.
type DB interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	Begin(ctx context.Context) (pgx.Tx, error)
}

// Config configures an Admin.
type Config struct {
	// Schema is the PostgreSQL schema holding the outbox tables. Defaults to "public".
	Schema string

	// InboxSchema is the schema holding the consumer inbox's processed_events
	// table, whose size Status reports (as absent when it does not exist there).
	// Defaults to Schema.
	InboxSchema string
}

// Admin runs operator actions against one outbox.
type Admin struct {
	db          DB
	schema      string
	inboxSchema string
	events      string
	skipped     string
	channel     string
}

// New returns an Admin working through db.
func New(db DB, cfg *Config) (*Admin, error) {
	schema := migrate.DefaultSchema
	if cfg != nil && cfg.Schema != "" {
		schema = cfg.Schema
	}
	if err := migrate.ValidateSchema(schema); err != nil {
		return nil, fmt.Errorf("admin: Config.Schema: %w", err)
	}
	inbox := schema
	if cfg != nil && cfg.InboxSchema != "" {
		inbox = cfg.InboxSchema
	}
	if err := migrate.ValidateSchema(inbox); err != nil {
		return nil, fmt.Errorf("admin: Config.InboxSchema: %w", err)
	}
	return &Admin{
		db:          db,
		schema:      schema,
		inboxSchema: inbox,
		events:      pgx.Identifier{schema, "outbox_events"}.Sanitize(),
		skipped:     pgx.Identifier{schema, "outbox_skipped_events"}.Sanitize(),
		channel:     migrate.NotifyChannel(schema),
	}, nil
}

// ErrNoEvents is returned by Retry and Skip when called without event ids.
var ErrNoEvents = errors.New("admin: no event ids given")

// Retry gives quarantined events a fresh start: quarantine lifted, attempts reset
// to zero, no backoff. Their last_error is kept for the record. The relays are
// woken at once, and each aggregate's lane resumes in sequence order from the
// retried event. It returns the ids actually retried; ids of events that are not
// quarantined (published, never failed) are left alone. An id no event has is an
// error wrapping ErrNotFound, and then nothing is retried. The action is audited
// (see RetryEvents, which this is with the default actor and reason).
func (a *Admin) Retry(ctx context.Context, ids ...pgoutbox.UUID) ([]pgoutbox.UUID, error) {
	if len(ids) == 0 {
		return nil, ErrNoEvents
	}
	return a.RetryEvents(ctx, RetryRequest{IDs: ids})
}
