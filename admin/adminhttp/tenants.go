package adminhttp

import (
	"cmp"
	"context"
	"errors"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"golang.org/x/sync/singleflight"

	"github.com/pgoutbox/pgoutbox/admin"
)

// maxTenantsRead bounds the tenants the overview reads to sort them: past it
// the page says how many it did not read.
const maxTenantsRead = 10000

// tenantBoard is the tenants' rows, read for every tenant, sorted worst
// first, and shared by every request (every open tab) for Config.Refresh:
// however many tabs refresh the overview, the tenants are read about once a
// refresh interval, by one request at a time.
type tenantBoard struct {
	mu     sync.Mutex
	key    string // the tenant list the rows were read for
	at     time.Time
	rows   []tenantRow
	flight singleflight.Group
}

// tenantBoard returns the rows of tenants, worst first, from the shared cache
// when it is younger than Config.Refresh.
func (h *Handler) tenantBoard(ctx context.Context, tenants []string) ([]tenantRow, error) {
	key := strings.Join(tenants, "\x00")
	b := &h.board
	b.mu.Lock()
	if b.key == key && time.Since(b.at) < h.cfg.Refresh {
		rows := b.rows
		b.mu.Unlock()
		return rows, nil
	}
	b.mu.Unlock()
	v, err, _ := b.flight.Do(key, func() (any, error) {
		// Shared by the requests waiting on it: none's cancellation ends it.
		// The reads end with their budget (the request's own figures and
		// its rendering need the rest of its time); the context is a
		// backstop.
		budget := tenantsBudget(ctx, h.cfg.QueryTimeout)
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*budget)
		defer cancel()
		rows, err := h.tenantRows(rctx, tenants, budget)
		if err != nil {
			return nil, err
		}
		sortTenants(rows)
		b.mu.Lock()
		b.key, b.at, b.rows = key, time.Now(), rows
		b.mu.Unlock()
		return rows, nil
	})
	if err != nil {
		return nil, err
	}
	return v.([]tenantRow), nil
}

// tenantsBudget is how long the overview reads the tenants: half the page's
// bound (Config.QueryTimeout), and at most three quarters of what is left of
// the request's, at least a second. The tenants not read by then are shown as
// such, worst first, with the rows read: on a loaded database the page
// answers, never an error page for want of time.
func tenantsBudget(ctx context.Context, page time.Duration) time.Duration {
	budget := page / 2
	if dl, ok := ctx.Deadline(); ok {
		budget = min(budget, time.Until(dl)*3/4)
	}
	return max(budget, time.Second)
}

// sortTenants orders the rows by severity: unreadable first, then the most
// dead letters, the most events blocked behind them, the oldest pending
// event, then by name.
func sortTenants(rows []tenantRow) {
	slices.SortStableFunc(rows, func(a, b tenantRow) int {
		if (a.Status == nil) != (b.Status == nil) {
			if a.Status == nil {
				return -1
			}
			return 1
		}
		if a.Status == nil {
			return cmp.Compare(a.Schema, b.Schema)
		}
		return cmp.Or(cmp.Compare(b.Status.Quarantined, a.Status.Quarantined),
			cmp.Compare(b.Status.BlockedBehindDeadLetter, a.Status.BlockedBehindDeadLetter),
			cmp.Compare(b.Status.OldestPendingAge, a.Status.OldestPendingAge),
			cmp.Compare(a.Schema, b.Schema))
	})
}

// findEvent finds the tenant holding the event id (the "id" parameter) and
// redirects to its page there.
func (h *Handler) findEvent(w http.ResponseWriter, r *http.Request) {
	v := &view{Title: "Find an event", Nav: "overview"}
	all, err := h.tenants(r.Context())
	if err == nil && len(all) > maxTenantsRead {
		err = badInput("more than %d tenants: open the event from its tenant's pages", maxTenantsRead)
	}
	if err == nil && len(all) > 0 {
		v.Schema, v.Schemas = all[0], all
	}
	ids, err2 := idsOf(r, "id")
	if err == nil {
		err = err2
	}
	if err == nil && len(ids) != 1 {
		err = badInput("id: give one event id")
	}
	if err != nil {
		h.fail(w, r, v, err)
		return
	}
	found, err := admin.FindEvents(r.Context(), h.pool, all, ids, &admin.TenantsConfig{Trust: h.cfg.Trust})
	switch {
	case err == nil, errors.Is(err, context.DeadlineExceeded), errors.Is(err, context.Canceled):
	case errors.Is(err, admin.ErrNotFound):
		err = &httpError{status: http.StatusNotFound, msg: "no tenant holds event " + ids[0].String()}
	case errors.Is(err, admin.ErrAmbiguousEvent):
		err = &httpError{status: http.StatusConflict, msg: "event " + ids[0].String() + " is in more than one tenant; open it from each tenant's pages"}
	default:
		h.log.Warn("console: find event", slog.Any("error", err))
		err = &httpError{status: http.StatusServiceUnavailable,
			msg: "not every tenant could be read (refused or stuck; the console's log says which): open the event from its tenant's pages"}
	}
	if err != nil {
		h.fail(w, r, v, err)
		return
	}
	http.Redirect(w, r, h.link("/event", found[0].Tenant, "id", ids[0].String()), http.StatusSeeOther)
}
