package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/pgoutbox/pgoutbox"
	"github.com/pgoutbox/pgoutbox/admin"
	"github.com/pgoutbox/pgoutbox/broker"
	"github.com/pgoutbox/pgoutbox/broker/brokertest"
	"github.com/pgoutbox/pgoutbox/internal/natstest"
	"github.com/pgoutbox/pgoutbox/internal/pgtest"
)

// pgoutbox replay prints the count first; --dry-run publishes nothing; a replay
// reaches the broker with the original ids, in order per aggregate.
func TestReplayCommand(t *testing.T) {
	t.Parallel()
	e := newRelayEnv(t)
	ids := e.enqueue(20, 50)
	_, err := e.pool.Exec(context.Background(), "UPDATE "+e.table()+" SET published_at = now()")
	pgtest.Must(t, err, "publish")
	base := []string{"replay", "--database-url", pgtest.URL(), "--schema", e.schema}

	out, errOut, code := run(t, append(base, "--dry-run", "--aggregate-type", "acct")...)
	if code != 0 || out != "1000 events selected (acct: 1000)\ndry run: nothing published\n" {
		t.Fatalf("dry run: code %d, stdout %q, stderr %q", code, out, errOut)
	}
	if got := e.target.Read(t); len(got) != 0 {
		t.Fatalf("the dry run published %d messages", len(got))
	}

	out, errOut, code = run(t, append(base, "--all", "--broker", "nats://127.0.0.1:4222", "--nats-stream", e.target.Stream,
		"--topic-template", e.target.Template, "--batch-size", "400", "--log-level", "error")...)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if code != 0 || len(lines) != 2 || lines[0] != "1000 events selected (acct: 1000)" ||
		!strings.HasPrefix(lines[1], "replayed 1000 events in 3 batches in ") {
		t.Fatalf("replay: code %d, stdout %q, stderr %q", code, out, errOut)
	}
	if dups := brokertest.CheckStream(t, e.target.Read(t), ids); dups != 0 {
		t.Fatalf("%d duplicates on the stream", dups)
	}

	// Filters select; nothing selected publishes nothing.
	out, _, code = run(t, append(base, "--dry-run", "--event-id", ids[3].String()+","+ids[4].String(), "--since", "1h")...)
	if code != 0 || !strings.HasPrefix(out, "2 events selected") {
		t.Fatalf("event ids: code %d, stdout %q", code, out)
	}
	out, _, code = run(t, append(base, "--broker", "null://", "--until", "2000-01-01")...)
	if code != 0 || out != "0 events selected\n" {
		t.Fatalf("nothing selected: code %d, stdout %q", code, out)
	}

	for _, bad := range [][]string{
		{"--event-id", "nope"},
		{"--since", "yesterday"},
		{"--since", "1h", "--until", "2h"},
		{"--batch-size", "0"},
		{"--all", "--broker", "bogus://x"},
		{"--broker", "null://"},                      // no selection
		{"--dry-run"},                                // no selection
		{"--all", "--aggregate-type", "acct"},        // both
		{"--all", "--since", "1h", "--dry-run"},      // both
		{"--all"},                                    // no broker
		{"--all", "--broker", "", "--dry-run=false"}, // empty broker
	} {
		_, errOut, code := run(t, append(base, bad...)...)
		if code != 2 || strings.Count(errOut, "\n") != 1 {
			t.Errorf("%v: code %d, stderr %q; want a usage error", bad, code, errOut)
		}
	}
}

// replay --destination re-publishes to one destination of a relay with
// destinations, through its broker and settings from the relay's file, and to
// no other; the selection is what that destination passed and its rules take;
// misuse is a usage error, an unknown or unregistered name an error naming it.
func TestReplayDestinationCommand(t *testing.T) {
	t.Parallel()
	e := newRelayEnv(t)
	warehouse := natstest.New(t, natstest.URL())
	ids := e.enqueue(3, 4) // 12 acct events
	p, err := pgoutbox.NewProducer(&pgoutbox.Config{Schema: e.schema})
	pgtest.Must(t, err, "producer")
	_, err = p.EnqueueTx(context.Background(), e.pool, pgoutbox.Event{AggregateType: "user", AggregateID: "u1", EventType: "joined", Payload: 1})
	pgtest.Must(t, err, "enqueue a user")
	ops := schemaDB{t: t, pool: e.pool, schema: e.schema}
	// services takes acct events, warehouse every event; both passed them all.
	ops.exec(`UPDATE ` + e.table() + ` SET published_at = now()`)
	ops.exec(`INSERT INTO ` + ops.table("outbox_destinations") + ` (name, rules, start) VALUES
  ('services', '[{"aggregate_types": ["acct"]}]', 'backfill'), ('warehouse', '[{"all": true}]', 'backfill')`)
	ops.exec(`INSERT INTO ` + ops.table("outbox_destination_lanes") + ` (destination, aggregate_type, aggregate_id, delivered_sequence)
SELECT d, aggregate_type, aggregate_id, max(aggregate_sequence) FROM ` + e.table() + `, unnest(ARRAY['services', 'warehouse']) d GROUP BY 1, 2, 3`)
	path := writeDestinationsFile(t, natsDestinationYAML("services", e.target, "[{aggregate_types: [acct]}]"),
		natsDestinationYAML("warehouse", warehouse, "[{all: true}]"), `  - name: archive
    broker: nats://127.0.0.1:4222
    start: now
    rules: [{all: true}]
`)
	base := []string{"replay", "--database-url", pgtest.URL(), "--schema", e.schema, "--log-level", "error"}

	out, errOut, code := run(t, append(base, "--destination", "services", "--dry-run", "--all")...)
	if code != 0 || out != "12 events selected for destination services (acct: 12)\ndry run: nothing published\n" {
		t.Fatalf("dry run: code %d, stdout %q, stderr %q", code, out, errOut)
	}
	out, errOut, code = run(t, append(base, "--destination", "warehouse", "--destinations-file", path, "--all",
		"--actor", "ops", "--reason", "warehouse restored from an old backup")...)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if code != 0 || len(lines) != 2 || lines[0] != "13 events selected for destination warehouse (acct: 12, user: 1)" ||
		!strings.HasPrefix(lines[1], "replayed 13 events in 1 batches") {
		t.Fatalf("replay to warehouse: code %d, stdout %q, stderr %q", code, out, errOut)
	}
	got := warehouse.Read(t)
	acct := slices.DeleteFunc(slices.Clone(got), func(m broker.Message) bool { return m.AggregateType != "acct" })
	if dups := brokertest.CheckStream(t, acct, ids); dups != 0 || len(got) != 13 {
		t.Fatalf("warehouse has %d messages (%d duplicates), want the 12 acct events and the user's", len(got), dups)
	}
	if n := len(e.target.Read(t)); n != 0 {
		t.Fatalf("a replay to warehouse sent %d messages to services", n)
	}
	out, _, _ = run(t, "dlq", "audit", "--json", "--database-url", pgtest.URL(), "--schema", e.schema)
	var audit []admin.AuditEntry
	if json.Unmarshal([]byte(out), &audit) != nil || len(audit) != 1 || audit[0].Selection["destination"] != "warehouse" ||
		!strings.Contains(fmt.Sprint(audit[0].Selection["broker"]), "127.0.0.1:4222") || audit[0].Actor != "ops" {
		t.Fatalf("dlq audit:\n%s", out)
	}

	for _, c := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"--destination", "warehouse", "--all"}, 2, "needs --destinations-file"},
		{[]string{"--destinations-file", path, "--all", "--broker", "null://"}, 2, "goes with --destination"},
		{[]string{"--destination", "nowhere", "--destinations-file", path, "--all"}, 2, "has no destination nowhere (it has services,warehouse,archive)"},
		{[]string{"--destination", "warehouse", "--destinations-file", path, "--all", "--broker", "null://"}, 2, "cannot be combined"},
		{[]string{"--destination", "warehouse", "--all", "--dry-run", "--tenants", "*"}, 2, "cannot be combined"},
		{[]string{"--destination", "warehouse", "--destinations-file", filepath.Join(t.TempDir(), "none.yaml"), "--all"}, 2, "--destinations-file"},
		{[]string{"--destination", "archive", "--destinations-file", path, "--all"}, 1, "destination not found: archive"},
		{[]string{"--destination", "nowhere", "--dry-run", "--all"}, 1, "destination not found: nowhere"},
		{[]string{"--destination", "warehouse", "--dry-run"}, 2, "say which events"},
	} {
		_, errOut, code := run(t, append(base, c.args...)...)
		if code != c.code || !strings.Contains(errOut, c.want) {
			t.Errorf("%v: code %d, stderr %q; want %d and %q", c.args, code, errOut, c.code, c.want)
		}
	}
	plain := newOpsEnv(t)
	if _, errOut, code := run(t, plain.args("replay", "--destination", "warehouse", "--dry-run", "--all")...); code != 1 ||
		!strings.Contains(errOut, "no destination is registered") {
		t.Errorf("an outbox without destinations: code %d, stderr %q", code, errOut)
	}
	if n := len(warehouse.Read(t)) + len(e.target.Read(t)); n != 13 {
		t.Errorf("refused replays published: %d messages in all, want 13", n)
	}
}
