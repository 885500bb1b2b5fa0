package inbox_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/pgoutbox/pgoutbox/inbox"
	"github.com/pgoutbox/pgoutbox/internal/pgtest"
)

// Acceptance: retention refuses a horizon shorter than the replay horizon, and
// deletes old rows oldest first in bounded batches, leaving recent ones.
func TestCleanup(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 2)
	ctx := context.Background()
	// 2,500 rows of "billing" applied 10 days ago, 10 applied now, 300 of "mail"
	// applied 10 days ago.
	f.exec(t, `INSERT INTO `+f.table("processed_events")+` (consumer_name, event_id, processed_at)
		SELECT 'billing', gen_random_uuid(), now() - interval '10 days' - i * interval '1 second' FROM generate_series(1, 2500) i`)
	f.exec(t, `INSERT INTO `+f.table("processed_events")+` (consumer_name, event_id)
		SELECT 'billing', gen_random_uuid() FROM generate_series(1, 10)`)
	f.exec(t, `INSERT INTO `+f.table("processed_events")+` (consumer_name, event_id, processed_at)
		SELECT 'mail', gen_random_uuid(), now() - interval '10 days' FROM generate_series(1, 300)`)
	f.exec(t, `INSERT INTO `+f.table("consumer_positions")+` (consumer_name, aggregate_type, aggregate_id, last_sequence)
		VALUES ('billing', 'order', '1', 7)`)
	week := 7 * 24 * time.Hour

	for name, cfg := range map[string]inbox.CleanupConfig{
		"shorter than the replay horizon": {Retention: 24 * time.Hour, ReplayHorizon: week},
		"no replay horizon":               {Retention: week},
		"no retention":                    {ReplayHorizon: week},
		"negative batch":                  {Retention: week, ReplayHorizon: week, BatchSize: -1},
	} {
		cfg.Schema = f.schema
		res, err := inbox.Cleanup(ctx, inbox.Pgx(f.pool), cfg)
		if err == nil || res.Deleted != 0 {
			t.Errorf("%s: deleted %d, err %v; want a refusal", name, res.Deleted, err)
		}
		if name == "shorter than the replay horizon" && !errors.Is(err, inbox.ErrRetentionTooShort) {
			t.Errorf("%s: %v does not match ErrRetentionTooShort", name, err)
		}
		if verr := cfg.Validate(); verr == nil || err == nil || verr.Error() != err.Error() {
			t.Errorf("%s: Validate = %v, want Cleanup's refusal %v", name, verr, err)
		}
	}
	if err := (&inbox.CleanupConfig{Retention: week, ReplayHorizon: week}).Validate(); err != nil {
		t.Errorf("a valid CleanupConfig: Validate = %v", err)
	}
	if n := f.count(t, "processed_events", "true"); n != 2810 {
		t.Fatalf("%d rows after refusals, want 2810", n)
	}

	res, err := inbox.Cleanup(ctx, inbox.Pgx(f.pool), inbox.CleanupConfig{
		Schema: f.schema, Consumer: "billing", Retention: week, ReplayHorizon: week, BatchSize: 1000})
	pgtest.Must(t, err, "Cleanup")
	if res.Deleted != 2500 || res.Batches != 3 {
		t.Fatalf("deleted %d in %d batches, want 2500 in 3", res.Deleted, res.Batches)
	}
	if n := f.count(t, "processed_events", "consumer_name = 'billing'"); n != 10 {
		t.Fatalf("%d billing rows left, want the 10 recent ones", n)
	}
	if n := f.count(t, "processed_events", "consumer_name = 'mail'"); n != 300 {
		t.Fatalf("%d mail rows left, want 300 (another consumer)", n)
	}
	if n := f.count(t, "consumer_positions", "true"); n != 1 {
		t.Fatal("cleanup touched consumer_positions")
	}

	// Every consumer, through database/sql; exactly one full batch then an empty one.
	res, err = inbox.Cleanup(ctx, inbox.SQL(sqlDB(t)), inbox.CleanupConfig{
		Schema: f.schema, Retention: week, ReplayHorizon: week, BatchSize: 300})
	pgtest.Must(t, err, "Cleanup")
	if res.Deleted != 300 || res.Batches != 2 || time.Since(res.Cutoff) < week {
		t.Fatalf("result %+v", res)
	}
}

func TestCleanupErrorNamesTheFields(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 1)
	_, err := inbox.Cleanup(context.Background(), inbox.Pgx(f.pool), inbox.CleanupConfig{
		Schema: f.schema, Retention: time.Hour, ReplayHorizon: 48 * time.Hour})
	if err == nil || !strings.Contains(err.Error(), "Retention 1h0m0s is shorter than CleanupConfig.ReplayHorizon 48h0m0s") {
		t.Fatalf("error %v", err)
	}
}
