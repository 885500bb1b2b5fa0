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
