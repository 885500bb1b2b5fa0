// Package admin holds the operator's actions on an outbox: its health figures
// ([Admin.Status]), the dead letters (list, show, retry, skip with an audited
// reason), replay and cleanup. The pgoutbox CLI is a thin layer over it.
//
// Outside the standard library it pulls in pgx, golang.org/x/sync and the
// OpenTelemetry API: no broker client.
package admin

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/pgoutbox"
	"github.com/pgoutbox/pgoutbox/internal/config"
	"github.com/pgoutbox/pgoutbox/migrate"
)

// DB is what Admin needs of a database handle: *pgxpool.Pool, *pgx.Conn and pgx.Tx
// have it. Begin is used by actions that must be atomic over several statements
// (Skip); on a pgx.Tx it opens a savepoint.
type DB interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	Begin(ctx context.Context) (pgx.Tx, error)
}

// Config configures an Admin. A nil *Config and the zero value are ready to
// use; each field names its default.
type Config struct {
	// Schema is the PostgreSQL schema holding the outbox tables. Empty means
	// migrate.DefaultSchema ("public").
	Schema string

	// InboxSchema is the schema holding the consumer inbox's processed_events
	// table, whose size Status reports (as absent when it does not exist there).
	// Empty means Schema.
	InboxSchema string
}

// Validate reports what New would reject in c, zero fields meaning their
// defaults: an error naming each bad field, joined. A nil c is valid.
func (c *Config) Validate() error {
	_, err := c.withDefaults()
	return err
}

// withDefaults returns a copy of c with its defaults filled in, and validates it.
func (c *Config) withDefaults() (Config, error) {
	return config.Resolve("admin", c, func(c *Config) {
		config.Default(&c.Schema, migrate.DefaultSchema)
		config.Default(&c.InboxSchema, c.Schema)
	}, func(c *Config, p *config.Problems) {
		p.Field("Config.Schema", migrate.ValidateSchema(c.Schema))
		p.Field("Config.InboxSchema", migrate.ValidateSchema(c.InboxSchema))
	})
}

// Admin runs operator actions against one outbox.
type Admin struct {
	db          DB
	schema      string
	inboxSchema string
	events      string
	skipped     string
	attempts    string
	channel     string
}

// New returns an Admin working through db. cfg may be nil for all defaults;
// invalid settings are reported here.
func New(db DB, cfg *Config) (*Admin, error) {
	c, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	return &Admin{
		db:          db,
		schema:      c.Schema,
		inboxSchema: c.InboxSchema,
		events:      pgx.Identifier{c.Schema, "outbox_events"}.Sanitize(),
		skipped:     pgx.Identifier{c.Schema, "outbox_skipped_events"}.Sanitize(),
		attempts:    pgx.Identifier{c.Schema, "outbox_attempts"}.Sanitize(),
		channel:     migrate.NotifyChannel(c.Schema),
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

// Now is the database's clock: what the ages of Status, Activity and the
// lists are measured against, and what a reader of their times should
// measure against too (the reader's own clock may be skewed).
func (a *Admin) Now(ctx context.Context) (time.Time, error) {
	var now time.Time
	if err := queryRow(ctx, a.db, "SELECT now()", nil, &now); err != nil {
		return time.Time{}, fmt.Errorf("admin: clock: %w", err)
	}
	return now, nil
}
