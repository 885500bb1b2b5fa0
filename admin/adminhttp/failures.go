package adminhttp

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strconv"
	"time"

	"github.com/pgoutbox/pgoutbox"
	"github.com/pgoutbox/pgoutbox/admin"
)

// The pages of failures before and beyond quarantine: the retrying events,
// the errors grouped by cause, and the actions on everything a filter or a
// group selects.

// pageOf reads a list's position: limit, and after_at with after (the last
// event of the previous page), both or neither.
func pageOf(r *http.Request) (admin.Page, error) {
	limit, err := limitOf(r)
	if err != nil {
		return admin.Page{}, err
	}
	p := admin.Page{Limit: limit}
	at, err := field(r, "after_at", 64)
	if err != nil {
		return p, err
	}
	id, err := field(r, "after", 64)
	if err != nil || (at == "") != (id == "") {
		return p, badInput("after and after_at: give both (the next-page link does) or neither")
	}
	if at == "" {
		return p, nil
	}
	if p.After.At, err = time.Parse(time.RFC3339Nano, at); err != nil {
		return p, badInput("after_at: not an RFC 3339 time")
	}
	if p.After.ID, err = pgoutbox.ParseUUID(id); err != nil {
		return p, badInput("after: not an event id")
	}
	return p, nil
}

// filterPageOf reads a dead-letter list's filter and position.
func filterPageOf(r *http.Request) (admin.Filter, admin.Page, error) {
	f, err := filterOf(r)
	if err != nil {
		return f, admin.Page{}, err
	}
	p, err := pageOf(r)
	return f, p, err
}

// nextPage returns the parameters of the page after the one ending with last
// (at is its ordering time), or nil when the page was not full.
func nextPage(n, limit int, at time.Time, last pgoutbox.UUID) []string {
	if n < limit {
		return nil
	}
	return []string{"after_at", at.UTC().Format(time.RFC3339Nano), "after", last.String(), "limit", strconv.Itoa(limit)}
}

// filterParams are f's criteria as link parameters: kept across pages and
// after an action.
func filterParams(f admin.Filter) []string {
	return []string{"aggregate_type", f.AggregateType, "aggregate_id", f.AggregateID, "event_type", f.EventType, "error", f.ErrorContains}
}

// ---- retrying ----

type retryingBody struct {
	Events []eventRow
	Limit  int
	Next   string
	First  string
}

func (h *Handler) retrying(w http.ResponseWriter, r *http.Request) {
	v := &view{Title: "Retrying", Nav: "retrying"}
	h.page(w, r, "retrying", v, func(a *admin.Admin) (any, error) {
		b, err := h.retryingData(r, v.Schema, a)
		if err == nil {
			v.Live = h.link("/retrying", v.Schema, append(pageParams(r), "partial", "1")...)
		}
		return b, err
	})
}

// pageParams are the request's own paging parameters, for its live link.
func pageParams(r *http.Request) []string {
	q := r.URL.Query()
	return []string{"after_at", q.Get("after_at"), "after", q.Get("after"), "limit", q.Get("limit")}
}

func (h *Handler) retryingData(r *http.Request, schema string, a *admin.Admin) (*retryingBody, error) {
	p, err := pageOf(r)
	if err != nil {
		return nil, err
	}
	evs, err := a.ListRetrying(r.Context(), p)
	if err != nil {
		return nil, err
	}
	b := &retryingBody{Limit: p.Limit, Events: []eventRow{}}
	for _, e := range evs {
		b.Events = append(b.Events, eventRow{Event: e, Link: h.link("/event", schema, "id", e.ID.String())})
	}
	if len(evs) > 0 {
		if next := nextPage(len(evs), p.Limit, evs[len(evs)-1].OccurredAt, evs[len(evs)-1].ID); next != nil {
			b.Next = h.link("/retrying", schema, next...)
		}
	}
	if !p.After.IsZero() {
		b.First = h.link("/retrying", schema, "limit", strconv.Itoa(p.Limit))
	}
	return b, nil
}

// ---- errors by cause ----

type errorsBody struct {
	*admin.ErrorGroups
	Rows []groupRow
}

type groupRow struct {
	admin.ErrorGroup
	ExampleLink string
}

func (h *Handler) errorGroups(w http.ResponseWriter, r *http.Request) {
	v := &view{Title: "Errors by cause", Nav: "errors"}
	h.page(w, r, "errors", v, func(a *admin.Admin) (any, error) {
		gs, err := a.ErrorGroups(r.Context())
		if err != nil {
			return nil, err
		}
		b := &errorsBody{ErrorGroups: gs}
		for _, g := range gs.Groups {
			b.Rows = append(b.Rows, groupRow{ErrorGroup: g, ExampleLink: h.link("/event", v.Schema, "id", g.Example.String())})
		}
		v.Notice = h.notice(r)
		return b, nil
	})
}

// ---- actions on everything a filter or a group selects ----

// bulkOf reads a bulk action's form: the filter, the group (an opaque id:
// the signature's text never comes from the form), the previewed count and
// the reason.
func bulkOf(r *http.Request) (admin.BulkRequest, error) {
	var req admin.BulkRequest
	var err error
	if req.Filter, err = filterOf(r); err != nil {
		return req, err
	}
	if req.Group, err = field(r, "group", 32); err != nil {
		return req, err
	}
	if _, err := strconv.ParseUint(req.Group, 16, 64); req.Group != "" && (err != nil || len(req.Group) != 16) {
		return req, badInput("group: not a group id")
	}
	s, err := field(r, "expect", 10)
	if err != nil {
		return req, err
	}
	if req.Expect, err = strconv.Atoi(s); err != nil || req.Expect < 1 || req.Expect > admin.MaxBulk {
		return req, badInput("expect: the previewed count, 1..%d", admin.MaxBulk)
	}
	req.Reason, err = reasonOf(r, "bulk action")
	return req, err
}

func (h *Handler) retryBulk(w http.ResponseWriter, r *http.Request) {
	h.bulkAction(w, r, "retry", "Retried %d event(s) in one action: the relays take them at once; the retry is in the audit.",
		func(ctx context.Context, a *admin.Admin, req admin.BulkRequest) (int, error) {
			done, err := a.RetryBulk(ctx, req)
			return len(done), err
		})
}

func (h *Handler) skipBulk(w http.ResponseWriter, r *http.Request) {
	h.bulkAction(w, r, "skip", "Skipped %d event(s) in one action: their lanes move on; the skip is in the audit.",
		func(ctx context.Context, a *admin.Admin, req admin.BulkRequest) (int, error) {
			done, err := a.SkipBulk(ctx, req)
			return len(done), err
		})
}

// bulkAction runs a retry or skip of everything a filter or a group selects,
// once, if the selection still holds the previewed count (else nothing is
// done and the form may be sent again after a reload); the result page is the
// group list or the filtered dead letters, filter kept.
func (h *Handler) bulkAction(w http.ResponseWriter, r *http.Request, verb, done string,
	act func(ctx context.Context, a *admin.Admin, req admin.BulkRequest) (int, error)) {
	schema, all, a, err := h.schemaOf(r)
	v := &view{Title: "Bulk " + verb, Nav: "dlq", Schema: schema, Schemas: all}
	var req admin.BulkRequest
	if err == nil {
		req, err = bulkOf(r)
	}
	if err != nil {
		h.fail(w, r, v, err)
		return
	}
	h.runCounted(w, r, v, countedAction{
		run: func(ctx context.Context, actor string) (int, error) {
			req.Actor = actor
			return act(ctx, a, req)
		},
		log: "console: bulk " + verb, attr: slog.String("group", req.Group),
		notice: func(n int) string { return fmt.Sprintf(done, n) },
		back: func(result string) string {
			if req.Group != "" {
				return h.link("/errors", schema, "result", result)
			}
			return h.link("/dlq", schema, append(filterParams(req.Filter), "result", result)...)
		},
	})
}

// bulkStatus maps the bulk actions' own errors to answers.
func bulkStatus(err error) (int, string, bool) {
	switch {
	case errors.Is(err, admin.ErrCountChanged):
		return http.StatusConflict, err.Error() + "; reload the page to preview again", true
	case errors.Is(err, admin.ErrTooMany):
		return http.StatusBadRequest, err.Error(), true
	}
	return 0, "", false
}
