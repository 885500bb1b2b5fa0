package adminhttp

import (
	"context"
	"html/template"
	"net/http"
	"sync"
	"time"

	"golang.org/x/sync/singleflight"

	"github.com/pgoutbox/pgoutbox/admin"
)

// timeRange is the span a page's charts and time-ordered lists cover: the
// request's "range" parameter (docs/console.md, "Time ranges").
type timeRange struct {
	// Param is the parameter's value, as links carry it.
	Param string
	// Label names it on the page ("last hour").
	Label string
	// Window is how far back it reaches; Bucket is a chart bar's span, so a
	// chart has at most 169 bars whatever the range.
	Window, Bucket time.Duration
	// Per names a bucket in a chart's title ("per-minute average").
	Per string
}

// timeRanges are the ranges a request may choose, the default first.
var timeRanges = []timeRange{
	{Param: "1h", Label: "last hour", Window: time.Hour, Bucket: time.Minute, Per: "per-minute"},
	{Param: "24h", Label: "last day", Window: 24 * time.Hour, Bucket: 15 * time.Minute, Per: "per-15-minute"},
	{Param: "7d", Label: "last week", Window: 7 * 24 * time.Hour, Bucket: time.Hour, Per: "per-hour"},
}

// errBadRange is the answer to any range but the three: the value is not
// echoed (it is the requester's text, of any size).
var errBadRange = badInput("range: must be 1h, 24h or 7d (the last hour, day or week)")

// rangeOf reads the request's range: absent is the default (the last hour,
// or all when all is true: a list that showed everything before ranges
// existed); anything but 1h, 24h or 7d, given once, is refused.
func rangeOf(r *http.Request, all bool) (*timeRange, error) {
	vs, ok := r.URL.Query()["range"]
	switch {
	case !ok && all:
		return nil, nil
	case !ok:
		return &timeRanges[0], nil
	case len(vs) != 1:
		return nil, errBadRange
	}
	for i := range timeRanges {
		if vs[0] == timeRanges[i].Param {
			return &timeRanges[i], nil
		}
	}
	return nil, errBadRange
}

// rangeLink is one choice of a page's range selector.
type rangeLink struct {
	Label, Link string
	Current     bool
}

// rangeLinks are the choices of the range selector of page p for schema,
// chosen marked; withAll adds "all" (no range) first.
func (h *Handler) rangeLinks(p, schema string, chosen *timeRange, withAll bool) []rangeLink {
	var out []rangeLink
	if withAll {
		out = append(out, rangeLink{Label: "all", Link: h.link(p, schema), Current: chosen == nil})
	}
	for i := range timeRanges {
		tr := &timeRanges[i]
		out = append(out, rangeLink{Label: tr.Label, Link: h.link(p, schema, "range", tr.Param), Current: chosen == tr})
	}
	return out
}

// param is the range's parameter value ("" for none), for links.
func (tr *timeRange) param() string {
	if tr == nil {
		return ""
	}
	return tr.Param
}

// when shows a time relative to now and absolute, the console's one way of
// writing a time: "4m12s ago · 2026-12-06 11:28:03Z" (or "in 3m0s · …" for a
// time to come); "—" for none. at is a time.Time or a *time.Time.
func when(now time.Time, at any) template.HTML {
	t := timeOf(at)
	return ago(admin.Duration(now.Sub(t)), t)
}

// ago is when with the age already known (as the database measured it).
func ago(age admin.Duration, at any) template.HTML {
	t := timeOf(at)
	if t.IsZero() {
		return "—"
	}
	rel := fmtAge(age) + " ago"
	if age < 0 {
		rel = "in " + fmtAge(-age)
	}
	return template.HTML(template.HTMLEscapeString(rel) + ` · <span class="muted">` + template.HTMLEscapeString(fmtTime(t)) + `</span>`) // #nosec: escaped
}

// timeOf is at as a time (zero for a nil pointer or anything else).
func timeOf(at any) time.Time {
	switch v := at.(type) {
	case time.Time:
		return v
	case *time.Time:
		if v != nil {
			return *v
		}
	}
	return time.Time{}
}

// activityCache shares the activity of the ranges longer than an hour
// between requests (every open tab, the live refreshes, the API): a week's
// hourly bars count up to a week of events, so they are read at most once
// per chartsTTL for each schema and range, by one request at a time. The last
// hour is read on every request: it is cheap, and live.
type activityCache struct {
	mu      sync.Mutex
	entries map[string]cachedActivity
	flight  singleflight.Group
}

type cachedActivity struct {
	at  time.Time
	act *admin.Activity
}

// chartsTTL is how long a day's or a week's activity is shared; its bars are
// 15 minutes or an hour wide.
const chartsTTL = time.Minute

// maxCachedActivities bounds the cache: past it the expired entries go, and if
// none had, all of them.
const maxCachedActivities = 256

// activityOf reads the schema's activity over the range, in its buckets;
// over a day or a week through the shared cache.
func (h *Handler) activityOf(ctx context.Context, schema string, a *admin.Admin, tr *timeRange) (*admin.Activity, error) {
	if tr.Window <= time.Hour {
		return a.ActivityOver(ctx, tr.Window, tr.Bucket)
	}
	c := &h.charts
	key := schema + "\x00" + tr.Param
	c.mu.Lock()
	if e, ok := c.entries[key]; ok && time.Since(e.at) < chartsTTL {
		c.mu.Unlock()
		return e.act, nil
	}
	c.mu.Unlock()
	v, err, _ := c.flight.Do(key, func() (any, error) {
		// Shared by the requests waiting on it: none's cancellation ends it.
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), h.cfg.QueryTimeout)
		defer cancel()
		act, err := a.ActivityOver(rctx, tr.Window, tr.Bucket)
		if err != nil {
			return nil, err
		}
		now := time.Now()
		c.mu.Lock()
		defer c.mu.Unlock()
		if c.entries == nil {
			c.entries = map[string]cachedActivity{}
		}
		if len(c.entries) >= maxCachedActivities {
			for k, e := range c.entries {
				if now.Sub(e.at) >= chartsTTL {
					delete(c.entries, k)
				}
			}
			if len(c.entries) >= maxCachedActivities {
				clear(c.entries)
			}
		}
		c.entries[key] = cachedActivity{at: now, act: act}
		return act, nil
	})
	if err != nil {
		return nil, err
	}
	return v.(*admin.Activity), nil
}
