package webhook_test

import (
	"context"
	"errors"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pgoutbox/pgoutbox/broker"
	"github.com/pgoutbox/pgoutbox/broker/webhook"
)

// TestRequest checks one request on the wire: method, path, body, every wire
// header, Idempotency-Key, a valid signature, Config.Header, and producer headers
// that cannot replace the publisher's.
func TestRequest(t *testing.T) {
	t.Parallel()
	type seen struct {
		method, path, uri string
		header            http.Header
		body              []byte
	}
	got := make(chan seen, 1)
	srv := serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		got <- seen{r.Method, r.URL.EscapedPath(), r.URL.RequestURI(), r.Header.Clone(), body}
	}))
	p := newPublisher(t, webhook.Config{
		URL:    srv.URL() + "/hooks/{aggregate_type}/{event_type}/v{schema_version}?tenant=acme",
		Header: http.Header{"authorization": {"Bearer config"}},
	})
	// Producer headers the publisher, HTTP or Config.Header own are refused, never sent.
	for name, v := range map[string]string{"Content-Type": "text/plain", "idempotency-key": "forged",
		"Authorization": "Bearer producer", "outbox-signature": "t=1,v1=forged", "Host": "evil", "Transfer-Encoding": "chunked"} {
		forged := message("order/line", "forged", 1)
		forged.Headers[name] = v
		if err := publish(t, p, forged)[0]; !broker.IsPermanent(err) {
			t.Fatalf("a producer header %s: %v, want a permanent refusal", name, err)
		}
	}
	m := message("order/line", "42", 1)
	if err := publish(t, p, m)[0]; err != nil {
		t.Fatalf("Publish: %v", err)
	}
	r := <-got
	if r.method != http.MethodPost {
		t.Errorf("method %s, want POST", r.method)
	}
	if want := "/hooks/order%2Fline/created/v2"; r.path != want {
		t.Errorf("path %s, want %s", r.path, want)
	}
	if string(r.body) != string(m.Payload) {
		t.Errorf("body %q, want %q", r.body, m.Payload)
	}
	for name, want := range m.WireHeaders() {
		if name == "Content-Type" || strings.EqualFold(name, "idempotency-key") || name == "Authorization" {
			continue
		}
		if v := r.header.Values(name); len(v) != 1 || v[0] != want {
			t.Errorf("header %s = %q, want [%q]", name, v, want)
		}
	}
	for name, want := range map[string]string{
		"Content-Type":    "application/json",
		"Idempotency-Key": m.EventID.String(),
		"Authorization":   "Bearer config",
		"User-Agent":      "pgoutbox-webhook",
	} {
		if v := r.header.Values(name); len(v) != 1 || v[0] != want {
			t.Errorf("header %s = %q, want [%q]", name, v, want)
		}
	}
	v := webhook.Verifier{Secrets: [][]byte{secret}}
	if err := v.Verify(request(r.header, r.uri), r.body); err != nil {
		t.Errorf("Verify: %v (signature %q)", err, r.header.Get(webhook.HeaderSignature))
	}
}

// A 500 is retried; the receiver deduplicates the re-deliveries on
// Idempotency-Key, so the event has exactly one effect.
func TestServerErrorThenSuccess(t *testing.T) {
	t.Parallel()
	rc := newReceiver()
	rc.answer = func(w http.ResponseWriter, _ *http.Request, attempt int) bool {
		if attempt == 1 {
			http.Error(w, "database is locked", http.StatusInternalServerError)
			return true
		}
		return false
	}
	srv := serve(t, rc.handler())
	p := newPublisher(t, webhook.Config{URL: srv.URL()})
	m := message("order", "42", 1)

	err := publish(t, p, m)[0]
	var se *webhook.StatusError
	switch {
	case err == nil:
		t.Fatal("first attempt: acknowledged despite the 500")
	case broker.IsPermanent(err) || broker.IsUnavailable(err):
		t.Errorf("first attempt: %v: a 500 must be retryable and count as an attempt", err)
	case !errors.As(err, &se) || se.StatusCode != 500 || se.Body != "database is locked":
		t.Errorf("first attempt: %v, want a *StatusError with 500 and the body", err)
	}
	for attempt := 2; attempt <= 3; attempt++ {
		if err := publish(t, p, m)[0]; err != nil {
			t.Fatalf("attempt %d: %v", attempt, err)
		}
	}
	if n := len(rc.messages()); n != 1 {
		t.Errorf("receiver stored %d copies, want 1", n)
	}
	keys := rc.requestKeys()
	if len(keys) != 3 {
		t.Fatalf("receiver saw %d requests, want 3", len(keys))
	}
	for i, k := range keys {
		if k != m.EventID.String() {
			t.Errorf("request %d: Idempotency-Key %q, want the event id %s", i+1, k, m.EventID)
		}
	}
}

// A 400 is a permanent refusal; its error, stored as last_error, holds the
// status and a bounded, sanitized excerpt of the body; the aggregate's lane stops.
func TestClientErrorIsPermanent(t *testing.T) {
	t.Parallel()
	rc := newReceiver()
	long := "field \"total\"\tmust be\r\na string\x00\x1b[31m, " + strings.Repeat("é", 400) + "\xff"
	rc.answer = func(w http.ResponseWriter, _ *http.Request, _ int) bool {
		w.WriteHeader(http.StatusBadRequest)
		_, _ = io.WriteString(w, long)
		return true
	}
	srv := serve(t, rc.handler())
	p := newPublisher(t, webhook.Config{URL: srv.URL()})

	results := publish(t, p, message("order", "42", 1), message("order", "42", 2))
	err := results[0]
	if !broker.IsPermanent(err) {
		t.Fatalf("400: %v, want a permanent error", err)
	}
	if !errors.Is(results[1], broker.ErrPredecessorFailed) {
		t.Errorf("next event of the aggregate: %v, want ErrPredecessorFailed", results[1])
	}
	text := err.Error()
	if !strings.Contains(text, "400 Bad Request") || !strings.Contains(text, `field \"total\" must be a string [31m, éé`) {
		t.Errorf("error text %q lacks the status or the excerpt", text)
	}
	var se *webhook.StatusError
	if !errors.As(err, &se) {
		t.Fatalf("%v is not a *StatusError", err)
	}
	if len(se.Body) > 256+len("…") || !strings.HasSuffix(se.Body, "…") || strings.ContainsAny(se.Body, "\x00\r\n\t\x1b") {
		t.Errorf("excerpt %q (%d bytes) is not bounded and sanitized", se.Body, len(se.Body))
	}
}

// A receiver that does not answer within the timeout: unavailable, and the retry
// carries the same Idempotency-Key.
func TestTimeout(t *testing.T) {
	t.Parallel()
	rc := newReceiver()
	entered := make(chan struct{})
	rc.answer = func(_ http.ResponseWriter, r *http.Request, attempt int) bool {
		if attempt > 1 {
			return false
		}
		close(entered)
		<-r.Context().Done() // the publisher gave up and closed the connection
		return true
	}
	srv := serve(t, rc.handler())
	p := newPublisher(t, webhook.Config{URL: srv.URL(), Timeout: time.Second})
	m := message("order", "42", 1)

	err := publish(t, p, m)[0]
	if !broker.IsUnavailable(err) || !errors.Is(err, webhook.ErrTimeout) {
		t.Fatalf("no answer: %v, want an unavailable ErrTimeout", err)
	}
	select {
	case <-entered:
	default:
		t.Fatal("the request never reached the receiver")
	}
	if err := publish(t, p, m)[0]; err != nil {
		t.Fatalf("retry: %v", err)
	}
	keys := rc.requestKeys()
	if len(keys) != 2 || keys[0] != m.EventID.String() || keys[1] != keys[0] {
		t.Errorf("Idempotency-Keys %q, want the event id %s twice", keys, m.EventID)
	}
}

func TestStatusClassification(t *testing.T) {
	t.Parallel()
	var redirected atomic.Int64
	elsewhere := serve(t, http.HandlerFunc(func(http.ResponseWriter, *http.Request) { redirected.Add(1) }))
	srv := serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		code, _ := strconv.Atoi(r.Header.Get("Want-Status"))
		if code >= 300 && code < 400 {
			w.Header().Set("Location", elsewhere.URL()+"/moved/secret-token")
		}
		w.WriteHeader(code)
	}))
	p := newPublisher(t, webhook.Config{URL: srv.URL()})

	const (
		ack = iota
		permanent
		unavailable
		retryable
	)
	want := map[int]int{
		200: ack, 201: ack, 202: ack, 204: ack,
		301: unavailable, 302: unavailable, 303: unavailable, 307: unavailable, 308: unavailable,
		400: permanent, 401: unavailable, 403: unavailable, // broker.Misconfigured, a kind of Unavailable
		404: permanent, 405: permanent,
		410: permanent, 413: permanent, 415: permanent, 422: permanent,
		408: unavailable, 429: unavailable,
		409: retryable, 425: retryable,
		500: retryable, 501: retryable, 505: retryable,
		502: unavailable, 503: unavailable, 504: unavailable,
	}
	var msgs []broker.Message
	var codes []int
	for code := range want {
		m := message("order", strconv.Itoa(code), 1)
		m.Headers["Want-Status"] = strconv.Itoa(code)
		msgs = append(msgs, m)
		codes = append(codes, code)
	}
	for i, err := range publish(t, p, msgs...) {
		code := codes[i]
		var got int
		switch {
		case err == nil:
			got = ack
		case broker.IsPermanent(err):
			got = permanent
		case broker.IsUnavailable(err):
			got = unavailable
		default:
			got = retryable
		}
		name := []string{"ack", "permanent", "unavailable", "retryable"}
		if got != want[code] {
			t.Errorf("%d: %v: %s, want %s", code, err, name[got], name[want[code]])
		}
		var se *webhook.StatusError
		if err != nil && (!errors.As(err, &se) || se.StatusCode != code) {
			t.Errorf("%d: %v is not a *StatusError with the status", code, err)
		}
		if code >= 300 && code < 400 {
			if se == nil || se.Location != elsewhere.URL() || strings.Contains(err.Error(), "secret-token") {
				t.Errorf("%d: %v: want the redirect's origin %s and not its path", code, err, elsewhere.URL())
			}
		}
	}
	if n := redirected.Load(); n != 0 {
		t.Errorf("%d redirects followed", n)
	}
}

func TestUnreachableIsUnavailable(t *testing.T) {
	t.Parallel()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	// Credentials in the URL must not reach the error, which lands in last_error.
	p := newPublisher(t, webhook.Config{URL: "http://admin:pa55word-x@" + addr + "/hooks/t0ken-x?key=qu3ry-x"})
	results := publish(t, p, message("order", "42", 1), message("order", "42", 2), message("invoice", "7", 1))
	for i, err := range results {
		if i == 1 {
			if !errors.Is(err, broker.ErrPredecessorFailed) {
				t.Errorf("result 1: %v, want ErrPredecessorFailed", err)
			}
			continue
		}
		if !broker.IsUnavailable(err) {
			t.Errorf("result %d: %v, want unavailable", i, err)
		}
		for _, secret := range []string{"pa55word", "t0ken", "qu3ry", "admin"} {
			if strings.Contains(err.Error(), secret) {
				t.Errorf("result %d: %q reveals %q", i, err, secret)
			}
		}
	}
	if err := p.Ping(t.Context()); !broker.IsUnavailable(err) {
		t.Errorf("Ping: %v, want unavailable", err)
	}
}

// A 503 with Retry-After pauses the publisher: events fail at once, without a
// request, until the pause (capped at RetryAfterMax) is over.
func TestRetryAfterPauses(t *testing.T) {
	t.Parallel()
	rc := newReceiver()
	var answered atomic.Bool
	rc.answer = func(w http.ResponseWriter, _ *http.Request, _ int) bool {
		if !answered.Swap(true) {
			w.Header().Set("Retry-After", "120")
			w.WriteHeader(http.StatusServiceUnavailable)
			return true
		}
		return false
	}
	srv := serve(t, rc.handler())
	p := newPublisher(t, webhook.Config{URL: srv.URL(), RetryAfterMax: 30 * time.Second})
	var mu sync.Mutex
	now := time.Now()
	webhook.SetClock(p, func() time.Time {
		mu.Lock()
		defer mu.Unlock()
		return now
	})

	first, second := message("order", "1", 1), message("invoice", "2", 1)
	err := publish(t, p, first)[0]
	var se *webhook.StatusError
	if !broker.IsUnavailable(err) || !errors.As(err, &se) || se.RetryAfter != 120*time.Second {
		t.Fatalf("503 with Retry-After 120: %v, want unavailable with RetryAfter 2m", err)
	}
	if err := publish(t, p, second)[0]; !broker.IsUnavailable(err) || !strings.Contains(err.Error(), "Retry-After") {
		t.Errorf("during the pause: %v, want unavailable, naming Retry-After", err)
	}
	if n := len(rc.requestKeys()); n != 1 {
		t.Errorf("%d requests reached the receiver, want 1: the pause must not send", n)
	}
	mu.Lock()
	now = now.Add(31 * time.Second) // past RetryAfterMax
	mu.Unlock()
	for i, err := range publish(t, p, first, second) {
		if err != nil {
			t.Errorf("after the pause: result %d: %v", i, err)
		}
	}
}

// Events whose headers or path segments cannot be sent unchanged are refused
// permanently, before any request.
func TestUnsendableEventsArePermanent(t *testing.T) {
	t.Parallel()
	rc := newReceiver()
	srv := serve(t, rc.handler())
	p := newPublisher(t, webhook.Config{URL: srv.URL() + "/hooks/{aggregate_id}"})

	lineBreak := message("order", "1", 1)
	lineBreak.Headers["Multi"] = "line\nbreak"
	leadingSpace := message("order", "2", 1)
	leadingSpace.Headers["Space"] = " padded"
	badName := message("order", "3", 1)
	badName.Headers["Bad Name"] = "v"
	sameHeader := message("order", "4", 1)
	sameHeader.Headers["tenant"] = "other"
	idLineBreak := message("order", "5\r\n6", 1)
	dotDot := message("order", "..", 1)
	empty := message("order", "", 1)

	for name, m := range map[string]broker.Message{
		"line break in a header":             lineBreak,
		"leading space in a header":          leadingSpace,
		"header name with a space":           badName,
		"two headers differing in case only": sameHeader,
		"line break in the aggregate id":     idLineBreak,
		"aggregate id ..":                    dotDot,
		"empty aggregate id in the path":     empty,
	} {
		if err := publish(t, p, m)[0]; !broker.IsPermanent(err) {
			t.Errorf("%s: %v, want a permanent error", name, err)
		}
	}
	if n := len(rc.requestKeys()); n != 0 {
		t.Errorf("%d requests sent, want 0", n)
	}
}

// No more than MaxConcurrency requests are in flight, and that many are.
func TestMaxConcurrency(t *testing.T) {
	t.Parallel()
	const limit = 4
	var inFlight, peak atomic.Int64
	full := make(chan struct{})
	var once sync.Once
	rc := newReceiver()
	rc.answer = func(_ http.ResponseWriter, r *http.Request, _ int) bool {
		n := inFlight.Add(1)
		defer inFlight.Add(-1)
		for p := peak.Load(); n > p && !peak.CompareAndSwap(p, n); p = peak.Load() {
		}
		if n >= limit {
			once.Do(func() { close(full) })
		}
		// Hold the first requests until limit are in flight together.
		select {
		case <-full:
			return false
		case <-r.Context().Done():
			return true
		}
	}
	srv := serve(t, rc.handler())
	p := newPublisher(t, webhook.Config{
		URL:            srv.URL(),
		MaxConcurrency: limit,
		HTTPClient:     &http.Client{Transport: transport(t, nil)},
	})
	var msgs []broker.Message
	for seq := int64(1); seq <= 3; seq++ {
		for a := range 10 {
			msgs = append(msgs, message("order", strconv.Itoa(a), seq))
		}
	}
	for i, err := range publish(t, p, msgs...) {
		if err != nil {
			t.Errorf("result %d: %v", i, err)
		}
	}
	if n := peak.Load(); n != limit {
		t.Errorf("peak of %d requests in flight, want %d", n, limit)
	}
}

// Close fails the requests in flight as unavailable and waits for them; later
// publishes fail too.
func TestCloseFailsInFlight(t *testing.T) {
	t.Parallel()
	entered := make(chan struct{})
	var once sync.Once
	rc := newReceiver()
	rc.answer = func(_ http.ResponseWriter, r *http.Request, _ int) bool {
		once.Do(func() { close(entered) })
		<-r.Context().Done()
		return true
	}
	srv := serve(t, rc.handler())
	p := newPublisher(t, webhook.Config{URL: srv.URL()})

	done := make(chan []error)
	go func() { done <- p.Publish(context.Background(), []broker.Message{message("order", "42", 1)}) }()
	select {
	case <-entered:
	case <-time.After(10 * time.Second):
		t.Fatal("the request did not reach the receiver")
	}
	if err := p.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	select {
	case results := <-done:
		if !broker.IsUnavailable(results[0]) {
			t.Errorf("in flight at Close: %v, want unavailable", results[0])
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Publish did not return after Close")
	}
	if err := p.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	for i, err := range publish(t, p, message("order", "42", 1), message("order", "42", 2)) {
		if !broker.IsUnavailable(err) {
			t.Errorf("after Close: result %d: %v, want unavailable", i, err)
		}
	}
	if err := p.Ping(t.Context()); !broker.IsUnavailable(err) {
		t.Errorf("Ping after Close: %v, want unavailable", err)
	}
}

func TestPing(t *testing.T) {
	t.Parallel()
	var status atomic.Int64
	status.Store(http.StatusMethodNotAllowed)
	paths := make(chan string, 10)
	srv := serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodHead {
			paths <- r.URL.Path + " " + r.Header.Get("Authorization")
		}
		w.WriteHeader(int(status.Load()))
	}))
	p := newPublisher(t, webhook.Config{
		URL:    srv.URL() + "/hooks/{aggregate_type}/in",
		Header: http.Header{"Authorization": {"Bearer x"}},
	})
	if err := p.Ping(t.Context()); err != nil {
		t.Errorf("Ping answered 405: %v, want nil", err)
	}
	if got := <-paths; got != "/hooks/ Bearer x" {
		t.Errorf("HEAD %q, want the path before the placeholder, with Config.Header", got)
	}
	status.Store(http.StatusServiceUnavailable)
	if err := p.Ping(t.Context()); !broker.IsUnavailable(err) {
		t.Errorf("Ping answered 503: %v, want unavailable", err)
	}
}

func TestHTTPS(t *testing.T) {
	t.Parallel()
	rc := newReceiver()
	srv := httptest.NewUnstartedServer(rc.handler())
	srv.Config.ErrorLog = log.New(io.Discard, "", 0) // the refused handshake below
	srv.StartTLS()
	t.Cleanup(srv.Close)

	// The test server's certificate is trusted only by its own client.
	untrusting := newPublisher(t, webhook.Config{URL: srv.URL})
	if err := publish(t, untrusting, message("order", "42", 1))[0]; !broker.IsUnavailable(err) {
		t.Errorf("untrusted certificate: %v, want unavailable", err)
	}
	client := srv.Client()
	t.Cleanup(client.CloseIdleConnections)
	p := newPublisher(t, webhook.Config{URL: srv.URL, HTTPClient: client})
	if err := publish(t, p, message("order", "42", 1))[0]; err != nil {
		t.Fatalf("Publish with the server's client: %v", err)
	}
	if n := len(rc.messages()); n != 1 {
		t.Errorf("receiver stored %d messages, want 1", n)
	}
}

func TestAllowUnsigned(t *testing.T) {
	t.Parallel()
	sigs := make(chan []string, 1)
	srv := serve(t, http.HandlerFunc(func(_ http.ResponseWriter, r *http.Request) {
		sigs <- r.Header.Values(webhook.HeaderSignature)
	}))
	p := newPublisher(t, webhook.Config{URL: srv.URL(), AllowUnsigned: true})
	if err := publish(t, p, message("order", "42", 1))[0]; err != nil {
		t.Fatal(err)
	}
	if got := <-sigs; len(got) != 0 {
		t.Errorf("unsigned publisher sent %s %q", webhook.HeaderSignature, got)
	}
}

func TestConfigErrorsNameTheField(t *testing.T) {
	t.Parallel()
	const url = "https://admin:pa55word-x@hooks.example.com/t0ken-x?key=qu3ry-x"
	for field, cfg := range map[string]webhook.Config{
		"Config.URL":            {URL: "ftp://admin:pa55word-x@hooks.example.com/t0ken-x", Secret: secret},
		"Config.Secret":         {URL: url},
		"Config.Secret is 5":    {URL: url, Secret: []byte("short")},
		"Config.Timeout":        {URL: url, Secret: secret, Timeout: -time.Second},
		"Config.MaxConcurrency": {URL: url, Secret: secret, MaxConcurrency: -1},
		"Config.Header":         {URL: url, Secret: secret, Header: http.Header{"Idempotency-Key": {"x"}}},
		"Config.Header: Outbox": {URL: url, Secret: secret, Header: http.Header{"outbox-signature": {"x"}}},
		"Config.Header: X-Bad":  {URL: url, Secret: secret, Header: http.Header{"X-Bad": {"a\nb"}}},
	} {
		if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), field) {
			t.Errorf("%s: Validate: %v does not name the field", field, err)
		}
		_, err := webhook.New(&cfg)
		if err == nil || !strings.Contains(err.Error(), field) {
			t.Errorf("%s: error %v does not name the field", field, err)
			continue
		}
		for _, secret := range []string{"pa55word", "t0ken", "qu3ry"} {
			if strings.Contains(err.Error(), secret) {
				t.Errorf("%s: %q reveals %q", field, err, secret)
			}
		}
	}
	if _, err := webhook.New(&webhook.Config{URL: url, AllowUnsigned: true}); err != nil {
		t.Errorf("AllowUnsigned without a secret: %v", err)
	}
	// URL and Secret have no defaults: a nil Config is refused, not a panic.
	var nilCfg *webhook.Config
	if err := nilCfg.Validate(); err == nil || !strings.Contains(err.Error(), "Config.URL") {
		t.Errorf("nil Config: %v", err)
	}
	if _, err := webhook.New(nil); err == nil {
		t.Error("New(nil): no error")
	}
	err := (&webhook.Config{URL: url, Timeout: -1, MaxConcurrency: -1}).Validate()
	for _, field := range []string{"Config.Secret", "Config.Timeout", "Config.MaxConcurrency"} {
		if err == nil || !strings.Contains(err.Error(), field) {
			t.Errorf("three invalid fields: %v, want %s named", err, field)
		}
	}
}
