package admin_test

import (
	"context"
	"errors"
	"testing"

	"github.com/pgoutbox/pgoutbox"
	"github.com/pgoutbox/pgoutbox/admin"
	"github.com/pgoutbox/pgoutbox/broker"
	"github.com/pgoutbox/pgoutbox/broker/brokertest"
	"github.com/pgoutbox/pgoutbox/internal/pgtest"
)

// A published event whose row carries a reserved or invalid header (written by a
// raw INSERT, or published before the rule existed) is refused by a replay, by
// the relay's rule, and never re-sent.
func TestReplayRefusesReservedHeaders(t *testing.T) {
	t.Parallel()
	pool, schema := pgtest.Migrated(t, 4)
	ctx := context.Background()
	table := quoted(schema, "outbox_events")
	for _, hdr := range []string{`{"Nats-Rollup": "all"}`, `{"authorization": "Bearer x"}`, `{"X-Delay": "1"}`, `{"k": "a\r\nb"}`, `{"a:b": "v"}`} {
		_, err := pool.Exec(ctx, "DELETE FROM "+table)
		pgtest.Must(t, err, "clean")
		_, err = pool.Exec(ctx, "INSERT INTO "+table+" (event_id, aggregate_type, aggregate_id, aggregate_sequence, event_type, payload, headers, published_at)"+
			" VALUES ($1, 'raw', 'r1', 1, 'raw.inserted', '{}', $2::jsonb, now())", pgoutbox.NewEventID(), hdr)
		pgtest.Must(t, err, "raw insert")
		rec := &brokertest.Recorder{}
		_, err = admin.Replay(ctx, pool, rec, admin.ReplayRequest{Schema: schema})
		var re *admin.ReplayError
		if !errors.As(err, &re) || !broker.IsPermanent(re.Err) {
			t.Errorf("headers %s: replay err = %v, want a permanent refusal", hdr, err)
		}
		if n := len(rec.Messages()); n != 0 {
			t.Errorf("headers %s: %d messages re-sent", hdr, n)
		}
	}
}
