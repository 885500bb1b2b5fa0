package ordersvc_test

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgoutbox/pgoutbox/examples/orders"
	"github.com/pgoutbox/pgoutbox/examples/orders/ordersvc"
	"github.com/pgoutbox/pgoutbox/internal/pgtest"
)

type env struct {
	t      *testing.T
	pool   *pgxpool.Pool
	schema string
	srv    *httptest.Server
	svc    *ordersvc.Service
}

func newEnv(t *testing.T) *env {
	t.Helper()
	pool, schema := pgtest.Schema(t, 8)
	pgtest.Must(t, orders.Migrate(context.Background(), pool, schema), "migrate")
	svc, err := ordersvc.New(pool, &ordersvc.Config{Schema: schema})
	pgtest.Must(t, err, "service")
	srv := httptest.NewServer(svc.Handler())
	t.Cleanup(srv.Close)
	return &env{t: t, pool: pool, schema: schema, srv: srv, svc: svc}
}

func (e *env) post(path, key string, body any) (*http.Response, ordersvc.Order) {
	e.t.Helper()
	b, _ := json.Marshal(body)
	req, err := http.NewRequest(http.MethodPost, e.srv.URL+path, bytes.NewReader(b))
	pgtest.Must(e.t, err, "request")
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	resp, err := http.DefaultClient.Do(req)
	pgtest.Must(e.t, err, "POST %s", path)
	defer resp.Body.Close()
	var o ordersvc.Order
	if resp.StatusCode/100 == 2 {
		pgtest.Must(e.t, json.NewDecoder(resp.Body).Decode(&o), "decode")
	}
	return resp, o
}

func (e *env) count(table, where string, args ...any) int {
	e.t.Helper()
	var n int
	pgtest.Must(e.t, e.pool.QueryRow(context.Background(), "SELECT count(*) FROM "+pgx.Identifier{e.schema, table}.Sanitize()+" WHERE "+where, args...).Scan(&n), "count")
	return n
}

var order = ordersvc.CreateOrder{Customer: "ada", SKU: "sku-fig", Quantity: 2, AmountCents: 1250}

// Acceptance: the same Idempotency-Key sent twice — one after the other, and
// concurrently — creates one order and one event, and both answers are the first
// order.
func TestSameIdempotencyKeyTwiceCreatesOneOrderAndOneEvent(t *testing.T) {
	t.Parallel()
	e := newEnv(t)

	r1, o1 := e.post("/orders", "key-1", order)
	r2, o2 := e.post("/orders", "key-1", order)
	if r1.StatusCode != http.StatusCreated || r2.StatusCode != http.StatusCreated || o1.ID == "" || o1 != o2 {
		t.Fatalf("answers: %d %+v, %d %+v", r1.StatusCode, o1, r2.StatusCode, o2)
	}
	if r1.Header.Get("Idempotent-Replayed") != "" || r2.Header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("Idempotent-Replayed: %q, %q", r1.Header.Get("Idempotent-Replayed"), r2.Header.Get("Idempotent-Replayed"))
	}
	if n := e.count("orders", "true"); n != 1 {
		t.Fatalf("%d orders", n)
	}
	if n := e.count("outbox_events", "aggregate_id = $1 AND event_type = $2 AND aggregate_sequence = 1", o1.ID, orders.EventOrderCreated); n != 1 ||
		e.count("outbox_events", "true") != 1 {
		t.Fatalf("%d events for the order, %d in all", n, e.count("outbox_events", "true"))
	}

	// Eight concurrent requests with one key: the late ones wait for the first's
	// commit and replay it.
	var wg sync.WaitGroup
	ids := make([]string, 8)
	for i := range ids {
		wg.Add(1)
		go func() {
			defer wg.Done()
			resp, o := e.post("/orders", "key-2", order)
			if resp.StatusCode == http.StatusCreated {
				ids[i] = o.ID
			}
		}()
	}
	wg.Wait()
	for _, id := range ids {
		if id == "" || id != ids[0] {
			t.Fatalf("concurrent answers: %v", ids)
		}
	}
	if n, ev := e.count("orders", "true"), e.count("outbox_events", "true"); n != 2 || ev != 2 {
		t.Fatalf("after the concurrent requests: %d orders, %d events; want 2 and 2", n, ev)
	}
	if st := e.svc.Stats(); st.Created != 2 || st.Replayed != 8 {
		t.Fatalf("stats %+v", st)
	}

	// Without a key every request is a new order.
	e.post("/orders", "", order)
	e.post("/orders", "", order)
	if n := e.count("orders", "true"); n != 4 {
		t.Fatalf("%d orders after two unkeyed requests", n)
	}
}

// A key reused for another request is refused; nothing is written.
func TestIdempotencyKeyReusedForAnotherRequest(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.post("/orders", "key-1", order)
	other := order
	other.Quantity = 3
	if r, _ := e.post("/orders", "key-1", other); r.StatusCode != http.StatusUnprocessableEntity {
		t.Fatalf("status %d, want 422", r.StatusCode)
	}
	if r, _ := e.post("/orders", "key-x", ordersvc.CreateOrder{Customer: "ada", SKU: "x", Quantity: 0}); r.StatusCode != http.StatusBadRequest {
		t.Fatalf("invalid order: status %d, want 400", r.StatusCode)
	}
	if n, ev := e.count("orders", "true"), e.count("outbox_events", "true"); n != 1 || ev != 1 {
		t.Fatalf("%d orders, %d events", n, ev)
	}
}

// Cancel emits OrderCancelled as sequence 2 of the same aggregate, once however
// often it is called.
func TestCancelEmitsTheNextSequenceOnce(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	_, o := e.post("/orders", "key-1", order)
	for range 2 {
		r, c := e.post("/orders/"+o.ID+"/cancel", "", map[string]string{"reason": "test"})
		if r.StatusCode != http.StatusOK || c.Status != "cancelled" || c.CancelledAt == nil {
			t.Fatalf("cancel: %d %+v", r.StatusCode, c)
		}
	}
	var types []string
	pgtest.Must(t, e.pool.QueryRow(context.Background(), "SELECT array_agg(event_type ORDER BY aggregate_sequence) FROM "+
		pgx.Identifier{e.schema, "outbox_events"}.Sanitize()+" WHERE aggregate_type = 'order' AND aggregate_id = $1", o.ID).Scan(&types), "events")
	if len(types) != 2 || types[0] != orders.EventOrderCreated || types[1] != orders.EventOrderCancelled {
		t.Fatalf("events of the order, by sequence: %v", types)
	}
	if r, _ := e.post("/orders/nope/cancel", "", nil); r.StatusCode != http.StatusNotFound {
		t.Fatalf("unknown order: status %d", r.StatusCode)
	}
}
