package migrate

import "context"

// NewTestMigration returns a migration that is not embedded, for tests.
func NewTestMigration(line Line, version int, name, sql string) Migration {
	return Migration{Line: line, Version: version, Name: name, sql: sql}
}

// UpMigrations is Up applying the given list instead of the embedded one.
func UpMigrations(ctx context.Context, db DB, cfg *Config, all []Migration) ([]Applied, error) {
	c, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	return up(ctx, db, c, all)
}

// Expand is expand, for tests.
var Expand = expand

// Template returns m's file as embedded, placeholders unexpanded.
func Template(m Migration) string { return m.sql }

// PartitionedTemplate is sql/partitioned/outbox_events.sql as embedded.
var PartitionedTemplate = partitionedSQL

// ParseCompat is parseCompat, for tests.
var ParseCompat = parseCompat
