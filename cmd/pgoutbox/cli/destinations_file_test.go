package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/pgoutbox/pgoutbox"
	"github.com/pgoutbox/pgoutbox/admin"
	"github.com/pgoutbox/pgoutbox/internal/natstest"
	"github.com/pgoutbox/pgoutbox/internal/pgtest"
	"github.com/pgoutbox/pgoutbox/internal/rabbittest"
	"github.com/pgoutbox/pgoutbox/internal/wait"
	"github.com/pgoutbox/pgoutbox/relay"
	"github.com/pgoutbox/pgoutbox/wire"
)

// A file in the documented format is read as written: every destination's
// rules and start, its broker through the registry with the kind's settings.
func TestDestinationsFileAccepted(t *testing.T) {
	env := map[string]string{"ANALYTICS_BROKER_URL": "amqp://app:s3cr3t-PW@rabbit:5672/prod"}
	df, err := parseDestinationsFile([]byte(`# three destinations
destinations:
  - name: analytics
    broker_env: ANALYTICS_BROKER_URL   # holds a password
    start: backfill
    amqp_exchange: analytics
    topic_template: '{aggregate_type}'
    rules:
      - aggregate_types: [order, invoice]
        event_types: created
        headers: {region: eu}
      - all: false
        event_types: [refunded]
  - name: services
    broker: nats://nats:4222
    start: now
    nats_stream: EVENTS
    nats_stream_subjects: [events.>, more.>]
    topic_template: events.{aggregate_type}.{event_type}
    format: cloudevents
    ack_timeout: 2s
    rules:
      - all: true
  - name: partner-hook
    broker: https://partner.example/hooks/{aggregate_type}
    webhook_unsigned: true
    start: now
    rules: [{aggregate_types: [order]}]
`), func(k string) string { return env[k] })
	pgtest.Must(t, err, "parse")
	if len(df.destinations) != 3 || df.names() != "analytics,services,partner-hook" {
		t.Fatalf("destinations %q", df.names())
	}
	a, s, w := df.destinations[0], df.destinations[1], df.destinations[2]
	wantRules := []relay.Rule{{AggregateTypes: []string{"order", "invoice"}, EventTypes: []string{"created"}, Headers: map[string]string{"region": "eu"}},
		{EventTypes: []string{"refunded"}}}
	if a.start != relay.StartBackfill || fmt.Sprint(a.rules) != fmt.Sprint(wantRules) || a.target.kind.name != "rabbitmq" ||
		kindFlags[rabbitmqFlags](a.target.flags, "rabbitmq").exchange != "analytics" || a.target.template.String() != "{aggregate_type}" {
		t.Errorf("analytics = %+v %+v", a, a.target)
	}
	if strings.Contains(a.target.describe(), "s3cr3t") {
		t.Errorf("analytics is described with its password: %s", a.target.describe())
	}
	if s.start != relay.StartNow || len(s.rules) != 1 || !s.rules[0].All || s.target.kind.name != "nats" ||
		kindFlags[natsFlags](s.target.flags, "nats").stream != "EVENTS" || fmt.Sprint(s.target.streamSubjects) != "[events.> more.>]" ||
		s.target.encoding.Format != wire.FormatCloudEvents || s.target.flags.ackTimeout != 2*time.Second {
		t.Errorf("services = %+v %+v", s, s.target)
	}
	if w.target.kind.name != "webhook" || !kindFlags[webhookFlags](w.target.flags, "webhook").unsigned {
		t.Errorf("partner-hook = %+v", w.target)
	}
}

// laughsDestinations is a YAML "billion laughs" whose aliases end in a
// destinations file.
func laughsDestinations(size int) string {
	return strings.Replace(laughs(9, 9, size), "databases:\n  - url:", "destinations:\n  - broker:", 1)
}

// hostileDestinationsFiles are destinations files that must be refused.
var hostileDestinationsFiles = []hostileFile{
	{"laughs 71KB", laughsDestinations(71 << 10), "anchors and aliases"},
	{"laughs at the size limit", laughsDestinations(maxDestinationsFile - 200), "anchors and aliases"},
	{"one anchor", "destinations:\n  - &d\n    broker: nats://u:s3cr3t-PW@h:4222\n", "anchors and aliases"},
	{"over the size limit", "destinations:\n" + strings.Repeat("  - broker: nats://u:s3cr3t-PW@h:4222\n", maxDestinationsFile/35), "larger than its limit"},
	{"many nodes", "destinations: [" + strings.Repeat("s3cr3t-PW,", maxDestinationsFile/12) + "]\n", "YAML nodes"},
	{"deep nesting", strings.Repeat("[", 200_000) + "s3cr3t-PW" + strings.Repeat("]", 200_000), ""},
	{"unknown key", "destinations:\n  - name: d\n    brokr: nats://h:4222\n", "unknown key brokr"},
	{"secret as a key", "destinations:\n  - nats://u:s3cr3t-PW@h:4222: 1\n", "unknown key (not shown)"},
	{"unknown top key", "destination:\n  - name: d\n", "unknown key destination"},
	{"unknown rule key", "destinations:\n  - name: d\n    rules: [{aggregate: s3cr3t-PW}]\n", "unknown key aggregate"},
	{"password in the URL", "destinations:\n  - name: d\n    broker: amqp://guest:s3cr3t-PW@h:5672/\n    start: now\n    rules: [{all: true}]\n", "holds credentials (not shown)"},
	{"token in the URL", "destinations:\n  - name: d\n    broker: nats://s3cr3t-PW@h:4222\n    start: now\n    rules: [{all: true}]\n", "holds credentials (not shown)"},
	{"secret parameter", "destinations:\n  - name: d\n    broker: https://h/x?token=s3cr3t-PW\n    start: now\n    rules: [{all: true}]\n", "holds credentials (not shown)"},
	{"unknown scheme", "destinations:\n  - name: d\n    broker: gopher://h/s3cr3t-PW\n    start: now\n    rules: [{all: true}]\n", "unknown scheme"},
	{"not a URL", "destinations:\n  - name: d\n    broker: 's3cr3t-PW'\n    start: now\n    rules: [{all: true}]\n", "not a broker URL"},
	{"broker_env unset", "destinations:\n  - name: d\n    broker_env: NO_SUCH_VAR_S\n    start: now\n    rules: [{all: true}]\n", "is not set"},
	{"broker_env not a name", "destinations:\n  - name: d\n    broker_env: 's3cr3t-PW'\n", "must be the name of an environment variable"},
	{"both brokers", "destinations:\n  - name: d\n    broker: nats://h:4222\n    broker_env: X\n    start: now\n    rules: [{all: true}]\n", "exactly one of broker and broker_env"},
	{"no start", "destinations:\n  - name: d\n    broker: nats://h:4222\n    rules: [{all: true}]\n", "start is required"},
	{"bad start", "destinations:\n  - name: d\n    start: s3cr3t-PW\n", "start must be now or backfill"},
	{"no rules", "destinations:\n  - name: d\n    broker: nats://h:4222\n    start: now\n", "rules are required"},
	{"empty rule", "destinations:\n  - name: d\n    broker: nats://h:4222\n    start: now\n    rules: [{}]\n", "matches nothing"},
	{"all and more", "destinations:\n  - name: d\n    broker: nats://h:4222\n    start: now\n    rules: [{all: true, event_types: [x]}]\n", "cannot be combined"},
	{"all not a bool", "destinations:\n  - name: d\n    rules: [{all: s3cr3t-PW}]\n", "all must be true or false"},
	{"bad name", "destinations:\n  - name: 's3cr3t-PW Bad'\n", "name must be 1 to 63"},
	{"no name", "destinations:\n  - broker: nats://h:4222\n    start: now\n    rules: [{all: true}]\n", "name is required"},
	{"name twice", "destinations:\n  - {name: d, broker: 'nats://h:4222', start: now, rules: [{all: true}]}\n  - {name: d, broker: 'nats://h:4222', start: now, rules: [{all: true}]}\n", "used twice"},
	{"too many", "destinations:\n" + strings.Repeat("  - name: d\n", relay.MaxDestinations+1), "above the limit of 32"},
	{"bad setting value", "destinations:\n  - name: d\n    ack_timeout: s3cr3t-PW\n", "ack_timeout is not a valid duration (value not shown"},
	{"setting below its floor", "destinations:\n  - name: d\n    broker: nats://h:4222\n    start: now\n    rules: [{all: true}]\n    ack_timeout: 1ms\n", "below its lower bound"},
	{"kind setting refused", "destinations:\n  - name: d\n    broker: nats://h:4222\n    start: now\n    rules: [{all: true}]\n    format: s3cr3t-PW\n", "format"},
	{"setting as a map", "destinations:\n  - name: d\n    topic_template: {s3cr3t-PW: 1}\n", "must be a single value"},
	{"long value", "destinations:\n  - name: d\n    topic_template: s3cr3t-PW" + strings.Repeat("x", 5000) + "\n", "longer than its limit"},
	{"custom tag", "destinations:\n  - name: d\n    broker: !secret nats://u:s3cr3t-PW@h\n", "custom YAML tags"},
	{"two documents", "destinations: []\n---\ndestinations: [s3cr3t-PW]\n", "more than one YAML document"},
	{"syntax error", "destinations:\n  - broker: 'nats://u:s3cr3t-PW@h\n", "line"},
	{"empty", "", "lists no destinations"},
	{"empty list", "destinations: []\n", "lists no destinations"},
}

// Every hostile destinations file is refused with one short line that
// quotes no value, within bounded memory.
func TestDestinationsFileRefusesHostileYAML(t *testing.T) {
	refuseHostileFiles(t, hostileDestinationsFiles, 600, func(ctx context.Context, path string) error {
		_, err := readDestinationsFile(ctx, path)
		return err
	})
}

// --destinations-file goes alone: not with --broker or a broker flag (each
// destination has its own), --tenants, --tenants-file or --source cdc; and a
// hostile file fails the relay with exit status 2 before it connects, quoting
// no secret.
func TestRelayDestinationsFileRefusals(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "d.yaml")
	pgtest.Must(t, os.WriteFile(path, []byte("destinations:\n  - {name: d, broker: 'null://', start: now, rules: [{all: true}]}\n"), 0o600), "write")
	for _, tc := range []struct {
		extra []string
		want  string
	}{
		{[]string{"--broker", "nats://h:4222"}, "--destinations-file and --broker cannot be combined"},
		{[]string{"--topic-template", "x.{aggregate_type}", "--nats-stream", "S"}, "--destinations-file and --nats-stream, --topic-template cannot be combined"},
		{[]string{"--tenants", "tenant_*"}, "not supported with --tenants"},
		{[]string{"--source", "cdc"}, "not supported with --source cdc"},
	} {
		args := append([]string{"relay", "--database-url", "postgres://127.0.0.1:1/none", "--destinations-file", path}, tc.extra...)
		_, errOut, code := run(t, args...)
		if code != 2 || !strings.Contains(errOut, tc.want) {
			t.Errorf("%v: code %d, stderr %q", tc.extra, code, errOut)
		}
	}
	bad := filepath.Join(t.TempDir(), "bad.yaml")
	pgtest.Must(t, os.WriteFile(bad, []byte("destinations:\n  - {name: d, broker: 'amqp://u:s3cr3t-PW@h/', start: now, rules: [{all: true}]}\n"), 0o600), "write")
	_, errOut, code := run(t, "relay", "--database-url", "postgres://127.0.0.1:1/none", "--destinations-file", bad)
	if code != 2 || strings.Contains(errOut, "s3cr3t") || !strings.Contains(errOut, "line 2: destinations[0] (d).broker holds credentials") {
		t.Errorf("a password in the file: code %d, stderr %q", code, errOut)
	}
}

// rabbitURL is the shared RabbitMQ server of the tests.
const rabbitURL = "amqp://guest:guest@127.0.0.1:5672/"

// queued counts the messages in the queue name.
func queued(t *testing.T, ch *amqp.Channel, name string) int {
	t.Helper()
	q, err := ch.QueueDeclarePassive(name, true, false, false, false, nil)
	pgtest.Must(t, err, "inspect queue")
	return q.Messages
}

// End to end: a relay process with a file of two destinations on real
// servers, NATS for the acct events and RabbitMQ (its URL with credentials
// from the environment) for every event: each gets its events, every event
// is done, and destinations list shows them with nothing pending.
func TestRelayDestinationsFileEndToEnd(t *testing.T) {
	t.Parallel()
	e := newRelayEnv(t)
	exchange := pgtest.Name("pgoutbox_cli_dest")
	ch := rabbittest.Queue(t, rabbitURL, exchange, nil)
	path := filepath.Join(t.TempDir(), "destinations.yaml")
	pgtest.Must(t, os.WriteFile(path, fmt.Appendf(nil, `destinations:
  - name: services
    broker: %s
    start: backfill
    nats_stream: %s
    topic_template: '%s'
    rules:
      - aggregate_types: [acct]
  - name: warehouse
    broker_env: WAREHOUSE_BROKER_URL
    start: backfill
    amqp_exchange: %s
    rules:
      - all: true
`, "nats://127.0.0.1:4222", e.target.Stream, e.target.Template, exchange), 0o600), "write")
	e.enqueue(5, 4) // 20 acct events
	p, err := pgoutbox.NewProducer(&pgoutbox.Config{Schema: e.schema})
	pgtest.Must(t, err, "producer")
	_, err = p.EnqueueTx(context.Background(), e.pool, pgoutbox.Event{AggregateType: "user", AggregateID: "u1", EventType: "joined", Payload: 1},
		pgoutbox.Event{AggregateType: "user", AggregateID: "u1", EventType: "left", Payload: 2})
	pgtest.Must(t, err, "enqueue users")

	proc := startRelayProc(t, "relay with destinations", []string{"WAREHOUSE_BROKER_URL=amqp://guest:guest@127.0.0.1:5672/"},
		[]string{"relay", "--database-url", pgtest.URL(), "--schema", e.schema, "--id", "dest-relay", "--destinations-file", path,
			"--poll-interval", "100ms"})
	wait.For(t, 60*time.Second, "every event done", func() bool { return e.count("published_at IS NULL") == 0 })
	wait.For(t, 60*time.Second, "the warehouse queue to hold every event", func() bool { return queued(t, ch, exchange) >= 22 })
	msgs := e.target.Read(t)
	if len(msgs) != 20 {
		t.Errorf("NATS has %d messages, want the 20 acct events", len(msgs))
	}
	if n := queued(t, ch, exchange); n != 22 {
		t.Errorf("RabbitMQ has %d messages, want 22", n)
	}
	if strings.Contains(proc.stderr.String(), "guest:guest") {
		t.Errorf("the relay logged the broker's password:\n%s", proc.stderr.String())
	}
	if !strings.Contains(proc.stderr.String(), "destinations=services,warehouse") {
		t.Errorf("the relay's log does not name its destinations:\n%.3000s", proc.stderr.String())
	}
	out, errOut, code := run(t, "destinations", "list", "--json", "--database-url", pgtest.URL(), "--schema", e.schema)
	var ds []admin.Destination
	if code != 0 || json.Unmarshal([]byte(out), &ds) != nil || len(ds) != 2 || ds[0].Name != "services" || ds[1].Name != "warehouse" ||
		ds[0].PendingEvents != 0 || ds[1].PendingEvents != 0 || ds[1].Start != "backfill" {
		t.Errorf("destinations list: code %d, stderr %q:\n%s", code, errOut, out)
	}
	proc.stopClean(t, "relay")
}

// End to end with the engine: a RabbitMQ destination whose exchange routes
// nowhere quarantines its lanes while the NATS destination gets every event;
// dlq --destination lists them, a skip moves one lane past its event for that
// destination alone, and once a queue is bound a retry delivers the rest, in
// order, and every event is done.
func TestRelayDestinationDeadLettersEndToEnd(t *testing.T) {
	t.Parallel()
	e := newRelayEnv(t)
	name := pgtest.Name("pgoutbox_cli_dlq")
	ch := rabbittest.Exchange(t, rabbitURL, name)
	path := writeDestinationsFile(t, natsDestinationYAML("services", e.target, "[{all: true}]"), fmt.Sprintf(`  - name: warehouse
    broker_env: WAREHOUSE_BROKER_URL
    start: backfill
    amqp_exchange: %s
    rules: [{all: true}]
`, name))
	ids := e.enqueue(2, 3) // a0000 and a0001, 3 events each, interleaved
	proc := startRelayProc(t, "relay with destinations", []string{"WAREHOUSE_BROKER_URL=amqp://guest:guest@127.0.0.1:5672/"},
		[]string{"relay", "--database-url", pgtest.URL(), "--schema", e.schema, "--id", "dlq-relay", "--destinations-file", path,
			"--poll-interval", "100ms", "--max-attempts", "2", "--backoff-base", "10ms", "--backoff-max", "50ms"})
	db := []string{"--database-url", pgtest.URL(), "--schema", e.schema}
	// dlq list --destination refuses a destination no relay has registered yet.
	wait.For(t, 60*time.Second, "the relay to register warehouse", func() bool {
		var n int
		pgtest.Must(t, e.pool.QueryRow(context.Background(), "SELECT count(*) FROM "+
			pgx.Identifier{e.schema, "outbox_destinations"}.Sanitize()+" WHERE name = 'warehouse'").Scan(&n), "registered")
		return n == 1
	})
	list := func() []admin.Event {
		out, errOut, code := run(t, append([]string{"dlq", "list", "--destination", "warehouse", "--json"}, db...)...)
		var evs []admin.Event
		if code != 0 || json.Unmarshal([]byte(out), &evs) != nil {
			t.Fatalf("dlq list --destination: code %d, stderr %q:\n%s", code, errOut, out)
		}
		return evs
	}
	var dead []admin.Event
	wait.For(t, 60*time.Second, "warehouse's two lanes quarantined", func() bool { dead = list(); return len(dead) == 2 })
	wait.For(t, 60*time.Second, "services to have every event", func() bool { return len(e.target.Read(t)) == 6 })
	if dead[0].ID != ids[0] && dead[0].ID != ids[1] || dead[0].AggregateSequence != 1 || dead[1].AggregateSequence != 1 {
		t.Fatalf("dead letters %+v, want the first event of each lane", dead)
	}
	if n := e.count("published_at IS NULL"); n != 6 {
		t.Errorf("%d events pending, want all 6 (warehouse has none)", n)
	}
	out, _, _ := run(t, append([]string{"status"}, db...)...)
	if !strings.Contains(out, "2 (pgoutbox dlq list --destination warehouse)") {
		t.Errorf("status does not show warehouse's dead letters:\n%s", out)
	}

	// Bind a queue; skip a0001's first event for warehouse; retry a0000's.
	skip, retry := dead[0], dead[1]
	if skip.AggregateID != "a0001" {
		skip, retry = retry, skip
	}
	rabbittest.BindQueue(t, ch, name, nil)
	// After the skip, a0001's lane goes on by itself: its next events were never quarantined.
	if out, errOut, code := run(t, append([]string{"dlq", "skip", skip.ID.String(), "--destination", "warehouse", "--reason", "not for the warehouse"}, db...)...); code != 0 {
		t.Fatalf("dlq skip: %d %q %q", code, out, errOut)
	}
	if out, errOut, code := run(t, append([]string{"dlq", "retry", retry.ID.String(), "--destination", "warehouse", "--reason", "queue bound"}, db...)...); code != 0 ||
		out != "retried 1 dead letter of destination warehouse\n" {
		t.Fatalf("dlq retry: %d %q %q", code, out, errOut)
	}
	wait.For(t, 60*time.Second, "every event done", func() bool { return e.count("published_at IS NULL") == 0 })
	var got []string
	for _, d := range rabbittest.Drain(t, ch, name) {
		got = append(got, d.MessageId)
	}
	want := []string{ids[0].String(), ids[2].String(), ids[4].String(), ids[3].String(), ids[5].String()} // a0000 in order, then a0001 without the skipped
	if len(got) != 5 || !sameSet(got, want) || indexOf(got, ids[0].String()) > indexOf(got, ids[2].String()) ||
		indexOf(got, ids[2].String()) > indexOf(got, ids[4].String()) || indexOf(got, ids[3].String()) > indexOf(got, ids[5].String()) {
		t.Errorf("warehouse got %v, want %v in order per aggregate", got, want)
	}
	proc.stopClean(t, "relay")
}

// natsDestinationYAML is a destinations file's entry for a NATS stream of the
// test's own, starting with a backfill.
func natsDestinationYAML(name string, target natstest.Target, rules string) string {
	return fmt.Sprintf(`  - name: %s
    broker: nats://127.0.0.1:4222
    start: backfill
    nats_stream: %s
    topic_template: '%s'
    rules: %s
`, name, target.Stream, target.Template, rules)
}

// writeDestinationsFile writes a destinations file of these entries in the
// test's temporary directory and returns its path.
func writeDestinationsFile(t *testing.T, entries ...string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "destinations.yaml")
	pgtest.Must(t, os.WriteFile(path, []byte("destinations:\n"+strings.Join(entries, "")), 0o600), "write")
	return path
}

func sameSet(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for _, x := range b {
		if indexOf(a, x) < 0 {
			return false
		}
	}
	return true
}

func indexOf(list []string, s string) int {
	for i, x := range list {
		if x == s {
			return i
		}
	}
	return -1
}
