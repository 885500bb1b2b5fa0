package cli

import (
	"context"
	"encoding/json"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/pgoutbox"
	"github.com/pgoutbox/pgoutbox/admin"
	"github.com/pgoutbox/pgoutbox/internal/natstest"
	"github.com/pgoutbox/pgoutbox/internal/pgtest"
)

// unreachableDB is a database URL that refuses connections at once: a command
// that gets as far as connecting exits 1, one refused at its flags exits 2.
const unreachableDB = "postgres://x@127.0.0.1:1/db"

// Item 1: no silent sink. Every verb that publishes refuses to start without a
// broker, whether the flag is missing, empty or blank, or the environment
// variable is unset, empty or blank. Not parallel: it sets PGOUTBOX_BROKER.
func TestNoBrokerNoStart(t *testing.T) {
	verbs := map[string][]string{
		"relay":              {"relay", "--database-url", unreachableDB},
		"relay --source cdc": {"relay", "--source", "cdc", "--database-url", unreachableDB},
		"replay":             {"replay", "--all", "--database-url", unreachableDB},
		"replay by type":     {"replay", "--aggregate-type", "order", "--database-url", unreachableDB},
		"cdc recover":        {"cdc", "recover", "--database-url", unreachableDB},
	}
	variants := []struct {
		name  string
		env   *string
		extra []string
	}{
		{"no flag, env unset", nil, nil},
		{"env empty", ptr(""), nil},
		{"env blank", ptr("   "), nil},
		{"flag empty", nil, []string{"--broker", ""}},
		{"flag blank", nil, []string{"--broker", " \t"}},
		{"flag empty=", nil, []string{"--broker="}},
		{"flag empty, env empty", ptr(""), []string{"--broker", ""}},
	}
	for _, v := range variants {
		t.Setenv("PGOUTBOX_BROKER", "") // restored after the test
		if v.env == nil {
			os.Unsetenv("PGOUTBOX_BROKER")
		} else {
			os.Setenv("PGOUTBOX_BROKER", *v.env)
		}
		for name, args := range verbs {
			_, errOut, code := run(t, append(append([]string{}, args...), v.extra...)...)
			if code != 2 || strings.Count(errOut, "\n") != 1 {
				t.Errorf("%s, %s: exit %d, stderr %q; want exit 2 and one line", name, v.name, code, errOut)
			}
			for _, want := range []string{"--broker", "PGOUTBOX_BROKER", "no default", "nats://", "kafka://", "amqp://", "https://", "null://", "embedded"} {
				if !strings.Contains(errOut, want) {
					t.Errorf("%s, %s: stderr %q lacks %q", name, v.name, errOut, want)
				}
			}
		}
	}
	// The help says so too.
	for _, verb := range [][]string{{"relay"}, {"replay"}, {"cdc", "recover"}} {
		out, _, _ := run(t, append(verb, "--help")...)
		if !strings.Contains(out, "there is no default") || !strings.Contains(out, "(no default)") {
			t.Errorf("%v --help does not say there is no default broker", verb)
		}
	}
	// A dry run of replay publishes nothing and needs no broker.
	e := newOpsEnv(t)
	e.enqueue(1, "o1")
	os.Unsetenv("PGOUTBOX_BROKER")
	if out, errOut, code := run(t, e.args("replay", "--all", "--dry-run")...); code != 0 || !strings.Contains(out, "dry run") {
		t.Fatalf("replay --dry-run without a broker: exit %d, %q, %q", code, out, errOut)
	}
}

func ptr[T any](v T) *T { return &v }

// Item 1: --broker embedded is an explicit choice that says where events go; the
// relay's start line names the broker without its credentials.
func TestRelayNamesItsBroker(t *testing.T) {
	t.Parallel()
	e := newRelayEnv(t)
	p := e.startRelay("embedded", "embedded", "--embedded-dir", t.TempDir(), "--log-level", "info")
	code := p.stop(t, syscall.SIGTERM)
	log := p.stderr.String()
	if code != 0 || !strings.Contains(log, "level=WARN") || !strings.Contains(log, "inside this process") ||
		!strings.Contains(log, "lost with its data directory") {
		t.Fatalf("embedded: exit %d, no WARN about the in-process server:\n%s", code, log)
	}
	if !lineWith(log, "relay starting", `broker="embedded (in-process NATS JetStream`) {
		t.Fatalf("the start line does not name the embedded broker:\n%s", log)
	}

	// The test NATS server takes any credentials; none may show.
	u := strings.Replace(natstest.URL(), "nats://", "nats://relay-user:s3cr3t-pw@", 1)
	p = e.startRelay("creds", u, "--log-level", "info")
	p.stop(t, syscall.SIGTERM)
	log = p.stderr.String()
	if strings.Contains(log, "s3cr3t-pw") || strings.Contains(log, "relay-user") || !lineWith(log, "relay starting", "broker=nats://xxxxx@127.0.0.1") {
		t.Fatalf("the start line leaks or lacks the broker:\n%s", log)
	}
}

func lineWith(log string, all ...string) bool {
	for _, l := range strings.Split(log, "\n") {
		ok := true
		for _, s := range all {
			ok = ok && strings.Contains(l, s)
		}
		if ok {
			return true
		}
	}
	return false
}

// describe never shows a credential, whatever URL form holds it.
func TestDescribeBrokerHidesCredentials(t *testing.T) {
	t.Parallel()
	secret := "Sx9-secret"
	for raw, want := range map[string]string{
		"nats://u:" + secret + "@h:4222":                                  "nats://xxxxx@h:4222",
		"nats://" + secret + "@h:4222":                                    "nats://xxxxx@h:4222",
		"nats://u:" + secret + "@a:4222,nats://u:" + secret + "@b:4222":   "nats://xxxxx@b:4222",
		"tls://u:p@ss" + secret + "@h":                                    "tls://xxxxx@h",
		"kafka://u:" + secret + "@b1:9092,b2:9092?sasl=plain&tls=true":    "kafka://xxxxx@b1:9092,b2:9092?sasl=plain&tls=true",
		"kafka://u:pa," + secret + "@b1:9092?sasl=plain":                  "kafka://xxxxx@b1:9092?sasl=plain",
		"amqp://guest:" + secret + "@rabbit:5672/vhost":                   "amqp://xxxxx@rabbit:5672/vhost",
		"amqps://u:" + secret + "%40x@rabbit/v":                           "amqps://xxxxx@rabbit/v",
		"https://h/hook?token=" + secret:                                  "https://h/hook?…",
		"https://u:" + secret + "@h/hook/{aggregate_type}":                "https://xxxxx@h/hook/{aggregate_type}",
		"http://h/hook#" + secret:                                         "http://h/hook?…",
		"wss://u:" + secret + "@h:443/ws":                                 "wss://xxxxx@h:443/ws",
		"nats://h:4222":                                                   "nats://h:4222",
		"nats-without-scheme-" + secret:                                   "(broker URL hidden)",
		"kafka://b1:9092":                                                 "kafka://b1:9092",
		"amqp://" + secret + ":@h":                                        "amqp://xxxxx@h",
		"https://h/p?a=1&" + "sig=" + secret:                              "https://h/p?…",
		"nats://u:" + strings.Repeat(secret, 3) + "@[::1]:4222":           "nats://xxxxx@[::1]:4222",
		"nats://u:" + secret + "@h:4222, nats://u:" + secret + "@i:4222 ": "nats://xxxxx@i:4222",
	} {
		got := (&brokerTarget{kind: kindNamed("nats"), flags: &brokerFlags{url: raw}}).describe()
		if strings.Contains(got, secret) || got != want {
			t.Errorf("describe(%q) = %q, want %q", raw, got, want)
		}
	}
}

// Item 8: every interval and timeout flag of every verb has a lower bound, checked
// by one helper, from the flag or the environment.
func TestDurationLowerBounds(t *testing.T) {
	t.Parallel()
	verbs := map[string][]string{
		"relay":       {"relay", "--broker", "null://"},
		"relay cdc":   {"relay", "--source", "cdc", "--broker", "null://"},
		"replay":      {"replay", "--all", "--broker", "null://"},
		"cleanup":     {"cleanup"},
		"status":      {"status"},
		"dlq list":    {"dlq", "list"},
		"dlq retry":   {"dlq", "retry", "--all"},
		"dlq audit":   {"dlq", "audit"},
		"cdc recover": {"cdc", "recover", "--broker", "null://"},
		"migrate":     {"migrate"},
	}
	checked := 0
	for name, base := range verbs {
		c := newRoot(nil, nil)
		sub, _, err := c.Find(base)
		pgtest.Must(t, err, "find %v", base)
		for flag, floor := range durationFloors {
			if sub.Flags().Lookup(flag) == nil {
				continue
			}
			values := []string{"1ns", "-1s", (floor - time.Nanosecond).String()}
			if !zeroOK[flag] {
				values = append(values, "0s", "0")
			}
			for _, v := range values {
				args := append(append([]string{}, base...), "--database-url", unreachableDB, "--"+flag, v)
				if flag == "retention" {
					args = append(args, "--force")
				}
				_, errOut, code := run(t, args...)
				if code != 2 || !strings.Contains(errOut, "--"+flag) || strings.Count(errOut, "\n") != 1 ||
					!(strings.Contains(errOut, floor.String()) || strings.Contains(errOut, "must not be negative") || strings.Contains(errOut, "must be positive")) {
					t.Errorf("%s --%s %s: exit %d, stderr %q; want exit 2 naming the flag and its bound", name, flag, v, code, errOut)
				}
				checked++
			}
			// At the bound the flags pass: the command goes on to the database.
			args := append(append([]string{}, base...), "--database-url", unreachableDB, "--"+flag, floor.String())
			if flag == "retention" || flag == "inbox-retention" {
				args = append(args, "--force")
			}
			if flag == "inbox-retention" {
				args = append(args, "--retention", floor.String())
			}
			if flag == "backoff-max" {
				args = append(args, "--backoff-base", floor.String())
			}
			if flag == "publish-timeout" {
				args = append(args, "--lease", "1s")
			}
			if _, errOut, code := run(t, args...); code == 2 && strings.Contains(errOut, "lower bound") {
				t.Errorf("%s --%s %s (the bound itself): refused: %q", name, flag, floor, errOut)
			}
		}
	}
	if checked < 60 {
		t.Fatalf("only %d flag values checked: the floors do not reach the verbs", checked)
	}
}

// The environment takes the same path as the flags; bad values and unknown flags
// are usage errors too. Not parallel: it sets variables.
func TestDurationBoundsFromEnvironment(t *testing.T) {
	for env, args := range map[string][]string{
		"PGOUTBOX_POLL_INTERVAL=1ns":       {"relay", "--broker", "null://"},
		"PGOUTBOX_LEASE=10ms":              {"relay", "--broker", "null://"},
		"PGOUTBOX_ACK_TIMEOUT=1us":         {"replay", "--all", "--broker", "null://"},
		"PGOUTBOX_CONNECT_TIMEOUT=-5s":     {"status"},
		"PGOUTBOX_STATUS_INTERVAL=1ms":     {"status", "--watch"},
		"PGOUTBOX_RETENTION=1m":            {"cleanup"},
		"PGOUTBOX_CLEANUP_INTERVAL=1ns":    {"relay", "--broker", "null://"},
		"PGOUTBOX_POLL_INTERVAL=soon":      {"relay", "--broker", "null://"},
		"PGOUTBOX_BATCH_SIZE=many":         {"relay", "--broker", "null://"},
		"PGOUTBOX_SHUTDOWN_TIMEOUT=1ns":    {"relay", "--broker", "null://"},
		"PGOUTBOX_BACKOFF_BASE=1ns":        {"relay", "--broker", "null://"},
		"PGOUTBOX_EMBEDDED_PORT=not-a-num": {"relay", "--broker", "embedded"},
	} {
		name, value, _ := strings.Cut(env, "=")
		t.Setenv(name, value)
		_, errOut, code := run(t, append(args, "--database-url", unreachableDB)...)
		if code != 2 || !strings.Contains(errOut, "--") || strings.Count(errOut, "\n") != 1 {
			t.Errorf("%s %v: exit %d, stderr %q; want a usage error", env, args, code, errOut)
		}
		os.Unsetenv(name)
	}
	for _, args := range [][]string{
		{"relay", "--broker", "null://", "--no-such-flag"},
		{"dlq", "retry", "--all", "--frobnicate", "x"},
		{"cleanup", "--dry-runn"},
		{"replay", "--all", "-z"},
	} {
		if _, errOut, code := run(t, append(args, "--database-url", unreachableDB)...); code != 2 || !strings.Contains(errOut, "unknown") {
			t.Errorf("%v: exit %d, stderr %q; want exit 2, unknown flag", args, code, errOut)
		}
	}
}

// Item 8: a retention below the floor needs --force, in cleanup and in the relay.
func TestRetentionFloorNeedsForce(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{
		{"cleanup", "--retention", "59m"},
		{"cleanup", "--retention", "1ms"},
		{"cleanup", "--retention", "30s", "--force=false"},
		{"relay", "--broker", "null://", "--cleanup-interval", "1m", "--retention", "10m"},
		{"relay", "--broker", "null://", "--retention", "1s"},
	} {
		_, errOut, code := run(t, append(args, "--database-url", unreachableDB)...)
		if code != 2 || !strings.Contains(errOut, "--force") || !strings.Contains(errOut, "1h") {
			t.Errorf("%v: exit %d, stderr %q; want exit 2 asking for --force", args, code, errOut)
		}
	}
	e := newRelayEnv(t)
	ids := e.enqueue(2, 5)
	_, err := e.pool.Exec(context.Background(), "UPDATE "+e.table()+" SET published_at = now() - interval '10 minutes' WHERE event_id = ANY($1)", ids[:4])
	pgtest.Must(t, err, "publish")
	base := []string{"cleanup", "--database-url", pgtest.URL(), "--schema", e.schema}
	if out, errOut, code := run(t, append(base, "--retention", "5m")...); code != 2 || e.count("true") != 10 {
		t.Fatalf("without --force: exit %d, %q, %q, %d rows left", code, out, errOut, e.count("true"))
	}
	if out, errOut, code := run(t, append(base, "--retention", "5m", "--force")...); code != 0 || !strings.HasPrefix(out, "deleted 4 ") || e.count("true") != 6 {
		t.Fatalf("with --force: exit %d, %q, %q, %d rows left", code, out, errOut, e.count("true"))
	}
}

// Item 8: cleanup --dry-run says what would go, table by table, and deletes
// nothing, plain and partitioned.
func TestCleanupDryRun(t *testing.T) {
	t.Parallel()
	e := newRelayEnv(t)
	ids := e.enqueue(3, 10)
	ctx := context.Background()
	_, err := e.pool.Exec(ctx, "UPDATE "+e.table()+" SET published_at = now() - interval '10 days' WHERE event_id = ANY($1)", ids[:12])
	pgtest.Must(t, err, "publish")
	_, err = e.pool.Exec(ctx, "UPDATE "+e.table()+" SET quarantined_at = now() - interval '10 days' WHERE event_id = ANY($1)", ids[12:14])
	pgtest.Must(t, err, "quarantine")
	_, err = e.pool.Exec(ctx, "INSERT INTO "+pgx.Identifier{e.schema, "processed_events"}.Sanitize()+
		" (consumer_name, event_id, processed_at) SELECT 'c', gen_random_uuid(), now() - interval '30 days' FROM generate_series(1, 7)")
	pgtest.Must(t, err, "dedup rows")
	base := []string{"cleanup", "--database-url", pgtest.URL(), "--schema", e.schema, "--dry-run"}

	out, errOut, code := run(t, append(base, "--inbox-retention", "336h")...)
	if code != 0 || !strings.HasPrefix(out, "dry run: would delete 12 published events older than ") ||
		!strings.Contains(out, "delete 7 dedup rows (processed_events)") || !strings.HasSuffix(out, "; nothing deleted\n") {
		t.Fatalf("dry run: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
	out, _, code = run(t, append(base, "--json")...)
	var sum cleanupSummary
	if code != 0 || json.Unmarshal([]byte(out), &sum) != nil || !sum.DryRun || sum.Deleted != 12 || sum.Batches != 0 {
		t.Fatalf("dry run --json: exit %d, %q", code, out)
	}
	if n := e.count("true"); n != 30 {
		t.Fatalf("the dry runs deleted rows: %d of 30 left", n)
	}
	var dedup int
	pgtest.Must(t, e.pool.QueryRow(ctx, "SELECT count(*) FROM "+pgx.Identifier{e.schema, "processed_events"}.Sanitize()).Scan(&dedup), "count")
	if dedup != 7 {
		t.Fatalf("the dry run deleted dedup rows: %d of 7 left", dedup)
	}

	// The partitioned outbox: admin's TestCleanupDryRunPartitioned.
}

// Item 8: stream subjects that cannot hold the subject template fail at start
// with exit 2 (and create nothing), not by quarantining every event.
func TestRelayRefusesStreamSubjectsThatCannotHoldTheTemplate(t *testing.T) {
	t.Parallel()
	e := newRelayEnv(t)
	e.enqueue(1, 3)
	ctx := context.Background()
	other := natstest.New(t, natstest.URL()) // an existing stream, deleted after the test
	existing := other.Stream
	_, err := other.JS.CreateStream(ctx, jetstream.StreamConfig{Name: existing, Subjects: []string{other.Prefix + ".other.>"}})
	pgtest.Must(t, err, "create stream")
	js := other.JS
	fresh := e.target.Stream // must not be created
	for _, c := range []struct {
		stream string
		flags  []string
	}{
		{fresh, []string{"--nats-stream-subjects", "foo.>", "--topic-template", "outbox.{aggregate_type}"}},
		{fresh, []string{"--nats-stream-subjects", "outbox.*.created", "--topic-template", "outbox.{aggregate_type}"}},
		{fresh, []string{"--nats-stream-subjects", "outbox.order", "--topic-template", "outbox.{aggregate_type}.{event_type}"}},
		{fresh, []string{"--nats-stream-subjects", "a.>,b.>", "--topic-template", "c.{aggregate_type}"}},
		{existing, []string{"--topic-template", "outbox.{aggregate_type}.{event_type}"}},
		{existing, []string{"--topic-template", other.Prefix + ".{aggregate_type}"}},
	} {
		args := append([]string{"relay", "--database-url", pgtest.URL(), "--schema", e.schema, "--broker", natstest.URL(),
			"--nats-stream", c.stream}, c.flags...)
		_, errOut, code := run(t, args...)
		if code != 2 || !strings.Contains(errOut, "do not hold the subjects") || strings.Count(errOut, "\n") != 1 {
			t.Errorf("%s %v: exit %d, stderr %q; want exit 2, subjects that cannot hold the template", c.stream, c.flags, code, errOut)
		}
	}
	if _, err := js.Stream(ctx, fresh); err == nil {
		t.Errorf("stream %s was created with subjects that cannot hold the template", fresh)
	}
	if n := e.count("quarantined_at IS NOT NULL OR attempt_count > 0"); n != 0 {
		t.Fatalf("%d events touched", n)
	}
}

// Item 9: an id no event has is "not found", exit 1, for show, retry and skip, and
// nothing is changed.
func TestDLQUnknownIDNotFound(t *testing.T) {
	t.Parallel()
	e := newOpsEnv(t)
	evs := e.enqueue(1, "o1")
	e.quarantine(evs["o1"][0], "boom")
	unknown := pgoutbox.NewEventID().String()
	for _, args := range [][]string{
		{"dlq", "show", unknown},
		{"dlq", "retry", unknown},
		{"dlq", "retry", evs["o1"][0].String(), unknown},
		{"dlq", "retry", unknown, unknown},
		{"dlq", "skip", unknown, "--reason", "gone"},
		{"dlq", "skip", evs["o1"][0].String(), unknown, "--reason", "gone"},
	} {
		_, errOut, code := run(t, e.args(args...)...)
		if code != 1 || !strings.Contains(errOut, "not found") || !strings.Contains(errOut, unknown) {
			t.Errorf("%v: exit %d, stderr %q; want exit 1, not found naming the id", args, code, errOut)
		}
	}
	if n := e.count("outbox_events", "quarantined_at IS NOT NULL"); n != 1 {
		t.Fatalf("a refused action changed the dead letter")
	}
	if n := e.count("outbox_operator_audit", "true"); n != 0 {
		t.Fatalf("%d audit rows for actions that did nothing", n)
	}
}

// Item 9: retry, skip and replay are each audited with who (--actor and the
// database role), when, why and what, and dlq audit shows them.
func TestOperatorActionsAreAudited(t *testing.T) {
	e := newOpsEnv(t) // not parallel: it sets USER and PGOUTBOX_ACTOR
	t.Setenv("PGOUTBOX_ACTOR", "")
	os.Unsetenv("PGOUTBOX_ACTOR")
	t.Setenv("USER", "env-user")
	evs := e.enqueue(2, "o1", "o2", "o3")
	e.quarantine(evs["o1"][0], "boom")
	e.quarantine(evs["o2"][0], "boom")
	e.exec("UPDATE "+e.table("outbox_events")+" SET published_at = now() WHERE event_id = ANY($1)", evs["o3"])

	if _, errOut, code := run(t, e.args("dlq", "retry", evs["o1"][0].String(), "--actor", "alice", "--reason", "schema fixed, TICKET-1")...); code != 0 {
		t.Fatalf("retry: %d %q", code, errOut)
	}
	if _, errOut, code := run(t, e.args("dlq", "retry", "--aggregate-id", "o2")...); code != 0 { // defaults
		t.Fatalf("retry by filter: %d %q", code, errOut)
	}
	e.quarantine(evs["o2"][0], "boom again")
	if _, errOut, code := run(t, e.args("dlq", "skip", evs["o2"][0].String(), "--actor", "bob", "--reason", "refunded by hand")...); code != 0 {
		t.Fatalf("skip: %d %q", code, errOut)
	}
	if _, errOut, code := run(t, e.args("replay", "--aggregate-id", "o3", "--broker", "null://", "--actor", "carol", "--reason", "consumer rebuilt")...); code != 0 {
		t.Fatalf("replay: %d %q", code, errOut)
	}
	if _, errOut, code := run(t, e.args("replay", "--aggregate-id", "o3", "--dry-run")...); code != 0 { // not audited
		t.Fatalf("replay --dry-run: %d %q", code, errOut)
	}

	out, errOut, code := run(t, e.args("dlq", "audit", "--json")...)
	var got []admin.AuditEntry
	if code != 0 || json.Unmarshal([]byte(out), &got) != nil || len(got) != 4 {
		t.Fatalf("dlq audit --json: exit %d, stderr %q:\n%s", code, errOut, out)
	}
	var role string
	pgtest.Must(t, e.pool.QueryRow(context.Background(), "SELECT current_user").Scan(&role), "current_user")
	replay, skip, byFilter, retry := got[0], got[1], got[2], got[3]
	check := func(name string, a admin.AuditEntry, action, actor, reason string, count int64, ids ...pgoutbox.UUID) {
		t.Helper()
		if a.Action != action || a.Actor != actor || a.Reason != reason || a.DBUser != role || a.EventCount != count ||
			time.Since(a.At) > time.Minute || len(a.EventIDs) != len(ids) {
			t.Errorf("%s: %+v", name, a)
		}
		for i := range ids {
			if i < len(a.EventIDs) && a.EventIDs[i] != ids[i] {
				t.Errorf("%s: event ids %v, want %v", name, a.EventIDs, ids)
			}
		}
	}
	check("retry", retry, admin.ActionRetry, "alice", "schema fixed, TICKET-1", 1, evs["o1"][0])
	check("retry by filter", byFilter, admin.ActionRetry, admin.DefaultActor(), admin.DefaultReason, 1, evs["o2"][0])
	check("skip", skip, admin.ActionSkip, "bob", "refunded by hand", 1, evs["o2"][0])
	check("replay", replay, admin.ActionReplay, "carol", "consumer rebuilt", 2)
	if byFilter.Selection["filter"].(map[string]any)["aggregate_id"] != "o2" || replay.Selection["aggregate_id"] != "o3" ||
		replay.Selection["destination"] != "null://" || replay.Selection["run_id"] == nil || replay.Outcome["published"] != float64(2) {
		t.Errorf("selections: filter %v, replay %v, outcome %v", byFilter.Selection, replay.Selection, replay.Outcome)
	}
	out, _, code = run(t, e.args("dlq", "audit")...)
	for _, want := range []string{"ACTION", "dlq_retry", "dlq_skip", "replay", "alice", "bob", "carol", role, "refunded by hand"} {
		if code != 0 || !strings.Contains(out, want) {
			t.Errorf("dlq audit lacks %q:\n%s", want, out)
		}
	}
}

// Item 9: a broker that refuses the credentials, and broker URL parameters that
// make no sense, are configuration errors: exit 2, the secret not shown.
func TestBrokerRefusalsExitTwo(t *testing.T) {
	t.Parallel()
	e := newRelayEnv(t)
	opts := &server.Options{Host: "127.0.0.1", Port: -1, JetStream: true, StoreDir: t.TempDir(), NoLog: true, NoSigs: true,
		Username: "relay", Password: "right-pw"}
	srv, err := server.NewServer(opts)
	pgtest.Must(t, err, "nats server")
	go srv.Start()
	if !srv.ReadyForConnections(10 * time.Second) {
		t.Fatal("nats server not ready")
	}
	t.Cleanup(srv.Shutdown)
	addr := srv.Addr().String()
	for _, b := range []string{
		"nats://relay:wr0ng-pw@" + addr,
		"nats://" + addr,
		"nats://wr0ng-pw@" + addr,
		"amqp://guest:wr0ng-pw@127.0.0.1:5672/",
		"amqp://nobody:wr0ng-pw@127.0.0.1:5672/",
		"amqp://guest:guest@127.0.0.1:5672/no-such-vhost",
		"amqp://guest:wr0ng-pw@127.0.0.1:5672/?heartbeat=soon",
		"amqp://guest:wr0ng-pw@127.0.0.1:5672/?no_such_param=1",
		"kafka://u:wr0ng-pw@127.0.0.1:9092?sasl=nope",
		"kafka://u:wr0ng-pw@127.0.0.1:9092?tls=perhaps",
		"nats://u:wr0ng-pw@127.0.0.1:99999",
		"https://u:wr0ng-pw@example.invalid/hook?x={nope}",
	} {
		args := []string{"relay", "--database-url", pgtest.URL(), "--schema", e.schema, "--broker", b,
			"--nats-stream", e.target.Stream, "--topic-template", e.target.Template, "--webhook-unsigned", "--log-level", "error"}
		if strings.HasPrefix(b, "amqp") || strings.HasPrefix(b, "kafka") {
			args = append(args[:len(args)-6], "--webhook-unsigned", "--log-level", "error")
		}
		_, errOut, code := run(t, args...)
		if code != 2 || strings.Contains(errOut, "wr0ng-pw") || strings.Count(errOut, "\n") != 1 {
			t.Errorf("--broker %s: exit %d, stderr %q; want exit 2 without the secret", b, code, errOut)
		}
	}
}

// An actor or reason PostgreSQL cannot store is a usage error, and nothing is done.
func TestAuditTextRefused(t *testing.T) {
	t.Parallel()
	e := newOpsEnv(t)
	evs := e.enqueue(1, "o1", "o2")
	e.quarantine(evs["o1"][0], "boom")
	e.exec("UPDATE "+e.table("outbox_events")+" SET published_at = now() WHERE event_id = ANY($1)", evs["o2"])
	for _, args := range [][]string{
		{"dlq", "retry", "--all", "--reason", "nul\x00byte"},
		{"dlq", "retry", "--all", "--actor", "\xff\xfe"},
		{"dlq", "retry", evs["o1"][0].String(), "--reason", strings.Repeat("long ", 1000)},
		{"dlq", "skip", evs["o1"][0].String(), "--reason", "nul\x00byte"},
		{"dlq", "skip", evs["o1"][0].String(), "--reason", "ok", "--actor", "a\x00b"},
		{"replay", "--all", "--broker", "null://", "--reason", "\xc3\x28"},
	} {
		_, errOut, code := run(t, e.args(args...)...)
		if code != 2 || !strings.Contains(errOut, "valid UTF-8 without NUL") {
			t.Errorf("%q: exit %d, stderr %q; want exit 2", args, code, errOut)
		}
	}
	if n := e.count("outbox_events", "quarantined_at IS NOT NULL"); n != 1 {
		t.Fatal("a refused action changed the dead letter")
	}
	if n := e.count("outbox_operator_audit", "true"); n != 0 {
		t.Fatalf("%d audit rows for refused actions", n)
	}
}
