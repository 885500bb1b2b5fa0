// Package pgtest gives each test its own PostgreSQL schema or database on the local
// server, so tests run in parallel and leave nothing behind.
//
// The server is PGOUTBOX_TEST_DATABASE_URL, else DATABASE_URL, else
// postgres://postgres@127.0.0.1:5432/test. Its settings may be PostgreSQL's
// defaults (wal_level = replica, max_connections = 100): tests that need other
// settings (logical replication) use a throwaway cluster of the test binary's
// own (Logical, MainLogical, StartCluster), started with the PostgreSQL server
// binaries (initdb, postgres), which the machine must have.
package pgtest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"log"
	"net/url"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgoutbox/pgoutbox/migrate"
)

// URL returns the connection string of the test server's main database.
func URL() string {
	for _, k := range []string{"PGOUTBOX_TEST_DATABASE_URL", "DATABASE_URL"} {
		if v := os.Getenv(k); v != "" {
			return v
		}
	}
	return "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"
}

// Name returns a fresh lower-case name with the given prefix, unique enough for
// concurrent test runs.
func Name(prefix string) string {
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	return prefix + "_" + hex.EncodeToString(b)
}

// Pool opens a pool on url, closed when the test ends.
func Pool(tb testing.TB, url string, maxConns int32) *pgxpool.Pool {
	tb.Helper()
	return pool(tb, url, maxConns, nil)
}

// pool is Pool, with tune (if not nil) applied to the pool's configuration.
func pool(tb testing.TB, url string, maxConns int32, tune func(*pgxpool.Config)) *pgxpool.Pool {
	tb.Helper()
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		tb.Fatalf("pgtest: parse %s: %v", url, err)
	}
	if maxConns > 0 {
		cfg.MaxConns = maxConns
	}
	if tune != nil {
		tune(cfg)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		tb.Fatalf("pgtest: connect: %v", err)
	}
	if err := pool.Ping(ctx); err != nil {
		tb.Fatalf("pgtest: connect to %s: %v (is PostgreSQL running? .ci/run starts it; PGOUTBOX_TEST_DATABASE_URL names another server)", url, err)
	}
	tb.Cleanup(pool.Close)
	return pool
}

// Schema creates an empty schema with a unique name, dropped with everything in it
// when the test ends, and returns a pool (at most maxConns connections, 0 for pgx's
// default) and the schema's name.
func Schema(tb testing.TB, maxConns int32) (*pgxpool.Pool, string) {
	tb.Helper()
	return SchemaOn(tb, URL(), maxConns)
}

// SchemaOn is Schema in the database of url.
func SchemaOn(tb testing.TB, url string, maxConns int32) (*pgxpool.Pool, string) {
	tb.Helper()
	pool := Pool(tb, url, maxConns)
	schema := SchemaName(tb, pool, "t")
	if _, err := pool.Exec(context.Background(), "CREATE SCHEMA "+pgx.Identifier{schema}.Sanitize()); err != nil {
		tb.Fatalf("pgtest: create schema: %v", err)
	}
	return pool, schema
}

// dropTimeout bounds the drop of a test's schema when the test ends.
const dropTimeout = time.Minute

// SchemaName returns a fresh schema name with the given prefix, without creating the
// schema, and drops whatever schema of that name exists when the test ends.
func SchemaName(tb testing.TB, pool *pgxpool.Pool, prefix string) string {
	tb.Helper()
	schema := Name(prefix)
	tb.Cleanup(func() {
		// Bounded: a pool of a test's own cluster may still hold a connection to
		// a server the test froze.
		ctx, cancel := context.WithTimeout(context.Background(), dropTimeout)
		defer cancel()
		if _, err := pool.Exec(ctx, "DROP SCHEMA IF EXISTS "+pgx.Identifier{schema}.Sanitize()+" CASCADE"); err != nil {
			tb.Errorf("pgtest: drop schema %s: %v", schema, err)
		}
	})
	return schema
}

// ExampleDB gives a runnable example a schema of its own on the test server,
// migrated with lines (none: migrate's default), and returns a function that
// drops the schema and closes the pool. Errors end the example with
// log.Fatal: an example has no testing.TB. Real code connects to its own
// DATABASE_URL and uses its own schema ("public" by default).
func ExampleDB(ctx context.Context, lines ...migrate.Line) (pool *pgxpool.Pool, schema string, done func()) {
	pool, err := pgxpool.New(ctx, URL())
	if err != nil {
		log.Fatal(err)
	}
	schema = Name("example")
	if _, err := migrate.Up(ctx, pool, &migrate.Config{Schema: schema, Lines: lines}); err != nil {
		log.Fatal(err)
	}
	return pool, schema, func() {
		_, _ = pool.Exec(context.Background(), "DROP SCHEMA "+pgx.Identifier{schema}.Sanitize()+" CASCADE")
		pool.Close()
	}
}

// Migrated is Schema with every migration applied.
func Migrated(tb testing.TB, maxConns int32) (*pgxpool.Pool, string) {
	tb.Helper()
	return MigratedOn(tb, URL(), maxConns)
}

// MigratedOn is Migrated in the database of url.
func MigratedOn(tb testing.TB, url string, maxConns int32) (*pgxpool.Pool, string) {
	tb.Helper()
	pool, schema := SchemaOn(tb, url, maxConns)
	if _, err := migrate.Up(context.Background(), pool, &migrate.Config{Schema: schema}); err != nil {
		tb.Fatalf("pgtest: migrate: %v", err)
	}
	return pool, schema
}

// Outboxes creates a database of the test's own (Database) with an outbox and
// an inbox (every migration line) in each of schemas, and returns its URL and
// a pool of maxConns on it: the tenants of the many-outbox tests.
func Outboxes(tb testing.TB, maxConns int32, schemas ...string) (string, *pgxpool.Pool) {
	tb.Helper()
	url := Database(tb)
	pool := Pool(tb, url, maxConns)
	for _, s := range schemas {
		MigrateSchema(tb, pool, s)
	}
	return url, pool
}

// MigrateSchema applies every migration to schema through pool.
func MigrateSchema(tb testing.TB, pool *pgxpool.Pool, schema string) {
	tb.Helper()
	if _, err := migrate.Up(context.Background(), pool, &migrate.Config{Schema: schema}); err != nil {
		tb.Fatalf("pgtest: migrate %q: %v", schema, err)
	}
}

// Database creates an empty database with a unique name on the test server
// (URL), dropped when the test ends, and returns its connection string.
func Database(tb testing.TB) string {
	tb.Helper()
	return DatabaseOn(tb, URL())
}

// DatabaseOn is Database on the server of the connection string server (e.g.
// Logical's).
func DatabaseOn(tb testing.TB, server string) string {
	tb.Helper()
	dbURL, drop, err := CreateDatabaseOn(server, "pgoutbox_test")
	if err != nil {
		tb.Fatalf("pgtest: %v", err)
	}
	tb.Cleanup(func() {
		if err := drop(); err != nil {
			tb.Errorf("pgtest: %v", err)
		}
	})
	return dbURL
}

// CreateDatabase creates an empty database named prefix_<random> on the test server
// and returns its connection string and a function that drops it; for a TestMain
// that gives a whole package a database of its own.
func CreateDatabase(prefix string) (dbURL string, drop func() error, err error) {
	return CreateDatabaseOn(URL(), prefix)
}

// CreateDatabaseOn is CreateDatabase on the server of the connection string
// server.
func CreateDatabaseOn(server, prefix string) (dbURL string, drop func() error, err error) {
	ctx := context.Background()
	name := Name(prefix)
	admin, err := pgx.Connect(ctx, server)
	if err != nil {
		return "", nil, fmt.Errorf("create database: %w", err)
	}
	defer admin.Close(ctx)
	if _, err := admin.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()); err != nil {
		return "", nil, fmt.Errorf("create database: %w", err)
	}
	u, err := url.Parse(server)
	if err != nil {
		return "", nil, fmt.Errorf("create database: server URL: %w", err)
	}
	u.Path = "/" + name
	return u.String(), func() error {
		admin, err := pgx.Connect(ctx, server)
		if err != nil {
			return fmt.Errorf("drop database %s: %w", name, err)
		}
		defer admin.Close(ctx)
		if _, err := admin.Exec(ctx, "DROP DATABASE "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)"); err != nil {
			return fmt.Errorf("drop database %s: %w", name, err)
		}
		return nil
	}, nil
}

// WithDatabase returns connURL with its database replaced by name.
func WithDatabase(tb testing.TB, connURL, name string) string {
	tb.Helper()
	u, err := url.Parse(connURL)
	if err != nil || (u.Scheme != "postgres" && u.Scheme != "postgresql") {
		tb.Fatalf("pgtest: %q is not a postgres:// URL", connURL)
	}
	u.Path = "/" + strings.TrimPrefix(name, "/")
	return u.String()
}

// Must fails the test on err.
func Must(tb testing.TB, err error, what string, args ...any) {
	tb.Helper()
	if err != nil {
		tb.Fatalf("%s: %v", fmt.Sprintf(what, args...), err)
	}
}

// Role creates a role named name (a fresh one from Name when name is empty) that
// can log in and is no superuser, with the extra options attrs (e.g.
// "REPLICATION"), and drops it when the test ends, with whatever it owns and was
// granted in pool's database. Roles are cluster-wide: give each test its own
// names, and drop any other database the role has rights in before this cleanup
// runs (create the database after the role).
func Role(tb testing.TB, pool *pgxpool.Pool, name string, attrs ...string) string {
	tb.Helper()
	if name == "" {
		name = Name("role")
	}
	ctx := context.Background()
	role := pgx.Identifier{name}.Sanitize()
	q := "CREATE ROLE " + role + " LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE " + strings.Join(attrs, " ")
	if _, err := pool.Exec(ctx, q); err != nil {
		tb.Fatalf("pgtest: create role %q: %v", name, err)
	}
	tb.Cleanup(func() {
		for _, q := range []string{"DROP OWNED BY " + role + " CASCADE", "DROP ROLE " + role} {
			if _, err := pool.Exec(ctx, q); err != nil {
				tb.Errorf("pgtest: %s: %v", q, err)
				return
			}
		}
	})
	return name
}

// AsRole returns connURL with its user replaced by role (the test server
// trusts local connections).
func AsRole(tb testing.TB, connURL, role string) string {
	tb.Helper()
	u, err := url.Parse(connURL)
	if err != nil || (u.Scheme != "postgres" && u.Scheme != "postgresql") {
		tb.Fatalf("pgtest: %q is not a postgres:// URL", connURL)
	}
	u.User = url.User(role)
	return u.String()
}
