package cli

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/pgoutbox/pgoutbox/internal/natstest"
	"github.com/pgoutbox/pgoutbox/internal/pgtest"
	"github.com/pgoutbox/pgoutbox/internal/wait"
)

// pgoutbox cleanup deletes old published events in batches and reports it, as
// one line or as JSON; bad flags are usage errors.
func TestCleanupCommand(t *testing.T) {
	t.Parallel()
	e := newRelayEnv(t)
	ids := e.enqueue(3, 10)
	ctx := context.Background()
	_, err := e.pool.Exec(ctx, "UPDATE "+e.table()+" SET published_at = now() - interval '10 days' WHERE event_id = ANY($1)", ids[:20])
	pgtest.Must(t, err, "publish")
	_, err = e.pool.Exec(ctx, "UPDATE "+e.table()+" SET quarantined_at = now() - interval '10 days' WHERE event_id = ANY($1)", ids[20:22])
	pgtest.Must(t, err, "quarantine")
	base := []string{"cleanup", "--database-url", pgtest.URL(), "--schema", e.schema}

	out, errOut, code := run(t, append(base, "--batch-size", "7", "--json", "--inbox-retention", "336h")...)
	var sum struct {
		Cutoff            time.Time `json:"cutoff"`
		Deleted           int64     `json:"deleted"`
		Batches           int       `json:"batches"`
		DroppedPartitions []string  `json:"dropped_partitions"`
		InboxDeleted      int64     `json:"inbox_deleted"`
		DurationSeconds   float64   `json:"duration_seconds"`
	}
	if code != 0 || json.Unmarshal([]byte(out), &sum) != nil {
		t.Fatalf("cleanup --json: code %d, stdout %q, stderr %q", code, out, errOut)
	}
	// 30 rows walked 7 at a time, then an empty batch.
	if sum.Deleted != 20 || sum.Batches != 6 || sum.DroppedPartitions == nil || time.Since(sum.Cutoff) < 167*time.Hour {
		t.Fatalf("summary %+v", sum)
	}
	if n := e.count("true"); n != 10 {
		t.Fatalf("%d rows left, want 10 (2 quarantined, 8 unpublished)", n)
	}

	out, errOut, code = run(t, base...)
	if code != 0 || !strings.HasPrefix(out, "deleted 0 published events older than ") || strings.Count(out, "\n") != 1 {
		t.Fatalf("cleanup: code %d, stdout %q, stderr %q", code, out, errOut)
	}

	for _, bad := range [][]string{
		{"--retention", "0s"},
		{"--batch-size", "0"},
		{"--inbox-retention", "1h"},
		{"--inbox-schema", "x"},
	} {
		_, errOut, code := run(t, append(base, bad...)...)
		if code != 2 || strings.Count(errOut, "\n") != 1 {
			t.Errorf("%v: code %d, stderr %q; want a usage error", bad, code, errOut)
		}
	}
}

// pgoutbox migrate --partitioned, then cleanup drops a whole old day.
func TestCleanupCommandDropsPartition(t *testing.T) {
	t.Parallel()
	pool, schema := pgtest.Schema(t, 2)
	out, errOut, code := run(t, "migrate", "--database-url", pgtest.URL(), "--schema", schema, "--partitioned")
	if code != 0 || !strings.Contains(out, "applied outbox/0001_outbox_events") {
		t.Fatalf("migrate --partitioned: code %d, stdout %q, stderr %q", code, out, errOut)
	}
	ctx := context.Background()
	day := time.Now().UTC().AddDate(0, 0, -10).Truncate(24 * time.Hour)
	name := "outbox_events_p" + day.Format("20060102")
	_, err := pool.Exec(ctx, `CREATE TABLE "`+schema+`".`+name+` PARTITION OF "`+schema+`".outbox_events FOR VALUES FROM ('`+
		day.Format(time.RFC3339)+`') TO ('`+day.AddDate(0, 0, 1).Format(time.RFC3339)+`')`)
	pgtest.Must(t, err, "old partition")
	_, err = pool.Exec(ctx, `INSERT INTO "`+schema+`".outbox_events (event_id, aggregate_type, aggregate_id, aggregate_sequence, event_type, payload, occurred_at, published_at)
SELECT gen_random_uuid(), 'a', 'x', i, 'e', '{}', $1, $1 FROM generate_series(1, 100) AS i`, day.Add(time.Hour))
	pgtest.Must(t, err, "old rows")

	out, errOut, code = run(t, "cleanup", "--database-url", pgtest.URL(), "--schema", schema, "--json")
	var sum struct {
		DroppedPartitions []string `json:"dropped_partitions"`
		DroppedRows       int64    `json:"dropped_rows"`
	}
	if code != 0 || json.Unmarshal([]byte(out), &sum) != nil || len(sum.DroppedPartitions) != 1 || sum.DroppedPartitions[0] != name || sum.DroppedRows != 100 {
		t.Fatalf("cleanup: code %d, stdout %q, stderr %q", code, out, errOut)
	}
}

// pgoutbox relay --cleanup-interval deletes old published events while it
// publishes new ones.
func TestRelayRunsCleanupJob(t *testing.T) {
	t.Parallel()
	e := newRelayEnv(t)
	ctx := context.Background()
	old := e.enqueue(5, 10)
	_, err := e.pool.Exec(ctx, "UPDATE "+e.table()+" SET published_at = now() - interval '2 hours' WHERE event_id = ANY($1)", old)
	pgtest.Must(t, err, "publish")
	p := e.startRelay("cleaner", natstest.URL(), "--cleanup-interval", "200ms", "--retention", "1h")
	fresh := e.enqueue(5, 4)
	wait.For(t, 60*time.Second, "old events deleted and new ones published", func() bool {
		return e.count("true") == len(fresh) && e.count("published_at IS NULL") == 0
	})
	// The rows are gone once the last deleting batch commits; the run logs
	// after its closing empty batch.
	wait.For(t, 60*time.Second, "the relay to log its cleanup", func() bool {
		return strings.Contains(p.stderr.String(), "cleanup done")
	})
	p.stopClean(t, "relay")
	_, errOut, code := run(t, "relay", "--database-url", pgtest.URL(), "--schema", e.schema, "--cleanup-interval", "-1s")
	if code != 2 {
		t.Fatalf("negative --cleanup-interval: code %d, stderr %q", code, errOut)
	}
}
