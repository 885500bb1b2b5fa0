package adminhttp

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/pgoutbox/pgoutbox"
	"github.com/pgoutbox/pgoutbox/admin"
	"github.com/pgoutbox/pgoutbox/migrate"
)

// Bounds of what a request may ask for.
const (
	maxField     = 1024 // a filter value
	defaultLimit = 100
	maxLimit     = 1000
	maxIDs       = 1000
)

// field returns the request's value of name, checked: valid UTF-8, no NUL or
// control characters but tab and newlines, at most max bytes.
func field(r *http.Request, name string, max int) (string, error) {
	v := r.FormValue(name)
	if len(v) > max {
		return "", badInput("%s: at most %d bytes, got %d", name, max, len(v))
	}
	if !utf8.ValidString(v) || strings.ContainsFunc(v, func(c rune) bool { return c < ' ' && c != '\t' && c != '\n' && c != '\r' || c == 0x7f }) {
		return "", badInput("%s: must be text without control characters", name)
	}
	return strings.TrimSpace(v), nil
}

func limitOf(r *http.Request) (int, error) {
	s, err := field(r, "limit", 10)
	if err != nil || s == "" {
		return defaultLimit, err
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 1 || n > maxLimit {
		return 0, badInput("limit: a number in 1..%d", maxLimit)
	}
	return n, nil
}

// idsOf reads event ids from the repeated parameter name, each possibly a list
// separated by commas or white space.
func idsOf(r *http.Request, name string) ([]pgoutbox.UUID, error) {
	if err := r.ParseForm(); err != nil {
		return nil, badInput("unreadable form")
	}
	var out []pgoutbox.UUID
	for _, v := range r.Form[name] {
		if len(v) > maxIDs*40 {
			return nil, badInput("%s: at most %d ids", name, maxIDs)
		}
		for s := range strings.FieldsFuncSeq(v, func(c rune) bool { return c == ',' || c == ' ' || c == '\n' || c == '\r' || c == '\t' }) {
			id, err := pgoutbox.ParseUUID(s)
			if err != nil {
				return nil, badInput("%s: %q is not an event id", name, truncate(s, 40))
			}
			if !slices.Contains(out, id) {
				out = append(out, id)
			}
			if len(out) > maxIDs {
				return nil, badInput("%s: at most %d ids", name, maxIDs)
			}
		}
	}
	return out, nil
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n] + "…"
}

// ---- overview ----

type tenantRow struct {
	Schema string
	Status *admin.Status
	Err    string
	Link   string
}

// tenantRows reads the status of the tenants, a few at a time, each within
// the per-tenant timeout of admin.TenantsConfig, all within budget: the
// tenants not read by then come back as rows saying so.
func (h *Handler) tenantRows(ctx context.Context, shown []string, budget time.Duration) ([]tenantRow, error) {
	sts, err := admin.StatusOf(ctx, h.pool, shown, &admin.TenantsConfig{Trust: h.cfg.Trust, Budget: budget})
	if err != nil {
		return nil, err
	}
	rows := make([]tenantRow, 0, len(sts))
	late := 0
	for _, st := range sts {
		row := tenantRow{Schema: st.Tenant, Status: st.Status, Link: h.link("/", st.Tenant)}
		if errors.Is(st.Err, admin.ErrNotReadInTime) {
			row.Err = "not read in time (the database is slow): read again at the next refresh"
			late++
		} else if st.Err != nil {
			row.Err = "could not read its status (see the console's log)"
			if errors.Is(st.Err, migrate.ErrUntrusted) {
				_, row.Err = errStatus(st.Err) // refused, with the reason
			}
			h.log.Warn("console: tenant status", slog.String("schema", st.Tenant), slog.Any("error", st.Err))
		}
		rows = append(rows, row)
	}
	if late > 0 {
		h.log.Warn("console: tenants not read in time", slog.Int("tenants", late), slog.Int("of", len(sts)),
			slog.Duration("budget", budget))
	}
	return rows, nil
}

type overviewBody struct {
	Status      *admin.Status
	Activity    *admin.Activity
	Published   any
	Failures    any
	Tenants     []tenantRow
	NotShown    int
	NotRead     int
	MultiTenant bool
	// Range is the span of the charts and the per-type publishes.
	Range *timeRange
}

func (h *Handler) overviewData(ctx context.Context, schema string, all []string, a *admin.Admin, tr *timeRange) (*overviewBody, error) {
	st, err := a.Status(ctx)
	if err != nil {
		return nil, err
	}
	act, err := h.activityOf(ctx, schema, a, tr)
	if err != nil {
		return nil, err
	}
	b := &overviewBody{Status: st, Activity: act, MultiTenant: len(all) > 1, Range: tr}
	at := make([]time.Time, len(act.Minutes))
	pub := make([]float64, len(act.Minutes))
	quar := make([]float64, len(act.Minutes))
	secs := tr.Bucket.Seconds()
	for i, m := range act.Minutes {
		at[i], pub[i], quar[i] = m.At, float64(m.Published)/secs, float64(m.Quarantined)/secs
	}
	layout := "15:04"
	if tr.Window > time.Hour {
		layout = "Jan 2 15:04"
	}
	b.Published = chart(fmt.Sprintf("Published per second (%s average), %s", tr.Per, tr.Label), "/s", layout, at, pub)
	b.Failures = chart(fmt.Sprintf("Quarantined per second (%s average), %s", tr.Per, tr.Label), "/s", layout, at, quar)
	if len(all) > 1 {
		b.NotRead = max(0, len(all)-maxTenantsRead)
		rows, err := h.tenantRowsAll(ctx, all)
		if err != nil {
			return nil, err
		}
		// Cut after sorting: the worst are shown, whatever their names.
		b.Tenants = rows
		if len(rows) > h.cfg.MaxTenants {
			b.Tenants, b.NotShown = rows[:h.cfg.MaxTenants], len(rows)-h.cfg.MaxTenants
		}
	}
	return b, nil
}

// page answers one console page for the schema the request chose: the body
// that body builds (it may set more of v), or the error page when choosing the
// schema or building the body fails.
func (h *Handler) page(w http.ResponseWriter, r *http.Request, name string, v *view, body func(a *admin.Admin) (any, error)) {
	var a *admin.Admin
	var err error
	v.Schema, v.Schemas, a, err = h.schemaOf(r)
	if err == nil {
		v.Body, err = body(a)
	}
	if err == nil && v.Now.IsZero() {
		// The page's times are written relative to the database's clock,
		// which wrote them, not the console's.
		v.Now, err = a.Now(r.Context())
	}
	if err != nil {
		h.fail(w, r, v, err)
		return
	}
	h.render(w, r, name, http.StatusOK, v)
}

func (h *Handler) overview(w http.ResponseWriter, r *http.Request) {
	v := &view{Title: "Overview", Nav: "overview"}
	h.page(w, r, "overview", v, func(a *admin.Admin) (any, error) {
		tr, err := rangeOf(r, false)
		if err != nil {
			return nil, err
		}
		v.Live = h.link("/", v.Schema, "partial", "1", "range", tr.Param)
		v.Ranges = h.rangeLinks("/", v.Schema, tr, false)
		b, err := h.overviewData(r.Context(), v.Schema, v.Schemas, a, tr)
		if err == nil {
			v.Now = b.Status.At
		}
		return b, err
	})
}

// apiOverview is the overview's figures as JSON, for scripts and dashboards.
func (h *Handler) apiOverview(w http.ResponseWriter, r *http.Request) {
	schema, _, a, err := h.schemaOf(r)
	var tr *timeRange
	if err == nil {
		tr, err = rangeOf(r, false)
	}
	if err == nil {
		var st *admin.Status
		var act *admin.Activity
		if st, err = a.Status(r.Context()); err == nil {
			if act, err = h.activityOf(r.Context(), schema, a, tr); err == nil {
				writeJSON(w, map[string]any{"status": st, "activity": act})
				return
			}
		}
	}
	status, msg := errStatus(err)
	if status >= 500 {
		h.log.Error("console: api", slog.Any("error", err))
	}
	w.WriteHeader(status)
	writeJSON(w, map[string]string{"error": msg})
}

// ---- lanes ----

type lanesBody struct {
	Lanes []laneRow
	Limit int
}

type laneRow struct {
	admin.BlockedLane
	Link string
}

func (h *Handler) lanes(w http.ResponseWriter, r *http.Request) {
	v := &view{Title: "Blocked lanes", Nav: "lanes"}
	h.page(w, r, "lanes", v, func(a *admin.Admin) (any, error) {
		limit, err := limitOf(r)
		if err != nil {
			return nil, err
		}
		v.Live = h.link("/lanes", v.Schema, "partial", "1", "limit", strconv.Itoa(limit))
		lanes, err := a.BlockedLanes(r.Context(), limit)
		if err != nil {
			return nil, err
		}
		b := &lanesBody{Limit: limit}
		for _, l := range lanes {
			b.Lanes = append(b.Lanes, laneRow{BlockedLane: l, Link: h.link("/event", v.Schema, "id", l.Head.ID.String())})
		}
		return b, nil
	})
}

// ---- dead letters ----

type dlqBody struct {
	Filter admin.Filter
	Events []eventRow
	// Matching counts every dead letter the filter selects: the preview of
	// the actions on all of them.
	Matching int
	Next     string
	First    string
	// Destination names the destination whose dead letters these are ("":
	// the outbox's own).
	Destination string
}

type eventRow struct {
	admin.Event
	Link string
	// Behind is, in a lane, the sequence of the dead letter this event
	// waits behind (0: none).
	Behind int64
}

func filterOf(r *http.Request) (admin.Filter, error) {
	var f admin.Filter
	var err error
	for _, p := range []struct {
		name string
		dst  *string
	}{{"aggregate_type", &f.AggregateType}, {"aggregate_id", &f.AggregateID}, {"event_type", &f.EventType}, {"error", &f.ErrorContains}} {
		if *p.dst, err = field(r, p.name, maxField); err != nil {
			return f, err
		}
	}
	f.Limit, err = limitOf(r)
	return f, err
}

// dlqList is the dead-letter list a request asks for (its filter, page and
// destination) and what was read of it.
type dlqList struct {
	Filter admin.Filter
	Page   admin.Page
	// Destination is the destination whose dead letters these are ("": the
	// outbox's own).
	Destination string
	// Matching is how many dead letters Filter selects in all.
	Matching int
	Events   []admin.Event
}

// dlqPage reads the dead-letter list r asks for: one page of dead letters,
// the outbox's or its destination's, and how many the filter selects in all.
// The page is read even when there are too many to count (ErrTooMany, with
// Matching 0).
func dlqPage(r *http.Request, a *admin.Admin) (dlqList, error) {
	var l dlqList
	var err error
	if l.Filter, l.Page, err = filterPageOf(r); err != nil {
		return l, err
	}
	if l.Destination, err = destinationOf(r); err != nil {
		return l, err
	}
	f, p, dest := l.Filter, l.Page, l.Destination
	count := func() (int, error) { return a.CountBulk(r.Context(), f, "") }
	list := func() ([]admin.Event, error) { return a.ListQuarantinedPage(r.Context(), f, p) }
	if dest != "" {
		count = func() (int, error) { return a.CountDestinationQuarantined(r.Context(), dest, f) }
		list = func() ([]admin.Event, error) { return a.ListDestinationQuarantinedPage(r.Context(), dest, f, p) }
	}
	if l.Events, err = list(); err != nil {
		return l, err
	}
	l.Matching, err = count()
	return l, err
}

func (h *Handler) dlq(w http.ResponseWriter, r *http.Request) {
	v := &view{Title: "Dead letters", Nav: "dlq"}
	h.page(w, r, "dlq", v, func(a *admin.Admin) (any, error) {
		l, err := dlqPage(r, a)
		if err != nil && !errors.Is(err, admin.ErrTooMany) {
			return nil, err
		}
		f, p, dest, evs := l.Filter, l.Page, l.Destination, l.Events
		b := &dlqBody{Filter: f, Matching: l.Matching, Destination: dest}
		params := filterParams(f)
		if dest != "" {
			v.Title = "Dead letters of destination " + dest
			params = append(params, "destination", dest)
		}
		for _, e := range evs {
			b.Events = append(b.Events, eventRow{Event: e, Link: h.link("/event", v.Schema, "id", e.ID.String())})
		}
		if len(evs) > 0 && evs[len(evs)-1].QuarantinedAt != nil {
			if next := nextPage(len(evs), p.Limit, *evs[len(evs)-1].QuarantinedAt, evs[len(evs)-1].ID); next != nil {
				b.Next = h.link("/dlq", v.Schema, append(params, next...)...)
			}
		}
		if !p.After.IsZero() {
			b.First = h.link("/dlq", v.Schema, append(params, "limit", strconv.Itoa(p.Limit))...)
		}
		v.Notice = h.notice(r)
		return b, nil
	})
}

// notice is the notice of the action whose result page r is: the server's
// record of what it did, found by the opaque id the redirect carried, and only
// for the user who ran it. A link can show nothing else.
func (h *Handler) notice(r *http.Request) string {
	if o := h.acts.outcome(r.URL.Query().Get("result"), who(r).name); o != nil {
		return o.notice
	}
	return ""
}

type eventBody struct {
	Event *admin.Event
	// Destinations is the event's state at each destination (none: the
	// outbox has no destinations).
	Destinations []eventDestination
	Payload      string
	PayloadCut   int
	Headers      []header
	Lane         []eventRow
	LaneLink     string
}

func (h *Handler) event(w http.ResponseWriter, r *http.Request) {
	v := &view{Title: "Event", Nav: "dlq"}
	h.page(w, r, "event", v, func(a *admin.Admin) (any, error) {
		e, err := oneEvent(r, a)
		if err != nil {
			return nil, err
		}
		b := &eventBody{Event: e, Headers: showHeaders(e.Headers)}
		b.Payload, b.PayloadCut = showPayload(e.Payload)
		ds, err := a.EventDestinations(r.Context(), e)
		if err != nil {
			return nil, err
		}
		for _, d := range ds {
			b.Destinations = append(b.Destinations, eventDestination{EventDestination: d,
				DLQLink: h.link("/dlq", v.Schema, "destination", d.Destination)})
		}
		if e.State != admin.StatePublished && e.State != admin.StateSkipped {
			lane, err := a.Lane(r.Context(), e.AggregateType, e.AggregateID, 50)
			if err != nil {
				return nil, err
			}
			var head int64 // the lane's first dead letter: every later event waits behind it
			for _, l := range lane {
				row := eventRow{Event: l, Link: h.link("/event", v.Schema, "id", l.ID.String()), Behind: head}
				if head == 0 && l.State == admin.StateQuarantined {
					head = l.AggregateSequence
				}
				b.Lane = append(b.Lane, row)
			}
		}
		v.Title, v.Notice = "Event "+e.ID.String(), h.notice(r)
		return b, nil
	})
}

// oneEvent reads the event the request's one "id" names.
func oneEvent(r *http.Request, a *admin.Admin) (*admin.Event, error) {
	ids, err := idsOf(r, "id")
	if err == nil && len(ids) != 1 {
		err = badInput("id: give one event id")
	}
	if err != nil {
		return nil, err
	}
	return a.Get(r.Context(), ids[0])
}

// back returns the result page of an action on ids: the event page for one
// event, else the dead-letter list (of the destination, if any) with the
// filter it was sent from, with the outcome's id.
func (h *Handler) back(schema, dest string, ids []pgoutbox.UUID, f admin.Filter) func(string) string {
	return func(result string) string {
		if len(ids) == 1 {
			return h.link("/event", schema, "id", ids[0].String(), "result", result)
		}
		return h.link("/dlq", schema, append(filterParams(f), "destination", dest, "result", result)...)
	}
}

func (h *Handler) retry(w http.ResponseWriter, r *http.Request) {
	h.deadLetterAction(w, r, "Retry", "retry", "Retried %d event(s): the relays take them at once; the retry is in the audit.",
		func(ctx context.Context, a *admin.Admin, dest string, ids []pgoutbox.UUID, reason, actor string) (int, error) {
			if dest != "" {
				done, err := a.RetryDestination(ctx, admin.DestinationRetryRequest{Destination: dest, IDs: ids, Reason: reason, Actor: actor})
				return len(done), err
			}
			done, err := a.RetryEvents(ctx, admin.RetryRequest{IDs: ids, Reason: reason, Actor: actor})
			return len(done), err
		})
}

func (h *Handler) skip(w http.ResponseWriter, r *http.Request) {
	h.deadLetterAction(w, r, "Skip", "skip", "Skipped %d event(s): their lanes move on; the skip is in the audit.",
		func(ctx context.Context, a *admin.Admin, dest string, ids []pgoutbox.UUID, reason, actor string) (int, error) {
			if dest != "" {
				done, err := a.SkipDestination(ctx, admin.DestinationSkipRequest{Destination: dest, IDs: ids, Reason: reason, Actor: actor})
				return len(done), err
			}
			done, err := a.Skip(ctx, admin.SkipRequest{IDs: ids, Reason: reason, Actor: actor})
			return len(done), err
		})
}

// reasonOf reads the reason every action needs: it is recorded in the audit.
func reasonOf(r *http.Request, verb string) (string, error) {
	reason, err := field(r, "reason", admin.MaxAuditText)
	if err == nil && reason == "" {
		err = badInput("a %s needs a reason: it is recorded in the audit", verb)
	}
	return reason, err
}

// deadLetterAction reads the form of a retry or a skip (the events' ids, a
// reason, and the destination whose dead letters they are, if any), runs act
// once as the signed-in user, and redirects to the result page, whose notice
// (done, with the count) comes from the record of the run.
func (h *Handler) deadLetterAction(w http.ResponseWriter, r *http.Request, title, verb, done string,
	act func(ctx context.Context, a *admin.Admin, dest string, ids []pgoutbox.UUID, reason, actor string) (int, error)) {
	schema, all, a, err := h.schemaOf(r)
	v := &view{Title: title, Nav: "dlq", Schema: schema, Schemas: all}
	var ids []pgoutbox.UUID
	var reason, dest string
	if err == nil {
		dest, err = destinationOf(r)
	}
	if err == nil {
		ids, err = idsOf(r, "id")
	}
	if err == nil {
		reason, err = reasonOf(r, verb)
	}
	if err == nil && len(ids) == 0 {
		err = badInput("choose the events to %s", verb)
	}
	var f admin.Filter
	if err == nil {
		f, err = filterOf(r) // the list's filter, kept on the result page
	}
	if err != nil {
		h.fail(w, r, v, err)
		return
	}
	h.runCounted(w, r, v, countedAction{
		run: func(ctx context.Context, actor string) (int, error) {
			return act(ctx, a, dest, ids, reason, actor)
		},
		log: "console: " + verb + " dead letters", attr: slog.String("destination", dest),
		notice: func(n int) string {
			notice := fmt.Sprintf(done, n)
			if dest != "" {
				notice = fmt.Sprintf("Destination %s: %s", dest, notice)
			}
			return notice
		},
		back: h.back(schema, dest, ids, f),
	})
}

// countedAction is an action on events whose form was read: what
// Handler.runCounted runs once.
type countedAction struct {
	// run changes the events as actor, in one transaction, and returns how
	// many it changed; after an error it changed nothing.
	run func(ctx context.Context, actor string) (int, error)
	// log is the message logged after the run, with the actor, the schema,
	// attr and the count.
	log  string
	attr slog.Attr
	// notice is the result page's notice for a run that changed n events.
	notice func(n int) string
	// back is the result page of the run whose record is result.
	back func(result string) string
}

// runCounted runs c once as the signed-in user (Handler.once) and answers
// with its result page. A failed run changed nothing: its token is given back,
// so the form may be confirmed again.
func (h *Handler) runCounted(w http.ResponseWriter, r *http.Request, v *view, c countedAction) {
	p, tok, ok := h.once(w, r, v)
	if !ok {
		return
	}
	n, err := c.run(r.Context(), p.actor)
	if err != nil {
		h.acts.abort(tok)
		h.fail(w, r, v, err)
		return
	}
	h.log.Info(c.log, slog.String("actor", p.actor), slog.String("schema", v.Schema), c.attr, slog.Int("events", n))
	o := &outcome{user: p.name, notice: c.notice(n), count: n}
	h.acts.finish(tok, o, c.back)
	h.done(w, r, o, false)
}

// once begins the one run of the action whose form r carries: the signed-in
// user and the form's one-shot token. false means it has answered already: a
// form submitted a second time gets the first submission's result page, a
// token that cannot run gets why.
func (h *Handler) once(w http.ResponseWriter, r *http.Request, v *view) (*principal, string, bool) {
	p := who(r)
	tok := r.PostForm.Get("once")
	prev, err := h.acts.begin(tok, p.name)
	switch {
	case err != nil:
		h.fail(w, r, v, err)
	case prev != nil:
		h.log.Info("console: a form submitted again; its action ran once", slog.String("user", p.name), slog.String("path", r.URL.Path))
		h.done(w, r, prev, true)
	default:
		return p, tok, true
	}
	return nil, "", false
}

// ---- replay ----

type replayBody struct {
	Form        map[string]string
	Preview     *admin.ReplayResult
	Result      *admin.ReplayResult
	Failed      string
	CanPublish  bool
	Destination string
}

// replayRequest reads a replay's selection; an empty one needs all=1, as the
// CLI's --all.
func replayRequest(r *http.Request) (admin.ReplayFilter, map[string]string, error) {
	form := map[string]string{}
	for _, n := range []string{"aggregate_type", "aggregate_id", "event_type", "since", "until", "all"} {
		v, err := field(r, n, maxField)
		if err != nil {
			return admin.ReplayFilter{}, form, err
		}
		form[n] = v
	}
	f := admin.ReplayFilter{AggregateType: form["aggregate_type"], AggregateID: form["aggregate_id"], EventType: form["event_type"]}
	var err error
	if f.Since, err = parseWhen(form["since"]); err != nil {
		return f, form, badInput("since: %v", err)
	}
	if f.Until, err = parseWhen(form["until"]); err != nil {
		return f, form, badInput("until: %v", err)
	}
	if !f.Since.IsZero() && !f.Until.IsZero() && !f.Until.After(f.Since) {
		return f, form, badInput("until must be after since")
	}
	// The run form carries the preview's times as instants: "24h ago" must
	// select at run time what the preview counted.
	for k, at := range map[string]time.Time{"since": f.Since, "until": f.Until} {
		if !at.IsZero() {
			form[k] = at.UTC().Format(time.RFC3339Nano)
		}
	}
	if f.EventIDs, err = idsOf(r, "event_ids"); err != nil {
		return f, form, err
	}
	ids := make([]string, len(f.EventIDs))
	for i, id := range f.EventIDs {
		ids[i] = id.String()
	}
	form["event_ids"] = strings.Join(ids, "\n")
	selected := f.AggregateType != "" || f.AggregateID != "" || f.EventType != "" || !f.Since.IsZero() || !f.Until.IsZero() || len(f.EventIDs) > 0
	switch {
	case !selected && form["all"] != "1":
		return f, form, errNoSelection
	case selected && form["all"] == "1":
		return f, form, badInput("give a selection or \"every published event\", not both")
	}
	return f, form, nil
}

var errNoSelection = badInput("say which events: an aggregate type, id, event type, time range or event ids, or tick \"every published event\"")

// parseWhen reads RFC 3339, a date, an HTML datetime-local value (UTC) or a
// duration ago ("24h").
func parseWhen(s string) (time.Time, error) {
	if s == "" {
		return time.Time{}, nil
	}
	for _, layout := range []string{time.RFC3339Nano, "2006-01-02T15:04", "2006-01-02T15:04:05", time.DateOnly} {
		if t, err := time.Parse(layout, s); err == nil {
			return t, nil
		}
	}
	if d, err := time.ParseDuration(s); err == nil && d > 0 {
		return time.Now().Add(-d), nil
	}
	return time.Time{}, fmt.Errorf("%q is not a time (2024-05-01T12:00:00Z, 2024-05-01) or a duration ago (24h)", truncate(s, 40))
}

func (h *Handler) replayPage(w http.ResponseWriter, r *http.Request) {
	schema, all, _, err := h.schemaOf(r)
	v := &view{Title: "Replay", Nav: "replay", Schema: schema, Schemas: all}
	if err != nil {
		h.fail(w, r, v, err)
		return
	}
	b := &replayBody{Form: map[string]string{}, CanPublish: h.cfg.Publisher != nil, Destination: h.cfg.Destination}
	v.Body = b
	if o := h.acts.outcome(r.URL.Query().Get("result"), who(r).name); o != nil && o.replay != nil {
		// The result page of a replay: what the run recorded, nothing run again.
		b.Form, b.Result, b.Failed, v.Notice = o.replay.form, &o.replay.result, o.replay.failed, o.notice
		h.render(w, r, "replay", http.StatusOK, v)
		return
	}
	if r.URL.Query().Get("preview") != "1" {
		h.render(w, r, "replay", http.StatusOK, v)
		return
	}
	f, form, err := replayRequest(r)
	b.Form = form
	if err != nil {
		_, b.Failed = errStatus(err)
		h.render(w, r, "replay", http.StatusBadRequest, v)
		return
	}
	res, err := admin.Replay(r.Context(), h.pool, nil, admin.ReplayRequest{Schema: schema, Filter: f, DryRun: true})
	if err != nil {
		h.fail(w, r, v, err)
		return
	}
	b.Preview = &res
	h.render(w, r, "replay", http.StatusOK, v)
}

func (h *Handler) replayRun(w http.ResponseWriter, r *http.Request) {
	schema, all, _, err := h.schemaOf(r)
	v := &view{Title: "Replay", Nav: "replay", Schema: schema, Schemas: all}
	if err != nil {
		h.fail(w, r, v, err)
		return
	}
	if h.cfg.Publisher == nil {
		h.fail(w, r, v, &httpError{status: http.StatusConflict,
			msg: "this console has no broker to replay to: it previews only (start it with --broker to replay)"})
		return
	}
	f, form, err := replayRequest(r)
	b := &replayBody{Form: form, CanPublish: true, Destination: h.cfg.Destination}
	v.Body = b
	if err != nil {
		_, b.Failed = errStatus(err)
		h.render(w, r, "replay", http.StatusBadRequest, v)
		return
	}
	reason, err := reasonOf(r, "replay")
	if err != nil {
		_, b.Failed = errStatus(err)
		h.render(w, r, "replay", http.StatusBadRequest, v)
		return
	}
	p, tok, ok := h.once(w, r, v)
	if !ok {
		return
	}
	// The replay runs while the page waits; closing it cancels the replay,
	// whose outcome the audit records either way.
	ctx, cancel := context.WithTimeout(r.Context(), h.cfg.ReplayTimeout)
	defer cancel()
	res, err := admin.Replay(ctx, h.pool, h.cfg.Publisher, admin.ReplayRequest{Schema: schema, Filter: f,
		Reason: reason, Actor: p.actor, Destination: h.cfg.Destination})
	h.log.Info("console: replay", slog.String("actor", p.actor), slog.String("schema", schema),
		slog.Int64("published", res.Published), slog.Int64("selected", res.Total), slog.Any("error", err))
	o := &outcome{user: p.name, replay: &replayOutcome{form: form, result: res}}
	switch {
	case err == nil:
		o.notice = fmt.Sprintf("Replayed: %d of %d selected events published; the replay is in the audit.", res.Published, res.Total)
	case errors.As(err, new(*admin.ReplayError)):
		o.replay.failed = fmt.Sprintf("the replay stopped after publishing %d of %d events (the audit has the broker's answer)", res.Published, res.Total)
	default:
		// Whatever stopped it, it ran: a resubmission shows this, and a new
		// replay needs a new form.
		_, msg := errStatus(err)
		o.replay.failed = fmt.Sprintf("the replay stopped after publishing %d of %d events: %s", res.Published, res.Total, msg)
	}
	http.Redirect(w, r, h.acts.finish(tok, o, func(id string) string { return h.link("/replay", schema, "result", id) }), http.StatusSeeOther)
}

// ---- relays, audit ----

type relaysBody struct {
	Status   *admin.Status
	Activity *admin.Activity
	Slots    []admin.ReplicationSlot
	// Running and Busy count the relays alive, and those of them at work:
	// "no relay running" and "relays idle" must not look alike.
	Running, Busy int
	// Range is the span of Activity's relays (those that published).
	Range *timeRange
}

func (h *Handler) relays(w http.ResponseWriter, r *http.Request) {
	v := &view{Title: "Relays and CDC", Nav: "relays"}
	h.page(w, r, "relays", v, func(a *admin.Admin) (any, error) {
		tr, err := rangeOf(r, false)
		if err != nil {
			return nil, err
		}
		v.Live = h.link("/relays", v.Schema, "partial", "1", "range", tr.Param)
		v.Ranges = h.rangeLinks("/relays", v.Schema, tr, false)
		b := &relaysBody{Range: tr}
		if b.Status, err = a.Status(r.Context()); err == nil {
			v.Now = b.Status.At
			for _, rh := range b.Status.Relays {
				if rh.Running() {
					b.Running++
					if rh.State == "busy" {
						b.Busy++
					}
				}
			}
			if b.Activity, err = h.activityOf(r.Context(), v.Schema, a, tr); err == nil {
				b.Slots, err = a.ReplicationSlots(r.Context())
			}
		}
		return b, err
	})
}

// auditLimit is how many audit rows a page or the API shows, newest first.
const auditLimit = 100

// auditOf reads the newest audit rows within the range (nil: any time).
func auditOf(r *http.Request, a *admin.Admin, tr *timeRange) ([]admin.AuditEntry, error) {
	var window time.Duration
	if tr != nil {
		window = tr.Window
	}
	return a.AuditWithin(r.Context(), window, auditLimit)
}

func (h *Handler) audit(w http.ResponseWriter, r *http.Request) {
	v := &view{Title: "Audit", Nav: "audit"}
	h.page(w, r, "audit", v, func(a *admin.Admin) (any, error) {
		tr, err := rangeOf(r, true)
		if err != nil {
			return nil, err
		}
		v.Live = h.link("/audit", v.Schema, "partial", "1", "range", tr.param())
		v.Ranges = h.rangeLinks("/audit", v.Schema, tr, true)
		return auditOf(r, a, tr)
	})
}
