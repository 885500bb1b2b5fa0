// Package ordersvc is the order service of the example: the producer side of the
// outbox.
//
// POST /orders writes the order and its OrderCreated event in one transaction:
// both commit or neither does, so no order is ever created without its event and no
// event announces an order that was rolled back. Publishing is the relay's job.
//
// Retrying an HTTP request is no fix on its own — a response lost after the commit
// makes the client create the order twice. So the service is idempotent per
// Idempotency-Key header: the key is recorded in the same transaction as the order,
// and a retry carrying the same key gets the first answer back (header
// Idempotent-Replayed: true) and creates nothing. A concurrent retry waits on the
// first request's row and then gets its answer.
//
// POST /orders/{id}/cancel emits OrderCancelled, the next sequence of the same
// aggregate, so every consumer sees it after OrderCreated.
package ordersvc

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgoutbox/pgoutbox"
	"github.com/pgoutbox/pgoutbox/examples/orders"
)

// Config configures a Service. The zero value is usable.
type Config struct {
	// Schema holds the orders and outbox tables (see orders.Migrate). Defaults to
	// "public".
	Schema string
	// Logger defaults to slog.Default().
	Logger *slog.Logger
}

// Service creates and cancels orders. It is safe for concurrent use.
type Service struct {
	pool     *pgxpool.Pool
	producer *pgoutbox.Producer
	log      *slog.Logger
	t        struct{ orders, requests string }

	created, replayed, cancelled atomic.Int64
}

// New returns a service on pool; the tables must exist (orders.Migrate).
func New(pool *pgxpool.Pool, cfg *Config) (*Service, error) {
	var c Config
	if cfg != nil {
		c = *cfg
	}
	if c.Schema == "" {
		c.Schema = "public"
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	p, err := pgoutbox.NewProducer(&pgoutbox.Config{Schema: c.Schema})
	if err != nil {
		return nil, err
	}
	s := &Service{pool: pool, producer: p, log: c.Logger}
	s.t.orders = pgx.Identifier{c.Schema, "orders"}.Sanitize()
	s.t.requests = pgx.Identifier{c.Schema, "order_requests"}.Sanitize()
	return s, nil
}

// CreateOrder is the body of POST /orders.
type CreateOrder struct {
	Customer    string `json:"customer"`
	SKU         string `json:"sku"`
	Quantity    int    `json:"quantity"`
	AmountCents int64  `json:"amount_cents"`
}

func (c CreateOrder) validate() error {
	switch {
	case strings.TrimSpace(c.Customer) == "":
		return errors.New("customer is required")
	case strings.TrimSpace(c.SKU) == "":
		return errors.New("sku is required")
	case c.Quantity < 1 || c.Quantity > 1000:
		return fmt.Errorf("quantity %d: want 1..1000", c.Quantity)
	case c.AmountCents < 0:
		return fmt.Errorf("amount_cents %d: must not be negative", c.AmountCents)
	}
	return nil
}

// Order is an order as the API returns it.
type Order struct {
	ID          string     `json:"id"`
	Customer    string     `json:"customer"`
	SKU         string     `json:"sku"`
	Quantity    int        `json:"quantity"`
	AmountCents int64      `json:"amount_cents"`
	Status      string     `json:"status"`
	CreatedAt   time.Time  `json:"created_at"`
	CancelledAt *time.Time `json:"cancelled_at,omitempty"`
}

// Errors a caller can branch on.
var (
	// ErrNotFound: no order with that id.
	ErrNotFound = errors.New("order not found")
	// ErrKeyReused: the Idempotency-Key was first used for a different request.
	ErrKeyReused = errors.New("Idempotency-Key already used for a different request")
	// ErrInvalid is matched by errors about a malformed request.
	ErrInvalid = errors.New("invalid request")
)

// Stats are the service's counters since New.
type Stats struct {
	Created   int64 // orders created
	Replayed  int64 // requests answered from an earlier request with the same Idempotency-Key
	Cancelled int64 // orders cancelled
}

// Stats returns the service's counters.
func (s *Service) Stats() Stats {
	return Stats{Created: s.created.Load(), Replayed: s.replayed.Load(), Cancelled: s.cancelled.Load()}
}

// Create creates an order and its OrderCreated event in one transaction. With a
// non-empty key, a repeated call with the same key and request returns the first
// call's order and replayed = true, creating nothing.
func (s *Service) Create(ctx context.Context, key string, req CreateOrder) (o Order, replayed bool, err error) {
	if err := req.validate(); err != nil {
		return Order{}, false, fmt.Errorf("%w: %v", ErrInvalid, err)
	}
	if len(key) > 255 {
		return Order{}, false, fmt.Errorf("%w: Idempotency-Key longer than 255 bytes", ErrInvalid)
	}
	body, _ := json.Marshal(req)
	sum := sha256.Sum256(body)
	hash := hex.EncodeToString(sum[:])
	id := pgoutbox.NewEventID().String()

	err = pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		if key != "" {
			// Claim the key first. A concurrent request with the same key waits
			// here for the first one's commit, then conflicts and replays it; if the
			// first rolled back, this one goes ahead.
			var claimed bool
			err := tx.QueryRow(ctx, "INSERT INTO "+s.t.requests+" (idempotency_key, request_hash, order_id) VALUES ($1, $2, $3)"+
				" ON CONFLICT (idempotency_key) DO NOTHING RETURNING true", key, hash, id).Scan(&claimed)
			if errors.Is(err, pgx.ErrNoRows) {
				var firstHash string
				var resp []byte
				if err := tx.QueryRow(ctx, "SELECT request_hash, response FROM "+s.t.requests+" WHERE idempotency_key = $1",
					key).Scan(&firstHash, &resp); err != nil {
					return fmt.Errorf("read idempotency key: %w", err)
				}
				if firstHash != hash {
					return ErrKeyReused
				}
				replayed = true
				return json.Unmarshal(resp, &o)
			}
			if err != nil {
				return fmt.Errorf("claim idempotency key: %w", err)
			}
		}
		if err := tx.QueryRow(ctx, "INSERT INTO "+s.t.orders+" (id, customer, sku, quantity, amount_cents) VALUES ($1, $2, $3, $4, $5)"+
			" RETURNING id, customer, sku, quantity, amount_cents, status, created_at",
			id, req.Customer, req.SKU, req.Quantity, req.AmountCents).Scan(
			&o.ID, &o.Customer, &o.SKU, &o.Quantity, &o.AmountCents, &o.Status, &o.CreatedAt); err != nil {
			return fmt.Errorf("insert order: %w", err)
		}
		// The event commits with the order, or neither does.
		if _, err := s.producer.EnqueueTx(ctx, tx, pgoutbox.Event{
			AggregateType: orders.AggregateType,
			AggregateID:   o.ID,
			EventType:     orders.EventOrderCreated,
			Payload: orders.OrderCreated{OrderID: o.ID, Customer: o.Customer, SKU: o.SKU,
				Quantity: o.Quantity, AmountCents: o.AmountCents},
		}); err != nil {
			return fmt.Errorf("enqueue %s: %w", orders.EventOrderCreated, err)
		}
		if key != "" {
			resp, _ := json.Marshal(o)
			if _, err := tx.Exec(ctx, "UPDATE "+s.t.requests+" SET response = $2 WHERE idempotency_key = $1", key, resp); err != nil {
				return fmt.Errorf("record response: %w", err)
			}
		}
		return nil
	})
	if err != nil {
		return Order{}, false, err
	}
	if replayed {
		s.replayed.Add(1)
	} else {
		s.created.Add(1)
	}
	return o, replayed, nil
}

// Cancel cancels an order and emits OrderCancelled in one transaction. Cancelling
// a cancelled order changes nothing and emits nothing (changed = false): the call
// is idempotent without a key.
func (s *Service) Cancel(ctx context.Context, id, reason string) (o Order, changed bool, err error) {
	err = pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		// FOR UPDATE: two concurrent cancels of one order emit one event.
		err := tx.QueryRow(ctx, "SELECT id, customer, sku, quantity, amount_cents, status, created_at, cancelled_at FROM "+
			s.t.orders+" WHERE id = $1 FOR UPDATE", id).Scan(
			&o.ID, &o.Customer, &o.SKU, &o.Quantity, &o.AmountCents, &o.Status, &o.CreatedAt, &o.CancelledAt)
		if errors.Is(err, pgx.ErrNoRows) {
			return ErrNotFound
		}
		if err != nil {
			return fmt.Errorf("read order: %w", err)
		}
		if o.Status == "cancelled" {
			return nil
		}
		if err := tx.QueryRow(ctx, "UPDATE "+s.t.orders+" SET status = 'cancelled', cancelled_at = now() WHERE id = $1 RETURNING status, cancelled_at",
			id).Scan(&o.Status, &o.CancelledAt); err != nil {
			return fmt.Errorf("cancel order: %w", err)
		}
		if _, err := s.producer.EnqueueTx(ctx, tx, pgoutbox.Event{
			AggregateType: orders.AggregateType,
			AggregateID:   o.ID,
			EventType:     orders.EventOrderCancelled,
			Payload:       orders.OrderCancelled{OrderID: o.ID, Reason: reason},
		}); err != nil {
			return fmt.Errorf("enqueue %s: %w", orders.EventOrderCancelled, err)
		}
		changed = true
		return nil
	})
	if err != nil {
		return Order{}, false, err
	}
	if changed {
		s.cancelled.Add(1)
	}
	return o, changed, nil
}

// Get returns one order.
func (s *Service) Get(ctx context.Context, id string) (Order, error) {
	var o Order
	err := s.pool.QueryRow(ctx, "SELECT id, customer, sku, quantity, amount_cents, status, created_at, cancelled_at FROM "+
		s.t.orders+" WHERE id = $1", id).Scan(&o.ID, &o.Customer, &o.SKU, &o.Quantity, &o.AmountCents, &o.Status, &o.CreatedAt, &o.CancelledAt)
	if errors.Is(err, pgx.ErrNoRows) {
		return Order{}, ErrNotFound
	}
	if err != nil {
		return Order{}, fmt.Errorf("read order: %w", err)
	}
	return o, nil
}

// Handler returns the HTTP API:
//
//	POST /orders               body CreateOrder, optional Idempotency-Key header → 201 Order
//	GET  /orders/{id}          → 200 Order
//	POST /orders/{id}/cancel   optional body {"reason": "..."} → 200 Order
//
// Errors are JSON {"error": "..."} with 400, 404, 422 or 500.
func (s *Service) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /orders", func(w http.ResponseWriter, r *http.Request) {
		var req CreateOrder
		if err := decode(r, &req); err != nil {
			writeError(w, http.StatusBadRequest, err)
			return
		}
		o, replayed, err := s.Create(r.Context(), r.Header.Get("Idempotency-Key"), req)
		if err != nil {
			s.fail(w, r, err)
			return
		}
		if replayed {
			w.Header().Set("Idempotent-Replayed", "true")
		}
		writeJSON(w, http.StatusCreated, o)
	})
	mux.HandleFunc("GET /orders/{id}", func(w http.ResponseWriter, r *http.Request) {
		o, err := s.Get(r.Context(), r.PathValue("id"))
		if err != nil {
			s.fail(w, r, err)
			return
		}
		writeJSON(w, http.StatusOK, o)
	})
	mux.HandleFunc("POST /orders/{id}/cancel", func(w http.ResponseWriter, r *http.Request) {
		var body struct {
			Reason string `json:"reason"`
		}
		if r.ContentLength != 0 {
			if err := decode(r, &body); err != nil {
				writeError(w, http.StatusBadRequest, err)
				return
			}
		}
		o, _, err := s.Cancel(r.Context(), r.PathValue("id"), body.Reason)
		if err != nil {
			s.fail(w, r, err)
			return
		}
		writeJSON(w, http.StatusOK, o)
	})
	return mux
}

func (s *Service) fail(w http.ResponseWriter, r *http.Request, err error) {
	switch {
	case errors.Is(err, ErrInvalid):
		writeError(w, http.StatusBadRequest, err)
	case errors.Is(err, ErrNotFound):
		writeError(w, http.StatusNotFound, err)
	case errors.Is(err, ErrKeyReused):
		writeError(w, http.StatusUnprocessableEntity, err)
	default:
		s.log.Error("request failed", slog.String("method", r.Method), slog.String("path", r.URL.Path), slog.Any("error", err))
		writeError(w, http.StatusInternalServerError, errors.New("internal error"))
	}
}

func decode(r *http.Request, v any) error {
	dec := json.NewDecoder(http.MaxBytesReader(nil, r.Body, 64<<10))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return fmt.Errorf("request body: %w", err)
	}
	return nil
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}

func writeError(w http.ResponseWriter, code int, err error) {
	writeJSON(w, code, map[string]string{"error": err.Error()})
}
