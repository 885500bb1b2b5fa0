package cli

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/pgoutbox/internal/pgtest"
)

// Issue 31, item 2, at the CLI: while another session keeps tenant s_a's
// outbox locked (its table: status, dlq list, cleanup; then its rows FOR
// UPDATE: dlq retry, dlq skip) the verbs with --tenants report s_a as stuck (the
// server's lock bound, admin.ErrTenantStuck's words), act on s_b, and exit 1;
// the lock is still held when they return, so s_a was skipped, not waited on.
func TestTenantsVerbsSkipALockedTenant(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newCLITenants(t, "s_a", "s_b")
	ids := map[string][]string{}
	for _, tenant := range []string{"s_a", "s_b"} {
		evs := e.enqueue(tenant, 4, 0)
		e.exec("UPDATE "+e.table(tenant, "outbox_events")+" SET published_at = now() - interval '10 days' WHERE event_id = ANY($1)", evs[:2])
		e.quarantine(tenant, evs[2], evs[3])
		ids[tenant] = []string{evs[2].String(), evs[3].String()}
	}
	const stuck = "statements time out (a lock held by another session"
	hold := func(sql string) pgx.Tx {
		t.Helper()
		tx, err := e.pool.Begin(ctx)
		pgtest.Must(t, err, "begin the holder")
		t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
		_, err = tx.Exec(ctx, sql)
		pgtest.Must(t, err, "hold: %s", sql)
		return tx
	}
	stillHeld := func(tx pgx.Tx) {
		t.Helper()
		if tx.Conn().PgConn().TxStatus() != 'T' {
			t.Fatal("the holder's transaction ended")
		}
	}

	tx := hold("LOCK TABLE " + e.table("s_a", "outbox_events") + " IN ACCESS EXCLUSIVE MODE")
	out, errOut, code := e.run("status", "--tenants", "s_*")
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if code != 1 || !strings.Contains(errOut, "1 of 2 tenants could not be read") || len(lines) != 4 ||
		!strings.HasPrefix(lines[1], "s_a ") || !strings.Contains(lines[1], stuck) ||
		!strings.HasPrefix(lines[2], "s_b ") || !strings.HasSuffix(lines[2], " -") {
		t.Fatalf("status --tenants: code %d, stderr %q:\n%s", code, errOut, out)
	}
	out, errOut, code = e.run("dlq", "list", "--tenants", "s_*")
	if code != 1 || !strings.Contains(errOut, "tenant s_a: ") || !strings.Contains(errOut, stuck) ||
		!strings.Contains(out, ids["s_b"][0]) || !strings.Contains(out, ids["s_b"][1]) || strings.Contains(out, ids["s_a"][0]) {
		t.Fatalf("dlq list --tenants: code %d, stderr %q:\n%s", code, errOut, out)
	}
	out, errOut, code = e.run("cleanup", "--tenants", "s_*", "--json")
	var rows []struct {
		Tenant  string  `json:"tenant"`
		Deleted int64   `json:"deleted"`
		Error   *string `json:"error"`
	}
	if code != 1 || !strings.Contains(errOut, "cleanup failed for 1 of 2 tenants") || json.Unmarshal([]byte(out), &rows) != nil ||
		len(rows) != 2 || rows[0].Error == nil || !strings.Contains(*rows[0].Error, stuck) ||
		rows[1].Tenant != "s_b" || rows[1].Error != nil || rows[1].Deleted != 2 {
		t.Fatalf("cleanup --tenants: code %d, stderr %q:\n%s", code, errOut, out)
	}
	stillHeld(tx)
	pgtest.Must(t, tx.Rollback(ctx), "release the table")

	// Rows locked FOR UPDATE: the reads go on, the writes to them are bounded.
	tx = hold("SELECT 1 FROM " + e.table("s_a", "outbox_events") + " FOR UPDATE")
	out, errOut, code = e.run("dlq", "retry", ids["s_a"][0], ids["s_b"][0], "--tenants", "*", "--reason", "fixed")
	if code != 1 || out != "tenant s_b: retried 1 event\n" || !strings.Contains(errOut, "tenant s_a: ") || !strings.Contains(errOut, stuck) ||
		!strings.Contains(errOut, "1 of 2 tenants were stuck") {
		t.Fatalf("dlq retry --tenants: code %d, stderr %q: %q", code, errOut, out)
	}
	out, errOut, code = e.run("dlq", "skip", ids["s_a"][1], ids["s_b"][1], "--tenants", "*", "--reason", "gone")
	if code != 1 || !strings.HasPrefix(out, "tenant s_b: skipped 1 event") || !strings.Contains(errOut, stuck) {
		t.Fatalf("dlq skip --tenants: code %d, stderr %q: %q", code, errOut, out)
	}
	// A cleanup's batches pass rows locked by others by (SKIP LOCKED): it
	// runs, leaves them, and reports no error.
	out, errOut, code = e.run("cleanup", "--tenants", "s_*", "--json")
	rows = nil
	if code != 0 || json.Unmarshal([]byte(out), &rows) != nil || len(rows) != 2 || rows[0].Error != nil || rows[0].Deleted != 0 {
		t.Fatalf("cleanup --tenants, rows locked: code %d, stderr %q:\n%s", code, errOut, out)
	}
	stillHeld(tx)
	pgtest.Must(t, tx.Rollback(ctx), "release the rows")

	if n := e.count("s_a", "outbox_events", "quarantined_at IS NOT NULL"); n != 2 {
		t.Errorf("s_a: %d quarantined, want its 2 left alone", n)
	}
	if n := e.count("s_b", "outbox_events", "quarantined_at IS NOT NULL"); n != 0 {
		t.Errorf("s_b: %d quarantined, want 0", n)
	}
	if n := e.count("s_a", "outbox_events", "true"); n != 4 {
		t.Errorf("s_a: %d events, want 4 (not cleaned)", n)
	}
}
