package migrate_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/pgoutbox/internal/pgtest"
	"github.com/pgoutbox/pgoutbox/migrate"
)

// refusedFor is what CheckTrusted must name for each hostile variant once its
// owner is trusted (Trust.Owners): the code it planted. Variants whose code is
// not attached to pgoutbox's tables (plain, shadow) are then served: nothing
// resolves a name in a tenant's schema (the relay tests prove their code never
// runs).
var refusedFor = map[string]string{
	"trg_before_row_update":  `trigger "trigger evil on table`,
	"trg_after_row_update":   `trigger "trigger evil on table`,
	"trg_before_stmt_update": `trigger "trigger evil on table`,
	"trg_after_stmt_update":  `trigger "trigger evil on table`,
	"trg_after_row_delete":   `trigger "trigger evil on table`,
	"trg_before_truncate":    `trigger "trigger evil on table`,
	"trg_deferred":           `trigger "trigger evil on table`,
	"trg_audit_insert":       `trigger "trigger evil on table`,
	"rls":                    `row-level security on "table`,
	"rls_audit":              `policy "policy evil on table`,
	"rule":                   `rule "rule evil on table`,
	"default":                `code from outside pg_catalog in "default value for column evil`,
	"generated":              `code from outside pg_catalog in "default value for column evil`,
	"check":                  `code from outside pg_catalog in "constraint evil`,
	"index":                  `code from outside pg_catalog in "index tenant_evil_index.evil" (uses "function evil_canary_`,
	"domain":                 `code from outside pg_catalog in "column evil`,
	"child":                  `trigger "trigger evil on table`,
	"fk_cascade":             `foreign key "constraint evil_ref_id_fkey on table tenant_evil_fk_cascade.evil_ref"`,
	"plain":                  "",
	"shadow":                 "",
}

// An outbox made by a role with only CREATE on the database is refused by its
// owner, and, once that owner is trusted, by each kind of code it attached to
// pgoutbox's tables; pgoutbox's own outboxes (plain, partitioned, with the
// inbox) pass.
func TestCheckTrustedRefusesHostileOutboxes(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	a := pgtest.NewAttacker(t, "tenant_victim", 2)
	for _, c := range []migrate.Config{
		{Schema: "tenant_victim"},
		{Schema: "tenant_part", Partitioned: true},
		{Schema: "tenant_outbox_only", Lines: []migrate.Line{migrate.LineOutbox}},
	} {
		_, err := migrate.Up(ctx, a.Pool, &c)
		pgtest.Must(t, err, "migrate %s", c.Schema)
		pgtest.Must(t, migrate.CheckTrusted(ctx, a.Pool, c.Schema, migrate.Trust{}), "pgoutbox's own outbox %s", c.Schema)
	}
	// Tables is every table the migrations make: none escapes the check.
	rows, err := a.Pool.Query(ctx, `SELECT relname::text FROM pg_class WHERE relnamespace = 'tenant_victim'::regnamespace
		AND relkind IN ('r', 'p') AND NOT relispartition ORDER BY relname::text COLLATE "C"`)
	pgtest.Must(t, err, "list tables")
	made, err := pgx.CollectRows(rows, pgx.RowTo[string])
	pgtest.Must(t, err, "list tables")
	if want := slices.Sorted(slices.Values(migrate.Tables())); !slices.Equal(made, want) {
		t.Fatalf("the migrations make tables %q, migrate.Tables() = %q", made, want)
	}
	for _, v := range pgtest.HostileVariants() {
		want, ok := refusedFor[v.Name]
		if !ok {
			t.Fatalf("variant %s has no expectation", v.Name)
		}
		schema := "tenant_evil_" + v.Name
		a.Plant(t, schema, "postgres", v)
		err := migrate.CheckTrusted(ctx, a.Pool, schema, migrate.Trust{})
		if !errors.Is(err, migrate.ErrUntrusted) || !strings.Contains(err.Error(), `owned by an untrusted role "schema `+schema+`" (owner "`+a.Role+`")`) {
			t.Errorf("%s, owner not trusted: CheckTrusted = %v, want the schema's owner refused", v.Name, err)
		}
		err = migrate.CheckTrusted(ctx, a.Pool, schema, migrate.Trust{Owners: []string{a.Role}})
		switch {
		case want == "" && err != nil:
			t.Errorf("%s, owner trusted: CheckTrusted = %v, want nil", v.Name, err)
		case want != "" && (!errors.Is(err, migrate.ErrUntrusted) || !strings.Contains(err.Error(), want)):
			t.Errorf("%s, owner trusted: CheckTrusted = %v, want an error naming %q", v.Name, err, want)
		}
	}
	if ran := a.RanAsOthers(t); len(ran) > 0 {
		t.Errorf("the attacker's code ran as another role: %q", ran)
	}
}

// A trusted schema is refused when one of pgoutbox's tables changed owner or
// was replaced by a view, and when the check names a bad role.
func TestCheckTrustedRefusesForeignTables(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	a := pgtest.NewAttacker(t, "victim", 2)
	role := pgx.Identifier{a.Role}.Sanitize()
	for _, schema := range []string{"owned", "viewed"} {
		_, err := migrate.Up(ctx, a.Pool, &migrate.Config{Schema: schema})
		pgtest.Must(t, err, "migrate %s", schema)
	}
	for _, q := range []string{
		"ALTER TABLE owned.outbox_events OWNER TO " + role,
		"ALTER TABLE owned.outbox_skipped_events OWNER TO " + role,
		"DROP TABLE viewed.outbox_aggregate_sequences",
		"CREATE VIEW viewed.outbox_aggregate_sequences AS SELECT ''::text AS aggregate_type, ''::text AS aggregate_id, 0::bigint AS last_sequence",
	} {
		_, err := a.Pool.Exec(ctx, q)
		pgtest.Must(t, err, "%s", q)
	}
	for schema, want := range map[string][]string{
		"owned":  {`owned by an untrusted role "table owned.outbox_events" (owner "` + a.Role + `")`, `"table owned.outbox_skipped_events" (owner`},
		"viewed": {`not a table "view viewed.outbox_aggregate_sequences"`},
	} {
		err := migrate.CheckTrusted(ctx, a.Pool, schema, migrate.Trust{})
		for _, w := range want {
			if !errors.Is(err, migrate.ErrUntrusted) || !strings.Contains(err.Error(), w) {
				t.Errorf("CheckTrusted(%s) = %v, want an error naming %s", schema, err, w)
			}
		}
	}
	for _, bad := range [][]string{{""}, {"public"}, {"pg_read_all_data"}, {"a\nb"}, make([]string, 101)} {
		if err := migrate.CheckTrusted(ctx, a.Pool, "owned", migrate.Trust{Owners: bad}); err == nil || errors.Is(err, migrate.ErrUntrusted) {
			t.Errorf("Trust{Owners: %q}: %v, want a validation error", bad, err)
		}
	}
}

// By default a check run as a plain role trusts that role, the roles that are
// members of it, superusers, and pg_database_owner when the database's owner is
// trusted, and no one else.
func TestCheckTrustedDefaultOwners(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	a := pgtest.NewAttacker(t, "victim", 2)
	admin := pgtest.Pool(t, pgtest.URL(), 1)
	runner := pgtest.Role(t, admin, "")
	member := pgtest.Role(t, admin, "")
	_, err := admin.Exec(ctx, "GRANT "+pgx.Identifier{runner}.Sanitize()+" TO "+pgx.Identifier{member}.Sanitize())
	pgtest.Must(t, err, "grant membership")
	owners := map[string]string{"by_runner": runner, "by_member": member, "by_super": "", "by_attacker": a.Role, "public": ""}
	for schema, owner := range owners {
		_, err := migrate.Up(ctx, a.Pool, &migrate.Config{Schema: schema})
		pgtest.Must(t, err, "migrate %s", schema)
		if owner != "" {
			_, err = a.Pool.Exec(ctx, "ALTER SCHEMA "+schema+" OWNER TO "+pgx.Identifier{owner}.Sanitize())
			pgtest.Must(t, err, "owner of %s", schema)
		}
	}
	t.Cleanup(func() {
		// The roles are dropped before the database: give their schemas back.
		for schema, owner := range owners {
			if owner == runner || owner == member {
				if _, err := a.Pool.Exec(ctx, "ALTER SCHEMA "+schema+" OWNER TO CURRENT_USER"); err != nil {
					t.Errorf("give back %s: %v", schema, err)
				}
			}
		}
	})
	asRunner := pgtest.Pool(t, pgtest.AsRole(t, a.URL, runner), 1)
	for schema, trusted := range map[string]bool{"by_runner": true, "by_member": true, "by_super": true, "by_attacker": false,
		"public": true /* owned by pg_database_owner: the database's owner, a superuser here */} {
		err := migrate.CheckTrusted(ctx, asRunner, schema, migrate.Trust{})
		if trusted != (err == nil) || (err != nil && !errors.Is(err, migrate.ErrUntrusted)) {
			t.Errorf("as %s, CheckTrusted(%s) = %v, want trusted %v", runner, schema, err, trusted)
		}
	}
	err = migrate.CheckTrusted(ctx, asRunner, "by_attacker", migrate.Trust{Owners: []string{a.Role}})
	pgtest.Must(t, err, "the attacker named as a trusted owner")
}

// Outboxes never lists a session's temporary schema, although any role may
// make tables named like an outbox there.
func TestOutboxesSkipsTemporarySchemas(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	a := pgtest.NewAttacker(t, "victim", 2)
	_, err := migrate.Up(ctx, a.Pool, &migrate.Config{Schema: "tenant_real"})
	pgtest.Must(t, err, "migrate")
	a.TempOutbox(t)
	a.TempOutbox(t)
	var temps int
	pgtest.Must(t, a.Pool.QueryRow(ctx, `SELECT count(DISTINCT relnamespace) FROM pg_class WHERE relname = 'outbox_events' AND relpersistence = 't'`).Scan(&temps), "count")
	if temps != 2 {
		t.Fatalf("%d temporary schemas hold outbox_events, want 2", temps)
	}
	for _, in := range []string{"", "*"} {
		sel, err := migrate.ParseSelector(in)
		pgtest.Must(t, err, "selector %q", in)
		got, err := migrate.Outboxes(ctx, a.Pool, sel)
		pgtest.Must(t, err, "outboxes")
		if len(got) != 1 || got[0] != "tenant_real" {
			t.Errorf("Outboxes(%q) = %q, want only tenant_real", sel, got)
		}
	}
}

func FuzzParseOwners(f *testing.F) {
	for _, s := range []string{"", "pgoutbox_migrator", "a, b ,,c", "public", "pg_monitor", "a\x00b", strings.Repeat("x,", 200), "\u202eevil"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		tr, err := migrate.ParseOwners(s)
		if err != nil {
			return
		}
		if len(tr.Owners) > 100 {
			t.Fatalf("%d owners accepted", len(tr.Owners))
		}
		for _, o := range tr.Owners {
			if migrate.ValidateRoleName(o) != nil || o != strings.TrimSpace(o) || strings.Contains(o, ",") {
				t.Fatalf("owner %q accepted", o)
			}
		}
	})
}

// TestCheckMigratedIsTheOneOutboxCheck: a schema never migrated, or missing
// a migration, gets one typed error in one wording; a migrated one none.
func TestCheckMigratedIsTheOneOutboxCheck(t *testing.T) {
	t.Parallel()
	pool, schema := pgtest.Migrated(t, 2)
	ctx := context.Background()
	if err := migrate.CheckMigrated(ctx, pool, schema); err != nil {
		t.Fatalf("migrated schema: %v", err)
	}
	if err := migrate.CheckTenant(ctx, pool, schema, migrate.Trust{}); err != nil {
		t.Fatalf("migrated schema as a tenant: %v", err)
	}
	absent := pgtest.Name("absent")
	err := migrate.CheckMigrated(ctx, pool, absent)
	var nm *migrate.NotMigratedError
	if !errors.As(err, &nm) || !errors.Is(err, migrate.ErrNotMigrated) || nm.Schema != absent ||
		nm.Missing.Line != migrate.LineOutbox || nm.Missing.Version != 1 {
		t.Fatalf("never migrated: %#v (%v)", nm, err)
	}
	want := `migrate: schema "` + absent + `" lacks migration outbox/1 ` + nm.Missing.Name +
		": run 'pgoutbox migrate --schema " + absent + "' first"
	if err.Error() != want {
		t.Fatalf("wording:\n got %s\nwant %s", err, want)
	}
	table := pgx.Identifier{schema, migrate.Table}.Sanitize()
	pgtest.Must(t, exec(ctx, pool, "DELETE FROM "+table+" WHERE line = 'outbox' AND version = 3"), "forget outbox/3")
	err = migrate.CheckTenant(ctx, pool, schema, migrate.Trust{})
	if !errors.As(err, &nm) || nm.Missing.Version != 3 || errors.Is(err, migrate.ErrDatabaseNewer) {
		t.Fatalf("missing outbox/3: %v", err)
	}
}
