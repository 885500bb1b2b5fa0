package adminhttp

import (
	"context"
	"net/http"
	"strings"

	"github.com/pgoutbox/pgoutbox/admin"
)

// The versioned JSON API (/api/v1/...): every page's data, under the same
// sign-in and roles, and every action as a POST with the same anti-forgery,
// submit-once and audit rules as the forms (docs/console.md, "JSON API").

// isAPI reports whether r is a request of the JSON API: its errors and
// results are JSON, never pages or redirects.
func isAPI(r *http.Request) bool { return strings.HasPrefix(r.URL.Path, "/api/") }

// done answers a finished action: the result page (303) for a form, the
// recorded outcome for the API. repeated says the form was sent again and
// nothing ran this time.
func (h *Handler) done(w http.ResponseWriter, r *http.Request, o *outcome, repeated bool) {
	if !isAPI(r) {
		http.Redirect(w, r, o.url, http.StatusSeeOther)
		return
	}
	writeJSON(w, apiOutcome{Notice: o.notice, Count: o.count, Result: o.url, Repeated: repeated})
}

// apiOutcome is an action's answer in the API.
type apiOutcome struct {
	Notice string `json:"notice"`
	Count  int    `json:"count"`
	// Result is the console page showing the outcome (for its user).
	Result string `json:"result"`
	// Repeated: the same submit-once token was sent before; nothing ran now.
	Repeated bool `json:"repeated"`
}

func (h *Handler) apiRoutes() {
	get := func(path string, fn func(r *http.Request, a *admin.Admin, schema string) (any, error)) {
		h.mux.HandleFunc("GET /api/v1/"+path, func(w http.ResponseWriter, r *http.Request) {
			schema, _, a, err := h.schemaOf(r)
			var v any
			if err == nil {
				v, err = fn(r, a, schema)
			}
			if err != nil {
				h.fail(w, r, nil, err)
				return
			}
			writeJSON(w, v)
		})
	}
	get("overview", h.apiOverviewV1)
	get("retrying", func(r *http.Request, a *admin.Admin, schema string) (any, error) {
		p, err := pageOf(r)
		if err != nil {
			return nil, err
		}
		evs, err := a.ListRetrying(r.Context(), p)
		return apiPage(evs, p, err, func(e admin.Event) admin.Cursor { return admin.Cursor{At: e.OccurredAt, ID: e.ID} })
	})
	get("dlq", func(r *http.Request, a *admin.Admin, schema string) (any, error) {
		l, err := dlqPage(r, a)
		if err != nil {
			return nil, err
		}
		page, err := apiPage(l.Events, l.Page, err, func(e admin.Event) admin.Cursor { return admin.Cursor{At: *e.QuarantinedAt, ID: e.ID} })
		if err != nil {
			return nil, err
		}
		page.Matching = &l.Matching
		return page, nil
	})
	get("errors", func(r *http.Request, a *admin.Admin, _ string) (any, error) { return a.ErrorGroups(r.Context()) })
	get("lanes", func(r *http.Request, a *admin.Admin, _ string) (any, error) {
		limit, err := limitOf(r)
		if err != nil {
			return nil, err
		}
		lanes, err := a.BlockedLanes(r.Context(), limit)
		return map[string]any{"lanes": orEmpty(lanes)}, err
	})
	get("event", func(r *http.Request, a *admin.Admin, _ string) (any, error) {
		e, err := oneEvent(r, a)
		if err != nil {
			return nil, err
		}
		ds, err := a.EventDestinations(r.Context(), e)
		if err != nil {
			return nil, err
		}
		hs := showHeaders(e.Headers) // masked as on the page, for every user
		e.Headers = nil
		return map[string]any{"event": e, "headers": hs, "destinations": ds}, nil
	})
	get("destinations", func(r *http.Request, a *admin.Admin, _ string) (any, error) {
		ds, err := a.Destinations(r.Context())
		return map[string]any{"destinations": orEmpty(ds)}, err
	})
	get("audit", func(r *http.Request, a *admin.Admin, _ string) (any, error) {
		tr, err := rangeOf(r, true)
		if err != nil {
			return nil, err
		}
		entries, err := auditOf(r, a, tr)
		return map[string]any{"entries": orEmpty(entries)}, err
	})
	h.mux.HandleFunc("GET /api/v1/session", h.apiSession)
	for _, p := range []struct {
		path string
		fn   http.HandlerFunc
	}{{"dlq/retry", h.retry}, {"dlq/skip", h.skip}, {"dlq/retry-matching", h.retryBulk}, {"dlq/skip-matching", h.skipBulk}} {
		h.mux.HandleFunc("POST /api/v1/"+p.path, h.operator(p.fn))
	}
	h.mux.HandleFunc("/api/", func(w http.ResponseWriter, r *http.Request) {
		h.fail(w, r, nil, &httpError{status: http.StatusNotFound, msg: "no such API path (see docs/console.md, \"JSON API\")"})
	})
}

// apiList is one page of events in the API, with the next page's position.
type apiList struct {
	Events   []admin.Event `json:"events"`
	Matching *int          `json:"matching,omitempty"`
	// Next is the next page's after_at and after, null on the last page.
	Next *apiCursor `json:"next"`
}

type apiCursor struct {
	AfterAt string `json:"after_at"`
	After   string `json:"after"`
}

func apiPage(evs []admin.Event, p admin.Page, err error, cursor func(admin.Event) admin.Cursor) (*apiList, error) {
	if err != nil {
		return nil, err
	}
	out := &apiList{Events: orEmpty(evs)}
	if len(evs) > 0 {
		c := cursor(evs[len(evs)-1])
		if next := nextPage(len(evs), p.Limit, c.At, c.ID); next != nil {
			out.Next = &apiCursor{AfterAt: next[1], After: next[3]}
		}
	}
	return out, nil
}

func orEmpty[T any](xs []T) []T {
	if xs == nil {
		return []T{}
	}
	return xs
}

// apiOverviewV1 is the overview's figures: the schema's status and its
// activity over the range (range=1h, 24h or 7d; the last hour by default), and with several tenants their rows, worst first (all of them, up to
// 10000, from the cache the overview pages share).
func (h *Handler) apiOverviewV1(r *http.Request, a *admin.Admin, schema string) (any, error) {
	tr, err := rangeOf(r, false)
	if err != nil {
		return nil, err
	}
	st, err := a.Status(r.Context())
	if err != nil {
		return nil, err
	}
	act, err := h.activityOf(r.Context(), schema, a, tr)
	if err != nil {
		return nil, err
	}
	out := map[string]any{"status": st, "activity": act}
	all, err := h.tenants(r.Context())
	if err != nil || len(all) < 2 {
		return out, err
	}
	rows, err := h.tenantRowsAll(r.Context(), all)
	if err != nil {
		return nil, err
	}
	type tenantJSON struct {
		Schema string        `json:"schema"`
		Status *admin.Status `json:"status"`
		Error  *string       `json:"error"`
	}
	ts := make([]tenantJSON, len(rows))
	for i, row := range rows {
		ts[i] = tenantJSON{Schema: row.Schema, Status: row.Status}
		if row.Status == nil {
			msg := row.Err
			ts[i].Error = &msg
		}
	}
	out["tenants"] = ts
	return out, nil
}

// tenantRowsAll is every tenant's row (up to maxTenantsRead), worst first.
func (h *Handler) tenantRowsAll(ctx context.Context, all []string) ([]tenantRow, error) {
	if len(all) > maxTenantsRead {
		all = all[:maxTenantsRead]
	}
	return h.tenantBoard(ctx, all)
}

// apiSession is the signed-in user, their role, and for an operator the
// tokens an action needs: the anti-forgery token, and a submit-once token
// (each action needs a fresh one: GET this again).
func (h *Handler) apiSession(w http.ResponseWriter, r *http.Request) {
	p := who(r)
	out := map[string]any{"user": p.name, "role": p.role.String()}
	if p.role == RoleOperator {
		out["csrf"], out["once"] = p.csrf, h.acts.issue(p.name)
	}
	writeJSON(w, out)
}
