// Package migrate creates and upgrades pgoutbox's tables and functions.
//
// Migrations are plain SQL files embedded in the binary, numbered within a line:
// the "outbox" line (outbox_events, the per-aggregate sequence counters and the
// outbox_enqueue function) lives in the producer's database, the "inbox" line
// (processed_events and consumer_positions) in each consumer's. Both may share one database.
//
// Up applies what is missing, all of it in one transaction holding a
// transaction-scoped advisory lock: a failure leaves nothing of the run, and any
// number of processes may call Up at once (one applies, the others wait and then
// find the migrations recorded). The SQL is also idempotent (IF NOT EXISTS, CREATE
// OR REPLACE), so teams that run it through their own migration tool (see [SQL])
// can apply it twice without harm.
//
// The schema may have any name PostgreSQL accepts: the files name it only through
// placeholders that are quoted for the context they land in (expand.go). A database
// migrated by a newer pgoutbox is refused ([CheckCompatible]) unless its newer
// migrations are all expand steps ([Compat], [Window]): the compatibility window
// that lets a rollout migrate first and roll binaries after.
//
// Outside the standard library it pulls in pgx only (with pgpassfile,
// pgservicefile and golang.org/x/text): no broker client and no other pgoutbox
// package.
package migrate

import (
	"context"
	"crypto/md5"
	"embed"
	"encoding/hex"
	"errors"
	"fmt"
	"hash/fnv"
	"io/fs"
	"path"
	"slices"
	"strconv"
	"strings"
	"sync"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgoutbox/pgoutbox/internal/config"
)

// Line names a sequence of migrations that is versioned on its own.
type Line string

const (
	// LineOutbox holds the producer side: outbox_events, outbox_aggregate_sequences
	// and the outbox_enqueue function.
	LineOutbox Line = "outbox"
	// LineInbox holds the consumer side: processed_events and consumer_positions.
	LineInbox Line = "inbox"
)

// Lines lists every line in the order Up applies them.
var Lines = []Line{LineOutbox, LineInbox}

// DefaultSchema is the PostgreSQL schema used when Config.Schema is empty.
const DefaultSchema = "public"

// Table is the name of the bookkeeping table, created in the configured schema.
const Table = "pgoutbox_migrations"

//go:embed sql
var files embed.FS

// nextRelease, set only in a build with the tag pgoutbox_next_release
// (next_release.go), adds the migrations that stand in for the next release's
// to line, numbered from version: the mixed-version upgrade test builds the
// "new" binary with it. Nil in every other build.
var nextRelease func(line Line, version int) ([]Migration, error)

// Migration is one numbered SQL file of a line.
type Migration struct {
	Line    Line
	Version int
	Name    string
	// Compat says whether binaries that do not know this migration keep
	// running against a database that has it (the file's `-- compat:` line).
	Compat Compat
	sql    string // with the {{schema}} placeholder
}

// SQL returns the migration's statements for the given schema: {{schema}} becomes
// the quoted identifier and {{schema_name}} a string literal, each quoted for the
// context it lands in, including inside function bodies (see expand.go for the
// rules a migration file follows). Any schema name of at most 63 bytes is safe.
func (m Migration) SQL(schema string) string {
	out, err := expand(m.sql, schema)
	if err != nil {
		// All checked the file; the lexer's errors do not depend on the name.
		panic(fmt.Sprintf("migrate: %s: %v", m.fileName(), err))
	}
	return out
}

// All returns the embedded migrations of the given lines (every line when none is
// given), ordered by line and version.
func All(lines ...Line) ([]Migration, error) {
	if len(lines) == 0 {
		lines = Lines
	}
	byLine, err := embedded()
	if err != nil {
		return nil, err
	}
	var out []Migration
	for _, line := range lines {
		if !slices.Contains(Lines, line) {
			return nil, fmt.Errorf("migrate: unknown line %q (want one of %s)", line, lineList())
		}
		out = append(out, byLine[line]...)
	}
	return out, nil
}

// embedded reads and checks the embedded migrations of every line once: they
// never change, and every check of an outbox (CheckMigrated, once per tenant
// of a listing) asks for them. Callers get copies (All).
var embedded = sync.OnceValues(func() (map[Line][]Migration, error) {
	byLine := map[Line][]Migration{}
	for _, line := range Lines {
		dir := path.Join("sql", string(line))
		entries, err := fs.ReadDir(files, dir)
		if err != nil {
			return nil, fmt.Errorf("migrate: read embedded %s: %w", dir, err)
		}
		var out []Migration
		for _, e := range entries {
			m, err := parseFile(line, dir, e.Name())
			if err != nil {
				return nil, err
			}
			out = append(out, m)
		}
		if nextRelease != nil {
			m, err := nextRelease(line, len(entries)+1)
			if err != nil {
				return nil, err
			}
			out = append(out, m...)
		}
		// Versions of a line must be 1..n without holes: a hole means a file was lost.
		for i, m := range out {
			if m.Version != i+1 {
				return nil, fmt.Errorf("migrate: line %s: expected version %d, found %s", line, i+1, m.fileName())
			}
		}
		byLine[line] = out
	}
	return byLine, nil
})

func parseFile(line Line, dir, name string) (Migration, error) {
	base, ok := strings.CutSuffix(name, ".sql")
	num, rest, ok2 := strings.Cut(base, "_")
	version, err := strconv.Atoi(num)
	if !ok || !ok2 || err != nil || version < 1 {
		return Migration{}, fmt.Errorf("migrate: embedded file %s/%s is not named NNNN_name.sql", dir, name)
	}
	body, err := fs.ReadFile(files, path.Join(dir, name))
	if err != nil {
		return Migration{}, fmt.Errorf("migrate: read embedded %s/%s: %w", dir, name, err)
	}
	m := Migration{Line: line, Version: version, Name: rest, sql: string(body)}
	if _, err := expand(m.sql, "x"); err != nil {
		return Migration{}, fmt.Errorf("migrate: embedded file %s/%s: %w", dir, name, err)
	}
	if m.Compat, err = parseCompat(m.sql); err != nil {
		return Migration{}, fmt.Errorf("migrate: embedded file %s/%s: %w", dir, name, err)
	}
	return m, nil
}

func (m Migration) fileName() string { return fmt.Sprintf("%s/%04d_%s.sql", m.Line, m.Version, m.Name) }

func lineList() string { return joinLines(Lines) }

// Config selects what Up applies and where. A nil *Config migrates every line
// into the public schema.
type Config struct {
	// Schema is the PostgreSQL schema that holds pgoutbox's objects; it is created if
	// missing. Empty means DefaultSchema ("public").
	Schema string

	// Lines restricts the migration to these lines. Empty means all of them
	// ([Lines]: outbox, then inbox).
	Lines []Line

	// Partitioned creates outbox_events partitioned by RANGE (occurred_at), one
	// partition a day plus a default one, so that cleanup drops whole partitions
	// instead of deleting rows; see [CreatePartitions] and docs/design.md for the
	// trade-offs. It only matters when the outbox line is first applied: an
	// existing table keeps its kind, and Up refuses to turn a plain table into a
	// partitioned one (that takes a data migration). False means a plain table.
	Partitioned bool
}

// Validate reports every invalid field of c, each error naming its field; zero
// fields stand for their defaults, and a nil c (all defaults) is valid.
func (c *Config) Validate() error {
	_, err := c.withDefaults()
	return err
}

// withMigrations is withDefaults and the embedded migrations of the configured
// lines, in order.
func (c *Config) withMigrations() (Config, []Migration, error) {
	cfg, err := c.withDefaults()
	if err != nil {
		return Config{}, nil, err
	}
	all, err := All(cfg.Lines...)
	if err != nil {
		return Config{}, nil, err
	}
	return cfg, all, nil
}

// withDefaults returns a copy of c with defaults applied, and validates it.
func (c *Config) withDefaults() (Config, error) {
	return config.Resolve("migrate", c, func(c *Config) {
		config.Default(&c.Schema, DefaultSchema)
		if len(c.Lines) == 0 {
			c.Lines = Lines
		} else {
			c.Lines = slices.Clone(c.Lines)
		}
	}, func(c *Config, p *config.Problems) {
		p.Field("Config.Schema", ValidateSchema(c.Schema))
		checkLines(p, "Config.Lines", c.Lines)
	})
}

// checkLines records each unknown line of lines as a problem of field.
func checkLines(p *config.Problems, field string, lines []Line) {
	for _, l := range lines {
		p.Check(slices.Contains(Lines, l), "%s: unknown line %q (want one of %s)", field, l, lineList())
	}
}

// maxSchemaName is PostgreSQL's identifier limit, in bytes.
const maxSchemaName = 63

// ValidateSchema reports whether name can be used as a schema name. Any name that
// PostgreSQL accepts is fine (it is always quoted); it must be non-empty valid UTF-8
// without NUL bytes and at most 63 bytes long, PostgreSQL's identifier limit.
func ValidateSchema(name string) error {
	switch {
	case name == "":
		return errors.New("migrate: schema name must not be empty")
	case len(name) > maxSchemaName:
		return fmt.Errorf("migrate: schema name %q is longer than %d bytes", name, maxSchemaName)
	case !utf8.ValidString(name) || strings.ContainsRune(name, 0):
		return fmt.Errorf("migrate: schema name %q must be valid UTF-8 without NUL bytes", name)
	}
	return nil
}

// DB is what Up needs of a database handle: *pgxpool.Pool and *pgx.Conn both have it.
type DB interface {
	Begin(ctx context.Context) (pgx.Tx, error)
}

// Applied describes a migration that Up applied.
type Applied struct {
	Line    Line
	Version int
	Name    string
}

// Up applies the missing migrations of the configured lines, in order, and returns
// those it applied (none when the database was up to date). The whole run (the
// schema, the bookkeeping table, every missing migration with the row that
// records it, and the first partitions of a partitioned outbox) is one
// transaction holding an advisory lock of the schema: a migration that fails
// leaves nothing of the run behind, and concurrent callers wait for each other,
// then find the migrations recorded. ctx bounds the whole run, including that wait.
func Up(ctx context.Context, db DB, cfg *Config) ([]Applied, error) {
	c, all, err := cfg.withMigrations()
	if err != nil {
		return nil, err
	}
	return up(ctx, db, c, all)
}

// up applies the missing ones of all in one transaction.
func up(ctx context.Context, db DB, c Config, all []Migration) ([]Applied, error) {
	schema := c.Schema
	tx, err := db.Begin(ctx)
	if err != nil {
		return nil, fmt.Errorf("migrate: begin: %w", err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) // no-op after Commit
	// The lock serialises migrators of this schema, and is taken before anything is
	// created: concurrent CREATE SCHEMA/TABLE IF NOT EXISTS can still fail with a
	// unique violation in the catalogs.
	if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock($1)", lockKey(schema)); err != nil {
		return nil, fmt.Errorf("migrate: take advisory lock: %w", err)
	}
	if err := ensureBookkeeping(ctx, tx, schema); err != nil {
		return nil, err
	}
	done, err := appliedRows(ctx, tx, schema)
	if err != nil {
		return nil, err
	}
	if err := skewError(schema, c.Lines, done); err != nil {
		return nil, err
	}
	known := map[string]bool{}
	for _, r := range done {
		known[r.key()] = true
	}
	var applied []Applied
	for _, m := range all {
		if c.Partitioned && m.Line == LineOutbox && m.Version == 1 {
			if err := checkPartitionable(ctx, tx, schema); err != nil {
				return nil, err
			}
		}
		if known[appliedRow{line: string(m.Line), version: m.Version}.key()] {
			continue
		}
		// Simple protocol: a migration file holds several statements.
		q, err := migrationSQL(c, m)
		if err != nil {
			return nil, err
		}
		if _, err := tx.Exec(ctx, q, pgx.QueryExecModeSimpleProtocol); err != nil {
			return nil, fmt.Errorf("migrate: apply %s (nothing of this run was kept): %w", m.fileName(), err)
		}
		if _, err := tx.Exec(ctx, recordStmt(schema), string(m.Line), m.Version, m.Name, string(m.Compat)); err != nil {
			return nil, fmt.Errorf("migrate: record %s: %w", m.fileName(), err)
		}
		applied = append(applied, Applied{Line: m.Line, Version: m.Version, Name: m.Name})
	}
	if slices.Contains(c.Lines, LineOutbox) {
		// pgx.Tx.Begin is a savepoint: the partitions are part of this transaction.
		if _, err := CreatePartitions(ctx, tx, schema, DefaultPartitionsAhead); err != nil {
			return nil, err
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return nil, fmt.Errorf("migrate: commit: %w", err)
	}
	return applied, nil
}

func ensureBookkeeping(ctx context.Context, tx pgx.Tx, schema string) error {
	// CREATE SCHEMA IF NOT EXISTS checks the CREATE privilege on the database even when
	// the schema exists, so look first: a user allowed only into an existing schema can
	// still migrate.
	var exists bool
	if err := tx.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = $1)", schema).Scan(&exists); err != nil {
		return fmt.Errorf("migrate: look up schema %q: %w", schema, err)
	}
	if !exists {
		if _, err := tx.Exec(ctx, "CREATE SCHEMA IF NOT EXISTS "+pgx.Identifier{schema}.Sanitize()); err != nil {
			return fmt.Errorf("migrate: create schema %q: %w", schema, err)
		}
	}
	if _, err := tx.Exec(ctx, bookkeepingSQL(schema)); err != nil {
		return fmt.Errorf("migrate: create %s: %w", Table, err)
	}
	// ALTER TABLE locks the table even when the column exists, and relays
	// read it at start: alter only a table made before the column existed.
	var has bool
	if err := tx.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_attribute WHERE attrelid = $1::regclass AND attname = 'compat' AND NOT attisdropped)",
		table(schema)).Scan(&has); err != nil {
		return fmt.Errorf("migrate: look up the compat column of %s: %w", Table, err)
	}
	if !has {
		if _, err := tx.Exec(ctx, compatColumnSQL(schema)); err != nil {
			return fmt.Errorf("migrate: add the compat column to %s: %w", Table, err)
		}
	}
	return nil
}

func table(schema string) string { return pgx.Identifier{schema, Table}.Sanitize() }

func bookkeepingSQL(schema string) string {
	return fmt.Sprintf(`CREATE TABLE IF NOT EXISTS %s (
    line       text        NOT NULL,
    version    integer     NOT NULL,
    name       text        NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (line, version)
)`, table(schema))
}

// compatColumnSQL adds the column that records each migration's Compat to a
// bookkeeping table made before binaries stated their window; its rows of
// then stay NULL, which counts as contract.
func compatColumnSQL(schema string) string {
	return "ALTER TABLE " + table(schema) + " ADD COLUMN IF NOT EXISTS compat text CHECK (compat IN ('expand', 'contract'))"
}

func recordStmt(schema string) string {
	return "INSERT INTO " + table(schema) + " (line, version, name, compat) VALUES ($1, $2, $3, $4) ON CONFLICT (line, version) DO NOTHING"
}

// recordSQL is recordStmt with the values inlined, for the printed script.
func recordSQL(schema string, m Migration) string {
	return fmt.Sprintf("INSERT INTO %s (line, version, name, compat) VALUES (%s, %d, %s, %s) ON CONFLICT (line, version) DO NOTHING",
		table(schema), quoteLiteral(string(m.Line)), m.Version, quoteLiteral(m.Name), quoteLiteral(string(m.Compat)))
}

// lockKey derives the advisory lock id from the schema, so migrations of different
// schemas in one database do not wait for each other.
func lockKey(schema string) int64 {
	h := fnv.New64a()
	h.Write([]byte("pgoutbox/migrate/" + schema))
	return int64(h.Sum64())
}

// Status is the state of one migration in a database.
type Status struct {
	Line    Line
	Version int
	Name    string
	// Applied is false for a pending migration.
	Applied bool
	// Unknown is true for a migration the database has and this binary does not
	// know (a version above its newest, or another name under a known version):
	// the database was most likely migrated by a newer pgoutbox. Applied is true.
	Unknown bool
	// Compat is the migration's compatibility statement: the embedded file's,
	// or for an Unknown one what the binary that applied it recorded (empty
	// when it recorded none, which counts as contract).
	Compat Compat
}

// Querier is what State needs: *pgxpool.Pool, *pgx.Conn and pgx.Tx have it.
type Querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// appliedRow is one row of the bookkeeping table.
type appliedRow struct {
	line    string
	version int
	name    string
	compat  *string // NULL before binaries recorded it
}

func (r appliedRow) key() string { return r.line + "/" + strconv.Itoa(r.version) }

// appliedRows reads the bookkeeping table; a schema or table that does not exist
// means nothing is applied. It looks the table up first, so that inside a
// caller's transaction a missing table does not abort it.
func appliedRows(ctx context.Context, db Querier, schema string) ([]appliedRow, error) {
	rows, err := db.Query(ctx, "SELECT to_regclass($1) IS NOT NULL", table(schema))
	if err != nil {
		return nil, fmt.Errorf("migrate: look up %s: %w", Table, err)
	}
	exists, err := pgx.CollectExactlyOneRow(rows, pgx.RowTo[bool])
	if err != nil {
		return nil, fmt.Errorf("migrate: look up %s: %w", Table, err)
	}
	if !exists {
		return nil, nil
	}
	// to_jsonb reads compat from a table made before that column existed too
	// (as NULL); this binary only reads here, it never alters the table.
	rows, err = db.Query(ctx, "SELECT line, version, name, to_jsonb(m)->>'compat' FROM "+table(schema)+" m ORDER BY line, version")
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && (pgErr.Code == "42P01" || pgErr.Code == "3F000") { // undefined table or schema
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("migrate: read applied versions: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (appliedRow, error) {
		var a appliedRow
		err := r.Scan(&a.line, &a.version, &a.name, &a.compat)
		return a, err
	})
	if errors.As(err, &pgErr) && (pgErr.Code == "42P01" || pgErr.Code == "3F000") {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("migrate: read applied versions: %w", err)
	}
	return out, nil
}

// unknownRows returns the rows of lines (every line when empty, and then rows
// of lines this binary does not know too) that no embedded migration matches.
func unknownRows(lines []Line, rows []appliedRow) []Status {
	all, err := All()
	if err != nil {
		panic(err) // the embedded files are checked by tests
	}
	known := map[string]string{}
	for _, m := range all {
		known[string(m.Line)+"/"+strconv.Itoa(m.Version)] = m.Name
	}
	var out []Status
	for _, r := range rows {
		selected := slices.Contains(lines, Line(r.line)) || (len(lines) == len(Lines) && !slices.Contains(Lines, Line(r.line)))
		if name, ok := known[r.key()]; selected && (!ok || name != r.name) {
			st := Status{Line: Line(r.line), Version: r.version, Name: r.name, Applied: true, Unknown: true}
			if r.compat != nil {
				st.Compat = Compat(*r.compat)
			}
			out = append(out, st)
		}
	}
	return out
}

// ErrDatabaseNewer is the sentinel of a [SkewError]: errors.Is(err,
// ErrDatabaseNewer) reports version skew.
var ErrDatabaseNewer = errors.New("the database has migrations this pgoutbox does not know")

// SkewError reports a database whose applied migrations include some that this
// binary does not know and that are outside its compatibility window (contract
// steps, or recorded without a compat statement): it was migrated by a newer
// pgoutbox, whose tables and functions this one may misuse. Upgrade the binary;
// nothing must be changed in the database.
type SkewError struct {
	Schema  string
	Unknown []Status // the migrations outside the window; Applied and Unknown are true
	Newest  map[Line]int
}

func (e *SkewError) Error() string {
	var parts, have []string
	for _, s := range e.Unknown {
		c := string(s.Compat)
		if c == "" {
			c = "no compat recorded"
		}
		parts = append(parts, fmt.Sprintf("%s/%d %s (%s)", s.Line, s.Version, s.Name, c))
	}
	for _, l := range Lines {
		if v, ok := e.Newest[l]; ok {
			have = append(have, fmt.Sprintf("%s/%d", l, v))
		}
	}
	return fmt.Sprintf("migrate: schema %s has migrations applied that this pgoutbox does not know (%s; it knows up to %s): "+
		"the database was migrated by a newer pgoutbox; run that version (or newer) instead of this one",
		pgx.Identifier{e.Schema}.Sanitize(), strings.Join(parts, ", "), strings.Join(have, ", "))
}

// Is makes errors.Is(err, ErrDatabaseNewer) hold.
func (e *SkewError) Is(target error) bool { return target == ErrDatabaseNewer }

// skewError is a *SkewError listing the applied migrations of lines this
// binary does not know and that are outside its window (WithinWindow); nil
// when there are none.
func skewError(schema string, lines []Line, rows []appliedRow) error {
	var outside []Status
	for _, s := range unknownRows(lines, rows) {
		if !s.WithinWindow() {
			outside = append(outside, s)
		}
	}
	if len(outside) == 0 {
		return nil
	}
	return &SkewError{Schema: schema, Unknown: outside, Newest: newestKnown()}
}

// CheckCompatible returns a *[SkewError] (errors.Is [ErrDatabaseNewer]) when
// schema's bookkeeping table records a migration of lines (every line when none
// is given) that this binary does not know, unless every such migration is a
// newer version recorded as an expand step ([CompatExpand]): that is the
// compatibility window, which lets a rollout migrate first and roll binaries
// after (docs/operations.md, "Rolling upgrades"). A schema not migrated at all, or
// missing some migrations, is not skew: commands report what is missing their
// own way. It changes nothing. Relays, consumers and operator commands call it
// at start; see docs/operations.md.
func CheckCompatible(ctx context.Context, db Querier, schema string, lines ...Line) error {
	if err := ValidateSchema(schema); err != nil {
		return err
	}
	if len(lines) == 0 {
		lines = Lines
	}
	rows, err := appliedRows(ctx, db, schema)
	if err != nil {
		return err
	}
	return skewError(schema, lines, rows)
}

// State reports, for each embedded migration of the configured lines, whether the
// database has it, followed by the applied migrations this binary does not know
// (Unknown; see [CheckCompatible]). It changes nothing; a database never migrated
// reports every migration pending.
func State(ctx context.Context, db Querier, cfg *Config) ([]Status, error) {
	c, all, err := cfg.withMigrations()
	if err != nil {
		return nil, err
	}
	rows, err := appliedRows(ctx, db, c.Schema)
	if err != nil {
		return nil, err
	}
	return stateOf(c.Lines, all, rows), nil
}

// stateOf is State's answer for the migrations all of lines, rows being the
// bookkeeping table's.
func stateOf(lines []Line, all []Migration, rows []appliedRow) []Status {
	done := map[string]string{}
	for _, r := range rows {
		done[r.key()] = r.name
	}
	out := make([]Status, len(all))
	for i, m := range all {
		name, ok := done[string(m.Line)+"/"+strconv.Itoa(m.Version)]
		out[i] = Status{Line: m.Line, Version: m.Version, Name: m.Name, Applied: ok && name == m.Name}
	}
	return append(out, unknownRows(lines, rows)...)
}

// SQL returns the whole migration script of the configured lines for teams that apply
// it with their own tool: the schema, the bookkeeping table, then each migration
// followed by the row that records it, so that a later Up agrees with what was done.
// The script is idempotent and runs in psql as one transaction (it holds BEGIN/COMMIT).
func SQL(cfg *Config) (string, error) {
	c, all, err := cfg.withMigrations()
	if err != nil {
		return "", err
	}
	var b strings.Builder
	// A comment ends at a line break: the name is shown escaped (ASCII, no control character).
	fmt.Fprintf(&b, "-- pgoutbox migrations for schema %s, lines %s.\n", strconv.QuoteToASCII(c.Schema), joinLines(c.Lines))
	b.WriteString("BEGIN;\n")
	fmt.Fprintf(&b, "SELECT pg_advisory_xact_lock(%d);\n", lockKey(c.Schema))
	fmt.Fprintf(&b, "CREATE SCHEMA IF NOT EXISTS %s;\n", pgx.Identifier{c.Schema}.Sanitize())
	b.WriteString(bookkeepingSQL(c.Schema) + ";\n")
	b.WriteString(compatColumnSQL(c.Schema) + ";\n")
	for _, m := range all {
		fmt.Fprintf(&b, "\n-- %s\n", m.fileName())
		q, err := migrationSQL(c, m)
		if err != nil {
			return "", err
		}
		b.WriteString(strings.TrimRight(q, "\n") + "\n")
		b.WriteString(recordSQL(c.Schema, m) + ";\n")
	}
	if c.Partitioned && slices.Contains(c.Lines, LineOutbox) {
		fmt.Fprintf(&b, "\n-- the first partitions (run this daily, e.g. with pg_cron, unless pgoutbox cleanup runs)\n")
		fmt.Fprintf(&b, "SELECT %s(%d);\n", pgx.Identifier{c.Schema, "outbox_create_partitions"}.Sanitize(), DefaultPartitionsAhead)
	}
	b.WriteString("COMMIT;\n")
	return b.String(), nil
}

func joinLines(lines []Line) string {
	s := make([]string, len(lines))
	for i, l := range lines {
		s[i] = string(l)
	}
	return strings.Join(s, ", ")
}

// NotifyChannel returns the LISTEN/NOTIFY channel on which outbox_wake (outbox
// migration 4) announces commits to a schema's outbox: "pgoutbox.<schema>", or
// "pgoutbox.<md5 of schema>" when that exceeds PostgreSQL's 63-byte identifier limit.
func NotifyChannel(schema string) string {
	c := "pgoutbox." + schema
	if len(c) > 63 {
		sum := md5.Sum([]byte(schema))
		c = "pgoutbox." + hex.EncodeToString(sum[:])
	}
	return c
}

// IdleLockClass is the first key of a schema's idle lock, the session-level
// advisory lock (hashtext(IdleLockClass), hashtext(<schema>)) that a relay
// waiting for work holds in exclusive mode, and that outbox_wake (outbox
// migrations 4 and 5) tries to take in shared mode: a producer notifies on
// NotifyChannel(schema) only when it cannot, i.e. while some relay waits.
// docs/design.md ("Wake-up") describes the protocol; relay/hub.go holds the lock.
const IdleLockClass = "pgoutbox.idle"

// ParseLines parses a comma-separated list of line names; "all" or "" means every line.
func ParseLines(s string) ([]Line, error) {
	if s == "" || s == "all" {
		return Lines, nil
	}
	var out []Line
	for _, part := range strings.Split(s, ",") {
		l := Line(strings.TrimSpace(part))
		if !slices.Contains(Lines, l) {
			return nil, fmt.Errorf("unknown migration line %q (want all, %s)", part, lineList())
		}
		if !slices.Contains(out, l) {
			out = append(out, l)
		}
	}
	return out, nil
}
