package migrate

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5"
)

// A schema that holds an outbox is served by commands that run with rights of
// their own (a relay serving many tenants, an operator, a superuser), while any
// role with CREATE on the database can make a schema that looks like an outbox.
// Whatever the schema's owner attached to the tables (a trigger, a rule, a
// row-level-security policy, a default or an index calling its own function)
// would run inside the relay's and operator's statements, with their rights.
// So a tenant is served only when CheckTrusted, which reads the catalog alone,
// finds the schema and pgoutbox's tables owned by a trusted role and bare of
// anything pgoutbox did not create (docs/security.md, "A tenant is a trust
// boundary").

// ErrUntrusted is wrapped by CheckTrusted's error: the outbox's owner is not
// trusted, or its tables carry objects pgoutbox did not create.
var ErrUntrusted = errors.New("migrate: outbox refused")

// tables are the tables pgoutbox's migrations create in a schema (outbox and
// inbox lines), which CheckTrusted inspects. The partitions of a partitioned
// outbox_events are found through the catalog.
var tables = []string{
	Table, "outbox_events", "outbox_aggregate_sequences", "outbox_skipped_events",
	"outbox_operator_audit", "outbox_relays", "outbox_destinations", "outbox_destination_lanes",
	"outbox_attempts",
	"processed_events", "consumer_positions",
}

// Tables returns the names of the tables pgoutbox's migrations create in a
// schema, which CheckTrusted inspects (with their partitions and children).
func Tables() []string { return slices.Clone(tables) }

// MaxTrustedOwners bounds the roles a Trust may name.
const MaxTrustedOwners = 100

// Trust says which roles may own a served outbox: its schema, its tables and
// their partitions. A superuser is always trusted (it could run anything
// anyway), and so is any role that is a member of the role the check runs as
// (current_user): its code, run with current_user's rights, gains nothing it
// did not have. The predefined role pg_database_owner (which owns the "public"
// schema since PostgreSQL 15) is trusted when the database's owner is. The
// zero Trust trusts those only.
type Trust struct {
	// Owners names further trusted roles, e.g. the migrator role of
	// docs/security.md when the relay and operators run as roles of their own.
	// At most 100.
	Owners []string
}

// Validate reports a Trust that names too many roles, or a role name that is
// empty or holds control characters.
func (t Trust) Validate() error {
	if len(t.Owners) > MaxTrustedOwners {
		return fmt.Errorf("migrate: at most %d trusted owner roles, got %d", MaxTrustedOwners, len(t.Owners))
	}
	for _, o := range t.Owners {
		if err := ValidateRoleName(o); err != nil {
			return fmt.Errorf("migrate: trusted owner: %w", err)
		}
	}
	return nil
}

// ParseOwners parses a comma-separated list of role names (blank items
// ignored) into a Trust, checked by Trust.Validate.
func ParseOwners(s string) (Trust, error) {
	var t Trust
	for item := range strings.SplitSeq(s, ",") {
		if item = strings.TrimSpace(item); item != "" {
			t.Owners = append(t.Owners, item)
		}
		if len(t.Owners) > MaxTrustedOwners {
			break
		}
	}
	return t, t.Validate()
}

// trustQuery lists what makes a schema untrusted. It
// reads the catalog only, so it runs no code of the schema's owner. Each row is
// a finding: what kind, the catalog's description of the object, and a labelled
// detail (its owner, the foreign code it uses) or NULLs. $1 is the
// schema, $2 pgoutbox's table names, $3 the trusted owners named in Trust.
//
//   - rels is pgoutbox's tables in the schema and every partition or child of
//     them (a statement on a parent reaches its children, with their triggers
//     and policies), and attached their indexes (an index expression runs on
//     every insert and update);
//   - the owners of the schema and of rels must be trusted; pg_database_owner
//     (the owner of "public" since PostgreSQL 15) stands for the database's
//     owner;
//   - rels must be tables (a view or foreign table under pgoutbox's name would
//     run its definition), without row-level security, policies, triggers
//     (pgoutbox creates none: migration 4 dropped its only one), rules, or
//     foreign keys from or to them (pgoutbox creates none; a cascade would
//     reach another table's triggers);
//   - defaults, generated columns, check constraints, indexes and column types
//     of rels may use only pg_catalog's functions, operators and types.
const trustQuery = `
WITH RECURSIVE
ns AS (SELECT oid, nspowner FROM pg_catalog.pg_namespace WHERE nspname = $1),
named AS (
  SELECT r.oid FROM pg_catalog.pg_roles r
   WHERE r.rolsuper OR r.rolname = ANY($3::text[]) OR pg_catalog.pg_has_role(r.oid, current_user, 'MEMBER')),
trusted AS (
  SELECT oid FROM named
  UNION ALL
  SELECT r.oid FROM pg_catalog.pg_roles r
   WHERE r.rolname = 'pg_database_owner'
     AND (SELECT datdba FROM pg_catalog.pg_database WHERE datname = current_database()) IN (SELECT oid FROM named)),
rels(oid) AS (
  SELECT c.oid FROM pg_catalog.pg_class c JOIN ns ON c.relnamespace = ns.oid WHERE c.relname = ANY($2::text[])
  UNION
  SELECT i.inhrelid FROM pg_catalog.pg_inherits i JOIN rels ON i.inhparent = rels.oid),
attached(classid, objid) AS (
  SELECT 'pg_catalog.pg_class'::regclass, oid FROM rels
  UNION ALL SELECT 'pg_catalog.pg_class'::regclass, x.indexrelid FROM pg_catalog.pg_index x JOIN rels ON x.indrelid = rels.oid
  UNION ALL SELECT 'pg_catalog.pg_attrdef'::regclass, a.oid FROM pg_catalog.pg_attrdef a JOIN rels ON a.adrelid = rels.oid
  UNION ALL SELECT 'pg_catalog.pg_constraint'::regclass, k.oid FROM pg_catalog.pg_constraint k JOIN rels ON k.conrelid = rels.oid),
findings(kind, what, label, detail) AS (
SELECT 'owned by an untrusted role', pg_catalog.pg_describe_object('pg_catalog.pg_namespace'::regclass, ns.oid, 0),
       'owner', pg_catalog.pg_get_userbyid(ns.nspowner)::text
  FROM ns WHERE ns.nspowner NOT IN (SELECT oid FROM trusted)
UNION ALL
SELECT 'owned by an untrusted role', pg_catalog.pg_describe_object('pg_catalog.pg_class'::regclass, c.oid, 0),
       'owner', pg_catalog.pg_get_userbyid(c.relowner)::text
  FROM rels JOIN pg_catalog.pg_class c ON c.oid = rels.oid WHERE c.relowner NOT IN (SELECT oid FROM trusted)
UNION ALL
SELECT 'not a table', pg_catalog.pg_describe_object('pg_catalog.pg_class'::regclass, c.oid, 0), NULL, NULL
  FROM rels JOIN pg_catalog.pg_class c ON c.oid = rels.oid WHERE c.relkind NOT IN ('r', 'p')
UNION ALL
SELECT 'row-level security on', pg_catalog.pg_describe_object('pg_catalog.pg_class'::regclass, c.oid, 0), NULL, NULL
  FROM rels JOIN pg_catalog.pg_class c ON c.oid = rels.oid WHERE c.relrowsecurity OR c.relforcerowsecurity
UNION ALL
SELECT 'policy', pg_catalog.pg_describe_object('pg_catalog.pg_policy'::regclass, p.oid, 0), NULL, NULL
  FROM pg_catalog.pg_policy p JOIN rels ON p.polrelid = rels.oid
UNION ALL
SELECT 'trigger', pg_catalog.pg_describe_object('pg_catalog.pg_trigger'::regclass, t.oid, 0), NULL, NULL
  FROM pg_catalog.pg_trigger t JOIN rels ON t.tgrelid = rels.oid WHERE NOT t.tgisinternal
UNION ALL
SELECT 'foreign key', pg_catalog.pg_describe_object('pg_catalog.pg_constraint'::regclass, k.oid, 0), NULL, NULL
  FROM pg_catalog.pg_constraint k
 WHERE k.contype = 'f' AND (k.conrelid IN (SELECT oid FROM rels) OR k.confrelid IN (SELECT oid FROM rels))
UNION ALL
SELECT 'rule', pg_catalog.pg_describe_object('pg_catalog.pg_rewrite'::regclass, w.oid, 0), NULL, NULL
  FROM pg_catalog.pg_rewrite w JOIN rels ON w.ev_class = rels.oid
UNION ALL
SELECT 'code from outside pg_catalog in', pg_catalog.pg_describe_object(d.classid, d.objid, d.objsubid),
       'uses', pg_catalog.pg_describe_object(d.refclassid, d.refobjid, 0)
  FROM pg_catalog.pg_depend d JOIN attached a ON d.classid = a.classid AND d.objid = a.objid
 WHERE (d.refclassid = 'pg_catalog.pg_proc'::regclass
        AND (SELECT pronamespace FROM pg_catalog.pg_proc WHERE oid = d.refobjid) <> 'pg_catalog'::regnamespace)
    OR (d.refclassid = 'pg_catalog.pg_operator'::regclass
        AND (SELECT oprnamespace FROM pg_catalog.pg_operator WHERE oid = d.refobjid) <> 'pg_catalog'::regnamespace)
    OR (d.refclassid = 'pg_catalog.pg_type'::regclass AND d.deptype = 'n'
        AND (SELECT typnamespace FROM pg_catalog.pg_type WHERE oid = d.refobjid) <> 'pg_catalog'::regnamespace))
SELECT kind, what, label, detail FROM findings
 ORDER BY kind COLLATE "C", what COLLATE "C", detail COLLATE "C"
 LIMIT 20`

// beginner is a pool, connection or transaction: CheckTrusted runs its query
// in a transaction (or savepoint) of its own.
type beginner interface {
	Begin(ctx context.Context) (pgx.Tx, error)
}

// CheckTrusted reports whether schema's outbox may be served by a command
// serving many tenants: an error wrapping ErrUntrusted names what it found
// when the schema or one of pgoutbox's tables (or their partitions) is owned by
// a role trust does not trust, or when those tables carry row-level security,
// policies, triggers, rules, or defaults, constraints, indexes or column types
// that use functions, operators or types from outside pg_catalog. It reads the
// catalog only: nothing of the schema runs. Call it before any statement
// touches the schema's tables.
func CheckTrusted(ctx context.Context, db Querier, schema string, trust Trust) error {
	if err := ValidateSchema(schema); err != nil {
		return err
	}
	if err := trust.Validate(); err != nil {
		return err
	}
	owners := trust.Owners
	if owners == nil {
		owners = []string{}
	}
	if b, ok := db.(beginner); ok {
		if _, inTx := db.(pgx.Tx); !inTx {
			tx, err := b.Begin(ctx)
			if err != nil {
				return fmt.Errorf("migrate: check that schema %q is trusted: %w", schema, err)
			}
			defer func() { _ = tx.Rollback(ctx) }()
			db = tx
		}
	}
	var found []string
	var err error
	if tx, ok := db.(pgx.Tx); ok {
		found, err = trustFindingsTx(ctx, tx, schema, owners)
	} else {
		var rows pgx.Rows
		if rows, err = db.Query(ctx, trustQuery, schema, tables, owners); err == nil {
			found, err = collectFindings(rows)
		}
	}
	if err != nil {
		return fmt.Errorf("migrate: check that schema %q is trusted: %w", schema, err)
	}
	if len(found) > 0 {
		return fmt.Errorf("%w: schema %q: %s", ErrUntrusted, schema, strings.Join(found, "; "))
	}
	return nil
}

// trustFindingsTx runs trustQuery in tx with jit off. The planner's estimates
// for the catalog's joins are far too high (a never-analysed pg_inherits is
// taken for 10 pages), and with PostgreSQL's default jit the query is
// compiled: some 1.5 s of CPU for a few milliseconds of work, at every page of
// the console and every tenant of a listing. So it runs in a savepoint that
// sets jit off for it alone and is rolled back after it, all in one round
// trip: the check runs for every tenant of a listing, on a database that may
// be loaded. A failure rolls the savepoint back too, leaving tx usable.
func trustFindingsTx(ctx context.Context, tx pgx.Tx, schema string, owners []string) ([]string, error) {
	b := &pgx.Batch{}
	b.Queue("SAVEPOINT pgoutbox_trust")
	b.Queue("SET LOCAL jit = off")
	b.Queue(trustQuery, schema, tables, owners)
	b.Queue("ROLLBACK TO SAVEPOINT pgoutbox_trust")
	b.Queue("RELEASE SAVEPOINT pgoutbox_trust")
	br := tx.SendBatch(ctx, b)
	found, err := readTrustBatch(br)
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		if _, rerr := tx.Exec(ctx, "ROLLBACK TO SAVEPOINT pgoutbox_trust"); rerr == nil {
			_, _ = tx.Exec(ctx, "RELEASE SAVEPOINT pgoutbox_trust")
		}
		return nil, err
	}
	return found, nil
}

// readTrustBatch reads the findings of trustFindingsTx's batch: the two
// statements before the query, then the query's rows.
func readTrustBatch(br pgx.BatchResults) ([]string, error) {
	for range 2 {
		if _, err := br.Exec(); err != nil {
			return nil, err
		}
	}
	rows, err := br.Query()
	if err != nil {
		return nil, err
	}
	return collectFindings(rows)
}

// collectFindings reads trustQuery's rows, each as the text of one finding.
func collectFindings(rows pgx.Rows) ([]string, error) {
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (string, error) {
		var kind, what string
		var label, detail *string
		if err := r.Scan(&kind, &what, &label, &detail); err != nil {
			return "", err
		}
		if label != nil && detail != nil {
			return fmt.Sprintf("%s %q (%s %q)", kind, what, *label, *detail), nil
		}
		return fmt.Sprintf("%s %q", kind, what), nil
	})
}

// ErrNotMigrated is the sentinel of a [NotMigratedError]: errors.Is(err,
// ErrNotMigrated) reports a schema that lacks some of the outbox migrations.
var ErrNotMigrated = errors.New("migrate: outbox not migrated")

// NotMigratedError reports a schema that lacks an outbox migration this
// binary needs (all of them when it was never migrated). Running 'pgoutbox
// migrate' (or Up) on the schema fixes it.
type NotMigratedError struct {
	Schema string
	// Missing is the first migration not applied.
	Missing Status
}

func (e *NotMigratedError) Error() string {
	return fmt.Sprintf("migrate: schema %q lacks migration %s/%d %s: run 'pgoutbox migrate --schema %s' first",
		e.Schema, e.Missing.Line, e.Missing.Version, e.Missing.Name, e.Schema)
}

// Is makes errors.Is(err, ErrNotMigrated) hold.
func (e *NotMigratedError) Is(target error) bool { return target == ErrNotMigrated }

// CheckMigrated is the one check that schema holds an outbox this binary can
// work on, run by every command and service before it uses an outbox (the
// relay, a Group's tenants, the operator commands, the console): an error
// wrapping ErrDatabaseNewer (a *SkewError) when it was migrated by a newer
// pgoutbox (CheckCompatible), a *NotMigratedError (ErrNotMigrated) naming the
// first missing migration when it is not fully migrated. It changes nothing.
// An outbox served as one tenant of many is checked with CheckTenant instead.
//
// It reads the bookkeeping table once for both checks: it runs for every
// tenant of a listing (the console's overview), on a database that may be
// loaded.
func CheckMigrated(ctx context.Context, db Querier, schema string) error {
	if err := ValidateSchema(schema); err != nil {
		return err
	}
	lines := []Line{LineOutbox}
	all, err := All(lines...)
	if err != nil {
		return err
	}
	rows, err := appliedRows(ctx, db, schema)
	if err != nil {
		return err
	}
	if err := skewError(schema, lines, rows); err != nil {
		return err
	}
	for _, s := range stateOf(lines, all, rows) {
		if !s.Applied {
			return &NotMigratedError{Schema: schema, Missing: s}
		}
	}
	return nil
}

// CheckTenant is the check of an outbox served as one tenant of many:
// CheckTrusted, and only then, once nothing of the schema can run, CheckMigrated
// (which reads the schema's bookkeeping table).
func CheckTenant(ctx context.Context, db Querier, schema string, trust Trust) error {
	if err := CheckTrusted(ctx, db, schema, trust); err != nil {
		return err
	}
	return CheckMigrated(ctx, db, schema)
}
