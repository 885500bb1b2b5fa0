// Package loadgen drives the order service's HTTP API the way real clients do:
// orders at a steady rate, some cancelled right away, and requests retried with the
// same Idempotency-Key — as a client does after a timeout or a lost response — some
// of them while the first is still in flight.
package loadgen

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	mrand "math/rand/v2"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/pgoutbox/pgoutbox/examples/orders/ordersvc"
)

// Config configures Run.
type Config struct {
	// BaseURL is the order service, e.g. http://127.0.0.1:8080. Required.
	BaseURL string
	// Rate is the orders per second to create. Defaults to 50.
	Rate float64
	// Workers is how many clients send at once. Defaults to 8.
	Workers int
	// RetryRate is the share of orders whose request is sent twice with the same key,
	// half of them concurrently. Defaults to 0.1.
	RetryRate float64
	// CancelRate is the share of orders cancelled just after they are created.
	// Defaults to 0.2.
	CancelRate float64
	// HTTP defaults to a client with a 10s timeout.
	HTTP *http.Client
	// Logger receives request failures. Defaults to slog.Default().
	Logger *slog.Logger
}

// Stats are what the load generator did.
type Stats struct {
	Created   int64 // orders created (first answers)
	Retries   int64 // repeated requests answered with the first order
	Cancelled int64 // cancellations sent and answered
	Errors    int64 // requests that failed (retried with the same key)
	// Mismatches counts retries answered with a different order than the first
	// request: the idempotency key failed. Must be 0.
	Mismatches int64
}

// Generator sends load; read its Stats while it runs.
type Generator struct {
	cfg                                           Config
	created, retries, cancelled, errors, mismatch atomic.Int64
}

// New returns a generator for cfg.
func New(cfg Config) *Generator {
	if cfg.Rate <= 0 {
		cfg.Rate = 50
	}
	if cfg.Workers <= 0 {
		cfg.Workers = 8
	}
	if cfg.RetryRate == 0 {
		cfg.RetryRate = 0.1
	}
	if cfg.CancelRate == 0 {
		cfg.CancelRate = 0.2
	}
	if cfg.HTTP == nil {
		cfg.HTTP = &http.Client{Timeout: 10 * time.Second}
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	cfg.BaseURL = strings.TrimRight(cfg.BaseURL, "/")
	return &Generator{cfg: cfg}
}

// Stats returns the counters so far.
func (g *Generator) Stats() Stats {
	return Stats{Created: g.created.Load(), Retries: g.retries.Load(), Cancelled: g.cancelled.Load(),
		Errors: g.errors.Load(), Mismatches: g.mismatch.Load()}
}

// Run sends load until ctx ends, then waits for the requests in flight (each is
// completed, with its retries and cancellation, even after ctx ended, so that no
// order is left half-done).
func (g *Generator) Run(ctx context.Context) {
	tokens := make(chan struct{})
	var wg sync.WaitGroup
	for range g.cfg.Workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range tokens {
				g.order()
			}
		}()
	}
	tick := time.NewTicker(time.Duration(float64(time.Second) / g.cfg.Rate))
	defer tick.Stop()
loop:
	for {
		select {
		case <-ctx.Done():
			break loop
		case <-tick.C:
			select {
			case tokens <- struct{}{}:
			case <-ctx.Done():
				break loop
			}
		}
	}
	close(tokens)
	wg.Wait()
}

var skus = []string{"sku-apple", "sku-pear", "sku-plum", "sku-fig", "sku-kiwi"}

// order creates one order, retrying and cancelling as configured. It does not take
// the run's context: an order begun is finished.
func (g *Generator) order() {
	req := ordersvc.CreateOrder{
		Customer:    fmt.Sprintf("customer-%03d", mrand.IntN(500)),
		SKU:         skus[mrand.IntN(len(skus))],
		Quantity:    1 + mrand.IntN(5),
		AmountCents: int64(100 + mrand.IntN(10000)),
	}
	key := newKey()
	var first ordersvc.Order
	switch x := mrand.Float64(); {
	case x < g.cfg.RetryRate/2: // a retry racing the first request
		var wg sync.WaitGroup
		var second ordersvc.Order
		var ok1, ok2 bool
		wg.Add(2)
		go func() { defer wg.Done(); first, ok1 = g.create(key, req) }()
		go func() { defer wg.Done(); second, ok2 = g.create(key, req) }()
		wg.Wait()
		if !ok1 || !ok2 {
			return
		}
		g.check(first, second)
	case x < g.cfg.RetryRate: // a retry after the answer was lost
		var ok bool
		if first, ok = g.create(key, req); !ok {
			return
		}
		second, ok := g.create(key, req)
		if !ok {
			return
		}
		g.check(first, second)
	default:
		var ok bool
		if first, ok = g.create(key, req); !ok {
			return
		}
	}
	if mrand.Float64() < g.cfg.CancelRate {
		for attempt := 0; attempt < 5; attempt++ {
			if g.post("/orders/"+first.ID+"/cancel", "", map[string]string{"reason": "changed my mind"}, nil) {
				g.cancelled.Add(1)
				return
			}
		}
	}
}

func (g *Generator) check(first, second ordersvc.Order) {
	g.retries.Add(1)
	if first.ID != second.ID {
		g.mismatch.Add(1)
		g.cfg.Logger.Error("a retry with the same Idempotency-Key got another order", slog.String("first", first.ID),
			slog.String("second", second.ID))
	}
}

// create posts the order, retrying with the same key on failure; ok is false after
// five failures.
func (g *Generator) create(key string, req ordersvc.CreateOrder) (o ordersvc.Order, ok bool) {
	for attempt := 0; attempt < 5; attempt++ {
		var replayed bool
		if g.post("/orders", key, req, func(resp *http.Response, body []byte) error {
			replayed = resp.Header.Get("Idempotent-Replayed") == "true"
			return json.Unmarshal(body, &o)
		}) {
			if !replayed {
				g.created.Add(1)
			}
			return o, true
		}
		time.Sleep(time.Duration(100*(attempt+1)) * time.Millisecond)
	}
	return o, false
}

func (g *Generator) post(path, key string, body any, decode func(*http.Response, []byte) error) bool {
	b, _ := json.Marshal(body)
	req, err := http.NewRequest(http.MethodPost, g.cfg.BaseURL+path, bytes.NewReader(b))
	if err != nil {
		g.fail(path, err)
		return false
	}
	req.Header.Set("Content-Type", "application/json")
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	resp, err := g.cfg.HTTP.Do(req)
	if err != nil {
		g.fail(path, err)
		return false
	}
	defer resp.Body.Close()
	rb, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err == nil && resp.StatusCode/100 != 2 {
		err = fmt.Errorf("%s: %s", resp.Status, bytes.TrimSpace(rb))
	}
	if err == nil && decode != nil {
		err = decode(resp, rb)
	}
	if err != nil {
		g.fail(path, err)
		return false
	}
	return true
}

func (g *Generator) fail(path string, err error) {
	g.errors.Add(1)
	g.cfg.Logger.Warn("request failed; retrying", slog.String("path", path), slog.Any("error", err))
}

func newKey() string {
	b := make([]byte, 12)
	_, _ = rand.Read(b)
	return "req-" + hex.EncodeToString(b)
}
