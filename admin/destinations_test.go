package admin_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/pgoutbox/pgoutbox"
	"github.com/pgoutbox/pgoutbox/admin"
	"github.com/pgoutbox/pgoutbox/internal/pgtest"
	"github.com/pgoutbox/pgoutbox/relay"
)

// destEnv is a migrated schema with two registered destinations, analytics
// and partners, and two lanes of three events each (order a1, order a2).
// Progress rows are written by the test as a relay with destinations would.
type destEnv struct {
	*dlqEnv
	ids map[string][]pgoutbox.UUID
}

func newDestEnv(t *testing.T) *destEnv {
	t.Helper()
	e := &destEnv{dlqEnv: newDLQEnv(t)}
	e.ids = e.enqueue("order", 3, "a1", "a2")
	for _, name := range []string{"analytics", "partners"} {
		e.exec(`INSERT INTO `+e.table("outbox_destinations")+` (name, rules, start) VALUES ($1, '[{"all":true}]', 'backfill')`, name)
	}
	return e
}

func (e *destEnv) exec(sql string, args ...any) {
	e.t.Helper()
	_, err := e.pool.Exec(context.Background(), sql, args...)
	pgtest.Must(e.t, err, "exec %s", sql)
}

// lane writes a destination's progress on lane order/agg.
func (e *destEnv) lane(dest, agg string, delivered int64, quarantinedAt *int64) {
	e.t.Helper()
	q := `INSERT INTO ` + e.table("outbox_destination_lanes") + ` (destination, aggregate_type, aggregate_id, delivered_sequence,
       attempt_count, last_error, quarantined_at, quarantined_sequence)
VALUES ($1, 'order', $2, $3, CASE WHEN $4::bigint IS NULL THEN 0 ELSE 10 END,
        CASE WHEN $4::bigint IS NULL THEN NULL ELSE 'broker refused it' END,
        CASE WHEN $4::bigint IS NULL THEN NULL ELSE now() END, $4)`
	e.exec(q, dest, agg, delivered, quarantinedAt)
}

func seq(n int64) *int64 { return &n }

func findDest(t *testing.T, ds []admin.Destination, name string) admin.Destination {
	t.Helper()
	for _, d := range ds {
		if d.Name == name {
			return d
		}
	}
	t.Fatalf("destination %s not listed in %+v", name, ds)
	return admin.Destination{}
}

func TestDestinationsListAndStatus(t *testing.T) {
	e := newDestEnv(t)
	ctx := context.Background()
	// analytics: a1 delivered, a2 stopped at its 2nd event; partners: nothing yet.
	e.lane("analytics", "a1", 3, nil)
	e.lane("analytics", "a2", 1, seq(2))

	ds, err := e.admin.Destinations(ctx)
	pgtest.Must(t, err, "destinations")
	if len(ds) != 2 || ds[0].Name != "analytics" || ds[1].Name != "partners" {
		t.Fatalf("destinations = %+v, want analytics and partners by name", ds)
	}
	a := findDest(t, ds, "analytics")
	if a.PendingLanes != 1 || a.PendingEvents != 2 || a.DeadLetters != 1 || a.Start != "backfill" || a.OldestPendingAge <= 0 {
		t.Errorf("analytics = %+v, want 1 pending lane, 2 pending events, 1 dead letter, an age", a)
	}
	if string(a.Rules) != `[{"all": true}]` {
		t.Errorf("analytics rules = %s", a.Rules)
	}
	p := findDest(t, ds, "partners")
	if p.PendingLanes != 2 || p.PendingEvents != 6 || p.DeadLetters != 0 {
		t.Errorf("partners = %+v, want 2 pending lanes, 6 events, no dead letter", p)
	}

	st, err := e.admin.Status(ctx)
	pgtest.Must(t, err, "status")
	if len(st.Destinations) != 2 || findDest(t, st.Destinations, "analytics").DeadLetters != 1 {
		t.Errorf("status destinations = %+v", st.Destinations)
	}
}

func TestStatusWithoutDestinations(t *testing.T) {
	e := newDLQEnv(t)
	st, err := e.admin.Status(context.Background())
	pgtest.Must(t, err, "status")
	if len(st.Destinations) != 0 {
		t.Errorf("status of an outbox without destinations lists %+v", st.Destinations)
	}
}

func TestDestinationDeadLetters(t *testing.T) {
	e := newDestEnv(t)
	ctx := context.Background()
	e.lane("analytics", "a1", 0, seq(1))
	e.lane("analytics", "a2", 1, seq(2))
	e.lane("partners", "a1", 3, nil)
	e.lane("partners", "a2", 3, nil)

	dl, err := e.admin.ListDestinationQuarantined(ctx, "analytics", admin.Filter{})
	pgtest.Must(t, err, "list")
	if len(dl) != 2 || dl[0].Destination != "analytics" || dl[0].State != admin.StateQuarantined || dl[0].AttemptCount != 10 ||
		dl[0].LastError != "broker refused it" {
		t.Fatalf("analytics dead letters = %+v", dl)
	}
	got := map[pgoutbox.UUID]bool{dl[0].ID: true, dl[1].ID: true}
	if !got[e.ids["a1"][0]] || !got[e.ids["a2"][1]] {
		t.Fatalf("dead letters %v, want a1's 1st and a2's 2nd event", got)
	}
	if f, err := e.admin.ListDestinationQuarantined(ctx, "analytics", admin.Filter{AggregateID: "a2", ErrorContains: "REFUSED"}); err != nil || len(f) != 1 {
		t.Errorf("filtered list = %+v, %v; want a2's", f, err)
	}
	if none, err := e.admin.ListDestinationQuarantined(ctx, "partners", admin.Filter{}); err != nil || len(none) != 0 {
		t.Errorf("partners dead letters = %+v, %v; want none", none, err)
	}
	// The outbox's own dead letters are untouched by a destination's.
	if outbox, err := e.admin.ListQuarantined(ctx, admin.Filter{}); err != nil || len(outbox) != 0 {
		t.Errorf("outbox dead letters = %+v, %v; want none", outbox, err)
	}

	// show: the event as analytics sees it, and as partners does.
	ev, err := e.admin.GetForDestination(ctx, "analytics", e.ids["a2"][1])
	pgtest.Must(t, err, "show")
	if ev.State != admin.StateQuarantined || ev.LastError != "broker refused it" {
		t.Errorf("analytics view = %+v", ev)
	}
	if ev, err = e.admin.GetForDestination(ctx, "analytics", e.ids["a2"][0]); err != nil || ev.State != admin.StatePublished {
		t.Errorf("analytics view of a delivered event = %+v, %v", ev, err)
	}
	if ev, err = e.admin.GetForDestination(ctx, "analytics", e.ids["a2"][2]); err != nil || ev.State != admin.StatePending {
		t.Errorf("analytics view of an event behind its dead letter = %+v, %v", ev, err)
	}
	if ev, err = e.admin.GetForDestination(ctx, "partners", e.ids["a2"][1]); err != nil || ev.State != admin.StatePublished {
		t.Errorf("partners view = %+v, %v", ev, err)
	}

	// retry a1 for analytics: the lane row is lifted, attempts reset.
	ids, err := e.admin.RetryDestination(ctx, admin.DestinationRetryRequest{Destination: "analytics", IDs: []pgoutbox.UUID{e.ids["a1"][0]}, Reason: "fixed"})
	pgtest.Must(t, err, "retry")
	if len(ids) != 1 || ids[0] != e.ids["a1"][0] {
		t.Fatalf("retried %v", ids)
	}
	if n := countRows(t, e.pool, e.table("outbox_destination_lanes"),
		"destination = 'analytics' AND aggregate_id = 'a1' AND quarantined_at IS NULL AND attempt_count = 0 AND delivered_sequence = 0"); n != 1 {
		t.Errorf("a1's lane row for analytics is not retried")
	}
	// retry of an event that is not its dead letter: nothing, no error.
	if ids, err := e.admin.RetryDestination(ctx, admin.DestinationRetryRequest{Destination: "partners", All: true}); err != nil || len(ids) != 0 {
		t.Errorf("retry all of partners = %v, %v", ids, err)
	}

	// skip a2's 2nd event for analytics: the lane moves past it, and since
	// partners passed it too, the event is done.
	sk, err := e.admin.SkipDestination(ctx, admin.DestinationSkipRequest{Destination: "analytics", IDs: []pgoutbox.UUID{e.ids["a2"][1]}, Reason: "poison for analytics"})
	pgtest.Must(t, err, "skip")
	if len(sk) != 1 {
		t.Fatalf("skipped %+v", sk)
	}
	if n := countRows(t, e.pool, e.table("outbox_destination_lanes"),
		"destination = 'analytics' AND aggregate_id = 'a2' AND quarantined_at IS NULL AND delivered_sequence = 2"); n != 1 {
		t.Errorf("a2's lane row for analytics did not move past the skipped event")
	}
	if n := countRows(t, e.pool, e.table("outbox_events"), "aggregate_id = 'a2' AND published_at IS NOT NULL"); n != 2 {
		t.Errorf("a2 has %d events done, want 2 (every destination passed them)", n)
	}
	// A skip of something that is not a dead letter is refused, nothing done.
	_, err = e.admin.SkipDestination(ctx, admin.DestinationSkipRequest{Destination: "analytics", IDs: []pgoutbox.UUID{e.ids["a2"][2]}, Reason: "x"})
	if !errors.Is(err, admin.ErrNotQuarantined) {
		t.Errorf("skip of a pending event: %v, want ErrNotQuarantined", err)
	}
	_, err = e.admin.SkipDestination(ctx, admin.DestinationSkipRequest{Destination: "analytics", IDs: []pgoutbox.UUID{e.ids["a2"][2]}})
	if !errors.Is(err, admin.ErrNoReason) {
		t.Errorf("skip without a reason: %v, want ErrNoReason", err)
	}

	audit, err := e.admin.Audit(ctx, 10)
	pgtest.Must(t, err, "audit")
	var skips, retries int
	for _, a := range audit {
		if a.Selection["destination"] != "analytics" && a.Selection["destination"] != "partners" {
			t.Errorf("audit row without its destination: %+v", a)
		}
		switch a.Action {
		case admin.ActionSkip:
			skips++
			if a.Reason != "poison for analytics" || a.EventCount != 1 {
				t.Errorf("skip audit = %+v", a)
			}
		case admin.ActionRetry:
			retries++
		}
	}
	if skips != 1 || retries != 2 {
		t.Errorf("audit has %d skips and %d retries, want 1 and 2: %+v", skips, retries, audit)
	}
}

func TestDropDestination(t *testing.T) {
	e := newDestEnv(t)
	ctx := context.Background()
	e.lane("analytics", "a1", 3, nil)
	e.lane("analytics", "a2", 1, seq(2))
	e.lane("partners", "a1", 1, nil)

	if _, err := e.admin.DropDestination(ctx, admin.DropRequest{Name: "analytics"}); !errors.Is(err, admin.ErrNoReason) {
		t.Errorf("drop without a reason: %v, want ErrNoReason", err)
	}
	if _, err := e.admin.DropDestination(ctx, admin.DropRequest{Name: "nowhere", Reason: "x"}); !errors.Is(err, admin.ErrDestinationNotFound) {
		t.Errorf("drop of an unknown destination: %v, want ErrDestinationNotFound", err)
	}
	// A relay's live lease on one of its lanes: refused unless forced.
	e.exec(`UPDATE ` + e.table("outbox_destination_lanes") + ` SET claimed_by = 'relay-1', claim_until = now() + interval '1 hour' WHERE destination = 'analytics' AND aggregate_id = 'a1'`)
	if _, err := e.admin.DropDestination(ctx, admin.DropRequest{Name: "analytics", Reason: "retired"}); !errors.Is(err, admin.ErrDestinationServed) {
		t.Errorf("drop of a served destination: %v, want ErrDestinationServed", err)
	}
	if n := countRows(t, e.pool, e.table("outbox_destination_lanes"), "destination = 'analytics'"); n != 2 {
		t.Fatalf("a refused drop deleted progress rows")
	}
	d, err := e.admin.DropDestination(ctx, admin.DropRequest{Name: "analytics", Reason: "retired", Actor: "ops", Force: true})
	pgtest.Must(t, err, "drop")
	if d.Lanes != 2 || d.Destination.Name != "analytics" || d.AuditID == 0 {
		t.Errorf("dropped = %+v", d)
	}
	if n := countRows(t, e.pool, e.table("outbox_destination_lanes"), "destination = 'analytics'"); n != 0 {
		t.Errorf("%d progress rows left", n)
	}
	if n := countRows(t, e.pool, e.table("outbox_destination_lanes"), "destination = 'partners'"); n != 1 {
		t.Errorf("partners' progress touched")
	}
	ds, err := e.admin.Destinations(ctx)
	pgtest.Must(t, err, "destinations")
	if len(ds) != 1 || ds[0].Name != "partners" {
		t.Errorf("destinations after the drop = %+v", ds)
	}
	audit, err := e.admin.Audit(ctx, 1)
	pgtest.Must(t, err, "audit")
	if len(audit) != 1 || audit[0].Action != admin.ActionDestinationDrop || audit[0].Actor != "ops" || audit[0].Reason != "retired" ||
		audit[0].Selection["destination"] != "analytics" || audit[0].Selection["start"] != "backfill" {
		t.Errorf("audit = %+v", audit)
	}
}

// TestDestinationHostileNames: names a destination cannot have are refused by
// relay.Destination's rule before any SQL, and the error does not carry them
// whole.
func TestDestinationHostileNames(t *testing.T) {
	e := newDestEnv(t)
	ctx := context.Background()
	for _, name := range []string{"", "Analytics", "a'; DROP TABLE outbox_events; --", "a\x00b", "-lead", "x y",
		strings.Repeat("a", 64), "a\nb", "ünicode", `"quoted"`, strings.Repeat("z", 10_000)} {
		checks := map[string]error{}
		_, checks["list"] = e.admin.ListDestinationQuarantined(ctx, name, admin.Filter{})
		_, checks["show"] = e.admin.GetForDestination(ctx, name, e.ids["a1"][0])
		_, checks["retry"] = e.admin.RetryDestination(ctx, admin.DestinationRetryRequest{Destination: name, All: true})
		_, checks["skip"] = e.admin.SkipDestination(ctx, admin.DestinationSkipRequest{Destination: name, IDs: e.ids["a1"], Reason: "x"})
		_, checks["drop"] = e.admin.DropDestination(ctx, admin.DropRequest{Name: name, Reason: "x"})
		_, checks["page"] = e.admin.ListDestinationQuarantinedPage(ctx, name, admin.Filter{}, admin.Page{Limit: 10})
		_, checks["count"] = e.admin.CountDestinationQuarantined(ctx, name, admin.Filter{})
		if name != "" { // no name: the outbox's replay
			_, checks["replay"] = admin.Replay(ctx, e.pool, nil, admin.ReplayRequest{Schema: e.schema, ToDestination: name, DryRun: true})
		}
		for what, err := range checks {
			if !errors.Is(err, relay.ErrInvalidDestination) {
				t.Errorf("%s of %q: %v, want relay.ErrInvalidDestination", what, name, err)
			}
			if err != nil && len(err.Error()) > 300 {
				t.Errorf("%s: an error of %d bytes", what, len(err.Error()))
			}
		}
	}
	if n := countRows(t, e.pool, e.table("outbox_operator_audit"), "true"); n != 0 {
		t.Errorf("%d audit rows written for refused names", n)
	}
	if n := countRows(t, e.pool, e.table("outbox_destinations"), "true"); n != 2 {
		t.Errorf("the destinations changed")
	}
}

// A destination's dead letters page by (quarantine, event id): each page
// goes on exactly after the last, whatever ties the quarantine times have;
// a page is bounded (1..MaxPage) and counted with the filter.
func TestDestinationDeadLettersPaged(t *testing.T) {
	t.Parallel()
	e := newDestEnv(t)
	ctx := context.Background()
	more := e.enqueue("order", 1, "a3", "a4", "a5")
	for _, agg := range []string{"a1", "a2", "a3", "a4", "a5"} {
		e.lane("analytics", agg, 0, seq(1)) // one statement each, some in the same microsecond maybe: ties are paged by id
	}
	e.exec(`UPDATE ` + e.table("outbox_destination_lanes") + ` SET quarantined_at = date_trunc('second', now()) WHERE aggregate_id IN ('a2', 'a3', 'a4')`)
	var got []pgoutbox.UUID
	p := admin.Page{Limit: 2}
	for range 4 {
		evs, err := e.admin.ListDestinationQuarantinedPage(ctx, "analytics", admin.Filter{}, p)
		pgtest.Must(t, err, "page after %v", p.After)
		if len(evs) == 0 {
			break
		}
		if len(evs) > 2 {
			t.Fatalf("a page of %d events, want at most 2", len(evs))
		}
		for _, ev := range evs {
			if ev.Destination != "analytics" || ev.State != admin.StateQuarantined {
				t.Errorf("event %+v is not a dead letter of analytics", ev)
			}
			got = append(got, ev.ID)
		}
		last := evs[len(evs)-1]
		p.After = admin.Cursor{At: *last.QuarantinedAt, ID: last.ID}
	}
	want := []pgoutbox.UUID{e.ids["a1"][0], e.ids["a2"][0], more["a3"][0], more["a4"][0], more["a5"][0]}
	if len(got) != 5 || !sameIDs(got, want) {
		t.Fatalf("pages gave %v, want each of %v once", got, want)
	}
	all, err := e.admin.ListDestinationQuarantined(ctx, "analytics", admin.Filter{})
	pgtest.Must(t, err, "list")
	if len(all) != 5 {
		t.Errorf("the whole list has %d, want 5", len(all))
	}
	for f, want := range map[admin.Filter]int{{}: 5, {AggregateID: "a3"}: 1, {ErrorContains: "REFUSED"}: 5, {EventType: "other"}: 0} {
		if n, err := e.admin.CountDestinationQuarantined(ctx, "analytics", f); err != nil || n != want {
			t.Errorf("count %+v: %d, %v; want %d", f, n, err, want)
		}
	}
	if n, err := e.admin.CountDestinationQuarantined(ctx, "partners", admin.Filter{}); err != nil || n != 0 {
		t.Errorf("count of partners: %d, %v", n, err)
	}
	for _, limit := range []int{0, -1, admin.MaxPage + 1} {
		if _, err := e.admin.ListDestinationQuarantinedPage(ctx, "analytics", admin.Filter{}, admin.Page{Limit: limit}); err == nil {
			t.Errorf("a page of %d was accepted", limit)
		}
	}
	if _, err := e.admin.ListDestinationQuarantinedPage(ctx, "nowhere", admin.Filter{}, admin.Page{Limit: 10}); !errors.Is(err, admin.ErrDestinationNotFound) {
		t.Errorf("page of an unknown destination: %v", err)
	}
}

func TestEventDestinations(t *testing.T) {
	e := newDestEnv(t)
	ctx := context.Background()
	e.exec(`INSERT INTO ` + e.table("outbox_destinations") + ` (name, rules, start) VALUES ('users', '[{"aggregate_types":["user"]}]', 'now')`)
	// analytics: a1 stopped at its 2nd event; partners: a1 delivered through 1.
	e.lane("analytics", "a1", 1, seq(2))
	e.lane("partners", "a1", 1, nil)
	want := map[int][]string{ // a1's events: analytics, partners, users
		0: {admin.DestDelivered, admin.DestDelivered, admin.DestNotRouted},
		1: {admin.DestQuarantined, admin.DestPending, admin.DestNotRouted},
		2: {admin.DestBlocked, admin.DestPending, admin.DestNotRouted},
	}
	for i, states := range want {
		ev, err := e.admin.Get(ctx, e.ids["a1"][i])
		pgtest.Must(t, err, "get")
		ds, err := e.admin.EventDestinations(ctx, ev)
		pgtest.Must(t, err, "event destinations")
		if len(ds) != 3 || ds[0].Destination != "analytics" || ds[1].Destination != "partners" || ds[2].Destination != "users" {
			t.Fatalf("event %d: destinations %+v", i+1, ds)
		}
		for j, s := range states {
			if ds[j].State != s {
				t.Errorf("event %d at %s: %s, want %s (%+v)", i+1, ds[j].Destination, ds[j].State, s, ds[j])
			}
		}
		if i == 1 && (ds[0].LastError != "broker refused it" || ds[0].AttemptCount != 10) {
			t.Errorf("the dead letter at analytics: %+v", ds[0])
		}
		if i == 2 && ds[0].BlockedBehind != 2 {
			t.Errorf("event 3 at analytics blocked behind %d, want 2", ds[0].BlockedBehind)
		}
	}

	ds, err := e.admin.Destinations(ctx)
	pgtest.Must(t, err, "destinations")
	a := findDest(t, ds, "analytics")
	if a.OldestPendingAt == nil || time.Since(*a.OldestPendingAt) < time.Duration(a.OldestPendingAge)-time.Minute {
		t.Errorf("analytics oldest pending at %v, age %v", a.OldestPendingAt, a.OldestPendingAge)
	}

	bare := newDLQEnv(t)
	ids := bare.enqueue("order", 1, "x")
	ev, err := bare.admin.Get(ctx, ids["x"][0])
	pgtest.Must(t, err, "get")
	if ds, err := bare.admin.EventDestinations(ctx, ev); err != nil || len(ds) != 0 {
		t.Errorf("without destinations: %+v, %v", ds, err)
	}
}
