package pgtest

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgoutbox/pgoutbox/migrate"
)

// Attacker is a role that can log in and holds only CREATE on a database
// made for the test (the rights that made hostile tenants in issue 31): it
// makes outbox schemas of its own and plants code in them that, if a relay or
// operator command ever ran it, records who ran it in a canary table and tries
// to mark a victim tenant's pending events published (so that they would be
// lost) and to read their payloads.
type Attacker struct {
	// Role is the attacker's login.
	Role string
	// URL is the test database as the test server's user (a superuser), and
	// Pool a pool on it.
	URL  string
	Pool *pgxpool.Pool
	// As is a pool on the test database as the attacker.
	As *pgxpool.Pool
	// Canary is the attacker's schema holding the canary table "ran" and its
	// functions: evil() and evil_trigger(), evil_imm(text) that call it.
	Canary string
}

// NewAttacker creates the attacker's role, then a database of the test's own
// where it holds CREATE, and the attacker's canary schema: the table code
// records its runs in (any role may insert) and the functions its hostile
// objects call. victim is the schema of the tenant it attacks. Everything is
// dropped when the test ends.
func NewAttacker(tb testing.TB, victim string, maxConns int32) *Attacker {
	tb.Helper()
	role := Role(tb, Pool(tb, URL(), 1), "")
	url := Database(tb) // after the role: dropped before it
	a := &Attacker{Role: role, URL: url, Pool: Pool(tb, url, maxConns), Canary: Name("evil_canary")}
	ctx := context.Background()
	var db string
	Must(tb, a.Pool.QueryRow(ctx, "SELECT current_database()").Scan(&db), "database name")
	_, err := a.Pool.Exec(ctx, "GRANT CREATE ON DATABASE "+pgx.Identifier{db}.Sanitize()+" TO "+pgx.Identifier{role}.Sanitize())
	Must(tb, err, "grant create on database")
	a.As = Pool(tb, AsRole(tb, url, role), 2)
	a.exec(tb, fmt.Sprintf(canarySQL, pgx.Identifier{a.Canary}.Sanitize(), pgx.Identifier{victim, "outbox_events"}.Sanitize()))
	return a
}

// canarySQL makes the canary schema (%[1]s); %[2]s is the victim's outbox table.
// evil() is plain SECURITY INVOKER code: whoever runs it runs it with their own
// rights, which is what a hostile tenant wants from a relay or a superuser.
const canarySQL = `
CREATE SCHEMA %[1]s;
CREATE TABLE %[1]s.ran (who text NOT NULL, what text);
GRANT USAGE ON SCHEMA %[1]s TO PUBLIC;
GRANT INSERT ON %[1]s.ran TO PUBLIC;
CREATE FUNCTION %[1]s.evil() RETURNS boolean LANGUAGE plpgsql AS $f$
DECLARE stolen text;
BEGIN
    BEGIN
        SELECT pg_catalog.string_agg(payload::text, ',') INTO stolen FROM %[2]s;
        UPDATE %[2]s SET published_at = pg_catalog.now() WHERE published_at IS NULL;
    EXCEPTION WHEN OTHERS THEN stolen := SQLERRM;
    END;
    INSERT INTO %[1]s.ran VALUES (current_user, stolen);
    RETURN true;
END $f$;
CREATE FUNCTION %[1]s.evil_trigger() RETURNS trigger LANGUAGE plpgsql AS $f$
BEGIN
    PERFORM %[1]s.evil();
    IF TG_LEVEL = 'ROW' AND TG_OP <> 'DELETE' THEN RETURN NEW; END IF;
    RETURN OLD;
END $f$;
CREATE FUNCTION %[1]s.evil_imm(text) RETURNS text LANGUAGE plpgsql IMMUTABLE AS $f$
BEGIN
    PERFORM %[1]s.evil();
    RETURN $1;
END $f$;
CREATE DOMAIN %[1]s.evil_text AS text CHECK (%[1]s.evil());
`

func (a *Attacker) exec(tb testing.TB, sql string) {
	tb.Helper()
	if _, err := a.As.Exec(context.Background(), sql); err != nil {
		tb.Fatalf("pgtest: as the attacker: %v\n%s", err, sql)
	}
}

// HostileVariant is one way the attacker plants code in an outbox of its own.
type HostileVariant struct {
	// Name names the variant (and suffixes its schema's name).
	Name string
	// SQL plants the code: {{schema}} is the outbox's schema, {{canary}} the
	// canary schema and {{login}} the role the victim's relay logs in as, all
	// quoted identifiers.
	SQL string
	// OnUpdate is true when an UPDATE of the outbox's pending events that sets
	// claimed_by and published_at runs the code (as the relay's claim and mark
	// do): Plant then checks
	// that it does, run by the attacker, so that a test that finds it never ran
	// for anyone else shows something.
	OnUpdate bool
}

// HostileVariants are the attacker's outboxes: plain (only its ownership is
// wrong), triggers of every timing, row-level security, rules, defaults,
// generated columns, checks, index expressions, domains, an inheriting table
// with a trigger, a table with a trigger whose foreign key cascades from the
// outbox, and functions and operators shadowing pg_catalog's in its
// schema and in a schema named like the victim relay's login ("$user" of the
// default search_path).
func HostileVariants() []HostileVariant {
	trigger := func(name, timing, level string) HostileVariant {
		return HostileVariant{Name: name, OnUpdate: strings.Contains(timing, "UPDATE"),
			SQL: "CREATE TRIGGER evil " + timing + " ON {{schema}}.outbox_events FOR EACH " + level + " EXECUTE FUNCTION {{canary}}.evil_trigger()"}
	}
	return []HostileVariant{
		{Name: "plain"},
		trigger("trg_before_row_update", "BEFORE UPDATE", "ROW"),
		trigger("trg_after_row_update", "AFTER UPDATE", "ROW"),
		trigger("trg_before_stmt_update", "BEFORE UPDATE", "STATEMENT"),
		trigger("trg_after_stmt_update", "AFTER UPDATE OR INSERT OR DELETE", "STATEMENT"),
		trigger("trg_after_row_delete", "AFTER DELETE", "ROW"),
		trigger("trg_before_truncate", "BEFORE TRUNCATE", "STATEMENT"),
		{Name: "trg_deferred", OnUpdate: true, SQL: `CREATE CONSTRAINT TRIGGER evil AFTER UPDATE ON {{schema}}.outbox_events
			DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION {{canary}}.evil_trigger()`},
		{Name: "trg_audit_insert", SQL: `CREATE TRIGGER evil BEFORE INSERT ON {{schema}}.outbox_operator_audit
			FOR EACH ROW EXECUTE FUNCTION {{canary}}.evil_trigger()`},
		{Name: "rls", OnUpdate: true, SQL: `ALTER TABLE {{schema}}.outbox_events ENABLE ROW LEVEL SECURITY;
			ALTER TABLE {{schema}}.outbox_events FORCE ROW LEVEL SECURITY;
			CREATE POLICY evil ON {{schema}}.outbox_events USING ({{canary}}.evil()) WITH CHECK ({{canary}}.evil())`},
		{Name: "rls_audit", SQL: `ALTER TABLE {{schema}}.outbox_operator_audit ENABLE ROW LEVEL SECURITY;
			CREATE POLICY evil ON {{schema}}.outbox_operator_audit USING ({{canary}}.evil())`},
		{Name: "rule", OnUpdate: true, SQL: `CREATE RULE evil AS ON UPDATE TO {{schema}}.outbox_events DO ALSO SELECT {{canary}}.evil()`},
		{Name: "default", SQL: `ALTER TABLE {{schema}}.outbox_operator_audit ADD COLUMN evil boolean DEFAULT {{canary}}.evil();
			ALTER TABLE {{schema}}.outbox_skipped_events ADD COLUMN evil boolean DEFAULT {{canary}}.evil()`},
		{Name: "generated", OnUpdate: true, SQL: `ALTER TABLE {{schema}}.outbox_events
			ADD COLUMN evil text GENERATED ALWAYS AS ({{canary}}.evil_imm(claimed_by)) STORED`},
		{Name: "check", OnUpdate: true, SQL: `ALTER TABLE {{schema}}.outbox_events ADD CONSTRAINT evil CHECK ({{canary}}.evil()) NOT VALID`},
		{Name: "index", OnUpdate: true, SQL: `CREATE INDEX evil ON {{schema}}.outbox_events ({{canary}}.evil_imm(aggregate_id))`},
		{Name: "domain", SQL: `ALTER TABLE {{schema}}.outbox_events ADD COLUMN evil {{canary}}.evil_text`},
		{Name: "child", OnUpdate: true, SQL: `CREATE TABLE {{schema}}.evil_child () INHERITS ({{schema}}.outbox_events);
			CREATE TRIGGER evil BEFORE UPDATE ON {{schema}}.evil_child FOR EACH ROW EXECUTE FUNCTION {{canary}}.evil_trigger();
			INSERT INTO {{schema}}.evil_child (event_id, aggregate_type, aggregate_id, aggregate_sequence, event_type, payload)
			VALUES (gen_random_uuid(), 'child', 'c1', 1, 'child.made', '{}')`},
		{Name: "fk_cascade", SQL: `CREATE TABLE {{schema}}.evil_ref (id uuid REFERENCES {{schema}}.outbox_events ON DELETE CASCADE);
			CREATE TRIGGER evil BEFORE DELETE ON {{schema}}.evil_ref FOR EACH ROW EXECUTE FUNCTION {{canary}}.evil_trigger()`},
		{Name: "shadow", SQL: "CREATE SCHEMA {{login}};" + shadowSQL("{{schema}}") + shadowSQL("{{login}}")},
	}
}

// shadowSQL creates, in schema, functions named like pg_catalog's that the
// relay's and the operators' statements use, and comparison and arithmetic
// operators on the types of the outbox's columns, each running evil(). Where
// PostgreSQL would pick one over pg_catalog's (a schema searched before
// pg_catalog, or a better match for the argument types), it would run.
func shadowSQL(schema string) string {
	return strings.ReplaceAll(`
DO $do$
DECLARE
    f text[];
    o text;
    t text[];
    n int := 0;
BEGIN
    FOREACH o IN ARRAY ARRAY['now', 'clock_timestamp', 'statement_timestamp', 'transaction_timestamp', 'random'] LOOP
        EXECUTE pg_catalog.format('CREATE FUNCTION %s.%I() RETURNS %s LANGUAGE plpgsql AS $b$BEGIN PERFORM {{canary}}.evil(); RETURN pg_catalog.%I(); END$b$',
            'S', o, CASE o WHEN 'random' THEN 'double precision' ELSE 'timestamptz' END, o);
    END LOOP;
    FOREACH o IN ARRAY ARRAY['=', '<>', '<', '<=', '>', '>='] LOOP
        FOREACH t SLICE 1 IN ARRAY ARRAY[['uuid','uuid'], ['text','text'], ['bigint','bigint'], ['integer','integer'], ['bigint','integer'],
                ['integer','bigint'], ['timestamptz','timestamptz'], ['uuid','uuid[]'], ['jsonb','jsonb'], ['name','text'], ['text','name']] LOOP
            n := n + 1;
            EXECUTE pg_catalog.format('CREATE FUNCTION %s.evil_op_%s(a %s, b %s) RETURNS boolean LANGUAGE plpgsql AS $b$BEGIN PERFORM {{canary}}.evil(); RETURN true; END$b$',
                'S', n, t[1], t[2]);
            EXECUTE pg_catalog.format('CREATE OPERATOR %s.%s (LEFTARG = %s, RIGHTARG = %s, FUNCTION = %s.evil_op_%s)', 'S', o, t[1], t[2], 'S', n);
        END LOOP;
    END LOOP;
    FOREACH o IN ARRAY ARRAY['+', '-'] LOOP
        FOREACH t SLICE 1 IN ARRAY ARRAY[['integer','integer','integer'], ['bigint','bigint','bigint'], ['timestamptz','interval','timestamptz'],
                ['bigint','integer','bigint'], ['integer','bigint','bigint']] LOOP
            n := n + 1;
            EXECUTE pg_catalog.format('CREATE FUNCTION %s.evil_op_%s(a %s, b %s) RETURNS %s LANGUAGE plpgsql AS $b$BEGIN PERFORM {{canary}}.evil(); RETURN a OPERATOR(pg_catalog.%s) b; END$b$',
                'S', n, t[1], t[2], t[3], o);
            EXECUTE pg_catalog.format('CREATE OPERATOR %s.%s (LEFTARG = %s, RIGHTARG = %s, FUNCTION = %s.evil_op_%s)', 'S', o, t[1], t[2], 'S', n);
        END LOOP;
    END LOOP;
END $do$;`, "'S'", "'"+strings.ReplaceAll(schema, "'", "''")+"'")
}

// Plant makes schema an outbox of the attacker (migrate.Up, as the attacker),
// plants v's code in it, and enqueues pending events through its
// outbox_enqueue. login is the victim relay's login (the {{login}} of v). With
// v.OnUpdate, it then checks that an UPDATE by the attacker of its own pending
// events runs the code, in a transaction it rolls back.
func (a *Attacker) Plant(tb testing.TB, schema, login string, v HostileVariant) {
	tb.Helper()
	ctx := context.Background()
	_, err := migrate.Up(ctx, a.As, &migrate.Config{Schema: schema})
	Must(tb, err, "migrate %s as the attacker", schema)
	s := pgx.Identifier{schema}.Sanitize()
	if v.SQL != "" {
		r := strings.NewReplacer("{{schema}}", s, "{{canary}}", pgx.Identifier{a.Canary}.Sanitize(), "{{login}}", pgx.Identifier{login}.Sanitize())
		a.exec(tb, r.Replace(v.SQL))
	}
	for i := range 3 {
		a.exec(tb, fmt.Sprintf("SELECT %s.outbox_enqueue('evil', 'e%d', 'evil.made', '{\"secret\": \"attacker\"}')", s, i))
	}
	if !v.OnUpdate {
		return
	}
	tx, err := a.As.Begin(ctx)
	Must(tb, err, "begin")
	defer func() { _ = tx.Rollback(ctx) }()
	count := "SELECT count(*) FROM " + pgx.Identifier{a.Canary, "ran"}.Sanitize()
	var before, after int
	Must(tb, tx.QueryRow(ctx, count).Scan(&before), "count canary")
	_, err = tx.Exec(ctx, "UPDATE "+s+".outbox_events SET claimed_by = 'attacker', published_at = now() WHERE published_at IS NULL")
	Must(tb, err, "update %s as the attacker", schema)
	_, err = tx.Exec(ctx, "SET CONSTRAINTS ALL IMMEDIATE")
	Must(tb, err, "fire deferred triggers")
	Must(tb, tx.QueryRow(ctx, count).Scan(&after), "count canary")
	if after == before {
		tb.Fatalf("pgtest: variant %s: the attacker's own UPDATE did not run its code: the variant proves nothing", v.Name)
	}
}

// RanAsOthers lists the runs of the attacker's code by any role but the
// attacker ("role: what it read"): none is the only right answer.
func (a *Attacker) RanAsOthers(tb testing.TB) []string {
	tb.Helper()
	rows, err := a.Pool.Query(context.Background(), "SELECT who || ': ' || coalesce(what, '') FROM "+
		pgx.Identifier{a.Canary, "ran"}.Sanitize()+" WHERE who <> $1", a.Role)
	Must(tb, err, "read canary")
	out, err := pgx.CollectRows(rows, pgx.RowTo[string])
	Must(tb, err, "read canary")
	return out
}

// TempOutbox opens a session of the attacker, kept until the test ends, that
// makes temporary tables named like an outbox: they live in a pg_temp_N schema
// of the session, where any role may create tables.
func (a *Attacker) TempOutbox(tb testing.TB) {
	tb.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, AsRole(tb, a.URL, a.Role))
	Must(tb, err, "connect as the attacker")
	tb.Cleanup(func() { _ = conn.Close(context.Background()) })
	_, err = conn.Exec(ctx, "CREATE TEMP TABLE outbox_events (x int); CREATE TEMP TABLE "+migrate.Table+" (x int)")
	Must(tb, err, "temporary outbox tables")
}
