package webhook_test

import (
	"bytes"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pgoutbox/pgoutbox/broker"
	"github.com/pgoutbox/pgoutbox/broker/webhook"
	"github.com/pgoutbox/pgoutbox/internal/systool"
)

var (
	stdKey   = []byte("standard webhooks key, 32 bytes.")
	otherKey = []byte("another standard key of 32 bytes")
)

// captured is a request as the receiver got it.
type captured struct {
	header http.Header
	body   []byte
}

// capture serves an endpoint that keeps every request and answers 204.
func capture(t *testing.T) (*server, func() []captured) {
	var mu sync.Mutex
	var got []captured
	srv := serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		mu.Lock()
		got = append(got, captured{r.Header.Clone(), body})
		mu.Unlock()
		w.WriteHeader(http.StatusNoContent)
	}))
	return srv, func() []captured {
		mu.Lock()
		defer mu.Unlock()
		return append([]captured(nil), got...)
	}
}

// libraryCase is one request for the standardwebhooks library to verify.
type libraryCase struct {
	Secret  int               `json:"secret"` // index into the secrets
	Headers map[string]string `json:"headers"`
	Body    []byte            `json:"body"`
}

// nodeHeaders returns h as Node's http module hands it to a handler: names in
// lower case, the values of a repeated header joined with ", ".
func nodeHeaders(h http.Header) map[string]string {
	out := make(map[string]string, len(h))
	for name, values := range h {
		out[strings.ToLower(name)] = strings.Join(values, ", ")
	}
	return out
}

// verifyWithLibrary runs the reference verifier, the npm package
// standardwebhooks, on cases; it returns "" for an accepted case, else the
// library's error. Secrets and requests go through stdin.
func verifyWithLibrary(t *testing.T, secrets []string, cases []libraryCase) []string {
	t.Helper()
	lib := systool.NeedNPM(t, systool.NPM{Package: "standardwebhooks", Version: "1.3.0"})
	node := systool.Need(t, systool.Tool{Program: "node", Package: "nodejs"})
	script, err := filepath.Abs(filepath.Join("testdata", "standardwebhooks_verify.js"))
	if err != nil {
		t.Fatal(err)
	}
	in, err := json.Marshal(map[string]any{"secrets": secrets, "cases": cases})
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(node, script)
	cmd.Env = append(os.Environ(), "NODE_PATH="+lib.NodeModules())
	cmd.Stdin = bytes.NewReader(in)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("node %s: %v: %s", script, err, stderr.String())
	}
	var results []struct {
		OK    bool   `json:"ok"`
		Error string `json:"error"`
	}
	if err := json.Unmarshal(out, &results); err != nil || len(results) != len(cases) {
		t.Fatalf("node said %q (%v), want %d results", out, err, len(cases))
	}
	refusals := make([]string, len(results))
	for i, r := range results {
		if !r.OK {
			refusals[i] = "refused: " + r.Error
		}
	}
	return refusals
}

// Real deliveries signed the Standard Webhooks way pass the reference library
// and StandardVerifier; forged variants of them are refused by both, where the
// library's laxer reading of repeated headers is pinned down as it is.
func TestStandardWebhooksReferenceLibrary(t *testing.T) {
	t.Parallel()
	srv, requests := capture(t)
	p := newPublisher(t, webhook.Config{URL: srv.URL() + "/hooks", StandardSecret: stdKey})
	both := newPublisher(t, webhook.Config{URL: srv.URL() + "/hooks", Secret: secret, StandardSecret: stdKey})
	old := newPublisher(t, webhook.Config{URL: srv.URL() + "/hooks", StandardSecret: stdKey})
	webhook.SetClock(old, func() time.Time { return time.Now().Add(-10 * time.Minute) })

	forging := message("order", "s1", 1)
	forging.Headers["webhook-signature"] = "v1," + base64.StdEncoding.EncodeToString(make([]byte, 32))
	forging.Headers["Webhook-Id"] = "forged"
	plain, signedBoth, stale := message("order", "s2", 1), message("order", "s3", 1), message("order", "s4", 1)
	for _, r := range [][]error{
		publish(t, p, forging, plain),
		publish(t, both, signedBoth),
		publish(t, old, stale),
	} {
		for _, err := range r {
			if err != nil {
				t.Fatalf("publish: %v", err)
			}
		}
	}
	byID := map[string]captured{}
	for _, c := range requests() {
		if ids, sigs := c.header.Values(webhook.HeaderWebhookID), c.header.Values(webhook.HeaderWebhookSignature); len(ids) != 1 || len(sigs) != 1 ||
			ids[0] != c.header.Get(webhook.HeaderIdempotencyKey) || sigs[0] == forging.Headers["webhook-signature"] {
			t.Fatalf("request headers %v: want one webhook-id (the event id) and the publisher's own signature", c.header)
		}
		byID[c.header.Get(webhook.HeaderWebhookID)] = c
	}
	if len(byID) != 4 {
		t.Fatalf("%d events received, want 4", len(byID))
	}
	// req returns a copy of the request of m, to change at will.
	req := func(m broker.Message) captured {
		c := byID[m.EventID.String()]
		return captured{c.header.Clone(), bytes.Clone(c.body)}
	}
	// Both signatures on one request: Outbox-Signature still verifies.
	c := req(signedBoth)
	if err := (&webhook.Verifier{Secrets: [][]byte{secret}}).Verify(request(c.header, "/hooks"), c.body); err != nil {
		t.Errorf("Outbox-Signature beside the standard one: %v", err)
	}

	type variant struct {
		name     string
		key      []byte
		req      captured
		goWant   error
		libTakes bool
	}
	variants := []variant{
		{"authentic, a producer's webhook-* headers dropped", stdKey, req(forging), nil, true},
		{"authentic", stdKey, req(plain), nil, true},
		{"authentic, beside Outbox-Signature", stdKey, req(signedBoth), nil, true},
		{"replayed old timestamp", stdKey, req(stale), webhook.ErrTooOld, false},
		{"wrong secret", otherKey, req(plain), webhook.ErrBadSignature, false},
	}
	c = req(plain)
	c.body = bytes.Replace(c.body, []byte("9.50"), []byte("0.01"), 1)
	variants = append(variants, variant{"tampered body", stdKey, c, webhook.ErrBadSignature, false})
	c = req(plain)
	c.header.Set(webhook.HeaderWebhookID, forging.EventID.String())
	c.header.Set(webhook.HeaderIdempotencyKey, forging.EventID.String())
	variants = append(variants, variant{"tampered id", stdKey, c, webhook.ErrBadSignature, false})
	c = req(stale)
	c.header.Set(webhook.HeaderWebhookTimestamp, strconv.FormatInt(time.Now().Unix(), 10))
	variants = append(variants, variant{"old request, timestamp made fresh", stdKey, c, webhook.ErrBadSignature, false})
	c = req(plain)
	c.header.Add(webhook.HeaderWebhookID, forging.EventID.String())
	variants = append(variants, variant{"duplicated webhook-id", stdKey, c, webhook.ErrAmbiguousRequest, false})
	// Node joins the two values with ", "; the library splits that on spaces and
	// the second entry is the signature itself, so it accepts: harmless, the
	// signature is still the publisher's, but Go refuses the ambiguity.
	c = req(plain)
	c.header.Add(webhook.HeaderWebhookSignature, c.header.Get(webhook.HeaderWebhookSignature))
	variants = append(variants, variant{"duplicated webhook-signature", stdKey, c, webhook.ErrAmbiguousRequest, true})
	// Key rotation: the sender signs with an old and a new key.
	c = req(plain)
	c.header.Set(webhook.HeaderWebhookSignature, standardSignature(otherKey, c)+" "+c.header.Get(webhook.HeaderWebhookSignature))
	variants = append(variants, variant{"two signatures, the second valid", stdKey, c, nil, true})

	secrets := []string{webhook.FormatStandardSecret(stdKey), webhook.FormatStandardSecret(otherKey)}
	cases := make([]libraryCase, len(variants))
	for i, v := range variants {
		cases[i] = libraryCase{Headers: nodeHeaders(v.req.header), Body: v.req.body}
		if bytes.Equal(v.key, otherKey) {
			cases[i].Secret = 1
		}
	}
	refusals := verifyWithLibrary(t, secrets, cases)
	for i, v := range variants {
		if (refusals[i] == "") != v.libTakes {
			t.Errorf("%s: the standardwebhooks library %s, want accepted=%v", v.name, or(refusals[i], "accepted"), v.libTakes)
		}
		err := (&webhook.StandardVerifier{Secrets: [][]byte{v.key}}).Verify(request(v.req.header, "/hooks"), v.req.body)
		if v.goWant == nil && err != nil || v.goWant != nil && !errors.Is(err, v.goWant) {
			t.Errorf("%s: StandardVerifier.Verify = %v, want %v", v.name, err, v.goWant)
		}
	}
}

func or(s, alt string) string {
	if s == "" {
		return alt
	}
	return s
}

// standardSignature signs c's id, timestamp and body with key, as another sender would.
func standardSignature(key []byte, c captured) string {
	mac := hmac.New(sha256.New, key)
	mac.Write([]byte(c.header.Get(webhook.HeaderWebhookID) + "." + c.header.Get(webhook.HeaderWebhookTimestamp) + "."))
	mac.Write(c.body)
	return "v1," + base64.StdEncoding.EncodeToString(mac.Sum(nil))
}

// The text form of a secret is checked at the boundary; errors never quote it.
func TestParseStandardSecret(t *testing.T) {
	t.Parallel()
	key, err := webhook.ParseStandardSecret(webhook.FormatStandardSecret(stdKey))
	if err != nil || !bytes.Equal(key, stdKey) {
		t.Fatalf("ParseStandardSecret(FormatStandardSecret(k)) = %q, %v", key, err)
	}
	b64 := base64.StdEncoding.EncodeToString
	for _, s := range []string{
		"", b64(stdKey), "whsec" + b64(stdKey), "WHSEC_" + b64(stdKey),
		"whsec_" + b64(stdKey)[1:], "whsec_" + base64.RawStdEncoding.EncodeToString(stdKey[:31]),
		"whsec_" + base64.URLEncoding.EncodeToString(bytes.Repeat([]byte{0xfb}, 30)),
		"whsec_" + b64(stdKey) + "\n", "whsec_" + b64(stdKey[:23]), "whsec_" + b64(bytes.Repeat(stdKey, 3)),
	} {
		_, err := webhook.ParseStandardSecret(s)
		if err == nil {
			t.Errorf("ParseStandardSecret(%q) accepted it", s)
			continue
		}
		if rest := strings.TrimPrefix(s, "whsec_"); len(rest) > 8 && strings.Contains(err.Error(), rest[:8]) {
			t.Errorf("ParseStandardSecret: the error quotes the value: %v", err)
		}
	}
}

func TestStandardConfig(t *testing.T) {
	t.Parallel()
	for name, cfg := range map[string]webhook.Config{
		"Config.StandardSecret is 23 bytes":    {URL: "https://h/x", StandardSecret: stdKey[:23]},
		"Config.StandardSecret is 65 bytes":    {URL: "https://h/x", StandardSecret: bytes.Repeat([]byte{1}, 65)},
		"Config.Header: Webhook-Signature is":  {URL: "https://h/x", StandardSecret: stdKey, Header: http.Header{"webhook-signature": {"v1,x"}}},
		"Config.Header: Webhook-Id is set":     {URL: "https://h/x", Secret: secret, Header: http.Header{"Webhook-Id": {"x"}}},
		"Config.Secret is required (or Config": {URL: "https://h/x"},
	} {
		if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), name) {
			t.Errorf("%s: Validate = %v", name, err)
		}
	}
	if err := (&webhook.Config{URL: "https://h/x", StandardSecret: stdKey}).Validate(); err != nil {
		t.Errorf("StandardSecret alone: %v", err)
	}
}

// StandardVerifier refuses what it cannot read unambiguously, naming the
// problem without quoting the headers.
func TestStandardVerifierMalformed(t *testing.T) {
	t.Parallel()
	now := time.Date(2025, 6, 1, 12, 0, 0, 0, time.UTC)
	body := []byte(`{"total":"9.50"}`)
	const id = "01975a2c-0000-7000-8000-000000000001"
	valid := webhook.SignStandard(stdKey, id, now, body)
	v := &webhook.StandardVerifier{Secrets: [][]byte{otherKey, stdKey}, Now: func() time.Time { return now }}
	headers := func(id, ts, sig string) http.Header {
		h := http.Header{}
		for name, value := range map[string]string{webhook.HeaderWebhookID: id, webhook.HeaderWebhookTimestamp: ts, webhook.HeaderWebhookSignature: sig} {
			if value != "" {
				h.Set(name, value)
			}
		}
		return h
	}
	ts := strconv.FormatInt(now.Unix(), 10)
	mac32 := base64.StdEncoding.EncodeToString(make([]byte, 32))
	for name, c := range map[string]struct {
		h    http.Header
		want error
	}{
		"authentic":                     {headers(id, ts, valid), nil},
		"other versions ignored":        {headers(id, ts, "v1a,"+mac32+" "+valid+" v2,xyz"), nil},
		"no id":                         {headers("", ts, valid), webhook.ErrNoStandardSignature},
		"no timestamp":                  {headers(id, "", valid), webhook.ErrNoStandardSignature},
		"no signature":                  {headers(id, ts, ""), webhook.ErrNoStandardSignature},
		"id with a space":               {headers("a b", ts, valid), webhook.ErrMalformedStandardSignature},
		"id too long":                   {headers(strings.Repeat("i", 257), ts, valid), webhook.ErrMalformedStandardSignature},
		"timestamp with a leading zero": {headers(id, "0"+ts, valid), webhook.ErrMalformedStandardSignature},
		"negative timestamp":            {headers(id, "-"+ts, valid), webhook.ErrMalformedStandardSignature},
		"timestamp of 13 digits":        {headers(id, "1"+ts+"00", valid), webhook.ErrMalformedStandardSignature},
		"no comma":                      {headers(id, ts, "v1"+mac32), webhook.ErrMalformedStandardSignature},
		"not base64":                    {headers(id, ts, "v1,"+strings.Repeat("!", 44)), webhook.ErrMalformedStandardSignature},
		"a MAC of 16 bytes":             {headers(id, ts, "v1,"+base64.StdEncoding.EncodeToString(make([]byte, 16))), webhook.ErrMalformedStandardSignature},
		"no v1":                         {headers(id, ts, "v1a,"+mac32), webhook.ErrMalformedStandardSignature},
		"two spaces":                    {headers(id, ts, valid+"  "+valid), webhook.ErrMalformedStandardSignature},
		"nine entries":                  {headers(id, ts, strings.Repeat(valid+" ", 8)+valid), webhook.ErrMalformedStandardSignature},
		"over 1 KiB":                    {headers(id, ts, valid+" v9,"+strings.Repeat("x", 1024)), webhook.ErrMalformedStandardSignature},
		"dated ahead":                   {headers(id, strconv.FormatInt(now.Add(6*time.Minute).Unix(), 10), webhook.SignStandard(stdKey, id, now.Add(6*time.Minute), body)), webhook.ErrTooNew},
		"Idempotency-Key not the id": {func() http.Header {
			h := headers(id, ts, valid)
			h.Set(webhook.HeaderIdempotencyKey, "other")
			return h
		}(), webhook.ErrBadSignature},
		"two Idempotency-Keys": {func() http.Header { h := headers(id, ts, valid); h["Idempotency-Key"] = []string{id, "x"}; return h }(), webhook.ErrAmbiguousRequest},
		"two timestamps":       {func() http.Header { h := headers(id, ts, valid); h.Add(webhook.HeaderWebhookTimestamp, ts); return h }(), webhook.ErrAmbiguousRequest},
	} {
		err := v.Verify(request(c.h, "/hooks"), body)
		if c.want == nil && err != nil || c.want != nil && !errors.Is(err, c.want) {
			t.Errorf("%s: Verify = %v, want %v", name, err, c.want)
		}
		if err != nil && strings.Contains(err.Error(), valid[3:11]) {
			t.Errorf("%s: the error quotes the signature: %v", name, err)
		}
	}
	for name, bad := range map[string]*webhook.StandardVerifier{
		"StandardVerifier.Secrets is empty": {},
		"StandardVerifier.Secrets[1] is 5":  {Secrets: [][]byte{stdKey, []byte("short")}},
		"StandardVerifier.Tolerance":        {Secrets: [][]byte{stdKey}, Tolerance: -time.Second},
	} {
		if err := bad.Validate(); err == nil || !strings.Contains(err.Error(), name) {
			t.Errorf("%s: Validate = %v", name, err)
		}
	}
}

// The middleware passes an authentic request on with its body and answers 401
// otherwise.
func TestStandardVerifierHandler(t *testing.T) {
	t.Parallel()
	var got []byte
	h := (&webhook.StandardVerifier{Secrets: [][]byte{stdKey}}).Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got, _ = io.ReadAll(r.Body)
		w.WriteHeader(http.StatusAccepted)
	}))
	srv := serve(t, h)
	p := newPublisher(t, webhook.Config{URL: srv.URL() + "/hooks", StandardSecret: stdKey})
	m := message("order", "h1", 1)
	if err := publish(t, p, m)[0]; err != nil || !bytes.Equal(got, m.Payload) {
		t.Errorf("authentic: %v, next handler read %q", err, got)
	}
	wrong := newPublisher(t, webhook.Config{URL: srv.URL() + "/hooks", StandardSecret: otherKey})
	if err := publish(t, wrong, message("order", "h2", 1))[0]; err == nil || !strings.Contains(err.Error(), "401") {
		t.Errorf("wrong key: %v, want a 401", err)
	}
}

// A receiver echoing the request in its refusal gets neither the key (in any
// form) nor the signature into the error the relay stores.
func TestStandardSecretNotInErrors(t *testing.T) {
	t.Parallel()
	var sig string
	var mu sync.Mutex
	srv := serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		sig = r.Header.Get(webhook.HeaderWebhookSignature)
		mu.Unlock()
		w.WriteHeader(http.StatusForbidden)
		_ = r.Header.Write(w)
		_, _ = io.WriteString(w, "expected key "+webhook.FormatStandardSecret(stdKey)+" raw "+string(stdKey))
	}))
	p := newPublisher(t, webhook.Config{URL: srv.URL() + "/hooks", StandardSecret: stdKey})
	err := publish(t, p, message("order", "e1", 1))[0]
	if err == nil {
		t.Fatal("no error")
	}
	mu.Lock()
	defer mu.Unlock()
	_, mac, _ := strings.Cut(sig, ",")
	for _, s := range []string{base64.StdEncoding.EncodeToString(stdKey)[:12], string(stdKey[:12]), mac[:12]} {
		if strings.Contains(err.Error(), s) {
			t.Errorf("the error holds %q: %v", s, err)
		}
	}
}

// Whatever the headers, Verify neither panics nor accepts a request unless its
// webhook-signature holds the MAC of its own id, timestamp and body.
func FuzzStandardVerify(f *testing.F) {
	now := time.Unix(1748779200, 0)
	body := []byte(`{"total":"9.50"}`)
	f.Add("evt-1", "1748779200", webhook.SignStandard(stdKey, "evt-1", now, body))
	f.Add("evt-1", "1748779200", "v1a,x v1,"+strings.Repeat("A", 43)+"=")
	f.Add("a.1", "01", "v1,, v1,")
	v := &webhook.StandardVerifier{Secrets: [][]byte{stdKey}, Now: func() time.Time { return now }}
	f.Fuzz(func(t *testing.T, id, ts, sig string) {
		h := http.Header{webhook.HeaderWebhookID: {id}, webhook.HeaderWebhookTimestamp: {ts}, webhook.HeaderWebhookSignature: {sig}}
		if v.Verify(request(h, "/hooks"), body) != nil {
			return
		}
		t0, err := strconv.ParseInt(ts, 10, 64)
		if err != nil || !strings.Contains(" "+sig+" ", " "+webhook.SignStandard(stdKey, id, time.Unix(t0, 0), body)+" ") {
			t.Fatalf("accepted id %q, timestamp %q, signature %q", id, ts, sig)
		}
	})
}
