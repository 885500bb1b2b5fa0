package cli

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/pgoutbox"
	"github.com/pgoutbox/pgoutbox/broker"
	"github.com/pgoutbox/pgoutbox/inbox"
	"github.com/pgoutbox/pgoutbox/internal/natstest"
	"github.com/pgoutbox/pgoutbox/internal/pgtest"
	"github.com/pgoutbox/pgoutbox/internal/wait"
	"github.com/pgoutbox/pgoutbox/migrate"
)

// rolesEnv is a schema owned by a non-superuser migrator role, migrated and
// granted with "pgoutbox migrate" and "pgoutbox migrate print --grants" run as
// that role, and one LOGIN role (no superuser) per pgoutbox role.
type rolesEnv struct {
	schemaDB // a superuser's pool: sets the scene and checks, never runs a command
	roles    map[migrate.Role]string
	urls     map[migrate.Role]string
}

func newRolesEnv(t *testing.T, suffix string, partitioned bool) *rolesEnv {
	t.Helper()
	ctx := context.Background()
	e := &rolesEnv{schemaDB: schemaDB{t: t, pool: pgtest.Pool(t, pgtest.URL(), 2)}, roles: map[migrate.Role]string{}, urls: map[migrate.Role]string{}}
	e.schema = pgtest.SchemaName(t, e.pool, "least") + suffix
	t.Cleanup(func() {
		_, _ = e.pool.Exec(ctx, "DROP SCHEMA IF EXISTS "+pgx.Identifier{e.schema}.Sanitize()+" CASCADE")
	})
	for _, r := range migrate.Roles {
		e.roles[r] = pgtest.Role(t, e.pool, pgtest.Name(string(r)[:3])+suffix)
		e.urls[r] = pgtest.AsRole(t, pgtest.URL(), e.roles[r])
	}
	e.exec("CREATE SCHEMA " + pgx.Identifier{e.schema}.Sanitize() + " AUTHORIZATION " + pgx.Identifier{e.roles[migrate.RoleMigrator]}.Sanitize())

	args := []string{"migrate", "--database-url", e.urls[migrate.RoleMigrator], "--schema", e.schema}
	if partitioned {
		args = append(args, "--partitioned")
	}
	if out, errOut, code := run(t, args...); code != 0 {
		t.Fatalf("migrate as the migrator role: code %d\n%s%s", code, out, errOut)
	}
	args = []string{"migrate", "print", "--grants", "--schema", e.schema}
	if partitioned {
		args = append(args, "--partitioned")
	}
	for _, r := range migrate.Roles[1:] {
		args = append(args, "--"+string(r)+"-role", e.roles[r])
	}
	script, errOut, code := run(t, args...)
	if code != 0 {
		t.Fatalf("migrate print --grants: code %d: %s", code, errOut)
	}
	mig := pgtest.Pool(t, e.urls[migrate.RoleMigrator], 1)
	_, err := mig.Exec(ctx, script, pgx.QueryExecModeSimpleProtocol)
	pgtest.Must(t, err, "apply the grants as the migrator role")
	return e
}

// as runs a CLI verb as role, with --database-url and --schema.
func (e *rolesEnv) as(role migrate.Role, verb ...string) (string, string, int) {
	e.t.Helper()
	return run(e.t, append(verb, "--database-url", e.urls[role], "--schema", e.schema)...)
}

// enqueue writes n events per aggregate as the producer role, through the Go
// API and through outbox_enqueue, and returns the Go API's ids.
func (e *rolesEnv) enqueue(n int, aggs ...string) []pgoutbox.UUID {
	e.t.Helper()
	ctx := context.Background()
	pool := pgtest.Pool(e.t, e.urls[migrate.RoleProducer], 2)
	p, err := pgoutbox.NewProducer(&pgoutbox.Config{Schema: e.schema})
	pgtest.Must(e.t, err, "producer")
	var evs []pgoutbox.Event
	for i := range n {
		for _, a := range aggs {
			evs = append(evs, pgoutbox.Event{AggregateType: "acct", AggregateID: a, EventType: "changed", Payload: i})
		}
	}
	res, err := p.EnqueueTx(ctx, pool, evs...)
	pgtest.Must(e.t, err, "enqueue with the Go API as the producer role")
	for _, a := range aggs {
		_, err := pool.Exec(ctx, "SELECT "+e.table("outbox_enqueue")+"('acct', $1, 'closed', '{\"by\": \"sql\"}'::jsonb)", a)
		pgtest.Must(e.t, err, "outbox_enqueue as the producer role")
	}
	ids := make([]pgoutbox.UUID, len(res))
	for i, r := range res {
		ids[i] = r.EventID
	}
	return ids
}

// Acceptance: every command runs as its least-privilege role, with the grants
// "migrate print --grants" printed, under a schema and role names that need
// quoting: migrate (migrator), enqueue with the Go API and SQL (producer), relay
// (relay), inbox processing (consumer), status, dlq list/show/retry/skip, replay
// and cleanup (operator).
func TestCommandsRunAsLeastPrivilegeRoles(t *testing.T) {
	t.Parallel()
	e := newRolesEnv(t, `"; q`, false)
	ctx := context.Background()
	ids := e.enqueue(5, "a1", "a2", "a3")

	relay := startOpsRelay(t, nil, "--database-url", e.urls[migrate.RoleRelay], "--schema", e.schema, "--broker", "null://",
		"--metrics-addr", "127.0.0.1:0", "--poll-interval", "100ms", "--id", "least-relay")
	wait.For(t, 30*time.Second, "the relay role drained the outbox", func() bool { return e.count("outbox_events", "published_at IS NULL") == 0 })
	if code, body := relay.get(t, "/readyz"); code != 200 {
		t.Fatalf("/readyz: %d %s\n%s", code, body, relay.stderr.String())
	}
	if code, body := relay.get(t, "/metrics"); code != 200 || !strings.Contains(body, "pgoutbox_relay_pending_events 0") {
		t.Fatalf("/metrics: %d\n%.2000s", code, body)
	}
	relay.sigterm(t)

	// The consumer role processes deliveries into its inbox.
	cpool := pgtest.Pool(t, e.urls[migrate.RoleConsumer], 2)
	consumer, err := inbox.New(inbox.Pgx(cpool), func(context.Context, pgx.Tx, inbox.Event) error { return nil },
		&inbox.Config{Name: "least", Schema: e.schema})
	pgtest.Must(t, err, "consumer")
	for seq := int64(1); seq <= 2; seq++ {
		o := consumer.Process(ctx, inbox.DeliveryOf(brokerMessage(ids[seq-1], "a1", seq)))
		if o.Err != nil || o.Status != inbox.StatusApplied {
			t.Fatalf("consumer role, sequence %d: %+v", seq, o)
		}
	}
	if o := consumer.Process(ctx, inbox.DeliveryOf(brokerMessage(ids[0], "a1", 1))); o.Err != nil || o.Status != inbox.StatusDuplicate {
		t.Fatalf("consumer role, duplicate: %+v", o)
	}

	// The operator role: status, the dead letter queue, replay, cleanup.
	if out, errOut, code := e.as(migrate.RoleOperator, "status", "--json"); code != 0 || !strings.Contains(out, `"pending": 0`) {
		t.Fatalf("status: code %d\n%s%s", code, out, errOut)
	}
	if out, errOut, code := e.as(migrate.RoleOperator, "migrate", "status"); code != 0 || strings.Contains(out, "pending") {
		t.Fatalf("migrate status: code %d\n%s%s", code, out, errOut)
	}
	poison := e.enqueue(1, "p1", "p2")
	e.exec("UPDATE " + e.table("outbox_events") + " SET quarantined_at = now(), last_error = 'boom', attempt_count = 10 WHERE aggregate_id IN ('p1', 'p2')")
	if out, errOut, code := e.as(migrate.RoleOperator, "dlq", "list"); code != 0 || !strings.Contains(out, poison[0].String()) {
		t.Fatalf("dlq list: code %d\n%s%s", code, out, errOut)
	}
	if out, errOut, code := e.as(migrate.RoleOperator, "dlq", "show", poison[0].String()); code != 0 || !strings.Contains(out, "boom") {
		t.Fatalf("dlq show: code %d\n%s%s", code, out, errOut)
	}
	if out, errOut, code := e.as(migrate.RoleOperator, "dlq", "retry", poison[0].String()); code != 0 {
		t.Fatalf("dlq retry: code %d\n%s%s", code, out, errOut)
	}
	if n := e.count("outbox_events", "quarantined_at IS NULL AND event_id = '"+poison[0].String()+"'"); n != 1 {
		t.Fatal("dlq retry did not release the event")
	}
	if out, errOut, code := e.as(migrate.RoleOperator, "dlq", "skip", poison[1].String(), "--reason", "poison", "--actor", "tester"); code != 0 {
		t.Fatalf("dlq skip: code %d\n%s%s", code, out, errOut)
	}
	if n := e.count("outbox_skipped_events", "skipped_by = 'tester' AND db_user = '"+strings.ReplaceAll(e.roles[migrate.RoleOperator], "'", "''")+"'"); n != 1 {
		t.Fatal("dlq skip left no audit row naming the operator role")
	}
	if out, errOut, code := e.as(migrate.RoleOperator, "replay", "--aggregate-type", "acct", "--broker", "null://", "--log-level", "error"); code != 0 ||
		!strings.Contains(out, "replayed") {
		t.Fatalf("replay: code %d\n%s%s", code, out, errOut)
	}
	e.exec("UPDATE " + e.table("outbox_events") + " SET published_at = now() - interval '30 days' WHERE aggregate_id = 'a3'")
	if out, errOut, code := e.as(migrate.RoleOperator, "cleanup", "--inbox-retention", "336h"); code != 0 || !strings.HasPrefix(out, "deleted 6 ") {
		t.Fatalf("cleanup: code %d\n%s%s", code, out, errOut)
	}
}

// brokerMessage is the delivery of an event of aggregate acct/agg.
func brokerMessage(id pgoutbox.UUID, agg string, seq int64) broker.Message {
	return broker.Message{EventID: id, AggregateType: "acct", AggregateID: agg, AggregateSequence: seq, EventType: "changed",
		SchemaVersion: 1, OccurredAt: time.Now(), Payload: []byte(fmt.Sprint(seq))}
}

// Acceptance: a role without the relay's grants is refused at start with the
// privileges it lacks (exit 1, not a usage error and not "unreachable"); a
// privilege revoked while the relay runs turns /readyz to 503 with PostgreSQL's
// permission error (SQLSTATE 42501), and granting it back makes the relay ready
// and drain.
func TestRelayReportsMissingPrivilegeAsSuch(t *testing.T) {
	t.Parallel()
	e := newRolesEnv(t, "", false)
	e.enqueue(2, "a1", "a2")

	// The consumer role has none of the relay's privileges.
	_, errOut, code := e.as(migrate.RoleConsumer, "relay", "--broker", "null://")
	if code != 1 || !strings.Contains(errOut, "permission denied") || !strings.Contains(errOut, "UPDATE (claimed_by") ||
		!strings.Contains(errOut, `"outbox_events"`) || strings.Contains(errOut, "unreachable") || strings.Count(errOut, "\n") != 1 {
		t.Fatalf("relay as the consumer role: code %d, stderr %q", code, errOut)
	}

	relay := startOpsRelay(t, nil, "--database-url", e.urls[migrate.RoleRelay], "--schema", e.schema, "--broker", "null://",
		"--metrics-addr", "127.0.0.1:0", "--poll-interval", "50ms")
	wait.For(t, 30*time.Second, "the first drain", func() bool { return e.count("outbox_events", "published_at IS NULL") == 0 })
	e.exec("REVOKE UPDATE ON " + e.table("outbox_events") + " FROM " + pgx.Identifier{e.roles[migrate.RoleRelay]}.Sanitize())
	e.enqueue(1, "a3")
	var body string
	wait.For(t, 30*time.Second, "/readyz to report the permission error", func() bool {
		var code int
		code, body = relay.get(t, "/readyz")
		return code == 503 && strings.Contains(body, "permission denied for table outbox_events") && strings.Contains(body, "42501")
	})
	if strings.Contains(body, "unreachable") {
		t.Fatalf("/readyz calls a missing privilege unreachable:\n%s", body)
	}
	if !strings.Contains(relay.stderr.String(), "permission denied") || strings.Contains(relay.stderr.String(), "database unreachable") {
		t.Fatalf("relay log:\n%s", relay.stderr.String())
	}
	e.exec("GRANT UPDATE (claimed_by, claim_until, published_at, attempt_count, last_error, available_at, quarantined_at) ON " +
		e.table("outbox_events") + " TO " + pgx.Identifier{e.roles[migrate.RoleRelay]}.Sanitize())
	wait.For(t, 30*time.Second, "the drain after the grant", func() bool { return e.count("outbox_events", "published_at IS NULL") == 0 })
	wait.For(t, 30*time.Second, "/readyz 200", func() bool { code, _ := relay.get(t, "/readyz"); return code == 200 })
	relay.sigterm(t)
}

// Partitioned: cleanup creates and drops partitions, which PostgreSQL allows the
// table's owner only. As the operator role alone it fails with the permission
// error; as a member of the owner role it drops the old day.
func TestPartitionedCleanupNeedsTheOwnerRole(t *testing.T) {
	t.Parallel()
	e := newRolesEnv(t, "", true)
	e.enqueue(2, "a1")
	// The last partition ahead is missing, as on the day after the last cleanup.
	mig := pgtest.Pool(t, e.urls[migrate.RoleMigrator], 1)
	var last string
	pgtest.Must(t, mig.QueryRow(context.Background(), `SELECT max(c.relname) FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
 WHERE i.inhparent = $1::regclass AND c.relname <> 'outbox_events_default'`, e.table("outbox_events")).Scan(&last), "last partition")
	_, err := mig.Exec(context.Background(), "DROP TABLE "+e.table(last))
	pgtest.Must(t, err, "drop the last partition")
	_, errOut, code := e.as(migrate.RoleOperator, "cleanup")
	if code != 1 || !strings.Contains(errOut, "create partitions") || !strings.Contains(errOut, "(SQLSTATE 42501)") {
		t.Fatalf("cleanup as the operator: code %d, stderr %q", code, errOut)
	}
	e.exec("GRANT " + pgx.Identifier{e.roles[migrate.RoleMigrator]}.Sanitize() + " TO " + pgx.Identifier{e.roles[migrate.RoleOperator]}.Sanitize())
	old := time.Now().UTC().AddDate(0, 0, -20)
	_, err = mig.Exec(context.Background(), fmt.Sprintf("CREATE TABLE %s PARTITION OF %s FOR VALUES FROM ('%s') TO ('%s')", e.table("outbox_events_p"+old.Format("20060102")),
		e.table("outbox_events"), old.Format("2006-01-02"), old.AddDate(0, 0, 1).Format("2006-01-02")))
	pgtest.Must(t, err, "create an old partition as the owner")
	out, errOut, code := e.as(migrate.RoleOperator, "cleanup")
	if code != 0 || !strings.Contains(out, "dropped 1 partitions") {
		t.Fatalf("cleanup as a member of the owner role: code %d\n%s%s", code, out, errOut)
	}
}

// Acceptance: the CDC relay runs as the CDC role (REPLICATION and the printed
// grants, nothing else) once the owner prepared the publication and the column
// defaults as docs/security.md says: it takes over the backlog, streams what the
// producer role commits meanwhile, and stops with status 0.
func TestCDCRelayRunsAsTheCDCRole(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	main := pgtest.Pool(t, pgtest.Logical(t), 2)
	roles := map[migrate.Role]string{}
	for _, r := range migrate.Roles {
		var attrs []string
		if r == migrate.RoleCDC {
			attrs = []string{"REPLICATION"}
		}
		roles[r] = pgtest.Role(t, main, pgtest.Name(string(r)[:3])+`"x`, attrs...)
	}
	// Created after the roles, so dropped before them; the slot is dropped before it.
	dbURL := pgtest.DatabaseOn(t, pgtest.Logical(t))
	admin := pgtest.Pool(t, dbURL, 4)
	schema := pgtest.SchemaName(t, admin, "cdc")
	urls := map[migrate.Role]string{}
	for r, n := range roles {
		urls[r] = pgtest.AsRole(t, dbURL, n)
	}
	_, err := admin.Exec(ctx, "CREATE SCHEMA "+pgx.Identifier{schema}.Sanitize()+" AUTHORIZATION "+pgx.Identifier{roles[migrate.RoleMigrator]}.Sanitize())
	pgtest.Must(t, err, "create schema")
	if out, errOut, code := run(t, "migrate", "--database-url", urls[migrate.RoleMigrator], "--schema", schema); code != 0 {
		t.Fatalf("migrate: code %d\n%s%s", code, out, errOut)
	}
	args := []string{"migrate", "print", "--grants", "--schema", schema}
	for _, r := range migrate.Roles[1:] {
		args = append(args, "--"+string(r)+"-role", roles[r])
	}
	script, errOut, code := run(t, args...)
	if code != 0 {
		t.Fatalf("migrate print --grants: %d %s", code, errOut)
	}
	mig := pgtest.Pool(t, urls[migrate.RoleMigrator], 1)
	_, err = mig.Exec(ctx, script, pgx.QueryExecModeSimpleProtocol)
	pgtest.Must(t, err, "apply the grants")

	// The consumer role has none of the CDC role's grants.
	_, errOut, code = run(t, "relay", "--source", "cdc", "--database-url", urls[migrate.RoleConsumer], "--schema", schema, "--broker", "null://")
	if code != 1 || !strings.Contains(errOut, "permission denied") || !strings.Contains(errOut, `"outbox_events"`) {
		t.Fatalf("cdc relay as the consumer role: code %d, stderr %q", code, errOut)
	}

	e := &relayEnv{t: t, pool: admin, schema: schema, dbURL: urls[migrate.RoleCDC], target: natstest.New(t, natstest.URL())}
	slot := e.dropCDC()
	// The owner's one-time preparation (docs/security.md, "The CDC role"): the
	// publication needs CREATE on the database too, so the DBA creates it.
	events := pgx.Identifier{schema, "outbox_events"}.Sanitize()
	_, err = admin.Exec(ctx, "CREATE PUBLICATION "+pgx.Identifier{slot}.Sanitize()+" FOR TABLE "+events+
		" WITH (publish = 'insert', publish_via_partition_root = true)")
	pgtest.Must(t, err, "create publication")
	_, err = mig.Exec(ctx, "ALTER TABLE "+events+" ALTER COLUMN claimed_by SET DEFAULT 'cdc:"+slot+"', ALTER COLUMN claim_until SET DEFAULT 'infinity'")
	pgtest.Must(t, err, "column defaults as the owner")

	prod := pgtest.Pool(t, urls[migrate.RoleProducer], 2)
	p, err := pgoutbox.NewProducer(&pgoutbox.Config{Schema: schema})
	pgtest.Must(t, err, "producer")
	enqueue := func(n int) {
		var evs []pgoutbox.Event
		for i := range n {
			evs = append(evs, pgoutbox.Event{AggregateType: "acct", AggregateID: fmt.Sprintf("a%d", i%3), EventType: "changed", Payload: i})
		}
		_, err := p.EnqueueTx(ctx, prod, evs...)
		pgtest.Must(t, err, "enqueue as the producer role")
	}
	enqueue(10) // a backlog: the table path's
	relay := e.startCDCRelay(nil)
	enqueue(20) // streamed
	wait.For(t, 60*time.Second, "the CDC role to publish everything", func() bool { return e.count("published_at IS NULL") == 0 })
	relay.stopClean(t, "relay")
	if got := len(e.target.Read(t)); got < 30 {
		t.Fatalf("%d messages on the stream, want 30", got)
	}
}

// migrate print --grants: flags, refusals (exit 2) and quoting.
func TestMigratePrintGrantsFlags(t *testing.T) {
	t.Parallel()
	out, errOut, code := run(t, "migrate", "print", "--grants", "--schema", `s"; DROP TABLE x; --`, "--relay-role", `r"x`,
		"--roles", "relay,operator", "--lines", "outbox")
	if code != 0 || !strings.Contains(out, `GRANT USAGE ON SCHEMA "s""; DROP TABLE x; --" TO "r""x";`) ||
		strings.Contains(out, "pgoutbox_producer") || strings.Contains(out, "processed_events") || !strings.Contains(out, `TO "pgoutbox_operator"`) {
		t.Fatalf("code %d, stderr %q:\n%s", code, errOut, out)
	}
	for _, bad := range [][]string{
		{"--grants", "--producer-role", "public"},
		{"--grants", "--operator-role", "pg_monitor"},
		{"--grants", "--relay-role", "a\nb"},
		{"--grants", "--consumer-role", ""},
		{"--grants", "--roles", "root"},
		{"--producer-role", "app"}, // without --grants
		{"--roles", "relay"},
	} {
		_, errOut, code := run(t, append([]string{"migrate", "print"}, bad...)...)
		if code != 2 || strings.Count(errOut, "\n") != 1 {
			t.Errorf("%q: code %d, stderr %q; want a usage error", bad, code, errOut)
		}
	}
}
