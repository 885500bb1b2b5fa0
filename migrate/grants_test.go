package migrate_test

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgoutbox/pgoutbox"
	"github.com/pgoutbox/pgoutbox/internal/pgtest"
	"github.com/pgoutbox/pgoutbox/migrate"
)

// hostileNames are schema and role names that would run SQL if pasted into a
// statement unquoted, or break out of a quoted identifier or a comment.
var hostileNames = []string{
	`x"; CREATE TABLE pwned (); --`,
	`'; DROP TABLE pgoutbox_migrations; --`,
	`a;b`,
	`$s$; SELECT 1; $s$`,
	`$$`,
	`Upper Case`,
	`"`,
	`""`,
	`\`,
	`émoji ☃`,
	`x) TO public; GRANT ALL ON ALL TABLES IN SCHEMA public TO (y`,
	`-- comment`,
	`/* open`,
	`public`, // as a schema name only: a role of that name is refused
}

// shape replaces each occurrence of the quoted forms of names with a marker, so
// that two scripts can be compared for structure.
func shape(script string, names map[string]string) string {
	// Longest first: a quoted name may begin with another's quoted form.
	type pair struct{ quoted, marker string }
	var pairs []pair
	for marker, name := range names {
		pairs = append(pairs, pair{pgx.Identifier{name}.Sanitize(), marker})
	}
	slices.SortFunc(pairs, func(a, b pair) int { return cmp.Or(len(b.quoted)-len(a.quoted), strings.Compare(a.marker, b.marker)) })
	var args []string
	for _, p := range pairs {
		args = append(args, p.quoted, p.marker)
	}
	return strings.NewReplacer(args...).Replace(script)
}

// grantsShape is the script for benign names, whose shape every hostile
// script must have.
func grantsShape(t testing.TB, schema string, roles map[migrate.Role]string, partitioned bool) string {
	t.Helper()
	script, err := migrate.Grants(&migrate.GrantsConfig{Schema: schema, RoleNames: roles, Partitioned: partitioned})
	if err != nil {
		t.Fatalf("Grants(%q, %q): %v", schema, roles, err)
	}
	markers := map[string]string{"<schema>": schema}
	for r, n := range roles {
		markers["<"+string(r)+">"] = n
	}
	return shape(script, markers)
}

func benignRoles() map[migrate.Role]string {
	out := map[migrate.Role]string{}
	for _, r := range migrate.Roles {
		out[r] = "benign_" + string(r)
	}
	return out
}

// checkHostile asserts that the script for schema and role name n has the
// benign script's shape: names only ever appear quoted, in identifier position,
// never in a comment.
func checkHostile(t testing.TB, schema, role string, partitioned bool) {
	t.Helper()
	want := grantsShape(t, "benign_schema", benignRoles(), partitioned)
	roles := benignRoles()
	roles[migrate.RoleRelay] = role
	got := grantsShape(t, schema, roles, partitioned)
	if got != want {
		t.Fatalf("schema %q, relay role %q: the script's shape differs from a benign one:\n%s\n--- want\n%s", schema, role, got, want)
	}
}

func TestGrantsQuoteEveryName(t *testing.T) {
	t.Parallel()
	for _, name := range hostileNames {
		for _, partitioned := range []bool{false, true} {
			// The role's name differs from the schema's, so that the shapes can tell them apart.
			checkHostile(t, name, "r"+name, partitioned)
		}
	}
}

func TestGrantsRefuseBadRoleNames(t *testing.T) {
	t.Parallel()
	for _, name := range []string{"", "public", "none", "pg_monitor", "pg_read_all_data", "pg_", "a\nb", "a\x00b", "tab\there",
		"\r", strings.Repeat("r", 64), "\xff"} {
		err := migrate.ValidateRoleName(name)
		if !errors.Is(err, migrate.ErrRoleName) {
			t.Errorf("ValidateRoleName(%q) = %v, want ErrRoleName", name, err)
		}
		_, err = migrate.Grants(&migrate.GrantsConfig{RoleNames: map[migrate.Role]string{migrate.RoleProducer: name}})
		if !errors.Is(err, migrate.ErrRoleName) {
			t.Errorf("Grants with producer role %q = %v, want ErrRoleName", name, err)
		}
	}
	for _, name := range []string{"PUBLIC", "Public", "None", "app", `a"b`, strings.Repeat("r", 63), "ドメイン"} {
		if err := migrate.ValidateRoleName(name); err != nil {
			t.Errorf("ValidateRoleName(%q): %v", name, err)
		}
	}
	if _, err := migrate.Grants(&migrate.GrantsConfig{RoleNames: map[migrate.Role]string{"root": "x"}}); err == nil {
		t.Error("an unknown role was accepted")
	}
	if _, err := migrate.Grants(&migrate.GrantsConfig{Schema: "a\x00b"}); err == nil {
		t.Error("a schema with NUL was accepted")
	}
}

// The script holds only the lines' objects: no inbox table for the outbox line.
func TestGrantsFollowLines(t *testing.T) {
	t.Parallel()
	out, err := migrate.Grants(&migrate.GrantsConfig{Lines: []migrate.Line{migrate.LineOutbox}})
	pgtest.Must(t, err, "grants")
	if strings.Contains(out, "processed_events") || strings.Contains(out, "pgoutbox_consumer") || !strings.Contains(out, "outbox_events") {
		t.Fatalf("outbox line:\n%s", out)
	}
	out, err = migrate.Grants(&migrate.GrantsConfig{Lines: []migrate.Line{migrate.LineInbox}})
	pgtest.Must(t, err, "grants")
	if strings.Contains(out, "outbox_events") || strings.Contains(out, "pgoutbox_producer") || !strings.Contains(out, `TO "pgoutbox_consumer"`) {
		t.Fatalf("inbox line:\n%s", out)
	}
	if strings.Contains(out, "outbox_create_partitions") {
		t.Fatalf("a plain outbox's grants name outbox_create_partitions:\n%s", out)
	}
}

func FuzzGrants(f *testing.F) {
	for _, n := range hostileNames {
		f.Add(n, "r"+n)
	}
	f.Add("public", "app")
	f.Add("s\nGRANT ALL ON SCHEMA public TO x;\n--", "y")
	f.Fuzz(func(t *testing.T, schema, role string) {
		if migrate.ValidateSchema(schema) != nil || migrate.ValidateRoleName(role) != nil {
			return
		}
		// A name the markers or the benign names would be confused with tells nothing.
		qs, qr := pgx.Identifier{schema}.Sanitize(), pgx.Identifier{role}.Sanitize()
		if strings.Contains(qs, qr) || strings.Contains(qr, qs) {
			return
		}
		for _, s := range []string{schema, role} {
			if strings.Contains(s, "benign") || strings.ContainsAny(s, "<>") {
				return
			}
		}
		checkHostile(t, schema, role, true)
	})
}

// migratedAs creates the roles and a schema owned by the migrator role, migrates
// it as that role (no superuser), and applies the printed grants as that role.
type grantsEnv struct {
	admin  *pgxpool.Pool // superuser
	schema string
	roles  map[migrate.Role]string
	pools  map[migrate.Role]*pgxpool.Pool
}

func newGrantsEnv(t *testing.T, schema string, roleSuffix string) *grantsEnv {
	t.Helper()
	ctx := context.Background()
	admin := pgtest.Pool(t, pgtest.URL(), 2)
	e := &grantsEnv{admin: admin, schema: schema, roles: map[migrate.Role]string{}, pools: map[migrate.Role]*pgxpool.Pool{}}
	t.Cleanup(func() {
		_, _ = admin.Exec(ctx, "DROP SCHEMA IF EXISTS "+pgx.Identifier{schema}.Sanitize()+" CASCADE")
	})
	for _, r := range migrate.Roles {
		e.roles[r] = pgtest.Role(t, admin, pgtest.Name(string(r)[:3])+roleSuffix)
	}
	_, err := admin.Exec(ctx, "CREATE SCHEMA "+pgx.Identifier{schema}.Sanitize()+" AUTHORIZATION "+pgx.Identifier{e.roles[migrate.RoleMigrator]}.Sanitize())
	pgtest.Must(t, err, "create schema")
	for _, r := range migrate.Roles {
		e.pools[r] = pgtest.Pool(t, pgtest.AsRole(t, pgtest.URL(), e.roles[r]), 2)
	}
	_, err = migrate.Up(ctx, e.pools[migrate.RoleMigrator], &migrate.Config{Schema: schema})
	pgtest.Must(t, err, "migrate as the migrator role")
	script, err := migrate.Grants(&migrate.GrantsConfig{Schema: schema, RoleNames: e.roles})
	pgtest.Must(t, err, "grants")
	_, err = e.pools[migrate.RoleMigrator].Exec(ctx, script, pgx.QueryExecModeSimpleProtocol)
	pgtest.Must(t, err, "apply the grants as the migrator role")
	return e
}

// Acceptance: under hostile schema and role names the printed grants apply as
// the (non-superuser) owner, give each role what CheckPrivileges wants, run no
// injected statement, and a producer enqueues with the Go API and the SQL
// function while a role without them is refused.
func TestGrantsApplyUnderHostileNames(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for i, name := range []string{`x"; CREATE TABLE pwned (); --`, `$s$; SELECT 1; $s$`, `Upper "Case" ;`} {
		t.Run("", func(t *testing.T) {
			t.Parallel()
			schema := pgtest.Name("g") + name
			e := newGrantsEnv(t, schema, name)
			for _, r := range migrate.Roles[1:] {
				if err := migrate.CheckPrivileges(ctx, e.pools[r], schema, r, false); err != nil {
					t.Errorf("%s: %v", r, err)
				}
			}
			var pwned bool
			pgtest.Must(t, e.admin.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_class WHERE relname = 'pwned')").Scan(&pwned), "look for pwned")
			if pwned {
				t.Fatal("an injected CREATE TABLE ran")
			}

			p, err := pgoutbox.NewProducer(&pgoutbox.Config{Schema: schema})
			pgtest.Must(t, err, "producer")
			_, err = p.EnqueueTx(ctx, e.pools[migrate.RoleProducer],
				pgoutbox.Event{AggregateType: "acct", AggregateID: "a1", EventType: "opened", Payload: i},
				pgoutbox.Event{AggregateType: "acct", AggregateID: "a1", EventType: "changed", Payload: i})
			pgtest.Must(t, err, "enqueue as the producer role")
			var id pgoutbox.UUID
			pgtest.Must(t, e.pools[migrate.RoleProducer].QueryRow(ctx,
				"SELECT "+pgx.Identifier{schema, "outbox_enqueue"}.Sanitize()+"('acct', 'a1', 'closed', '{}'::jsonb)").Scan(&id),
				"outbox_enqueue as the producer role")
			var seq int64
			pgtest.Must(t, e.admin.QueryRow(ctx, "SELECT aggregate_sequence FROM "+pgx.Identifier{schema, "outbox_events"}.Sanitize()+
				" WHERE event_id = $1", id).Scan(&seq), "read the sequence")
			if seq != 3 {
				t.Errorf("outbox_enqueue got sequence %d, want 3", seq)
			}

			// What each role must not do.
			events := pgx.Identifier{schema, "outbox_events"}.Sanitize()
			for _, c := range []struct {
				role migrate.Role
				sql  string
			}{
				{migrate.RoleProducer, "UPDATE " + events + " SET published_at = now()"},
				{migrate.RoleProducer, "SELECT payload FROM " + events},
				{migrate.RoleProducer, "DELETE FROM " + events},
				{migrate.RoleRelay, "UPDATE " + events + " SET payload = '1'"},
				{migrate.RoleRelay, "INSERT INTO " + events + " (event_id, aggregate_type, aggregate_id, aggregate_sequence, event_type, payload) VALUES (gen_random_uuid(), 'a', 'b', 9, 'c', '1')"},
				{migrate.RoleRelay, "DELETE FROM " + events},
				{migrate.RoleRelay, "UPDATE " + pgx.Identifier{schema, "outbox_aggregate_sequences"}.Sanitize() + " SET last_sequence = 0"},
				{migrate.RoleConsumer, "SELECT 1 FROM " + events},
				{migrate.RoleOperator, "UPDATE " + events + " SET payload = '1'"},
				{migrate.RoleOperator, "UPDATE " + pgx.Identifier{schema, "outbox_aggregate_sequences"}.Sanitize() + " SET last_sequence = 0"},
				{migrate.RoleOperator, "DELETE FROM " + pgx.Identifier{schema, "outbox_skipped_events"}.Sanitize()},
				{migrate.RoleCDC, "DELETE FROM " + events},
			} {
				_, err := e.pools[c.role].Exec(ctx, c.sql)
				if !migrate.IsPermissionDenied(err) {
					t.Errorf("%s: %s: got %v, want permission denied", c.role, c.sql, err)
				}
			}
		})
	}
}

// A role without the grants is told exactly what it lacks.
func TestCheckPrivilegesNamesWhatIsMissing(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	schema := pgtest.Name("g") + `"'; x`
	e := newGrantsEnv(t, schema, `'"`)
	relay := e.roles[migrate.RoleRelay]
	_, err := e.pools[migrate.RoleMigrator].Exec(ctx, "REVOKE UPDATE (quarantined_at) ON "+pgx.Identifier{schema, "outbox_events"}.Sanitize()+
		" FROM "+pgx.Identifier{relay}.Sanitize())
	pgtest.Must(t, err, "revoke")
	err = migrate.CheckPrivileges(ctx, e.pools[migrate.RoleRelay], schema, migrate.RoleRelay, false)
	if !errors.Is(err, migrate.ErrPermissionDenied) || !migrate.IsPermissionDenied(err) ||
		!strings.Contains(err.Error(), "UPDATE (") || !strings.Contains(err.Error(), "role "+pgx.Identifier{relay}.Sanitize()+" lacks") {
		t.Fatalf("got %v", err)
	}
	// The consumer has nothing of the outbox's.
	err = migrate.CheckPrivileges(ctx, e.pools[migrate.RoleConsumer], schema, migrate.RoleOperator, false)
	for _, want := range []string{"ON TABLE " + pgx.Identifier{schema, "outbox_events"}.Sanitize(), "outbox_skipped_events", "DELETE"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Fatalf("consumer checked as operator: %v, want it to name %s", err, want)
		}
	}
	// The owner has everything.
	for _, r := range migrate.Roles[1:] {
		if err := migrate.CheckPrivileges(ctx, e.pools[migrate.RoleMigrator], schema, r, false); err != nil {
			t.Errorf("owner as %s: %v", r, err)
		}
	}
}

// outbox_enqueue stays SECURITY DEFINER with a fixed search_path and without
// PUBLIC's EXECUTE after every migration: a later migration that redefines it
// with CREATE OR REPLACE must declare them again.
func TestEnqueueIsSecurityDefinerAfterAllMigrations(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, partitioned := range []bool{false, true} {
		pool, schema := pgtest.Schema(t, 2)
		_, err := migrate.Up(ctx, pool, &migrate.Config{Schema: schema, Partitioned: partitioned})
		pgtest.Must(t, err, "migrate")
		var definer, public bool
		var config []string
		pgtest.Must(t, pool.QueryRow(ctx, `SELECT p.prosecdef, coalesce(p.proconfig, '{}'),
       EXISTS (SELECT 1 FROM aclexplode(coalesce(p.proacl, acldefault('f', p.proowner))) a WHERE a.grantee = 0)
  FROM pg_proc p WHERE p.oid = to_regprocedure($1)`,
			pgx.Identifier{schema, "outbox_enqueue"}.Sanitize()+"(text, text, text, jsonb, integer, jsonb)").Scan(&definer, &config, &public), "read outbox_enqueue")
		if !definer || len(config) != 1 || config[0] != "search_path=pg_catalog, pg_temp" || public {
			t.Fatalf("partitioned %v: SECURITY DEFINER %v, config %q, PUBLIC may execute: %v", partitioned, definer, config, public)
		}
	}
}

// Acceptance: the function-only producer (enqueuer) enqueues through
// outbox_enqueue and can do nothing else, whatever it does to its session: a
// search_path that puts its temporary tables first changes nothing. A role
// allowed into the schema without the grant may not call the function.
func TestFunctionOnlyProducer(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	schema := pgtest.Name("g") + `"; fn`
	e := newGrantsEnv(t, schema, `"`)
	pool := e.pools[migrate.RoleEnqueuer]
	fn := pgx.Identifier{schema, "outbox_enqueue"}.Sanitize()
	events, counters := pgx.Identifier{schema, "outbox_events"}.Sanitize(), pgx.Identifier{schema, "outbox_aggregate_sequences"}.Sanitize()

	conn, err := pool.Acquire(ctx)
	pgtest.Must(t, err, "acquire")
	defer conn.Release()
	// Hostile sessions: temporary look-alikes of the outbox's tables first in the
	// search_path, the setting changed mid-transaction.
	for _, q := range []string{
		"CREATE TEMP TABLE outbox_events (event_id uuid, aggregate_type text, aggregate_id text, aggregate_sequence bigint, " +
			"event_type text, schema_version integer, payload jsonb, headers jsonb)",
		"CREATE TEMP TABLE outbox_aggregate_sequences (aggregate_type text, aggregate_id text, last_sequence bigint)",
		"SET search_path = pg_temp, pg_catalog",
	} {
		_, err := conn.Exec(ctx, q)
		pgtest.Must(t, err, "%s", q)
	}
	for i := range 3 {
		var id pgoutbox.UUID
		pgtest.Must(t, conn.QueryRow(ctx, "SELECT "+fn+"('acct', 'a1', 'changed', $1::jsonb)", fmt.Sprint(i)).Scan(&id), "enqueue as the enqueuer")
	}
	var temp int
	pgtest.Must(t, conn.QueryRow(ctx, "SELECT (SELECT count(*) FROM pg_temp.outbox_events) + (SELECT count(*) FROM pg_temp.outbox_aggregate_sequences)").Scan(&temp), "temp tables")
	var seqs []int64
	rows, err := e.admin.Query(ctx, "SELECT aggregate_sequence FROM "+events+" ORDER BY 1")
	pgtest.Must(t, err, "read")
	seqs, err = pgx.CollectRows(rows, pgx.RowTo[int64])
	pgtest.Must(t, err, "read")
	if temp != 0 || fmt.Sprint(seqs) != "[1 2 3]" {
		t.Fatalf("temporary rows %d, sequences in the outbox %v", temp, seqs)
	}

	for _, q := range []string{
		"INSERT INTO " + events + " (event_id, aggregate_type, aggregate_id, aggregate_sequence, event_type, payload) VALUES (gen_random_uuid(), 'acct', 'a1', 4, 'forged', '1')",
		"UPDATE " + counters + " SET last_sequence = 0",
		"INSERT INTO " + counters + " VALUES ('acct', 'a2', 100)",
		"SELECT payload FROM " + events,
	} {
		_, err := pool.Exec(ctx, q)
		if !migrate.IsPermissionDenied(err) {
			t.Errorf("enqueuer: %s: got %v, want permission denied", q, err)
		}
	}
	// The consumer role may use the schema but was not granted the function.
	_, err = e.pools[migrate.RoleConsumer].Exec(ctx, "SELECT "+fn+"('acct', 'a1', 'changed', '1')")
	if !migrate.IsPermissionDenied(err) || !strings.Contains(err.Error(), "permission denied for function outbox_enqueue") {
		t.Fatalf("consumer calling outbox_enqueue: %v", err)
	}
}
