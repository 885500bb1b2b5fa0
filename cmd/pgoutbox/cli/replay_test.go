package cli

import (
	"context"
	"strings"
	"testing"

	"github.com/pgoutbox/pgoutbox/broker/brokertest"
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
