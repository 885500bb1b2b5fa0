package cli

import (
	"encoding/json"
	"regexp"
	"strings"
	"testing"

	"github.com/pgoutbox/pgoutbox"
	"github.com/pgoutbox/pgoutbox/admin"
	"github.com/pgoutbox/pgoutbox/migrate"
)

// destOpsEnv is an opsEnv with two registered destinations, analytics and
// partners, and their progress written by the test as a relay with
// destinations would: analytics has o1 delivered and o2 stopped at its 2nd
// event; partners has delivered nothing.
type destOpsEnv struct {
	*opsEnv
	ids map[string][]pgoutbox.UUID
}

func newDestOpsEnv(t *testing.T) *destOpsEnv {
	t.Helper()
	e := &destOpsEnv{opsEnv: newOpsEnv(t)}
	e.ids = e.enqueue(3, "o1", "o2")
	e.exec(`INSERT INTO ` + e.table("outbox_destinations") + ` (name, rules, start) VALUES
  ('analytics', '[{"aggregate_types": ["order"]}]', 'backfill'), ('partners', '[{"all": true}]', 'now')`)
	e.exec(`INSERT INTO ` + e.table("outbox_destination_lanes") + ` (destination, aggregate_type, aggregate_id, delivered_sequence,
    attempt_count, last_error, quarantined_at, quarantined_sequence) VALUES
  ('analytics', 'order', 'o1', 3, 0, NULL, NULL, NULL),
  ('analytics', 'order', 'o2', 1, 10, 'rabbitmq: NO_ROUTE', now(), 2)`)
	return e
}

func TestDestinationsListAndStatus(t *testing.T) {
	t.Parallel()
	e := newDestOpsEnv(t)
	out, errOut, code := run(t, e.args("destinations", "list", "--json")...)
	var ds []admin.Destination
	if code != 0 || json.Unmarshal([]byte(out), &ds) != nil || len(ds) != 2 || ds[0].Name != "analytics" ||
		ds[0].DeadLetters != 1 || ds[0].PendingLanes != 1 || ds[0].PendingEvents != 2 || ds[1].PendingEvents != 6 || ds[1].Start != "now" {
		t.Fatalf("destinations list --json: code %d, stderr %q:\n%s", code, errOut, out)
	}
	out, _, code = run(t, e.args("destinations", "list")...)
	for _, want := range []string{"DESTINATION", "analytics", "backfill", `[{"aggregate_types": ["order"]}]`, "partners"} {
		if code != 0 || !strings.Contains(out, want) {
			t.Errorf("destinations list lacks %q:\n%s", want, out)
		}
	}
	out, _, code = run(t, e.args("status")...)
	if code != 0 || !strings.Contains(out, "DESTINATION") || !strings.Contains(out, "1 (pgoutbox dlq list --destination analytics)") {
		t.Errorf("status does not show the destinations:\n%s", out)
	}
	out, _, code = run(t, e.args("status", "--json")...)
	var st admin.Status
	if code != 0 || json.Unmarshal([]byte(out), &st) != nil || len(st.Destinations) != 2 {
		t.Errorf("status --json: %s", out)
	}

	// An outbox without destinations: status says nothing of them.
	plain := newOpsEnv(t)
	out, _, code = run(t, plain.args("status")...)
	if code != 0 || strings.Contains(out, "DESTINATION") {
		t.Errorf("status of an outbox without destinations:\n%s", out)
	}
	if out, _, code = run(t, plain.args("destinations", "list")...); code != 0 || !strings.HasPrefix(out, "no destinations") {
		t.Errorf("destinations list of none: %d %q", code, out)
	}
}

func TestDLQDestination(t *testing.T) {
	t.Parallel()
	e := newDestOpsEnv(t)
	dead := e.ids["o2"][1]
	out, errOut, code := run(t, e.args("dlq", "list", "--destination", "analytics", "--json")...)
	var evs []admin.Event
	if code != 0 || json.Unmarshal([]byte(out), &evs) != nil || len(evs) != 1 || evs[0].ID != dead ||
		evs[0].Destination != "analytics" || evs[0].LastError != "rabbitmq: NO_ROUTE" {
		t.Fatalf("dlq list --destination: code %d, stderr %q:\n%s", code, errOut, out)
	}
	out, _, code = run(t, e.args("dlq", "list", "--destination", "analytics")...)
	if code != 0 || !strings.Contains(out, dead.String()) || !strings.HasSuffix(out, "1 dead letter of destination analytics\n") {
		t.Errorf("dlq list --destination:\n%s", out)
	}
	// The outbox's own dead letters are not the destination's.
	if out, _, code = run(t, e.args("dlq", "list")...); code != 0 || out != "no quarantined events\n" {
		t.Errorf("dlq list: %q", out)
	}
	out, _, code = run(t, e.args("dlq", "show", dead.String(), "--destination", "analytics")...)
	if code != 0 || !strings.Contains(out, "destination  analytics") || !strings.Contains(out, "quarantined") ||
		!strings.Contains(out, "rabbitmq: NO_ROUTE") {
		t.Errorf("dlq show --destination:\n%s", out)
	}
	out, _, code = run(t, e.args("dlq", "show", dead.String(), "--destination", "partners", "--json")...)
	var ev admin.Event
	if code != 0 || json.Unmarshal([]byte(out), &ev) != nil || ev.State != admin.StatePending {
		t.Errorf("dlq show --destination partners: %s", out)
	}
	if _, errOut, code = run(t, e.args("dlq", "list", "--destination", "nowhere")...); code != 1 || !strings.Contains(errOut, "destination not found") {
		t.Errorf("dlq list of an unknown destination: %d %q", code, errOut)
	}

	// skip needs a reason; then the lane moves past the event for analytics.
	if _, errOut, code = run(t, e.args("dlq", "skip", dead.String(), "--destination", "analytics")...); code != 2 {
		t.Errorf("dlq skip without --reason: %d %q", code, errOut)
	}
	out, errOut, code = run(t, e.args("dlq", "skip", dead.String(), "--destination", "analytics", "--reason", "not for analytics", "--actor", "ops")...)
	if code != 0 || out != "skipped 1 event for destination analytics (order/o2 #2)\n" {
		t.Fatalf("dlq skip --destination: %d %q %q", code, out, errOut)
	}
	if n := e.count("outbox_destination_lanes", "destination = 'analytics' AND aggregate_id = 'o2' AND delivered_sequence = 2 AND quarantined_at IS NULL"); n != 1 {
		t.Errorf("the lane did not move past the skipped event")
	}
	if n := e.count("outbox_skipped_events", "true"); n != 0 {
		t.Errorf("a destination's skip wrote the outbox's skip record")
	}

	// retry: quarantine o1 for partners, retry it by filter.
	e.exec(`INSERT INTO ` + e.table("outbox_destination_lanes") + ` (destination, aggregate_type, aggregate_id, delivered_sequence,
    attempt_count, last_error, quarantined_at, quarantined_sequence) VALUES ('partners', 'order', 'o1', 0, 10, 'webhook: 400', now(), 1)`)
	out, errOut, code = run(t, e.args("dlq", "retry", "--destination", "partners", "--error-contains", "webhook", "--reason", "partner fixed it")...)
	if code != 0 || out != "retried 1 dead letter of destination partners\n" {
		t.Fatalf("dlq retry --destination: %d %q %q", code, out, errOut)
	}
	if n := e.count("outbox_destination_lanes", "destination = 'partners' AND quarantined_at IS NULL AND attempt_count = 0"); n != 1 {
		t.Errorf("the lane is still quarantined")
	}
	out, _, _ = run(t, e.args("dlq", "audit", "--json")...)
	var audit []admin.AuditEntry
	if json.Unmarshal([]byte(out), &audit) != nil || len(audit) != 2 || audit[0].Selection["destination"] != "partners" ||
		audit[1].Selection["destination"] != "analytics" || audit[1].Reason != "not for analytics" {
		t.Errorf("dlq audit:\n%s", out)
	}
}

func TestDestinationsDrop(t *testing.T) {
	t.Parallel()
	e := newDestOpsEnv(t)
	if _, errOut, code := run(t, e.args("destinations", "drop", "analytics")...); code != 2 || !strings.Contains(errOut, "--reason") {
		t.Errorf("drop without --reason: %d %q", code, errOut)
	}
	e.exec(`UPDATE ` + e.table("outbox_destination_lanes") + ` SET claimed_by = 'r1', claim_until = now() + interval '1 hour' WHERE aggregate_id = 'o1'`)
	if _, errOut, code := run(t, e.args("destinations", "drop", "analytics", "--reason", "retired")...); code != 1 ||
		!strings.Contains(errOut, "a relay is serving the destination") || !strings.Contains(errOut, "--force") {
		t.Errorf("drop of a served destination: %d %q", code, errOut)
	}
	out, errOut, code := run(t, e.args("destinations", "drop", "analytics", "--reason", "retired", "--force")...)
	if code != 0 || !strings.HasPrefix(out, "dropped destination analytics: 2 progress rows deleted, 1 dead letters") ||
		!strings.Contains(errOut, "registers analytics again") {
		t.Fatalf("drop --force: %d %q %q", code, out, errOut)
	}
	if n := e.count("outbox_destinations", "true"); n != 1 {
		t.Errorf("%d destinations left, want partners", n)
	}
	// A running relay (its heartbeat) without leases on partners: dropped, with a warning.
	e.exec(`INSERT INTO ` + e.table("outbox_relays") + ` (relay_id, source, version, host, pid, state, beat_every, started_at, last_seen)
VALUES ('r1', 'poll', 'test', 'h', 1, 'idle', interval '1 hour', now(), now())`)
	out, errOut, code = run(t, e.args("destinations", "drop", "partners", "--reason", "partners retired")...)
	if code != 0 || !strings.HasPrefix(out, "dropped destination partners") || !strings.Contains(errOut, "1 relay is running on this outbox") {
		t.Errorf("drop with a relay running: %d %q %q", code, out, errOut)
	}
	if n := e.count("outbox_operator_audit", "action = 'destination_drop' AND reason = 'retired'"); n != 1 {
		t.Errorf("the drop is not audited")
	}
	if _, errOut, code := run(t, e.args("destinations", "drop", "analytics", "--reason", "again")...); code != 1 || !strings.Contains(errOut, "destination not found") {
		t.Errorf("drop of a dropped destination: %d %q", code, errOut)
	}
}

// TestDestinationFlagHostile: hostile destination names in flags are refused
// by relay.Destination's name rule before any SQL (exit status 2), shown at
// most truncated, and --destination does not go with --tenants.
func TestDestinationFlagHostile(t *testing.T) {
	t.Parallel()
	e := newDestOpsEnv(t)
	id := e.ids["o1"][0].String()
	long := strings.Repeat("x", 5000)
	for _, name := range []string{"", "Analytics", "a'; DELETE FROM outbox_destinations; --", "a\x1b[31mred", "../etc", long, "-x", "a b", "名前"} {
		for _, args := range [][]string{
			{"dlq", "list", "--destination", name},
			{"dlq", "show", id, "--destination", name},
			{"dlq", "retry", "--all", "--destination", name},
			{"dlq", "skip", id, "--reason", "r", "--destination", name},
			{"destinations", "drop", name, "--reason", "r"},
			{"replay", "--all", "--dry-run", "--destination", name},
		} {
			_, errOut, code := run(t, e.args(args...)...)
			if args[0] == "destinations" && strings.HasPrefix(name, "-") {
				errOut += "invalid destination" // a flag to cobra: refused as unknown, exit status 2
			}
			if code != 2 || !strings.Contains(errOut, "invalid destination") || strings.Contains(errOut, long) || strings.Contains(errOut, "\x1b") {
				t.Errorf("%q: code %d, stderr %q", args[:2], code, errOut)
			}
		}
	}
	if _, errOut, code := run(t, e.args("dlq", "list", "--destination", "analytics", "--tenants", "*")...); code != 2 || !strings.Contains(errOut, "cannot be combined") {
		t.Errorf("--destination with --tenants: %d %q", code, errOut)
	}
	if n := e.count("outbox_destinations", "true"); n != 2 {
		t.Errorf("the destinations changed")
	}
	if n := e.count("outbox_operator_audit", "true"); n != 0 {
		t.Errorf("refused commands were audited")
	}
}

// TestDestinationVerbsAsOperator: destinations list and drop, dlq list, show,
// retry and skip --destination and status run as the operator role with the
// grants of migrate print --grants alone.
func TestDestinationVerbsAsOperator(t *testing.T) {
	t.Parallel()
	e := newRolesEnv(t, "", false)
	ids := e.enqueue(2, "a1")
	e.exec(`INSERT INTO ` + e.table("outbox_destinations") + ` (name, rules, start) VALUES ('d1', '[{"all": true}]', 'backfill')`)
	e.exec(`INSERT INTO ` + e.table("outbox_destination_lanes") + ` (destination, aggregate_type, aggregate_id, delivered_sequence,
    attempt_count, last_error, quarantined_at, quarantined_sequence) VALUES ('d1', 'acct', 'a1', 0, 10, 'boom', now(), 1)`)
	for _, args := range [][]string{
		{"destinations", "list"},
		{"status"},
		{"dlq", "list", "--destination", "d1"},
		{"dlq", "show", ids[0].String(), "--destination", "d1"},
		{"dlq", "retry", ids[0].String(), "--destination", "d1"},
		{"replay", "--destination", "d1", "--all", "--dry-run"},
	} {
		if out, errOut, code := e.as(migrate.RoleOperator, args...); code != 0 {
			t.Fatalf("%v as the operator: code %d\n%s%s", args, code, out, errOut)
		}
	}
	e.exec(`UPDATE ` + e.table("outbox_destination_lanes") + ` SET quarantined_at = now(), quarantined_sequence = 1`)
	for _, args := range [][]string{
		{"dlq", "skip", ids[0].String(), "--destination", "d1", "--reason", "r"},
		{"destinations", "drop", "d1", "--reason", "r"},
	} {
		if out, errOut, code := e.as(migrate.RoleOperator, args...); code != 0 {
			t.Fatalf("%v as the operator: code %d\n%s%s", args, code, out, errOut)
		}
	}
	if n := e.count("outbox_destinations", "true"); n != 0 {
		t.Errorf("the drop as the operator left the destination")
	}
}

// dlq list pages with --limit and --after, a destination's dead letters always
// (bounded), the outbox's while --limit is in 1..MaxPage: each full page's
// summary says where the next starts, and the pages hold every dead letter once.
func TestDLQListPaged(t *testing.T) {
	t.Parallel()
	e := newDestOpsEnv(t) // analytics: o2 stopped at #2
	more := e.enqueue(1, "o3", "o4")
	e.exec(`INSERT INTO ` + e.table("outbox_destination_lanes") + ` (destination, aggregate_type, aggregate_id, delivered_sequence,
    attempt_count, last_error, quarantined_at, quarantined_sequence) VALUES
  ('analytics', 'order', 'o3', 0, 10, 'boom', now(), 1), ('analytics', 'order', 'o4', 0, 10, 'boom', now(), 1)`)
	next := regexp.MustCompile(`the next: --after (\S+)\)`)
	pages := func(args ...string) (ids []string) {
		t.Helper()
		after := ""
		for range 5 {
			cmd := e.args(append([]string{"dlq", "list", "--limit", "2"}, args...)...)
			if after != "" {
				cmd = append(cmd, "--after", after)
			}
			out, errOut, code := run(t, cmd...)
			if code != 0 {
				t.Fatalf("%v: code %d, stderr %q", cmd, code, errOut)
			}
			for _, l := range strings.Split(out, "\n") {
				if f := strings.Fields(l); len(f) > 1 && len(f[0]) == 36 {
					ids = append(ids, f[0])
				}
			}
			m := next.FindStringSubmatch(out)
			if m == nil {
				return ids
			}
			after = m[1]
		}
		t.Fatalf("more pages than dead letters")
		return nil
	}
	got := pages("--destination", "analytics")
	if want := []string{e.ids["o2"][1].String(), more["o3"][0].String(), more["o4"][0].String()}; !sameSet(got, want) {
		t.Errorf("the pages of analytics gave %v, want each of %v once", got, want)
	}
	for _, id := range []pgoutbox.UUID{e.ids["o1"][0], e.ids["o1"][1], e.ids["o2"][0]} {
		e.quarantine(id, "refused")
	}
	if got := pages(); len(got) != 3 || !sameSet(got, []string{e.ids["o1"][0].String(), e.ids["o1"][1].String(), e.ids["o2"][0].String()}) {
		t.Errorf("the pages of the outbox gave %v", got)
	}
	if out, _, code := run(t, e.args("dlq", "list", "--limit", "0")...); code != 0 || !strings.HasSuffix(out, "\n3 quarantined events\n") {
		t.Errorf("dlq list --limit 0: %d\n%s", code, out)
	}
	for _, bad := range [][]string{
		{"--destination", "analytics", "--limit", "0"},
		{"--destination", "analytics", "--limit", "1001"},
		{"--limit", "0", "--after", "2026-01-01T00:00:00Z," + e.ids["o1"][0].String()},
		{"--after", "yesterday"},
		{"--after", "2026-01-01T00:00:00Z,\x1b[31m"},
		{"--after", "2026-01-01T00:00:00Z," + e.ids["o1"][0].String(), "--tenants", "*"},
	} {
		_, errOut, code := run(t, e.args(append([]string{"dlq", "list"}, bad...)...)...)
		if code != 2 || strings.Contains(errOut, "\x1b") {
			t.Errorf("%q: code %d, stderr %q; want a usage error", bad, code, errOut)
		}
	}
}
