package brokertest

import (
	"io"
	"maps"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/pgoutbox/pgoutbox/broker"
	"github.com/pgoutbox/pgoutbox/wire"
)

// HookReceiver is a webhook receiver, an http.Handler for httptest.NewServer,
// that keeps every message it accepts in order of acceptance, decoded by
// wire.ParseReceived (either wire format). A message is kept before the answer
// goes out: one the sender saw accepted is in Messages. A body over 1 MiB or
// a request that does not decode is answered 400 Bad Request.
type HookReceiver struct {
	// Down, while true, answers every request 503 Service Unavailable and
	// keeps nothing: a receiver down for maintenance.
	Down atomic.Bool

	mu  sync.Mutex
	got []broker.Message
}

// ServeHTTP implements http.Handler.
func (h *HookReceiver) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if h.Down.Load() {
		http.Error(w, "receiver down for maintenance", http.StatusServiceUnavailable)
		return
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, 1<<20))
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	names := slices.Collect(maps.Keys(r.Header))
	m, err := wire.ParseReceived(body, names, r.Header.Get)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	h.mu.Lock()
	h.got = append(h.got, m)
	h.mu.Unlock()
	w.WriteHeader(http.StatusNoContent)
}

// Messages returns a copy of the messages accepted so far.
func (h *HookReceiver) Messages() []broker.Message {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]broker.Message(nil), h.got...)
}
