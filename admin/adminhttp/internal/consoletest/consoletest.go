// Package consoletest starts the web console (package adminhttp) on a migrated
// test schema, with an operator and a viewer, for the console's tests and its
// browser tests (the module admin/adminhttp/browsertest, which keeps the
// browser driver out of the library's go.mod). Test code only: production
// packages never import it (internal/layout checks).
package consoletest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgoutbox/pgoutbox"
	"github.com/pgoutbox/pgoutbox/admin"
	"github.com/pgoutbox/pgoutbox/admin/adminhttp"
	"github.com/pgoutbox/pgoutbox/internal/pgtest"
	"github.com/pgoutbox/pgoutbox/migrate"
)

// Env is a console served on a test server over one schema: the operator
// "alice" and the viewer "victor" sign in with their keys.
type Env struct {
	T                   testing.TB
	Pool                *pgxpool.Pool
	Schema              string
	Handler             *adminhttp.Handler
	Server              *httptest.Server
	AliceKey, VictorKey string
	Admin               *admin.Admin
}

// Selector parses s, a schema selector (migrate.ParseSelector).
func Selector(t testing.TB, s string) migrate.Selector {
	t.Helper()
	sel, err := migrate.ParseSelector(s)
	pgtest.Must(t, err, "selector %q", s)
	return sel
}

// New migrates a schema of its own and serves a console on it; mod, when not
// nil, changes the console's configuration first.
func New(t testing.TB, mod func(*adminhttp.Config)) *Env {
	t.Helper()
	pool, schema := pgtest.Migrated(t, 6)
	return On(t, pool, schema, mod, nil)
}

// On serves a console on schema: mod, when not nil, changes its configuration,
// and prepare, when not nil, is called with the handler before it serves.
func On(t testing.TB, pool *pgxpool.Pool, schema string, mod func(*adminhttp.Config), prepare func(*adminhttp.Handler)) *Env {
	t.Helper()
	e := &Env{T: t, Pool: pool, Schema: schema, AliceKey: Secret(), VictorKey: Secret()}
	cfg := &adminhttp.Config{Schemas: Selector(t, schema), Logger: Quiet(),
		Users: []adminhttp.User{{Name: "alice", Role: adminhttp.RoleOperator, Secret: e.AliceKey},
			{Name: "victor", Role: adminhttp.RoleViewer, Secret: e.VictorKey}}}
	if mod != nil {
		mod(cfg)
	}
	h, err := adminhttp.New(pool, cfg)
	pgtest.Must(t, err, "console")
	if prepare != nil {
		prepare(h)
	}
	e.Handler, e.Server = h, httptest.NewServer(h)
	t.Cleanup(e.Server.Close)
	e.Admin, err = admin.New(pool, &admin.Config{Schema: schema})
	pgtest.Must(t, err, "admin")
	return e
}

// Secret returns a random key of 32 hex digits.
func Secret() string {
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// Quiet is a logger that writes nothing.
func Quiet() *slog.Logger { return slog.New(slog.DiscardHandler) }

// Table is the quoted name of the schema's table n.
func (e *Env) Table(n string) string { return pgx.Identifier{e.Schema, n}.Sanitize() }

// Enqueue writes n events to one aggregate and returns their ids.
func (e *Env) Enqueue(aggType, aggID string, n int, payload any) []pgoutbox.UUID {
	e.T.Helper()
	p, err := pgoutbox.NewProducer(&pgoutbox.Config{Schema: e.Schema})
	pgtest.Must(e.T, err, "producer")
	var out []pgoutbox.UUID
	for range n {
		res, err := p.EnqueueTx(context.Background(), e.Pool, pgoutbox.Event{AggregateType: aggType, AggregateID: aggID,
			EventType: "changed", Payload: payload})
		pgtest.Must(e.T, err, "enqueue")
		out = append(out, res[0].EventID)
	}
	return out
}

// Quarantine quarantines the event id with the error lastErr.
func (e *Env) Quarantine(id pgoutbox.UUID, lastErr string) {
	e.T.Helper()
	_, err := e.Pool.Exec(context.Background(), "UPDATE "+e.Table("outbox_events")+
		" SET quarantined_at = now(), attempt_count = 10, last_error = $2 WHERE event_id = $1", id, lastErr)
	pgtest.Must(e.T, err, "quarantine")
}

// History writes n events in insertion order over n/10 aggregates of 20
// types, one every spacing back from now, published as they go (published_at
// grows with the rows, as a relay writes them) by 4 relays; the last pending
// of them still pending, one in a hundred of those quarantined now. Then
// VACUUM ANALYZE unless fresh (a table just bulk-loaded, its BRIN index not
// summarised yet). For the console's measurements.
func (e *Env) History(n, pending int, spacing time.Duration, fresh bool) {
	e.T.Helper()
	ctx := context.Background()
	_, err := e.Pool.Exec(ctx, `INSERT INTO `+e.Table("outbox_events")+`
  (event_id, aggregate_type, aggregate_id, aggregate_sequence, event_type, payload, occurred_at, available_at,
   published_at, claimed_by, attempt_count, last_error, quarantined_at)
SELECT gen_random_uuid(), 'type' || (i / 10 % 20), 'agg' || (i / 10), i % 10 + 1, 'changed',
       jsonb_build_object('n', i, 'note', 'some payload text of an ordinary size'),
       now() - ($1 - i) * $3::interval, now(),
       CASE WHEN i < $1 - $2 THEN now() - ($1 - i) * $3::interval + interval '20 milliseconds' END,
       CASE WHEN i < $1 - $2 THEN 'relay-' || (i % 4) END,
       CASE WHEN i >= $1 - $2 AND i % 100 = 0 THEN 10 ELSE 0 END,
       CASE WHEN i >= $1 - $2 AND i % 100 = 0 THEN 'broker said no' END,
       CASE WHEN i >= $1 - $2 AND i % 100 = 0 THEN now() END
  FROM generate_series(0, $1 - 1) i`, n, pending, spacing)
	pgtest.Must(e.T, err, "generate")
	q := "VACUUM ANALYZE "
	if fresh {
		q = "ANALYZE "
	}
	_, err = e.Pool.Exec(ctx, q+e.Table("outbox_events"))
	pgtest.Must(e.T, err, "analyze")
}

// Published marks the event id published by relay ago, by the database's
// clock: history for the console's ranges.
func (e *Env) Published(id pgoutbox.UUID, ago time.Duration, relay string) {
	e.T.Helper()
	_, err := e.Pool.Exec(context.Background(), "UPDATE "+e.Table("outbox_events")+
		" SET published_at = now() - $2::interval, claimed_by = nullif($3, '') WHERE event_id = $1", id, ago, relay)
	pgtest.Must(e.T, err, "publish %s ago", ago)
}

// State is the event id's state as admin reports it.
func (e *Env) State(id pgoutbox.UUID) string {
	e.T.Helper()
	ev, err := e.Admin.Get(context.Background(), id)
	pgtest.Must(e.T, err, "get")
	return ev.State
}

// Untouched fails the test unless the dead letter id is still quarantined
// and the audit is empty: what refused requests (after) must leave behind.
func (e *Env) Untouched(id pgoutbox.UUID, after string) {
	e.T.Helper()
	if s := e.State(id); s != admin.StateQuarantined {
		e.T.Fatalf("after %s the event is %s", after, s)
	}
	a, err := e.Admin.Audit(context.Background(), 10)
	pgtest.Must(e.T, err, "audit")
	if len(a) != 0 {
		e.T.Fatalf("after %s, audit rows: %+v", after, a)
	}
}

// Get fetches path as the operator alice and returns the status and body.
func (e *Env) Get(path string) (status int, body string) {
	e.T.Helper()
	return e.get(path, "alice", e.AliceKey)
}

// CSRF is the cross-site request token on the overview page of user, signed
// in with key.
func (e *Env) CSRF(user, key string) string {
	e.T.Helper()
	status, body := e.get("/?schema="+e.Schema, user, key)
	_, after, ok := strings.Cut(body, `<meta name="csrf" content="`)
	if !ok {
		e.T.Fatalf("no csrf token on the page of %s (status %d)", user, status)
	}
	tok, _, _ := strings.Cut(after, `"`)
	return tok
}

func (e *Env) get(path, user, key string) (int, string) {
	e.T.Helper()
	req, err := http.NewRequest(http.MethodGet, e.Server.URL+path, nil)
	pgtest.Must(e.T, err, "request")
	req.SetBasicAuth(user, key)
	res, err := e.Server.Client().Do(req)
	pgtest.Must(e.T, err, "GET %s", path)
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	pgtest.Must(e.T, err, "read %s", path)
	return res.StatusCode, string(b)
}
