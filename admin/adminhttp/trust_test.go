package adminhttp_test

import (
	"encoding/json"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/pgoutbox"
	"github.com/pgoutbox/pgoutbox/admin/adminhttp"
	"github.com/pgoutbox/pgoutbox/broker/null"
	"github.com/pgoutbox/pgoutbox/internal/pgtest"
	"github.com/pgoutbox/pgoutbox/migrate"
)

// consoleVariants are the attacker's outboxes the console meets: wrong owner
// only, a trigger on update, a row-level-security policy, a rule, a default
// calling its function (on the audit table an action writes), and functions
// and operators shadowing pg_catalog's, in its schema and in one named like
// the console's login.
var consoleVariants = map[string]bool{"plain": true, "trg_before_row_update": true, "rls": true, "rule": true,
	"default": true, "shadow": true}

// The console, run as a superuser on 'tenant_*', beside outboxes that a role
// holding only CREATE on the database made under the glob, each with one kind
// of hostile code: every page of an attacker's tenant and every retry, skip
// and replay on it answers 403 with the refusal and its reason, the overview
// names each one refused, the attacker's code never runs as anyone but the
// attacker, and its events are untouched; the victim's pages and actions work.
func TestConsoleRefusesHostileTenants(t *testing.T) {
	t.Parallel()
	const victim = "tenant_victim"
	a := pgtest.NewAttacker(t, victim, 6)
	pgtest.MigrateSchema(t, a.Pool, victim)
	var evil []string
	for _, v := range pgtest.HostileVariants() {
		if !consoleVariants[v.Name] {
			continue
		}
		schema := "tenant_evil_" + v.Name
		a.Plant(t, schema, "postgres", v)
		evil = append(evil, schema)
	}
	if len(evil) != len(consoleVariants) {
		t.Fatalf("found %d of the %d variants in pgtest.HostileVariants", len(evil), len(consoleVariants))
	}
	// A trigger whose name reverses the text after it: the refusal names it,
	// its override shown as an escape.
	const bidi = "tenant_evil_bidi"
	a.Plant(t, bidi, "postgres", pgtest.HostileVariant{Name: "bidi", OnUpdate: true,
		SQL: "CREATE TRIGGER \"evil\u202etxt.exe\" BEFORE UPDATE ON {{schema}}.outbox_events FOR EACH ROW EXECUTE FUNCTION {{canary}}.evil_trigger()"})
	evil = append(evil, bidi)
	for _, s := range evil {
		// A dead letter of its own to retry, skip and show (its own update
		// runs its code as itself, which RanAsOthers leaves out).
		_, err := a.As.Exec(t.Context(), "UPDATE "+tableOf(s, "outbox_events")+
			" SET quarantined_at = now(), last_error = 'boom' WHERE aggregate_id = 'e1'")
		pgtest.Must(t, err, "quarantine in %s", s)
	}
	pub := &null.Publisher{}
	e := consoleOn(t, a.Pool, victim, func(c *adminhttp.Config) {
		c.Schemas, c.Publisher, c.Destination = selector(t, "tenant_*"), pub, "null://"
	})
	ids := e.enqueue("order", "o1", 3, map[string]int{"n": 1})
	e.quarantine(ids[0], "boom")
	csrf := e.csrfOf("alice", e.aliceKey)

	// The victim's overview reads every tenant's status: each attacker's is
	// refused, with the reason.
	r := e.get("/?schema=" + victim)
	if r.status != http.StatusOK {
		t.Fatalf("victim overview: %d\n%s", r.status, r.body)
	}
	for _, s := range evil {
		_, row, _ := strings.Cut(r.body, `>`+s+`</a>`)
		row, _, _ = strings.Cut(row, "</tr>")
		if !strings.Contains(row, "tenant refused: migrate: outbox refused: schema &#34;"+s+"&#34;") {
			t.Errorf("overview row of %s does not say it is refused: %q", s, row)
		}
	}

	for _, s := range evil {
		var id pgoutbox.UUID
		pgtest.Must(t, a.Pool.QueryRow(t.Context(), "SELECT event_id FROM "+tableOf(s, "outbox_events")+
			" WHERE aggregate_id = 'e1'").Scan(&id), "attacker event")
		q := "schema=" + url.QueryEscape(s)
		for _, path := range []string{"/?" + q, "/lanes?" + q, "/dlq?" + q, "/event?id=" + id.String() + "&" + q,
			"/replay?" + q, "/replay?preview=1&all=1&" + q, "/relays?" + q, "/audit?" + q, "/?partial=1&" + q} {
			refused(t, "GET "+path, s, e.get(path))
		}
		r := e.get("/api/overview?" + q)
		var body map[string]string
		if err := json.Unmarshal([]byte(r.body), &body); err != nil || r.status != http.StatusForbidden ||
			!strings.Contains(body["error"], "outbox refused") {
			t.Errorf("GET /api/overview?%s: %d %q", q, r.status, r.body)
		}
		// The submit-once token comes from the victim's page: the attacker's
		// pages issue none.
		for path, form := range map[string]url.Values{
			"/dlq/retry": {"id": {id.String()}, "reason": {"r"}},
			"/dlq/skip":  {"id": {id.String()}, "reason": {"r"}},
			"/replay":    {"event_ids": {id.String()}, "reason": {"r"}},
		} {
			form.Set("csrf", csrf)
			form.Set("schema", s)
			form.Set("once", e.onceOf("/event?schema="+victim+"&id="+ids[0].String()))
			refused(t, "POST "+path+" on "+s, s, e.do("POST", path, "alice", e.aliceKey, form, nil))
		}
	}

	if r := e.get("/dlq?schema=" + bidi); !strings.Contains(r.body, `trigger evil\u202etxt.exe on table`) || strings.ContainsRune(r.body, '\u202e') {
		t.Errorf("the refusal of %s does not show the trigger's name escaped:\n%s", bidi, r.body)
	}

	// The victim's pages and actions work beside them.
	for _, path := range []string{"/lanes", "/dlq", "/event?id=" + ids[0].String(), "/replay?preview=1&all=1", "/relays", "/audit", "/api/overview"} {
		sep := "?"
		if strings.Contains(path, "?") {
			sep = "&"
		}
		if r := e.get(path + sep + "schema=" + victim); r.status != http.StatusOK || strings.Contains(r.body, "refused") {
			t.Errorf("GET %s of the victim: %d\n%s", path, r.status, r.body)
		}
	}
	retry := url.Values{"csrf": {csrf}, "schema": {victim}, "id": {ids[0].String()}, "reason": {"fixed"},
		"once": {e.onceOf("/event?schema=" + victim + "&id=" + ids[0].String())}}
	location(e, e.do("POST", "/dlq/retry", "alice", e.aliceKey, retry, nil))
	if st := e.state(ids[0]); st != "pending" {
		t.Errorf("victim's retried event is %s, want pending", st)
	}
	e.quarantine(ids[0], "boom again")
	skip := url.Values{"csrf": {csrf}, "schema": {victim}, "id": {ids[0].String()}, "reason": {"poison"},
		"once": {e.onceOf("/event?schema=" + victim + "&id=" + ids[0].String())}}
	location(e, e.do("POST", "/dlq/skip", "alice", e.aliceKey, skip, nil))
	if st := e.state(ids[0]); st != "skipped" {
		t.Errorf("victim's skipped event is %s, want skipped", st)
	}
	_, err := a.Pool.Exec(t.Context(), "UPDATE "+e.table("outbox_events")+" SET published_at = now() WHERE event_id = $1", ids[1])
	pgtest.Must(t, err, "publish")
	replay := url.Values{"csrf": {csrf}, "schema": {victim}, "event_ids": {ids[1].String()}, "reason": {"resend"},
		"once": {e.onceOf("/replay?preview=1&schema=" + victim + "&event_ids=" + ids[1].String())}}
	location(e, e.do("POST", "/replay", "alice", e.aliceKey, replay, nil))
	if n := pub.Published(); n != 1 {
		t.Errorf("victim's replay published %d events, want 1", n)
	}

	if ran := a.RanAsOthers(t); len(ran) > 0 {
		t.Fatalf("the attacker's code ran as another role: %q", ran)
	}
	for _, s := range evil {
		var quarantined, skipped, audited int
		pgtest.Must(t, a.Pool.QueryRow(t.Context(), "SELECT (SELECT count(*) FROM "+tableOf(s, "outbox_events")+
			" WHERE quarantined_at IS NOT NULL), (SELECT count(*) FROM "+tableOf(s, "outbox_skipped_events")+
			"), (SELECT count(*) FROM "+tableOf(s, "outbox_operator_audit")+")").Scan(&quarantined, &skipped, &audited), "count %s", s)
		if quarantined != 1 || skipped != 0 || audited != 0 {
			t.Errorf("%s: %d quarantined, %d skipped, %d audited; want its 1 dead letter untouched", s, quarantined, skipped, audited)
		}
	}
}

// refused checks that r is the console's refusal of the attacker's schema.
func refused(t *testing.T, what, schema string, r resp) {
	t.Helper()
	if r.status != http.StatusForbidden || !strings.Contains(r.body, "tenant refused: migrate: outbox refused: schema &#34;"+schema+"&#34;") {
		t.Errorf("%s: %d, want 403 and the refusal:\n%s", what, r.status, r.body)
	}
}

func tableOf(schema, table string) string { return pgx.Identifier{schema, table}.Sanitize() }

// Config.Trust is checked as migrate.Trust.Validate checks it.
func TestConfigTrustValidated(t *testing.T) {
	t.Parallel()
	many := make([]string, 101)
	for i := range many {
		many[i] = "r"
	}
	for name, owners := range map[string][]string{"empty": {""}, "control": {"a\x01b"}, "too many": many} {
		cfg := adminhttp.Config{NoAuth: true, Trust: migrate.Trust{Owners: owners}}
		if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), "Config.Trust") {
			t.Errorf("%s: %v, want an error naming Config.Trust", name, err)
		}
	}
	if err := (&adminhttp.Config{NoAuth: true, Trust: migrate.Trust{Owners: []string{"pgoutbox_migrator"}}}).Validate(); err != nil {
		t.Errorf("a trusted owner: %v", err)
	}
}
