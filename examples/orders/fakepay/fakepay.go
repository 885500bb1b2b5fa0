// Package fakepay is a stand-in for an external payment provider's HTTP API, with
// the one property that makes at-least-once delivery safe to build on: it honours
// idempotency keys. The first POST /v1/charges with a given Idempotency-Key creates
// a charge; every later request with that key gets the same charge back and charges
// nothing (header Idempotent-Replayed: true). A request without a key is charged
// every time, as a naive API would.
//
// It can be told to misbehave, to show why the key matters:
//
//	timeout  the charge is recorded, then the response never comes (the server
//	         holds the request until the client gives up): the caller cannot tell
//	         whether it was charged and must retry — with the same key
//	fail     a 503 before anything is recorded
//
// per request at random (Config.TimeoutRate, Config.FailRate, PUT /v1/faults), or
// by a function of the key and attempt (Config.Decide) for deterministic tests.
// Charges live in memory.
package fakepay

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/pgoutbox/pgoutbox/examples/orders"
)

// ChargeRequest is the body of POST /v1/charges.
type ChargeRequest struct {
	OrderID     string `json:"order_id"`
	AmountCents int64  `json:"amount_cents"`
}

// Charge is a recorded charge.
type Charge struct {
	ID             string    `json:"id"`
	OrderID        string    `json:"order_id"`
	AmountCents    int64     `json:"amount_cents"`
	IdempotencyKey string    `json:"idempotency_key,omitempty"`
	CreatedAt      time.Time `json:"created_at"`
	// Requests is how many requests carried this charge's key (1 without a key).
	Requests int `json:"requests"`
}

// Fault is what the server does with one request.
type Fault int

const (
	// FaultNone answers normally.
	FaultNone Fault = iota
	// FaultTimeout records the charge (for a new key) and then does not answer
	// until the client gives up, or Config.MaxHang passes.
	FaultTimeout
	// FaultFail answers 503 without recording anything.
	FaultFail
)

// Config configures a Server. The zero value never misbehaves.
type Config struct {
	// TimeoutRate and FailRate are the chances (0..1) that a request times out or
	// fails. They apply when Decide is nil. Default to 0.
	TimeoutRate, FailRate float64

	// Decide, if set, chooses each request's fault from its key and attempt: 1 for
	// the first request with that key (without a key, for the first request for
	// that order). Defaults to the rates.
	Decide func(key string, attempt int) Fault

	// MaxHang bounds how long a timed-out request is held. Defaults to 30s.
	MaxHang time.Duration

	// Logger defaults to slog.Default().
	Logger *slog.Logger
}

// Stats are a server's counters.
type Stats struct {
	Requests int64 // POST /v1/charges requests
	Charges  int64 // charges created
	Replays  int64 // requests answered with an existing charge (a repeated key)
	Timeouts int64 // requests held without an answer
	Failures int64 // requests answered 503
}

// Server is the fake payment API; it is an http.Handler.
type Server struct {
	cfg Config
	mux *http.ServeMux

	mu       sync.Mutex
	byKey    map[string]*Charge
	charges  []*Charge
	attempts map[string]int
	stats    Stats
	rates    [2]float64 // timeout, fail
}

// New returns a server configured by cfg (nil: well-behaved).
func New(cfg *Config) *Server {
	var c Config
	if cfg != nil {
		c = *cfg
	}
	if c.MaxHang == 0 {
		c.MaxHang = 30 * time.Second
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	s := &Server{cfg: c, byKey: map[string]*Charge{}, attempts: map[string]int{}, rates: [2]float64{c.TimeoutRate, c.FailRate}}
	s.mux = http.NewServeMux()
	s.mux.HandleFunc("POST /v1/charges", s.charge)
	s.mux.HandleFunc("GET /v1/charges", func(w http.ResponseWriter, _ *http.Request) { writeJSON(w, http.StatusOK, s.Charges()) })
	s.mux.HandleFunc("GET /v1/stats", func(w http.ResponseWriter, _ *http.Request) { writeJSON(w, http.StatusOK, s.Stats()) })
	s.mux.HandleFunc("PUT /v1/faults", func(w http.ResponseWriter, r *http.Request) {
		var f struct {
			TimeoutRate float64 `json:"timeout_rate"`
			FailRate    float64 `json:"fail_rate"`
		}
		if err := json.NewDecoder(r.Body).Decode(&f); err != nil {
			writeJSON(w, http.StatusBadRequest, map[string]string{"error": err.Error()})
			return
		}
		if err := s.SetFaults(f.TimeoutRate, f.FailRate); err != nil {
			writeJSON(w, http.StatusBadRequest, map[string]string{"error": err.Error()})
			return
		}
		w.WriteHeader(http.StatusNoContent)
	})
	return s
}

// ServeHTTP serves the API.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) { s.mux.ServeHTTP(w, r) }

// SetFaults changes the timeout and failure rates (each 0..1).
func (s *Server) SetFaults(timeoutRate, failRate float64) error {
	if timeoutRate < 0 || timeoutRate > 1 || failRate < 0 || failRate > 1 || timeoutRate+failRate > 1 {
		return fmt.Errorf("fakepay: rates %.2f and %.2f: want each in 0..1, together at most 1", timeoutRate, failRate)
	}
	s.mu.Lock()
	s.rates = [2]float64{timeoutRate, failRate}
	s.mu.Unlock()
	return nil
}

// Charges returns every charge recorded, in creation order.
func (s *Server) Charges() []Charge {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]Charge, len(s.charges))
	for i, c := range s.charges {
		out[i] = *c
	}
	return out
}

// Stats returns the server's counters.
func (s *Server) Stats() Stats {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.stats
}

func (s *Server) decide(key string, attempt int) Fault {
	if s.cfg.Decide != nil {
		return s.cfg.Decide(key, attempt)
	}
	s.mu.Lock()
	rates := s.rates
	s.mu.Unlock()
	switch x := rand.Float64(); {
	case x < rates[0]:
		return FaultTimeout
	case x < rates[0]+rates[1]:
		return FaultFail
	}
	return FaultNone
}

func (s *Server) charge(w http.ResponseWriter, r *http.Request) {
	var req ChargeRequest
	if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, 64<<10)).Decode(&req); err != nil || req.OrderID == "" || req.AmountCents < 0 {
		writeJSON(w, http.StatusBadRequest, map[string]string{"error": "want {\"order_id\": \"...\", \"amount_cents\": n ≥ 0}"})
		return
	}
	key := r.Header.Get("Idempotency-Key")

	s.mu.Lock()
	s.stats.Requests++
	retryOf := "key:" + key
	if key == "" {
		retryOf = "order:" + req.OrderID
	}
	s.attempts[retryOf]++
	attempt := s.attempts[retryOf]
	s.mu.Unlock()
	fault := s.decide(key, attempt)

	if fault == FaultFail {
		s.mu.Lock()
		s.stats.Failures++
		s.mu.Unlock()
		writeJSON(w, http.StatusServiceUnavailable, map[string]string{"error": "payment processor unavailable (injected)"})
		return
	}

	s.mu.Lock()
	c, replayed := s.byKey[key]
	if replayed && key != "" {
		c.Requests++
		s.stats.Replays++
	} else {
		replayed = false
		c = &Charge{ID: fmt.Sprintf("ch_%06d", len(s.charges)+1), OrderID: req.OrderID, AmountCents: req.AmountCents,
			IdempotencyKey: key, CreatedAt: time.Now(), Requests: 1}
		s.charges = append(s.charges, c)
		if key != "" {
			s.byKey[key] = c
		}
		s.stats.Charges++
	}
	resp := *c
	if fault == FaultTimeout {
		s.stats.Timeouts++
	}
	s.mu.Unlock()

	if fault == FaultTimeout {
		// Recorded, and now silence: the caller's timeout fires and it cannot know
		// whether the charge happened.
		t := time.NewTimer(s.cfg.MaxHang)
		defer t.Stop()
		select {
		case <-r.Context().Done():
			return
		case <-t.C:
		}
	}
	if replayed {
		w.Header().Set("Idempotent-Replayed", "true")
	}
	writeJSON(w, http.StatusCreated, resp)
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}

// ChargesPerOrder counts the charges of each order: more than one is a double charge.
func ChargesPerOrder(charges []Charge) map[string]int {
	m := map[string]int{}
	for _, c := range charges {
		m[c.OrderID]++
	}
	return m
}

// Run serves the API on addr until ctx ends; ready, if set, is called with the
// address once listening. Requests held on purpose (the timeout fault) may outlive
// the 5s shutdown grace; that is not an error of the fake.
func Run(ctx context.Context, addr string, s *Server, ready func(addr string)) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("listen: %w", err)
	}
	if ready != nil {
		ready(ln.Addr().String())
	}
	if err := orders.Serve(ctx, ln, s, 5*time.Second); err != nil && !errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	return nil
}
