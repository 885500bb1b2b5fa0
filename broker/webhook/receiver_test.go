package webhook_test

import (
	"context"
	"encoding/json"
	"io"
	"log"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/pgoutbox/pgoutbox/broker"
	"github.com/pgoutbox/pgoutbox/broker/brokertest"
	"github.com/pgoutbox/pgoutbox/broker/webhook"
)

var (
	secret = []byte("test secret, 32 bytes long......")
	quiet  = slog.New(slog.DiscardHandler)
)

// receiver is a webhook endpoint for tests, as a careful application would write
// one: it checks signatures, refuses a body that is not JSON (400), deduplicates
// on Idempotency-Key and stores what it accepted, in arrival order.
type receiver struct {
	// answer, when set, may answer a request itself (returning true) before the
	// receiver stores it. attempt counts the requests with the request's
	// Idempotency-Key, from 1. Set it before the first request.
	answer func(w http.ResponseWriter, r *http.Request, attempt int) bool

	mu       sync.Mutex
	stored   []brokertest.Stored
	seen     map[string]bool
	attempts map[string]int
	keys     []string // the Idempotency-Key of every verified request, in order
}

func newReceiver() *receiver {
	return &receiver{seen: map[string]bool{}, attempts: map[string]int{}}
}

// handler is the receiver behind signature verification.
func (rc *receiver) handler() http.Handler {
	return (&webhook.Verifier{Secrets: [][]byte{secret}}).Handler(http.HandlerFunc(rc.serve))
}

func (rc *receiver) serve(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(r.Body)
	if err != nil {
		http.Error(w, "cannot read body", http.StatusBadRequest)
		return
	}
	key := r.Header.Get(webhook.HeaderIdempotencyKey)
	rc.mu.Lock()
	rc.attempts[key]++
	attempt := rc.attempts[key]
	rc.keys = append(rc.keys, key)
	rc.mu.Unlock()
	if rc.answer != nil && rc.answer(w, r, attempt) {
		return
	}
	if !json.Valid(body) {
		http.Error(w, "payload is not valid JSON", http.StatusBadRequest)
		return
	}
	rc.mu.Lock()
	defer rc.mu.Unlock()
	// Stored before the answer: a 2xx the publisher reads is always stored.
	if !rc.seen[key] {
		rc.seen[key] = true
		h := map[string]string{}
		for name, values := range r.Header {
			h[name] = values[0]
		}
		rc.stored = append(rc.stored, brokertest.Stored{
			Destination: r.Host + r.URL.EscapedPath(),
			Headers:     h,
			Body:        body,
		})
	}
	w.WriteHeader(http.StatusNoContent)
}

// messages returns what the receiver stored.
func (rc *receiver) messages() []brokertest.Stored {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return append([]brokertest.Stored(nil), rc.stored...)
}

// requestKeys returns the Idempotency-Key of every request that passed the
// signature check.
func (rc *receiver) requestKeys() []string {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return append([]string(nil), rc.keys...)
}

// server is an HTTP server for a handler that can be stopped, dropping every
// connection, and started again on the same address.
type server struct {
	handler http.Handler
	addr    string

	mu  sync.Mutex
	srv *httptest.Server // nil while stopped
}

// serve starts a server for h, closed when the test ends.
func serve(t *testing.T, h http.Handler) *server {
	t.Helper()
	s := &server{handler: h, srv: httptest.NewUnstartedServer(h)}
	s.srv.Config.ErrorLog = log.New(io.Discard, "", 0)
	s.srv.Start()
	s.addr = s.srv.Listener.Addr().String()
	t.Cleanup(s.stop)
	return s
}

// URL returns the server's base URL, which stays the same across restarts.
func (s *server) URL() string { return "http://" + s.addr }

func (s *server) stop() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.srv != nil {
		// Close alone would wait for requests in progress, some of which wait for
		// bodies the tripwire lost: drop every connection first.
		s.srv.CloseClientConnections()
		s.srv.Close()
		s.srv = nil
	}
}

func (s *server) start() error {
	l, err := net.Listen("tcp", s.addr)
	if err != nil {
		return err
	}
	srv := httptest.NewUnstartedServer(s.handler)
	srv.Listener.Close()
	srv.Listener = l
	srv.Config.ErrorLog = log.New(io.Discard, "", 0)
	srv.Start()
	s.mu.Lock()
	defer s.mu.Unlock()
	s.srv = srv
	return nil
}

// newPublisher returns a publisher closed when the test ends, with the test
// secret and a quiet logger unless cfg says otherwise.
func newPublisher(t *testing.T, cfg webhook.Config) *webhook.Publisher {
	t.Helper()
	if cfg.Secret == nil && !cfg.AllowUnsigned {
		cfg.Secret = secret
	}
	if cfg.Logger == nil {
		cfg.Logger = quiet
	}
	p, err := webhook.New(&cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() { _ = p.Close() })
	return p
}

// transport returns an http.Transport that wraps its connections with wrap (if
// set), and closes its idle connections when the test ends.
func transport(t *testing.T, wrap func(net.Conn) net.Conn) *http.Transport {
	d := &net.Dialer{Timeout: 5 * time.Second}
	tr := &http.Transport{
		MaxIdleConnsPerHost: 64,
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			c, err := d.DialContext(ctx, network, addr)
			if err != nil || wrap == nil {
				return c, err
			}
			return wrap(c), nil
		},
	}
	t.Cleanup(tr.CloseIdleConnections)
	return tr
}

func message(aggType, aggID string, seq int64) broker.Message {
	return brokertest.Message(aggType, aggID, seq)
}

func publish(t *testing.T, p broker.Publisher, msgs ...broker.Message) []error {
	t.Helper()
	return brokertest.Publish(t, p, msgs...)
}
