package webhook_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/pgoutbox/pgoutbox/broker"
	"github.com/pgoutbox/pgoutbox/broker/webhook"
)

func newSecret() string { return "Zq" + strings.ToLower(rand.Text()) }

// A receiver that echoes the request back in its error answer — headers, body,
// URL, in many shapes and at every offset around the excerpt's cut — gets none of
// the request's secret material into the error the relay stores: not the signing
// secret, the signature, the URL's password and tokens, the basic authentication
// they make, or Config.Header's credentials. The excerpt stays bounded.
func TestErrorExcerptHoldsNoSecret(t *testing.T) {
	t.Parallel()
	sign, pass, token, bearer, apiKey := newSecret(), newSecret(), newSecret(), newSecret(), newSecret()
	basic := base64.StdEncoding.EncodeToString([]byte("hook:" + pass))
	var sigs atomic.Value // the last request's signature header
	echoes := []func(r *http.Request, body []byte) string{
		func(r *http.Request, body []byte) string { // JSON of everything
			b, _ := json.Marshal(map[string]any{"headers": r.Header, "url": r.URL.String(), "body": string(body)})
			return string(b)
		},
		func(r *http.Request, body []byte) string { // a header dump
			var b bytes.Buffer
			_ = r.Header.Write(&b)
			return b.String()
		},
		func(r *http.Request, _ []byte) string { return "bad auth " + r.Header.Get("Authorization") },
		func(r *http.Request, _ []byte) string { return "you sent " + r.URL.RawQuery },
		func(r *http.Request, _ []byte) string { return "key " + r.Header.Get("X-Api-Key") + " unknown" },
		func(r *http.Request, _ []byte) string {
			return "expected signature with secret " + sign + ", got " + r.Header.Get(webhook.HeaderSignature)
		},
		func(*http.Request, []byte) string { return "secret=" + url.QueryEscape(sign) + " token " + token },
		func(r *http.Request, _ []byte) string { u, p, _ := r.BasicAuth(); return u + ":" + p },
	}
	// Padding that puts a secret across the 256-byte cut and the 4 KiB read limit.
	for _, pad := range []int{0, 230, 240, 250, 252, 255, 4080, 4090} {
		echoes = append(echoes, func(*http.Request, []byte) string { return strings.Repeat("a", pad) + sign + pass })
		echoes = append(echoes, func(r *http.Request, _ []byte) string {
			return strings.Repeat("b", pad) + r.Header.Get("Authorization")
		})
	}
	var which atomic.Int64
	srv := serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		sigs.Store(r.Header.Get(webhook.HeaderSignature))
		code, _ := strconv.Atoi(r.Header.Get("Want-Status"))
		w.WriteHeader(code)
		_, _ = io.WriteString(w, echoes[int(which.Load())](r, body))
	}))
	u, _ := url.Parse(srv.URL())
	u.User = url.UserPassword("hook", pass)
	p := newPublisher(t, webhook.Config{
		URL:    u.String() + "/outbox?token=" + token + "&access_token=" + token,
		Secret: []byte(sign),
		Header: http.Header{"X-Api-Key": {apiKey}},
	})
	pb := newPublisher(t, webhook.Config{URL: srv.URL() + "/outbox", Secret: []byte(sign),
		Header: http.Header{"Authorization": {"Bearer " + bearer}}})
	for i := range echoes {
		which.Store(int64(i))
		for _, code := range []int{400, 401, 403, 422, 500, 503} {
			for pi, pub := range []*webhook.Publisher{p, pb} {
				m := message("order", fmt.Sprintf("e%d-%d", i, code), 1)
				m.Headers["Want-Status"] = strconv.Itoa(code)
				err := publish(t, pub, m)[0]
				if err == nil {
					t.Fatalf("echo %d, %d: no error", i, code)
				}
				text := err.Error()
				sig, _ := sigs.Load().(string)
				_, v1, _ := strings.Cut(sig, "v1=")
				own := []string{sign, pass, token, apiKey, basic, url.QueryEscape(sign), v1, sign[:8], pass[:8], token[:8], basic[:8]}
				if pi == 1 { // pb knows only the signing secret and its bearer token
					own = []string{sign, bearer, url.QueryEscape(sign), v1, sign[:8], bearer[:8]}
				}
				for _, s := range own {
					if s != "" && strings.Contains(text, s) {
						t.Errorf("echo %d, %d: the error holds %q: %s", i, code, s, text)
					}
				}
				var se *webhook.StatusError
				if !errorsAs(err, &se) || len(se.Body) > 256+len("…") {
					t.Errorf("echo %d, %d: excerpt not bounded: %v", i, code, err)
				}
			}
		}
	}
}

func errorsAs(err error, se **webhook.StatusError) bool {
	for err != nil {
		if s, ok := err.(*webhook.StatusError); ok {
			*se = s
			return true
		}
		u, ok := err.(interface{ Unwrap() error })
		if !ok {
			return false
		}
		err = u.Unwrap()
	}
	return false
}

// 401 and 403 are one rule: a configuration error (broker.Misconfigured, a kind of
// Unavailable), never quarantined; Ping fails with the reason until a request is
// acknowledged again.
func TestRefusedCredentialsAreAConfigurationError(t *testing.T) {
	t.Parallel()
	var status atomic.Int64
	srv := serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodHead {
			w.WriteHeader(http.StatusMethodNotAllowed) // a HEAD says nothing about credentials
			return
		}
		c := int(status.Load())
		w.WriteHeader(c)
		_, _ = io.WriteString(w, "signature mismatch")
	}))
	p := newPublisher(t, webhook.Config{URL: srv.URL()})
	ctx := context.Background()
	if err := p.Ping(ctx); err != nil {
		t.Fatalf("Ping before any request: %v", err)
	}
	for _, code := range []int{401, 403} {
		status.Store(int64(code))
		err := publish(t, p, message("order", "a"+strconv.Itoa(code), 1))[0]
		if !broker.IsMisconfigured(err) || !broker.IsUnavailable(err) || broker.IsPermanent(err) ||
			!strings.Contains(err.Error(), "configuration error") {
			t.Errorf("%d: %v: want a configuration error, unavailable, not permanent", code, err)
		}
		if perr := p.Ping(ctx); !broker.IsMisconfigured(perr) || !strings.Contains(perr.Error(), strconv.Itoa(code)) {
			t.Errorf("%d: Ping = %v, want the refusal", code, perr)
		}
	}
	status.Store(500) // an answer that is not a refusal leaves the refusal standing
	_ = publish(t, p, message("order", "b", 1))
	if perr := p.Ping(ctx); !broker.IsMisconfigured(perr) {
		t.Errorf("after a 500, Ping = %v: want the refusal still", perr)
	}
	status.Store(204)
	if err := publish(t, p, message("order", "c", 1))[0]; err != nil {
		t.Fatalf("204: %v", err)
	}
	if err := p.Ping(ctx); err != nil {
		t.Errorf("after an acknowledgement, Ping = %v", err)
	}
	for _, code := range []int{400, 404, 500, 502} {
		status.Store(int64(code))
		if err := publish(t, p, message("order", "d"+strconv.Itoa(code), 1))[0]; broker.IsMisconfigured(err) {
			t.Errorf("%d is not a configuration error: %v", code, err)
		}
	}
}

// Credentials or signed requests bound for plain http:// are warned about at New.
func TestPlainHTTPCredentialsWarn(t *testing.T) {
	t.Parallel()
	sec := []byte(newSecret())
	for _, tc := range []struct {
		cfg  webhook.Config
		warn bool
	}{
		{webhook.Config{URL: "http://hooks.example/x", Secret: sec}, true},
		{webhook.Config{URL: "http://u:p@hooks.example/x", AllowUnsigned: true}, true},
		{webhook.Config{URL: "http://tok@hooks.example/x", AllowUnsigned: true}, true},
		{webhook.Config{URL: "http://hooks.example/x?token=t", AllowUnsigned: true}, true},
		{webhook.Config{URL: "http://hooks.example/x?sig=t", AllowUnsigned: true}, true},
		{webhook.Config{URL: "http://hooks.example/x", AllowUnsigned: true, Header: http.Header{"Authorization": {"Bearer t"}}}, true},
		{webhook.Config{URL: "http://hooks.example/x", AllowUnsigned: true, Header: http.Header{"Cookie": {"s=1"}}}, true},
		{webhook.Config{URL: "http://hooks.example/x?tenant=a", AllowUnsigned: true}, false},
		{webhook.Config{URL: "https://u:p@hooks.example/x?token=t", Secret: sec}, false},
	} {
		var logs bytes.Buffer
		tc.cfg.Logger = slog.New(slog.NewTextHandler(&logs, nil))
		p, err := webhook.New(&tc.cfg)
		if err != nil {
			t.Fatalf("%s: %v", tc.cfg.URL, err)
		}
		_ = p.Close()
		warned := strings.Contains(logs.String(), "level=WARN") && strings.Contains(logs.String(), "use https://")
		if warned != tc.warn {
			t.Errorf("%s: warned %v, want %v: %s", tc.cfg.URL, warned, tc.warn, logs.String())
		}
		if strings.Contains(logs.String(), string(sec)) || strings.Contains(logs.String(), "u:p") || strings.Contains(logs.String(), "token=t") {
			t.Errorf("%s: the warning shows a secret: %s", tc.cfg.URL, logs.String())
		}
	}
}
