package admin_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/pgoutbox/admin"
	"github.com/pgoutbox/pgoutbox/internal/pgtest"
)

// Relays lists running relays first, then stopped and gone ones by when they
// were last seen; cleanup forgets the heartbeats older than its retention.
func TestRelaysAndTheirCleanup(t *testing.T) {
	t.Parallel()
	pool, schema := pgtest.Migrated(t, 2)
	ctx := context.Background()
	_, err := pool.Exec(ctx, "INSERT INTO "+pgx.Identifier{schema, "outbox_relays"}.Sanitize()+
		` (relay_id, source, version, host, pid, state, beat_every, started_at, last_seen) VALUES
		('stopped-old', 'poll', 'v', 'h', 1, 'stopped', '15s', now() - interval '40 days', now() - interval '30 days'),
		('gone', 'poll', 'v', 'h', 2, 'busy', '15s', now() - interval '1 hour', now() - interval '10 minutes'),
		('busy', 'cdc', 'v', 'h', 3, 'busy', '15s', now() - interval '1 hour', now()),
		('stopped', 'poll', 'v', 'h', 4, 'stopped', '15s', now() - interval '1 hour', now() - interval '1 minute')`)
	pgtest.Must(t, err, "heartbeats")
	a, err := admin.New(pool, &admin.Config{Schema: schema})
	pgtest.Must(t, err, "admin")
	order := func() []string {
		hs, err := a.Relays(ctx)
		pgtest.Must(t, err, "relays")
		var ids []string
		for _, h := range hs {
			if h.Running() != (h.ID == "busy") || h.Gone != (h.ID == "gone") {
				t.Errorf("%s: running %v, gone %v", h.ID, h.Running(), h.Gone)
			}
			ids = append(ids, h.ID)
		}
		return ids
	}
	if got := order(); len(got) != 4 || got[0] != "busy" || got[1] != "stopped" || got[2] != "gone" || got[3] != "stopped-old" {
		t.Fatalf("order %v", got)
	}
	res, err := admin.Cleanup(ctx, pool, admin.CleanupConfig{Schema: schema, Retention: 7 * 24 * time.Hour})
	pgtest.Must(t, err, "cleanup")
	if got := order(); res.RelaysForgotten != 1 || len(got) != 3 {
		t.Fatalf("cleanup forgot %d heartbeats; left %v", res.RelaysForgotten, got)
	}
}
