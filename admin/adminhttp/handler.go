// Package adminhttp is pgoutbox's web console: an http.Handler that a service
// mounts in its own mux (or that pgoutbox console serves) to watch the outboxes
// of one database and act on them — the backlog and its age, publishes and
// quarantines over the last hour, blocked lanes, dead letters (retry, skip with
// a reason), replay with a dry-run preview, relays and CDC slots.
//
// Every action goes through package admin, so it is audited exactly as the
// CLI's (outbox_operator_audit), with the signed-in user as the actor. The pages
// are server-rendered with html/template; the assets (one style sheet, one
// script that refreshes the live figures) are embedded, and the Content
// Security Policy allows no inline script.
//
// Security: every request is authenticated (HTTP basic auth or a bearer token,
// Config.Users; failed sign-ins are rate-limited) unless Config.NoAuth says
// otherwise; viewers only read, operators act. Every state change is a POST
// that must carry the user's anti-forgery token and pass net/http's
// CrossOriginProtection (Sec-Fetch-Site and Origin checks), needs a reason
// (audited), and runs once: its form carries a submit-once token, and the
// answer redirects to a result page that shows the server's record of what
// happened. Producers' text is shown escaped, hidden characters visibly, and
// credential-looking headers are masked (internal/redact).
//
// Outside the standard library it pulls in pgx, golang.org/x/crypto (argon2id),
// golang.org/x/sync and the OpenTelemetry trace API, through package admin and its
// own password hashing; no broker client.
package adminhttp

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"html/template"
	"io/fs"
	"log/slog"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgoutbox/pgoutbox/admin"
	"github.com/pgoutbox/pgoutbox/migrate"
	"github.com/pgoutbox/pgoutbox/relay"
)

//go:embed assets
var assets embed.FS

// Handler is the console. Create it with New.
type Handler struct {
	pool  *pgxpool.Pool
	cfg   Config
	auth  *authenticator
	acts  *actions
	pages map[string]*template.Template
	mux   *http.ServeMux
	root  http.Handler
	log   *slog.Logger
	board tenantBoard
	// charts shares the activity of the long ranges (a day, a week) between
	// requests.
	charts activityCache
}

// New returns the console serving the outboxes of pool that cfg selects. cfg
// must say who may sign in (Config.Users) or that nobody needs to
// (Config.NoAuth).
func New(pool *pgxpool.Pool, cfg *Config) (*Handler, error) {
	if pool == nil {
		return nil, ErrNoPool
	}
	c, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	if c.NoAuth && c.NoAuthActor == "" {
		c.NoAuthActor = admin.DefaultActor() + " (console, no auth)"
	}
	key := c.CSRFKey
	if len(key) == 0 {
		if key, err = newCSRFKey(); err != nil {
			return nil, err
		}
	}
	pages, err := parsePages()
	if err != nil {
		return nil, err
	}
	h := &Handler{pool: pool, cfg: c, auth: newAuthenticator(&c, key, time.Now), acts: newActions(), pages: pages, mux: http.NewServeMux(), log: c.Logger}
	h.routes()
	cop := http.NewCrossOriginProtection()
	cop.SetDenyHandler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h.log.Warn("console: cross-origin request refused", slog.String("method", r.Method), slog.String("path", r.URL.Path),
			slog.String("remote", r.RemoteAddr))
		http.Error(w, "cross-origin request refused", http.StatusForbidden)
	}))
	h.root = h.secure(cop.Handler(h.authenticate(h.mux)))
	return h, nil
}

// ServeHTTP serves the console.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) { h.root.ServeHTTP(w, r) }

func (h *Handler) routes() {
	static, _ := fs.Sub(assets, "assets/static")
	fileServer := http.StripPrefix("/static/", http.FileServer(http.FS(static)))
	h.mux.Handle("GET /static/", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Cache-Control", "private, max-age=300")
		fileServer.ServeHTTP(w, r)
	}))
	h.mux.HandleFunc("GET /{$}", h.overview)
	h.mux.HandleFunc("GET /lanes", h.lanes)
	h.mux.HandleFunc("GET /dlq", h.dlq)
	h.mux.HandleFunc("GET /event", h.event)
	h.mux.HandleFunc("POST /dlq/retry", h.operator(h.retry))
	h.mux.HandleFunc("POST /dlq/skip", h.operator(h.skip))
	h.mux.HandleFunc("GET /find", h.findEvent)
	h.mux.HandleFunc("GET /retrying", h.retrying)
	h.mux.HandleFunc("GET /errors", h.errorGroups)
	h.mux.HandleFunc("POST /dlq/retry-matching", h.operator(h.retryBulk))
	h.mux.HandleFunc("POST /dlq/skip-matching", h.operator(h.skipBulk))
	h.mux.HandleFunc("GET /replay", h.replayPage)
	h.mux.HandleFunc("POST /replay", h.operator(h.replayRun))
	h.mux.HandleFunc("GET /relays", h.relays)
	h.mux.HandleFunc("GET /destinations", h.destinationsPage)
	h.mux.HandleFunc("GET /audit", h.audit)
	h.mux.HandleFunc("GET /api/overview", h.apiOverview)
	h.apiRoutes()
	h.mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		h.fail(w, r, nil, &httpError{status: http.StatusNotFound, msg: "no such page"})
	})
}

// securityHeaders are set on every answer: no inline script or style, no
// framing, no sniffing, no referrer leaving the console.
var securityHeaders = map[string]string{
	"Content-Security-Policy": "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; " +
		"connect-src 'self'; object-src 'none'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'",
	"X-Frame-Options":              "DENY",
	"X-Content-Type-Options":       "nosniff",
	"Referrer-Policy":              "no-referrer",
	"Cross-Origin-Opener-Policy":   "same-origin",
	"Cross-Origin-Resource-Policy": "same-origin",
	"Permissions-Policy":           "camera=(), microphone=(), geolocation=()",
}

func (h *Handler) secure(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		for k, v := range securityHeaders {
			w.Header().Set(k, v)
		}
		w.Header().Set("Cache-Control", "no-store")
		if h.cfg.NoAuth && !loopbackHost(r.Host) {
			// Without authentication, only a loopback Host: a page that rebinds
			// its own DNS name to 127.0.0.1 cannot read or drive the console.
			http.Error(w, "this console runs without authentication and answers only to localhost, 127.0.0.1 or [::1]", http.StatusMisdirectedRequest)
			return
		}
		next.ServeHTTP(w, r)
	})
}

func loopbackHost(hostport string) bool {
	host := hostport
	if h, _, err := net.SplitHostPort(hostport); err == nil {
		host = h
	}
	host = strings.Trim(host, "[]")
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

type ctxKey struct{}

func (h *Handler) authenticate(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p, res, wait := h.auth.authenticate(r)
		switch res {
		case authLimited:
			// The limiter logs these, aggregated; the credentials were not checked.
			w.Header().Set("Retry-After", strconv.Itoa(int(max(1, (wait+time.Second-1)/time.Second))))
			http.Error(w, "too many failed sign-ins: try again later", http.StatusTooManyRequests)
			return
		case authNone, authFailed:
			// Failures are logged by the limiter, aggregated per client.
			w.Header().Set("WWW-Authenticate", `Basic realm="pgoutbox console", charset="UTF-8"`)
			http.Error(w, "sign in: HTTP basic auth or a bearer token", http.StatusUnauthorized)
			return
		}
		ctx := context.WithValue(r.Context(), ctxKey{}, p)
		if !(r.Method == http.MethodPost && r.URL.Path == "/replay") { // a replay has its own bound
			var cancel context.CancelFunc
			ctx, cancel = context.WithTimeout(ctx, h.cfg.QueryTimeout)
			defer cancel()
		}
		next.ServeHTTP(w, r.WithContext(ctx))
	})
}

func who(r *http.Request) *principal { p, _ := r.Context().Value(ctxKey{}).(*principal); return p }

// maxBody bounds a form's body: a thousand event ids and a reason.
const maxBody = 128 << 10

// operator guards a state change: an operator's POST with their anti-forgery
// token (CrossOriginProtection already refused cross-site requests).
func (h *Handler) operator(next http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		p := who(r)
		if p.role != RoleOperator {
			h.fail(w, r, nil, &httpError{status: http.StatusForbidden, msg: "your role (" + p.role.String() + ") cannot do this; an operator can"})
			return
		}
		r.Body = http.MaxBytesReader(w, r.Body, maxBody)
		if err := r.ParseForm(); err != nil {
			h.fail(w, r, nil, &httpError{status: http.StatusBadRequest, msg: "unreadable form (at most 128 KiB)"})
			return
		}
		if !tokenEqual(r.PostForm.Get("csrf"), p.csrf) {
			h.log.Warn("console: form without a valid anti-forgery token refused", slog.String("user", p.name), slog.String("path", r.URL.Path))
			h.fail(w, r, nil, &httpError{status: http.StatusForbidden, msg: "the form's anti-forgery token is missing or wrong; reload the page and try again"})
			return
		}
		next(w, r)
	}
}

// httpError is an answer other than 200, with a message safe to show.
type httpError struct {
	status int
	msg    string
}

func (e *httpError) Error() string { return e.msg }

func badInput(format string, args ...any) error {
	return &httpError{status: http.StatusBadRequest, msg: fmt.Sprintf(format, args...)}
}

// tenants returns the outbox schemas the console shows.
func (h *Handler) tenants(ctx context.Context) ([]string, error) {
	return migrate.Outboxes(ctx, h.pool, h.cfg.Schemas)
}

// schemaOf returns the schema the request asks for (its "schema" parameter, by
// default the first tenant), which must be one of the tenants and pass
// migrate.CheckTenant with Config.Trust (else an error wrapping
// migrate.ErrUntrusted, which the page shows as the tenant's refusal), and an
// Admin on it. Every page and action on a tenant goes through it.
func (h *Handler) schemaOf(r *http.Request) (string, []string, *admin.Admin, error) {
	all, err := h.tenants(r.Context())
	if err != nil {
		return "", nil, nil, err
	}
	s := r.FormValue("schema")
	if len(s) > maxField {
		return "", all, nil, badInput("schema: at most %d bytes", maxField)
	}
	switch {
	case s == "" && len(all) == 0:
		return "", all, nil, &httpError{status: http.StatusNotFound,
			msg: "no outbox schema matches " + h.cfg.Schemas.String() + " (is the database migrated?)"}
	case s == "":
		s = all[0]
	case !slices.Contains(all, s):
		return "", all, nil, &httpError{status: http.StatusNotFound, msg: fmt.Sprintf("no outbox schema %q among the console's schemas", s)}
	}
	// A tenant is a trust boundary: nothing of it runs, and no statement
	// touches its tables, unless its owner is trusted and its tables are bare.
	if err := migrate.CheckTenant(r.Context(), h.pool, s, h.cfg.Trust); err != nil {
		if errors.Is(err, migrate.ErrUntrusted) {
			h.log.Warn("console: tenant refused", slog.String("schema", s), slog.Any("error", err))
		}
		return s, all, nil, err
	}
	a, err := admin.New(h.pool, &admin.Config{Schema: s})
	return s, all, a, err
}

// errStatus maps admin's errors to HTTP answers.
func errStatus(err error) (int, string) {
	var he *httpError
	if status, msg, ok := bulkStatus(err); ok {
		return status, msg
	}
	switch {
	case errors.As(err, &he):
		return he.status, he.msg
	case errors.Is(err, migrate.ErrUntrusted):
		// The catalog's names of what was found: shown escaped (html/template,
		// then internal/visible), as producers' text.
		return http.StatusForbidden, "tenant refused: " + err.Error()
	case errors.Is(err, admin.ErrNotFound), errors.Is(err, admin.ErrDestinationNotFound):
		return http.StatusNotFound, err.Error()
	case errors.Is(err, admin.ErrNotQuarantined):
		return http.StatusConflict, err.Error()
	case errors.Is(err, admin.ErrNoReason), errors.Is(err, admin.ErrInvalidAuditText), errors.Is(err, admin.ErrNoEvents),
		errors.Is(err, admin.ErrNoFilter), errors.Is(err, relay.ErrInvalidDestination):
		return http.StatusBadRequest, err.Error()
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, context.Canceled):
		return http.StatusServiceUnavailable, "the database did not answer in time"
	}
	return http.StatusInternalServerError, "the console could not read the database; its log says why"
}
