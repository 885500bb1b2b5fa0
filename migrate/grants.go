package migrate

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgoutbox/pgoutbox/internal/config"
)

// Role is one of the database roles pgoutbox's processes run as, each with the
// least privileges it needs (docs/security.md).
type Role string

const (
	// RoleMigrator runs "pgoutbox migrate" and owns every object it creates. It
	// needs CREATE on the schema (or on the database, to create the schema) and
	// is granted nothing here: an owner has every privilege on what it owns.
	RoleMigrator Role = "migrator"
	// RoleProducer enqueues events: the Go API or the outbox_enqueue function.
	RoleProducer Role = "producer"
	// RoleEnqueuer is a function-only producer: it may call outbox_enqueue, a
	// SECURITY DEFINER function (outbox migration 8), and nothing else, so it
	// cannot write the outbox's rows or counters itself. The Go API needs
	// RoleProducer.
	RoleEnqueuer Role = "enqueuer"
	// RoleRelay runs "pgoutbox relay": it claims, leases and marks events.
	RoleRelay Role = "relay"
	// RoleCDC runs "pgoutbox relay --source cdc". It also needs the REPLICATION
	// attribute, which is a role attribute, not a grant.
	RoleCDC Role = "cdc"
	// RoleConsumer runs inbox consumers (processed_events, consumer_positions).
	RoleConsumer Role = "consumer"
	// RoleOperator runs "pgoutbox status", "dlq", "replay" and "cleanup".
	RoleOperator Role = "operator"
)

// Roles lists the roles in the order Grants writes them.
var Roles = []Role{RoleMigrator, RoleProducer, RoleEnqueuer, RoleRelay, RoleCDC, RoleConsumer, RoleOperator}

// ParseRoles parses a comma-separated list of roles; "all" or "" means every role.
func ParseRoles(s string) ([]Role, error) {
	if s == "" || s == "all" {
		return Roles, nil
	}
	var out []Role
	for _, part := range strings.Split(s, ",") {
		r := Role(strings.TrimSpace(part))
		if !slices.Contains(Roles, r) {
			return nil, fmt.Errorf("unknown role %q (want all or a comma list of %s)", part, roleList())
		}
		if !slices.Contains(out, r) {
			out = append(out, r)
		}
	}
	return out, nil
}

func roleList() string {
	s := make([]string, len(Roles))
	for i, r := range Roles {
		s[i] = string(r)
	}
	return strings.Join(s, ", ")
}

// DefaultRoleName returns the role name Grants uses for r unless told otherwise:
// "pgoutbox_" followed by the role, e.g. pgoutbox_producer.
func DefaultRoleName(r Role) string { return "pgoutbox_" + string(r) }

// ObjectKind is the kind of object a Privilege is on.
type ObjectKind string

// Object kinds of a Privilege.
const (
	ObjectSchema   ObjectKind = "SCHEMA"
	ObjectTable    ObjectKind = "TABLE"
	ObjectFunction ObjectKind = "FUNCTION"
)

// Privilege is what one role needs on one object of the schema.
type Privilege struct {
	Role Role
	// Line is the migration line that creates the object; empty for objects of
	// every line (the schema, the bookkeeping table).
	Line Line
	Kind ObjectKind
	// Object is the table or function name; empty for the schema itself.
	Object string
	// Args are a function's argument types, as GRANT ON FUNCTION needs them.
	Args string
	// Privileges is the privilege list as written after GRANT, column lists
	// included, e.g. "SELECT, UPDATE (claimed_by)".
	Privileges string
	// Partitioned marks objects that only a partitioned outbox has.
	Partitioned bool
	// Why says which statement needs it.
	Why string
}

// relayColumns are the columns of outbox_events a relay writes: the lease, the
// outcome and the failure record, never an event's content.
const relayColumns = "claimed_by, claim_until, published_at, attempt_count, last_error, available_at, quarantined_at"

// privileges is the single source of the least-privilege grants: Grants writes
// them, docs/security.md explains them and the tests run every command as these
// roles. A new table or function a role uses is one more row here.
var privileges = []Privilege{
	{RoleProducer, "", ObjectSchema, "", "", "USAGE", false, "find the objects"},
	{RoleProducer, LineOutbox, ObjectTable, "outbox_events", "", "INSERT, SELECT (aggregate_sequence)", false,
		"insert the event; the Go API's INSERT ... RETURNING aggregate_sequence"},
	{RoleProducer, LineOutbox, ObjectTable, "outbox_aggregate_sequences", "", "SELECT, INSERT, UPDATE (last_sequence)", false,
		"the per-aggregate counter upsert (INSERT ... ON CONFLICT DO UPDATE ... RETURNING)"},
	{RoleProducer, LineOutbox, ObjectFunction, "outbox_enqueue", "text, text, text, jsonb, integer, jsonb", "EXECUTE", false,
		"enqueue from SQL"},
	{RoleProducer, LineOutbox, ObjectFunction, "outbox_wake", "", "EXECUTE", false, "wake an idle relay at commit"},
	{RoleProducer, "", ObjectTable, Table, "", "SELECT", false, "check the schema's migrations"},

	{RoleEnqueuer, "", ObjectSchema, "", "", "USAGE", false, "find the function"},
	{RoleEnqueuer, LineOutbox, ObjectFunction, "outbox_enqueue", "text, text, text, jsonb, integer, jsonb", "EXECUTE", false,
		"enqueue from SQL; the function runs with its owner's rights"},

	{RoleRelay, "", ObjectSchema, "", "", "USAGE", false, "find the objects"},
	{RoleRelay, LineOutbox, ObjectTable, "outbox_events", "", "SELECT, UPDATE (" + relayColumns + ")", false,
		"claim (SELECT ... FOR UPDATE SKIP LOCKED), lease, mark, fail, release; the backlog metrics"},
	{RoleRelay, "", ObjectTable, Table, "", "SELECT", false, "check the schema's migrations at start"},
	{RoleRelay, LineOutbox, ObjectTable, "outbox_relays", "", "SELECT, INSERT, UPDATE", false,
		"the relay's heartbeat (INSERT ... ON CONFLICT DO UPDATE)"},
	{RoleRelay, LineOutbox, ObjectTable, "outbox_attempts", "", "SELECT, INSERT, DELETE", false,
		"the fail statement writes each failure's attempt row and keeps an event's 20 newest"},
	{RoleRelay, LineOutbox, ObjectTable, "outbox_destinations", "", "SELECT, INSERT, UPDATE (rules, updated_at)", false,
		"register the relay's destinations at start"},
	{RoleRelay, LineOutbox, ObjectTable, "outbox_aggregate_sequences", "", "SELECT", false,
		"a destination registered with start now begins after each lane's last sequence"},
	{RoleRelay, LineOutbox, ObjectTable, "outbox_destination_lanes", "", "SELECT, INSERT, UPDATE", false,
		"a destination's progress per lane: lease, deliver, fail, quarantine"},
	{RoleRelay, LineOutbox, ObjectTable, "outbox_operator_audit", "", "INSERT", false,
		"audit a change of a destination's rules at registration"},

	{RoleCDC, "", ObjectSchema, "", "", "USAGE", false, "find the objects"},
	{RoleCDC, LineOutbox, ObjectTable, "outbox_events", "", "SELECT, UPDATE (" + relayColumns + ")", false,
		"take over, mark, fail and lease events; the table path"},
	{RoleCDC, "", ObjectTable, Table, "", "SELECT", false, "check the schema's migrations at start"},
	{RoleCDC, LineOutbox, ObjectTable, "outbox_relays", "", "SELECT, INSERT, UPDATE", false,
		"the source's heartbeat (INSERT ... ON CONFLICT DO UPDATE)"},
	{RoleCDC, LineOutbox, ObjectTable, "outbox_attempts", "", "SELECT, INSERT, DELETE", false,
		"the fail statement writes each failure's attempt row and keeps an event's 20 newest"},

	{RoleConsumer, "", ObjectSchema, "", "", "USAGE", false, "find the objects"},
	{RoleConsumer, LineInbox, ObjectTable, "processed_events", "", "SELECT, INSERT", false, "the dedup row"},
	{RoleConsumer, LineInbox, ObjectTable, "consumer_positions", "", "SELECT, INSERT, UPDATE (last_sequence, updated_at)", false,
		"lock and move the per-aggregate position"},
	{RoleConsumer, "", ObjectTable, Table, "", "SELECT", false, "check the schema's migrations"},

	{RoleOperator, "", ObjectSchema, "", "", "USAGE", false, "find the objects"},
	{RoleOperator, LineOutbox, ObjectTable, "outbox_events", "",
		"SELECT, DELETE, UPDATE (published_at, quarantined_at, attempt_count, available_at, claimed_by, claim_until)", false,
		"status, dlq list/show, replay (read); dlq retry and skip (update); cleanup (delete)"},
	{RoleOperator, LineOutbox, ObjectTable, "outbox_skipped_events", "", "SELECT, INSERT", false,
		"the audit row of dlq skip; status counts skips"},
	{RoleOperator, LineOutbox, ObjectTable, "outbox_operator_audit", "", "SELECT, INSERT, UPDATE (outcome)", false,
		"audit dlq retry, skip and replay (INSERT ... RETURNING audit_id; a replay's outcome)"},
	{RoleOperator, LineOutbox, ObjectTable, "outbox_relays", "", "SELECT, DELETE", false,
		"status and the console show the relays' heartbeats; cleanup deletes old ones"},
	{RoleOperator, LineOutbox, ObjectTable, "outbox_attempts", "", "SELECT, DELETE", false,
		"dlq show and the console show an event's attempts; cleanup deletes them with the event"},
	{RoleOperator, LineOutbox, ObjectTable, "outbox_destinations", "", "SELECT, DELETE", false,
		"status lists the destinations; destinations drop deletes one"},
	{RoleOperator, LineOutbox, ObjectTable, "outbox_destination_lanes", "",
		"SELECT, DELETE, UPDATE (delivered_sequence, attempt_count, available_at, claimed_by, claim_until, last_error, quarantined_at, quarantined_sequence)", false,
		"status, dlq list/show per destination (read); dlq retry and skip (update); destinations drop (delete)"},
	{RoleOperator, LineOutbox, ObjectFunction, "outbox_create_partitions", "integer", "EXECUTE", true,
		"cleanup creates the partitions ahead (the table's owner only: see docs/security.md)"},
	{RoleOperator, LineInbox, ObjectTable, "processed_events", "", "SELECT, DELETE, UPDATE (processed_at)", false,
		"cleanup --inbox-retention (its batches lock rows FOR UPDATE SKIP LOCKED, which takes UPDATE on a column)"},
	{RoleOperator, "", ObjectTable, Table, "", "SELECT", false, "check the schema's migrations"},
}

// Privileges returns the least-privilege table, one row per role and object, in
// the order Grants writes it.
func Privileges() []Privilege { return slices.Clone(privileges) }

// GrantsConfig says what Grants writes the statements for.
type GrantsConfig struct {
	// Schema holds pgoutbox's objects. Defaults to "public".
	Schema string
	// Lines restricts the grants to the objects of these lines. Defaults to all.
	Lines []Line
	// Partitioned adds the grants on the objects of a partitioned outbox
	// (outbox_create_partitions). Defaults to false.
	Partitioned bool
	// RoleNames maps a role to the database role that plays it. A role missing
	// from the map is named DefaultRoleName(role).
	RoleNames map[Role]string
	// Roles restricts the script to these roles. Defaults to all of them.
	Roles []Role
}

// ErrRoleName is wrapped by the errors of ValidateRoleName.
var ErrRoleName = errors.New("migrate: invalid role name")

// ValidateRoleName reports whether name can be granted privileges. Any name
// PostgreSQL accepts is fine (it is always quoted) except those GRANT treats
// specially: "public" (even quoted, it means every role) and "none", names
// starting with "pg_" (reserved for the system's predefined roles, whose members
// would all get the privileges), and names with control characters.
func ValidateRoleName(name string) error {
	switch {
	case name == "":
		return fmt.Errorf("%w: it must not be empty", ErrRoleName)
	case len(name) > 63:
		return fmt.Errorf("%w: %q is longer than 63 bytes", ErrRoleName, name)
	case !utf8.ValidString(name):
		return fmt.Errorf("%w: %q is not valid UTF-8", ErrRoleName, name)
	case strings.ContainsFunc(name, unicode.IsControl):
		return fmt.Errorf("%w: %q holds control characters", ErrRoleName, name)
	case name == "public" || name == "none":
		return fmt.Errorf("%w: %q is reserved (GRANT TO public grants to every role)", ErrRoleName, name)
	case strings.HasPrefix(name, "pg_"):
		return fmt.Errorf("%w: %q: names starting with pg_ are reserved for PostgreSQL's predefined roles", ErrRoleName, name)
	}
	return nil
}

// Validate reports every invalid field of c, each error naming its field; zero
// fields stand for their defaults, and a nil c (all defaults) is valid.
func (c *GrantsConfig) Validate() error {
	_, err := c.withDefaults()
	return err
}

// withDefaults returns a copy of c with defaults applied, and validates it.
func (c *GrantsConfig) withDefaults() (GrantsConfig, error) {
	return config.Resolve("migrate", c, func(c *GrantsConfig) {
		config.Default(&c.Schema, DefaultSchema)
		if len(c.Lines) == 0 {
			c.Lines = Lines
		}
		if len(c.Roles) == 0 {
			c.Roles = Roles
		}
	}, func(c *GrantsConfig, p *config.Problems) {
		p.Field("GrantsConfig.Schema", ValidateSchema(c.Schema))
		checkLines(p, "GrantsConfig.Lines", c.Lines)
		for _, r := range c.Roles {
			p.Check(slices.Contains(Roles, r), "GrantsConfig.Roles: unknown role %q", r)
		}
		for _, r := range slices.Sorted(maps.Keys(c.RoleNames)) {
			if !slices.Contains(Roles, r) {
				p.Check(false, "GrantsConfig.RoleNames: unknown role %q", r)
				continue
			}
			p.Field(fmt.Sprintf("GrantsConfig.RoleNames[%s]", r), ValidateRoleName(c.RoleNames[r]))
		}
	})
}

// Grants returns the GRANT statements that give each role the privileges it needs
// on the schema's objects, as one script that runs in a transaction. Run it as the
// objects' owner (the migrator) after "pgoutbox migrate", and again after
// migrations that add objects; GRANT is idempotent. The roles must exist (CREATE
// ROLE ... LOGIN, without SUPERUSER). Every name is quoted; no name appears in a
// comment.
func Grants(cfg *GrantsConfig) (string, error) {
	c, err := cfg.withDefaults()
	if err != nil {
		return "", err
	}
	names := map[Role]string{}
	for _, r := range Roles {
		names[r] = DefaultRoleName(r)
	}
	maps.Copy(names, c.RoleNames)

	var b strings.Builder
	b.WriteString("-- pgoutbox least-privilege grants (docs/security.md). Run as the owner of the objects,\n")
	b.WriteString("-- after pgoutbox migrate; the roles must exist (LOGIN, no SUPERUSER).\n")
	b.WriteString("BEGIN;\n")
	for _, r := range Roles {
		if !slices.Contains(c.Roles, r) {
			continue
		}
		var rows []Privilege
		for _, p := range privileges {
			if p.Role != r || (p.Partitioned && !c.Partitioned) || (p.Line != "" && !slices.Contains(c.Lines, p.Line)) {
				continue
			}
			rows = append(rows, p)
		}
		if !slices.ContainsFunc(rows, func(p Privilege) bool { return p.Kind != ObjectSchema && p.Object != Table }) {
			continue // nothing of this role's lines is in the script
		}
		fmt.Fprintf(&b, "\n-- %s\n", r)
		if r == RoleCDC {
			b.WriteString("-- Also: the REPLICATION attribute (ALTER ROLE ... REPLICATION, as a superuser), and the\n")
			b.WriteString("-- publication and column defaults prepared once by the owner (docs/security.md); with\n")
			b.WriteString("-- synchronous standbys, GRANT pg_monitor TO the role (their positions in pg_stat_replication).\n")
		}
		if r == RoleOperator && c.Partitioned {
			b.WriteString("-- Partitioned: creating and dropping partitions is the table owner's; run cleanup as\n")
			b.WriteString("-- a member of the owner role (docs/security.md).\n")
		}
		role := pgx.Identifier{names[r]}.Sanitize()
		for _, p := range rows {
			var obj string
			switch p.Kind {
			case ObjectSchema:
				obj = pgx.Identifier{c.Schema}.Sanitize()
			case ObjectFunction:
				obj = pgx.Identifier{c.Schema, p.Object}.Sanitize() + "(" + p.Args + ")"
			default:
				obj = pgx.Identifier{c.Schema, p.Object}.Sanitize()
			}
			fmt.Fprintf(&b, "GRANT %s ON %s %s TO %s;\n", p.Privileges, p.Kind, obj, role)
		}
	}
	b.WriteString("COMMIT;\n")
	return b.String(), nil
}

// ErrPermissionDenied is wrapped by CheckPrivileges' error, and is what
// IsPermissionDenied recognises in a database error (SQLSTATE 42501).
var ErrPermissionDenied = errors.New("permission denied")

// IsPermissionDenied reports whether err is PostgreSQL's insufficient_privilege
// (SQLSTATE 42501, "permission denied for table ...") or wraps ErrPermissionDenied:
// the database is reachable and refuses, which no retry cures.
func IsPermissionDenied(err error) bool {
	var pgErr *pgconn.PgError
	return errors.Is(err, ErrPermissionDenied) || (errors.As(err, &pgErr) && pgErr.Code == "42501")
}

// CheckPrivileges reports, without changing anything, which privileges of role's
// rows in the table of Privileges the connected user lacks on schema's objects
// (granted directly, through a role it inherits, or as the owner). The error
// wraps ErrPermissionDenied and names each missing privilege; objects that do not
// exist are not checked (the migration check reports them).
func CheckPrivileges(ctx context.Context, db Querier, schema string, role Role, partitioned bool) error {
	if err := ValidateSchema(schema); err != nil {
		return err
	}
	var objs, kinds, privs []string
	for _, p := range privileges {
		if p.Role != role || (p.Partitioned && !partitioned) {
			continue
		}
		for _, priv := range splitPrivileges(p.Privileges) {
			switch p.Kind {
			case ObjectSchema:
				objs = append(objs, schema)
			case ObjectFunction:
				objs = append(objs, pgx.Identifier{schema, p.Object}.Sanitize()+"("+p.Args+")")
			default:
				objs = append(objs, pgx.Identifier{schema, p.Object}.Sanitize())
			}
			kinds, privs = append(kinds, string(p.Kind)), append(privs, priv)
		}
	}
	// Each check runs only when its object exists, so a missing table is not a
	// missing privilege. A column privilege "UPDATE (a, b)" is checked per column.
	rows, err := db.Query(ctx, `
SELECT c.kind, c.obj, c.priv, current_user::text
  FROM unnest($1::text[], $2::text[], $3::text[]) AS c (kind, obj, priv)
 WHERE NOT CASE c.kind
   WHEN 'SCHEMA' THEN NOT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = c.obj) OR has_schema_privilege(c.obj, c.priv)
   WHEN 'FUNCTION' THEN to_regprocedure(c.obj) IS NULL OR has_function_privilege(to_regprocedure(c.obj), c.priv)
   ELSE to_regclass(c.obj) IS NULL OR CASE WHEN c.priv ~ '\('
        THEN (SELECT bool_and(has_column_privilege(to_regclass(c.obj), btrim(col), split_part(c.priv, ' ', 1)))
                FROM unnest(string_to_array(btrim(substring(c.priv FROM '\((.*)\)')), ',')) AS col)
        ELSE has_table_privilege(to_regclass(c.obj), c.priv) END
 END`, kinds, objs, privs)
	if err != nil {
		return fmt.Errorf("migrate: check the privileges of the %s role: %w", role, err)
	}
	type gap struct{ kind, obj, priv, user string }
	missing, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (gap, error) {
		var g gap
		return g, r.Scan(&g.kind, &g.obj, &g.priv, &g.user)
	})
	if err != nil {
		return fmt.Errorf("migrate: check the privileges of the %s role: %w", role, err)
	}
	if len(missing) == 0 {
		return nil
	}
	parts := make([]string, len(missing))
	for i, g := range missing {
		obj := g.obj
		if g.kind == string(ObjectSchema) {
			obj = pgx.Identifier{g.obj}.Sanitize()
		}
		parts[i] = g.priv + " ON " + g.kind + " " + obj
	}
	return fmt.Errorf("%w: role %s lacks %s (the %s role's grants: pgoutbox migrate print --grants; docs/security.md)",
		ErrPermissionDenied, pgx.Identifier{missing[0].user}.Sanitize(), strings.Join(parts, ", "), role)
}

// splitPrivileges splits "SELECT, UPDATE (a, b)" into "SELECT" and "UPDATE (a, b)".
func splitPrivileges(s string) []string {
	var out []string
	depth, start := 0, 0
	for i, r := range s {
		switch r {
		case '(':
			depth++
		case ')':
			depth--
		case ',':
			if depth == 0 {
				out = append(out, strings.TrimSpace(s[start:i]))
				start = i + 1
			}
		}
	}
	return append(out, strings.TrimSpace(s[start:]))
}
