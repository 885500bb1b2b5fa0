package pgoutboxtest

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgoutbox/pgoutbox/migrate"
)

// Timeouts of Schema.
const (
	// MigrateTimeout bounds the migrations Schema applies.
	MigrateTimeout = time.Minute
	// DropTimeout bounds the drop of Schema's schema when the test ends, so
	// that a database that stopped answering cannot hang the test binary.
	DropTimeout = time.Minute
)

// Schema creates a schema with a unique name ("pgoutboxtest_" and 12 hex
// digits) through pool, applies every migration to it (migrate.Up: the outbox
// and the inbox lines), and returns its name; the schema and everything in it
// are dropped when the test ends. Give the name to Config.Schema, to
// pgoutbox.Config.Schema and to inbox's config. It fails the test if the
// migrations fail.
//
// The drop runs in a t.Cleanup through pool, so close pool with t.Cleanup
// registered before the call, not with defer.
func Schema(tb testing.TB, pool *pgxpool.Pool) string {
	tb.Helper()
	schema := "pgoutboxtest_" + randomHex()
	tb.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), DropTimeout)
		defer cancel()
		if err := dropSchema(ctx, pool, schema); err != nil {
			tb.Errorf("pgoutboxtest: %v", err)
		}
	})
	if err := migrateSchema(context.Background(), pool, schema); err != nil {
		tb.Fatalf("pgoutboxtest: %v", err)
	}
	return schema
}

// migrateSchema applies every migration to schema, bounded by MigrateTimeout.
func migrateSchema(ctx context.Context, pool *pgxpool.Pool, schema string) error {
	ctx, cancel := context.WithTimeout(ctx, MigrateTimeout)
	defer cancel()
	if _, err := migrate.Up(ctx, pool, &migrate.Config{Schema: schema}); err != nil {
		return fmt.Errorf("migrate schema %s: %w", schema, err)
	}
	return nil
}

// dropSchema drops schema and everything in it.
func dropSchema(ctx context.Context, pool *pgxpool.Pool, schema string) error {
	if _, err := pool.Exec(ctx, "DROP SCHEMA IF EXISTS "+pgx.Identifier{schema}.Sanitize()+" CASCADE"); err != nil {
		return fmt.Errorf("drop schema %s: %w", schema, err)
	}
	return nil
}
