package admin_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/pgoutbox/pgoutbox"
	"github.com/pgoutbox/pgoutbox/admin"
	"github.com/pgoutbox/pgoutbox/internal/pgtest"
)

// Actors and reasons are data: recorded verbatim, whatever they hold; blank ones
// take the defaults; a failed action leaves no audit row, and the audit row of
// a retry commits or rolls back with it.
func TestAuditRecordsHostileTextVerbatim(t *testing.T) {
	t.Parallel()
	pool, schema := pgtest.Migrated(t, 2)
	ctx := context.Background()
	p, err := pgoutbox.NewProducer(&pgoutbox.Config{Schema: schema})
	pgtest.Must(t, err, "producer")
	a, err := admin.New(pool, &admin.Config{Schema: schema})
	pgtest.Must(t, err, "admin")
	table := quoted(schema, "outbox_events")
	hostile := []struct{ actor, reason string }{
		{"'); DROP TABLE outbox_events; --", "$$ SELECT pg_sleep(10) $$"},
		{"ali\nce", "line one\nline two\r\n"},
		{"日本語 \u202e", "NUL-free but \u00a0odd\u200b"},
		{"   ", "\t"},                // defaults
		{"x", "%s %d %v {{schema}}"}, // placeholders stay text
	}
	for i, h := range hostile {
		res, err := p.EnqueueTx(ctx, pool, pgoutbox.Event{AggregateType: "a", AggregateID: string(rune('a' + i)), EventType: "e"})
		pgtest.Must(t, err, "enqueue")
		_, err = pool.Exec(ctx, "UPDATE "+table+" SET quarantined_at = now() WHERE event_id = $1", res[0].EventID)
		pgtest.Must(t, err, "quarantine")
		got, err := a.RetryEvents(ctx, admin.RetryRequest{IDs: []pgoutbox.UUID{res[0].EventID}, Actor: h.actor, Reason: h.reason})
		if err != nil || len(got) != 1 {
			t.Fatalf("%q/%q: %v, %v", h.actor, h.reason, got, err)
		}
	}
	// Text PostgreSQL cannot store, or too long, is refused before anything is done.
	for _, bad := range []admin.RetryRequest{{All: true, Reason: "nul\x00byte"}, {All: true, Actor: "\xff\xfe"},
		{All: true, Reason: strings.Repeat("r", admin.MaxAuditText+1)}} {
		if _, err := a.RetryEvents(ctx, bad); !errors.Is(err, admin.ErrInvalidAuditText) {
			t.Errorf("%.40q/%.40q: %v, want ErrInvalidAuditText", bad.Actor, bad.Reason, err)
		}
	}
	if _, err := a.Skip(ctx, admin.SkipRequest{IDs: []pgoutbox.UUID{pgoutbox.NewEventID()}, Reason: "x\x00"}); !errors.Is(err, admin.ErrInvalidAuditText) {
		t.Errorf("skip with a NUL: %v", err)
	}
	// Failed actions leave nothing.
	if _, err := a.RetryEvents(ctx, admin.RetryRequest{IDs: []pgoutbox.UUID{pgoutbox.NewEventID()}, Reason: "nope"}); !errors.Is(err, admin.ErrNotFound) {
		t.Fatalf("unknown id: %v", err)
	}
	if _, err := a.Skip(ctx, admin.SkipRequest{IDs: []pgoutbox.UUID{pgoutbox.NewEventID()}, Reason: "nope"}); !errors.Is(err, admin.ErrNotFound) {
		t.Fatalf("skip unknown id: %v", err)
	}
	if _, err := a.RetryEvents(ctx, admin.RetryRequest{All: true, IDs: []pgoutbox.UUID{pgoutbox.NewEventID()}}); err == nil {
		t.Fatal("ids and all together accepted")
	}
	entries, err := a.Audit(ctx, 0)
	pgtest.Must(t, err, "audit")
	if len(entries) != len(hostile) {
		t.Fatalf("%d audit rows, want %d", len(entries), len(hostile))
	}
	for i, h := range hostile {
		e := entries[len(hostile)-1-i]
		wantActor, wantReason := h.actor, h.reason
		if i == 3 {
			wantActor, wantReason = admin.DefaultActor(), admin.DefaultReason
		}
		if e.Action != admin.ActionRetry || e.Actor != trim(wantActor) || e.Reason != trim(wantReason) || e.EventCount != 1 {
			t.Errorf("row %d: %+v, want actor %q reason %q", i, e, wantActor, wantReason)
		}
	}
	var n int
	pgtest.Must(t, pool.QueryRow(ctx, "SELECT count(*) FROM "+table).Scan(&n), "the outbox is still there")

	// In a caller's transaction that rolls back, the audit row goes with the retry.
	tx, err := pool.Begin(ctx)
	pgtest.Must(t, err, "begin")
	ta, err := admin.New(tx, &admin.Config{Schema: schema})
	pgtest.Must(t, err, "admin on tx")
	_, err = tx.Exec(ctx, "UPDATE "+table+" SET quarantined_at = now()")
	pgtest.Must(t, err, "quarantine all")
	if _, err := ta.RetryEvents(ctx, admin.RetryRequest{All: true, Reason: "rolled back"}); err != nil {
		t.Fatal(err)
	}
	pgtest.Must(t, tx.Rollback(ctx), "rollback")
	if entries, _ := a.Audit(ctx, 100); len(entries) != len(hostile) {
		t.Fatalf("%d audit rows after a rolled-back retry, want %d", len(entries), len(hostile))
	}
}

func trim(s string) string {
	for len(s) > 0 && (s[0] == ' ' || s[0] == '\t' || s[0] == '\n' || s[0] == '\r') {
		s = s[1:]
	}
	for len(s) > 0 && (s[len(s)-1] == ' ' || s[len(s)-1] == '\t' || s[len(s)-1] == '\n' || s[len(s)-1] == '\r') {
		s = s[:len(s)-1]
	}
	return s
}
