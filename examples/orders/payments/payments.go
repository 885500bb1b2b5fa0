// Package payments is the payment worker of the example: an inbox consumer that
// charges each created order through an external payment API.
//
// The charge is a remote call, outside the consumer's transaction: if the worker
// crashes after the call and before its commit, or the call times out after the
// provider charged, the event is delivered again and the call repeated. The worker
// therefore sends inbox.IdempotencyKey(ev) — the event id, the same on every
// delivery — as the Idempotency-Key, and the provider (package fakepay here)
// charges once per key. The charge id is stored in the same transaction as the
// inbox's dedup row, so once committed the event is never charged again at all.
package payments

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/pgoutbox/examples/orders"
	"github.com/pgoutbox/pgoutbox/examples/orders/fakepay"
	"github.com/pgoutbox/pgoutbox/inbox"
)

// ConsumerName is the inbox consumer name (and durable JetStream consumer).
const ConsumerName = "payments"

// Client calls the payment API.
type Client struct {
	// BaseURL is the API's address, e.g. http://127.0.0.1:8090. Required.
	BaseURL string
	// HTTP is the client to use; its Timeout bounds a call. Defaults to a client
	// with a 5s timeout.
	HTTP *http.Client
	// NoIdempotencyKey leaves the Idempotency-Key header out: every retry is then a
	// new charge. Only for showing what goes wrong without it.
	NoIdempotencyKey bool
}

// Charge asks the API to charge req once per key. An error means the outcome is
// unknown (a timeout) or the charge failed: retry with the same key.
func (c *Client) Charge(ctx context.Context, key string, req fakepay.ChargeRequest) (fakepay.Charge, error) {
	hc := c.HTTP
	if hc == nil {
		hc = &http.Client{Timeout: 5 * time.Second}
	}
	body, _ := json.Marshal(req)
	r, err := http.NewRequestWithContext(ctx, http.MethodPost, strings.TrimRight(c.BaseURL, "/")+"/v1/charges", bytes.NewReader(body))
	if err != nil {
		return fakepay.Charge{}, fmt.Errorf("charge order %s: %w", req.OrderID, err)
	}
	r.Header.Set("Content-Type", "application/json")
	if !c.NoIdempotencyKey {
		r.Header.Set("Idempotency-Key", key)
	}
	resp, err := hc.Do(r)
	if err != nil {
		return fakepay.Charge{}, fmt.Errorf("charge order %s: %w", req.OrderID, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	if err != nil {
		return fakepay.Charge{}, fmt.Errorf("charge order %s: read answer: %w", req.OrderID, err)
	}
	if resp.StatusCode != http.StatusCreated && resp.StatusCode != http.StatusOK {
		return fakepay.Charge{}, fmt.Errorf("charge order %s: %s: %s", req.OrderID, resp.Status, bytes.TrimSpace(b))
	}
	var ch fakepay.Charge
	if err := json.Unmarshal(b, &ch); err != nil {
		return fakepay.Charge{}, fmt.Errorf("charge order %s: decode answer: %w", req.OrderID, err)
	}
	return ch, nil
}

// Handler returns the worker's inbox handler: OrderCreated → charge the order and
// record the payment in the consumer transaction; other events are marked
// processed without effect.
func Handler(schema string, client *Client) inbox.Handler[pgx.Tx] {
	table := pgx.Identifier{schema, "payments"}.Sanitize()
	return func(ctx context.Context, tx pgx.Tx, ev inbox.Event) error {
		if ev.EventType != orders.EventOrderCreated {
			return nil // a refund flow would handle OrderCancelled here
		}
		o, err := inbox.UnmarshalPayload[orders.OrderCreated](ev)
		if err != nil {
			return err
		}
		// The same key on every delivery of this event: the API charges once.
		ch, err := client.Charge(ctx, inbox.IdempotencyKey(ev), fakepay.ChargeRequest{OrderID: o.OrderID, AmountCents: o.AmountCents})
		if err != nil {
			return err // rolled back and redelivered; the retry carries the same key
		}
		if _, err := tx.Exec(ctx, "INSERT INTO "+table+" (event_id, order_id, charge_id, amount_cents) VALUES ($1, $2, $3, $4)",
			ev.EventID, o.OrderID, ch.ID, ch.AmountCents); err != nil {
			return fmt.Errorf("record payment of order %s: %w", o.OrderID, err)
		}
		return nil
	}
}

// RunConfig configures Run.
type RunConfig struct {
	// DatabaseURL is the PostgreSQL connection string. Required.
	DatabaseURL string
	// Client calls the payment API. Required.
	Client *Client
	// Inbox configures the inbox consumer; Name defaults to ConsumerName.
	Inbox inbox.Config
	// Consumer says where the events come from.
	Consumer orders.ConsumerConfig
}

// Run runs one payment worker instance until ctx ends.
func Run(ctx context.Context, cfg RunConfig) error {
	if cfg.Client == nil || cfg.Client.BaseURL == "" {
		return fmt.Errorf("payments: the payment API's URL is required")
	}
	if cfg.Inbox.Name == "" {
		cfg.Inbox.Name = ConsumerName
	}
	if cfg.Inbox.Schema == "" {
		cfg.Inbox.Schema = "public"
	}
	return orders.RunInbox(ctx, cfg.DatabaseURL, cfg.Inbox, Handler(cfg.Inbox.Schema, cfg.Client), cfg.Consumer)
}
