package adminhttp

import (
	"bytes"
	"encoding/json"
	"fmt"
	"html/template"
	"io"
	"io/fs"
	"log/slog"
	"math"
	"net/http"
	"net/url"
	"path"
	"sort"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/pgoutbox/pgoutbox/admin"
	"github.com/pgoutbox/pgoutbox/internal/redact"
	"github.com/pgoutbox/pgoutbox/internal/visible"
)

// view is what every page template gets.
type view struct {
	Title   string
	Nav     string
	Base    string
	Schema  string
	Schemas []string
	User    string
	Role    string
	CanAct  bool
	CSRF    string
	Once    string // the submit-once token of the page's forms
	Refresh int64  // milliseconds
	Live    string
	Notice  string
	Body    any
	// Now is the clock relative times are written from: the database's (a
	// page's body, or page, reads it), else the console's (set by render).
	Now time.Time
	// Ranges is the page's range selector (none: the page has no range).
	Ranges []rangeLink
}

var funcs = template.FuncMap{
	"age":   fmtAge,
	"ts":    fmtTime,
	"when":  when,
	"ago":   ago,
	"bytes": fmtBytes,
	"short": func(s string, n int) string {
		if utf8.RuneCountInString(s) <= n {
			return s
		}
		return string([]rune(s)[:n]) + "…"
	},
	"i64": func(p *int64) string {
		if p == nil {
			return "—"
		}
		return fmtBytes(*p)
	},
}

func parsePages() (map[string]*template.Template, error) {
	base, err := template.New("layout.html").Funcs(funcs).ParseFS(assets, "assets/layout.html")
	if err != nil {
		return nil, fmt.Errorf("adminhttp: templates: %w", err)
	}
	names, err := fs.Glob(assets, "assets/pages/*.html")
	if err != nil {
		return nil, err
	}
	pages := map[string]*template.Template{}
	for _, n := range names {
		t, err := template.Must(base.Clone()).ParseFS(assets, n)
		if err != nil {
			return nil, fmt.Errorf("adminhttp: template %s: %w", n, err)
		}
		pages[strings.TrimSuffix(path.Base(n), ".html")] = t
	}
	return pages, nil
}

// link returns the console path p with the schema and the given parameters.
func (h *Handler) link(p, schema string, kv ...string) string {
	q := url.Values{}
	if schema != "" {
		q.Set("schema", schema)
	}
	for i := 0; i+1 < len(kv); i += 2 {
		if kv[i+1] != "" {
			q.Set(kv[i], kv[i+1])
		}
	}
	u := h.cfg.BasePath + p
	if len(q) > 0 {
		u += "?" + q.Encode()
	}
	return u
}

// formPages are the pages with forms that change state.
var formPages = map[string]bool{"event": true, "dlq": true, "replay": true, "errors": true}

// render writes page name with v; a request with partial=1 gets only the page's
// live region (the script's refresh).
func (h *Handler) render(w http.ResponseWriter, r *http.Request, name string, status int, v *view) {
	p := who(r)
	v.Base = h.cfg.BasePath
	if p != nil {
		v.User, v.Role, v.CanAct, v.CSRF = p.name, p.role.String(), p.role == RoleOperator, p.csrf
	}
	v.Refresh = h.cfg.Refresh.Milliseconds()
	if v.Now.IsZero() {
		v.Now = time.Now()
	}
	t := h.pages[name]
	tmpl := "layout.html"
	if r.URL.Query().Get("partial") == "1" && t.Lookup("live") != nil {
		tmpl = "live"
	}
	if v.CanAct && formPages[name] && tmpl == "layout.html" {
		v.Once = h.acts.issue(p.name)
	}
	var buf bytes.Buffer
	if err := t.ExecuteTemplate(&buf, tmpl, v); err != nil {
		h.log.Error("console: render", slog.String("page", name), slog.Any("error", err))
		http.Error(w, "the page could not be rendered", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(status)
	// Producers' text shows its hidden characters (bidi overrides, zero-width,
	// controls) as escapes, wherever a template put it; the templates hold none.
	_, _ = io.WriteString(w, visible.Block(buf.String()))
}

// fail answers with err's status and a page saying what went wrong. Errors
// that are not the user's are logged and shown without their details.
func (h *Handler) fail(w http.ResponseWriter, r *http.Request, v *view, err error) {
	status, msg := errStatus(err)
	if status >= 500 {
		h.log.Error("console: request failed", slog.String("path", r.URL.Path), slog.Any("error", err))
	}
	if isAPI(r) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		writeJSON(w, map[string]string{"error": msg})
		return
	}
	if v == nil {
		v = &view{}
	}
	v.Title, v.Body = http.StatusText(status), msg
	h.render(w, r, "error", status, v)
}

// writeJSON answers v as JSON, its strings' hidden characters as \u escapes
// (the same strings to a JSON reader, inert on a terminal).
func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v)
	_, _ = io.WriteString(w, visible.Block(buf.String()))
}

// header is one event header as shown.
type header struct {
	Name   string `json:"name"`
	Value  string `json:"value"`
	Masked bool   `json:"masked"`
}

// showHeaders returns the headers as shown to every user: the values of
// secret-named headers and the credentials in any value hidden by
// redact.Header, the project's one idea of what a secret looks like.
func showHeaders(m map[string]string) []header {
	out := make([]header, 0, len(m))
	for k, v := range m {
		shown, masked := redact.Header(k, v)
		out = append(out, header{Name: k, Value: shown, Masked: masked})
	}
	slicesSortFunc(out)
	return out
}

// maxPayloadShown bounds the payload text a page shows; the page says when it
// cut one.
const maxPayloadShown = 256 << 10

// showPayload returns the payload indented, cut at maxPayloadShown bytes (the
// second result is the full size when it was cut, else 0).
func showPayload(p json.RawMessage) (string, int) {
	var b bytes.Buffer
	if err := json.Indent(&b, p, "", "  "); err != nil {
		b.Reset()
		b.Write(p)
	}
	if b.Len() > maxPayloadShown {
		s := b.Bytes()[:maxPayloadShown]
		for !utf8.Valid(s) {
			s = s[:len(s)-1]
		}
		return string(s), b.Len()
	}
	return b.String(), 0
}

func fmtAge(d admin.Duration) string {
	t := time.Duration(d)
	switch {
	case t <= 0:
		return "0s"
	case t < time.Minute:
		return t.Round(100 * time.Millisecond).String()
	case t < time.Hour:
		return t.Round(time.Second).String()
	}
	return t.Round(time.Minute).String()
}

func fmtTime(t time.Time) string {
	if t.IsZero() {
		return "—"
	}
	return t.UTC().Format("2006-01-02 15:04:05Z")
}

func fmtBytes(n int64) string {
	switch {
	case n < 1<<10:
		return fmt.Sprintf("%d B", n)
	case n < 1<<20:
		return fmt.Sprintf("%.1f KiB", float64(n)/(1<<10))
	case n < 1<<30:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	}
	return fmt.Sprintf("%.1f GiB", float64(n)/(1<<30))
}

// chart draws one series, a bar a bucket, as an SVG bar chart; its times are
// written as layout. Only numbers and times go into it, each escaped by
// template.HTMLEscapeString anyway.
func chart(title, unit, layout string, at []time.Time, values []float64) template.HTML {
	const w, hgt, left, bottom, top = 640.0, 140.0, 48.0, 18.0, 8.0
	peak := 0.0
	for _, v := range values {
		peak = math.Max(peak, v)
	}
	scale := niceCeil(peak)
	var b strings.Builder
	esc := template.HTMLEscapeString
	fmt.Fprintf(&b, `<svg class="chart" viewBox="0 0 %.0f %.0f" role="img" aria-label="%s"><title>%s</title>`, w, hgt, esc(title), esc(title))
	plotW, plotH := w-left-4, hgt-bottom-top
	fmt.Fprintf(&b, `<line class="axis" x1="%.0f" y1="%.1f" x2="%.0f" y2="%.1f"/>`, left, top+plotH, w-4, top+plotH)
	fmt.Fprintf(&b, `<text class="tick" x="%.0f" y="%.1f" text-anchor="end">%s</text>`, left-4, top+8, esc(fmtRate(scale)+unit))
	fmt.Fprintf(&b, `<text class="tick" x="%.0f" y="%.1f" text-anchor="end">0</text>`, left-4, top+plotH)
	n := len(values)
	if n > 0 {
		bw := plotW / float64(n)
		for i, v := range values {
			bh := 0.0
			if scale > 0 {
				bh = v / scale * plotH
			}
			x := left + float64(i)*bw
			fmt.Fprintf(&b, `<rect class="bar" x="%.1f" y="%.1f" width="%.1f" height="%.1f"><title>%s: %s%s</title></rect>`,
				x+0.5, top+plotH-bh, math.Max(bw-1, 0.5), bh, esc(at[i].UTC().Format(layout)), esc(fmtRate(v)), esc(unit))
		}
		for k, i := range []int{0, n / 2, n - 1} {
			anchor := [...]string{"start", "middle", "end"}[k]
			x := left + float64(i)*bw + [...]float64{0, bw / 2, bw}[k]
			fmt.Fprintf(&b, `<text class="tick" x="%.1f" y="%.0f" text-anchor="%s">%s UTC</text>`,
				x, hgt-4, anchor, esc(at[i].UTC().Format(layout)))
		}
	}
	b.WriteString(`</svg>`)
	return template.HTML(b.String()) // #nosec: built from numbers and escaped text
}

func fmtRate(v float64) string {
	switch {
	case v == 0:
		return "0"
	case v >= 100:
		return fmt.Sprintf("%.0f", v)
	case v >= 1:
		return fmt.Sprintf("%.1f", v)
	}
	return fmt.Sprintf("%.3f", v)
}

// niceCeil rounds v up to 1, 2 or 5 times a power of ten.
func niceCeil(v float64) float64 {
	if v <= 0 {
		return 0
	}
	p := math.Pow(10, math.Floor(math.Log10(v)))
	for _, m := range []float64{1, 2, 5, 10} {
		if v <= m*p {
			return m * p
		}
	}
	return 10 * p
}

func slicesSortFunc(hs []header) {
	sort.Slice(hs, func(i, j int) bool { return hs[i].Name < hs[j].Name })
}
