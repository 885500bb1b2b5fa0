package payments_test

import (
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"go.uber.org/goleak"

	"github.com/pgoutbox/pgoutbox/broker"
	natsbroker "github.com/pgoutbox/pgoutbox/broker/nats"
	"github.com/pgoutbox/pgoutbox/examples/orders"
	"github.com/pgoutbox/pgoutbox/examples/orders/fakepay"
	"github.com/pgoutbox/pgoutbox/examples/orders/ordersvc"
	"github.com/pgoutbox/pgoutbox/examples/orders/payments"
	"github.com/pgoutbox/pgoutbox/inbox"
	"github.com/pgoutbox/pgoutbox/internal/natstest"
	"github.com/pgoutbox/pgoutbox/internal/pgtest"
	"github.com/pgoutbox/pgoutbox/relay"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var quiet = slog.New(slog.DiscardHandler)

// Acceptance: the payment API times out on the first request of every charge —
// after recording it. The real worker (inbox consumer on JetStream, fed by a real
// relay from a real outbox) gives up, rolls back, gets the event again and retries
// with the same key: the API still holds exactly one charge per order, and the
// worker recorded that charge. Without the key, the same retries double-charge,
// which is what the key is for.
func TestChargedOnceDespiteTimeouts(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		noKey bool
	}{{"with key", false}, {"without key", true}} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			const n = 15
			pool, schema := pgtest.Schema(t, 16)
			ctx := context.Background()
			pgtest.Must(t, orders.Migrate(ctx, pool, schema), "migrate")
			target := natstest.New(t, natstest.URL())

			// Every key's first request is recorded and then left unanswered.
			api := fakepay.New(&fakepay.Config{Logger: quiet, Decide: func(_ string, attempt int) fakepay.Fault {
				if attempt == 1 {
					return fakepay.FaultTimeout
				}
				return fakepay.FaultNone
			}})
			apiSrv := httptest.NewServer(api)
			t.Cleanup(apiSrv.Close)

			svc, err := ordersvc.New(pool, &ordersvc.Config{Schema: schema, Logger: quiet})
			pgtest.Must(t, err, "order service")
			placed := map[string]int64{}
			for i := range n {
				o, _, err := svc.Create(ctx, "", ordersvc.CreateOrder{Customer: "c", SKU: "s", Quantity: 1, AmountCents: int64(100 + i)})
				pgtest.Must(t, err, "create order")
				placed[o.ID] = o.AmountCents
			}

			pub, err := natsbroker.Dial(ctx, natstest.URL(), &natsbroker.Config{Stream: target.Stream, StreamSubjects: target.Subjects(),
				Subject: broker.MustParseTemplate(target.Template), Logger: quiet})
			pgtest.Must(t, err, "publisher")
			t.Cleanup(func() { _ = pub.Close() })
			r, err := relay.New(pool, pub, &relay.Config{Schema: schema, PollInterval: 100 * time.Millisecond, Logger: quiet})
			pgtest.Must(t, err, "relay")
			pgtest.Must(t, r.Start(ctx), "start relay")
			t.Cleanup(func() { _ = r.Stop(context.Background()) })

			wctx, stop := context.WithCancel(ctx)
			done := make(chan error, 1)
			go func() {
				done <- payments.Run(wctx, payments.RunConfig{
					DatabaseURL: pgtest.URL(),
					Client:      &payments.Client{BaseURL: apiSrv.URL, HTTP: &http.Client{Timeout: 300 * time.Millisecond}, NoIdempotencyKey: tc.noKey},
					Inbox:       inbox.Config{Schema: schema, RetryDelay: 50 * time.Millisecond, MaxRetryDelay: 200 * time.Millisecond, Logger: quiet},
					Consumer: orders.ConsumerConfig{NatsURL: natstest.URL(), Stream: target.Stream, StreamSubjects: target.Subjects(),
						AckWait: 10 * time.Second, Logger: quiet},
				})
			}()
			t.Cleanup(func() {
				stop()
				if err := <-done; err != nil {
					t.Errorf("payment worker: %v", err)
				}
			})

			table := pgx.Identifier{schema, "payments"}.Sanitize()
			deadline := time.Now().Add(time.Minute)
			for {
				var rows int
				pgtest.Must(t, pool.QueryRow(ctx, "SELECT count(*) FROM "+table).Scan(&rows), "count payments")
				if rows == n {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("%d of %d orders paid after 1m; API stats %+v", rows, n, api.Stats())
				}
				time.Sleep(20 * time.Millisecond) // polling interval, not synchronisation
			}

			charges := api.Charges()
			perOrder := fakepay.ChargesPerOrder(charges)
			if st := api.Stats(); st.Timeouts < n || st.Requests < 2*n {
				t.Fatalf("the worker did not retry after the timeouts: %+v", st)
			}
			if tc.noKey {
				for id := range placed {
					if perOrder[id] < 2 {
						t.Fatalf("without the key, order %s was charged %d times; the test cannot tell the key's effect", id, perOrder[id])
					}
				}
				return
			}
			if len(charges) != n {
				t.Fatalf("the API recorded %d charges for %d orders", len(charges), n)
			}
			byID := map[string]fakepay.Charge{}
			for _, c := range charges {
				if perOrder[c.OrderID] != 1 || c.AmountCents != placed[c.OrderID] || c.Requests < 2 {
					t.Fatalf("charge %+v: %d charges for its order, want 1 after ≥2 requests", c, perOrder[c.OrderID])
				}
				byID[c.ID] = c
			}
			rows, err := pool.Query(ctx, "SELECT order_id, charge_id, amount_cents FROM "+table)
			pgtest.Must(t, err, "read payments")
			for rows.Next() {
				var orderID, chargeID string
				var amount int64
				pgtest.Must(t, rows.Scan(&orderID, &chargeID, &amount), "scan")
				if c, ok := byID[chargeID]; !ok || c.OrderID != orderID || amount != placed[orderID] {
					t.Fatalf("payment row %s/%s/%d does not match the API's charge %+v", orderID, chargeID, amount, c)
				}
			}
			pgtest.Must(t, rows.Err(), "read payments")
		})
	}
}
