// Package admin holds the operator's actions on an outbox: retrying quarantined
// events today; status, dead-letter listing, replay and cleanup build on it.
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
// have it.
type DB interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// Config configures an Admin.
type Config struct {
	// Schema is the PostgreSQL schema holding the outbox tables. Defaults to "public".
	Schema string
}

// Admin runs operator actions against one outbox.
type Admin struct {
	db      DB
	events  string
	channel string
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
	return &Admin{
		db:      db,
		events:  pgx.Identifier{schema, "outbox_events"}.Sanitize(),
		channel: migrate.NotifyChannel(schema),
	}, nil
}

// ErrNoEvents is returned by Retry when called without event ids.
var ErrNoEvents = errors.New("admin: no event ids given")

// Retry gives quarantined events a fresh start: quarantine lifted, attempts reset
// to zero, no backoff. Their last_error is kept for the record. The relays are
// woken at once, and each aggregate's lane resumes in sequence order from the
// retried event. It returns the ids actually retried; ids that are not quarantined
// (published, never failed, unknown) are left alone.
func (a *Admin) Retry(ctx context.Context, ids ...pgoutbox.UUID) ([]pgoutbox.UUID, error) {
	if len(ids) == 0 {
		return nil, ErrNoEvents
	}
	q := fmt.Sprintf(`WITH retried AS (
    UPDATE %s
       SET quarantined_at = NULL, attempt_count = 0, available_at = now(), claimed_by = NULL, claim_until = NULL
     WHERE event_id = ANY($1::uuid[]) AND quarantined_at IS NOT NULL AND published_at IS NULL
    RETURNING event_id
), wake AS (
    SELECT pg_notify($2, '') WHERE EXISTS (SELECT 1 FROM retried)
)
SELECT event_id FROM retried, (SELECT count(*) FROM wake) w`, a.events)
	rows, err := a.db.Query(ctx, q, ids, a.channel)
	if err != nil {
		return nil, fmt.Errorf("admin: retry: %w", err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowTo[pgoutbox.UUID])
	if err != nil {
		return nil, fmt.Errorf("admin: retry: %w", err)
	}
	return out, nil
}
