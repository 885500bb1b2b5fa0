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

func TestSignatureFoldsIDsNumbersURLs(t *testing.T) {
	t.Parallel()
	a := admin.Signature(`webhook: event 0b9f3c2e-6a51-4e0b-9d1f-3f2a7c9e1b44: POST https://hooks.example.com/u/123?token=abc: 500 Internal Server Error: "request 98765 failed at 2026-01-02"`)
	b := admin.Signature(`webhook: event 7d1e5a90-1b2c-4d3e-8f40-5a6b7c8d9e0f: POST https://hooks.example.com/u/9?token=zzz: 500 Internal Server Error: "request 1 failed at 2025-12-31"`)
	if a != b {
		t.Fatalf("one cause, two signatures:\n%q\n%q", a, b)
	}
	if !strings.HasPrefix(a.Answer, "500 Internal Server Error") || !strings.Contains(a.Where, "<url>") || strings.Contains(a.String(), "token") {
		t.Fatalf("signature %q: want the receiver's answer first, the URL folded", a)
	}
	if c := admin.Signature(`webhook: event 0b9f3c2e-6a51-4e0b-9d1f-3f2a7c9e1b44: POST https://x/: 503 Service Unavailable`); c.ID() == a.ID() {
		t.Fatalf("503 and 500 share a group: %q", c)
	}
	if n := admin.Signature("nats: maximum payload exceeded"); n.Answer != "maximum payload exceeded" || n.Where != "nats" {
		t.Fatalf("signature %+v", n)
	}
	// Hostile: huge, controls, bidi overrides: bounded, no control left.
	huge := admin.Signature(strings.Repeat("\u202e\x00a1b2c3d4 ", 1<<20))
	if len(huge.String()) > 1100 || strings.ContainsAny(huge.String(), "\x00\u202e") {
		t.Fatalf("hostile text: %d bytes, %q", len(huge.String()), huge.String()[:40])
	}
}

func TestErrorGroupsAndBulkRetryOfAGroup(t *testing.T) {
	t.Parallel()
	e := newDLQEnv(t)
	ctx := context.Background()
	var fiveHundreds []pgoutbox.UUID
	for i, id := range e.enqueue("order", 1, "o-1", "o-2", "o-3") {
		_ = i
		e.quarantine(id[0], "webhook: event "+id[0].String()+": POST https://r.example/"+id[0].String()[:4]+": 500 Internal Server Error")
		fiveHundreds = append(fiveHundreds, id[0])
	}
	other := e.enqueue("invoice", 1, "i-1")["i-1"][0]
	e.quarantine(other, "nats: maximum payload exceeded")
	retrying := e.enqueue("order", 1, "o-9")["o-9"][0]
	_, err := e.pool.Exec(ctx, "UPDATE "+e.table("outbox_events")+" SET attempt_count = 3, available_at = now() + interval '1 hour', last_error = $2 WHERE event_id = $1",
		retrying, "webhook: event "+retrying.String()+": POST https://r.example/zz: 500 Internal Server Error")
	pgtest.Must(t, err, "retrying")

	gs, err := e.admin.ErrorGroups(ctx)
	pgtest.Must(t, err, "groups")
	if len(gs.Groups) != 2 || gs.Events != 5 || gs.Truncated {
		t.Fatalf("groups: %+v", gs)
	}
	g := gs.Groups[0]
	if g.DeadLetters != 3 || g.Retrying != 1 || g.Aggregates != 4 || g.FirstSeen.After(g.LastSeen) {
		t.Fatalf("the 500s group: %+v", g)
	}
	if n, err := e.admin.CountBulk(ctx, admin.Filter{}, g.ID); err != nil || n != 3 {
		t.Fatalf("preview: %d, %v", n, err)
	}
	// A stale preview does nothing.
	_, err = e.admin.RetryBulk(ctx, admin.BulkRequest{Group: g.ID, Expect: 2, Reason: "receiver fixed", Actor: "test"})
	if !errors.Is(err, admin.ErrCountChanged) {
		t.Fatalf("stale preview: %v", err)
	}
	if _, err := e.admin.RetryBulk(ctx, admin.BulkRequest{Group: g.ID, Expect: 3}); !errors.Is(err, admin.ErrNoReason) {
		t.Fatalf("no reason: %v", err)
	}
	done, err := e.admin.RetryBulk(ctx, admin.BulkRequest{Group: g.ID, Expect: 3, Reason: "receiver fixed", Actor: "test"})
	pgtest.Must(t, err, "retry group")
	if !sameIDs(done, fiveHundreds) {
		t.Fatalf("retried %v, want %v", done, fiveHundreds)
	}
	audit, err := e.admin.Audit(ctx, 5)
	pgtest.Must(t, err, "audit")
	if len(audit) != 1 || audit[0].EventCount != 3 || audit[0].Selection["error_group"] != g.ID {
		t.Fatalf("audit: %+v", audit)
	}
	// Skip by filter, with its preview.
	f := admin.Filter{ErrorContains: "payload"}
	n, err := e.admin.CountBulk(ctx, f, "")
	pgtest.Must(t, err, "count")
	sk, err := e.admin.SkipBulk(ctx, admin.BulkRequest{Filter: f, Expect: n, Reason: "too big, re-sent", Actor: "test"})
	if err != nil || len(sk) != 1 || sk[0].EventID != other {
		t.Fatalf("skip by filter: %v %+v", err, sk)
	}
}

func TestSplitPendingAndPages(t *testing.T) {
	t.Parallel()
	e := newDLQEnv(t)
	ctx := context.Background()
	lane := e.enqueue("order", 4, "o-1")["o-1"]
	e.enqueue("order", 2, "o-2")
	e.quarantine(lane[1], "boom")
	st, err := e.admin.Status(ctx)
	pgtest.Must(t, err, "status")
	// o-1: seq 1 waits for a relay, 3 and 4 wait behind the dead letter 2; o-2's two wait for a relay.
	if st.WaitingForRelay != 3 || st.BlockedBehindDeadLetter != 2 || st.Pending != 5 || st.OldestBlockedAge <= 0 {
		t.Fatalf("status: waiting %d blocked %d pending %d oldest blocked %s", st.WaitingForRelay, st.BlockedBehindDeadLetter, st.Pending, st.OldestBlockedAge)
	}

	var failing []pgoutbox.UUID
	for _, id := range e.enqueue("retry", 1, "r-1", "r-2", "r-3", "r-4", "r-5") {
		failing = append(failing, id[0])
	}
	_, err = e.pool.Exec(ctx, "UPDATE "+e.table("outbox_events")+" SET attempt_count = 2, last_error = 'HTTP 500', available_at = now() + interval '1 hour' WHERE event_id = ANY($1)", failing)
	pgtest.Must(t, err, "fail")
	var got []pgoutbox.UUID
	p := admin.Page{Limit: 2}
	for range 5 {
		evs, err := e.admin.ListRetrying(ctx, p)
		pgtest.Must(t, err, "list retrying")
		if len(evs) == 0 {
			break
		}
		got = append(got, ids(evs)...)
		last := evs[len(evs)-1]
		p.After = admin.Cursor{At: last.OccurredAt, ID: last.ID}
	}
	if !sameIDs(got, failing) || len(got) != 5 {
		t.Fatalf("paged retrying: %v, want %v", got, failing)
	}
	if _, err := e.admin.ListRetrying(ctx, admin.Page{Limit: admin.MaxPage + 1}); err == nil {
		t.Fatal("a page over MaxPage was accepted")
	}
	dl, err := e.admin.ListQuarantinedPage(ctx, admin.Filter{}, admin.Page{Limit: 10})
	if err != nil || len(dl) != 1 || dl[0].ID != lane[1] {
		t.Fatalf("quarantined page: %v %v", err, dl)
	}
}
