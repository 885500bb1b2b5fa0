package webhook_test

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/pgoutbox/pgoutbox/broker/webhook"
	"github.com/pgoutbox/pgoutbox/wire"
)

// target is the path and query of the requests of these tests.
const target = "/hooks/order?tenant=acme"

// request returns a POST request to target (a path and query) with header h, as
// a receiver's handler gets it.
func request(h http.Header, target string) *http.Request {
	r := httptest.NewRequest(http.MethodPost, target, nil)
	r.Header = h
	return r
}

// signedRequest returns the headers and body of a request to target as the
// publisher signs it, at time at with key.
func signedRequest(key []byte, at time.Time) (http.Header, []byte) {
	m := message("order", "42", 1)
	h := http.Header{}
	for name, v := range m.WireHeaders() {
		h.Set(name, v)
	}
	h.Set("Content-Type", "application/json")
	h.Set(webhook.HeaderIdempotencyKey, m.EventID.String())
	h.Set(webhook.HeaderSignature, webhook.Sign(key, at, request(h, target), m.Payload))
	return h, m.Payload
}

func TestVerify(t *testing.T) {
	t.Parallel()
	now := time.Date(2025, 6, 1, 12, 0, 0, 0, time.UTC)
	other := []byte("another secret of 32 bytes......")
	v := &webhook.Verifier{Secrets: [][]byte{secret}, Now: func() time.Time { return now }}

	for name, c := range map[string]struct {
		change func(h http.Header, body []byte) (http.Header, []byte)
		want   error
	}{
		"authentic": {func(h http.Header, b []byte) (http.Header, []byte) { return h, b }, nil},
		"tampered body": {func(h http.Header, b []byte) (http.Header, []byte) {
			return h, []byte(strings.Replace(string(b), "9.50", "0.01", 1))
		}, webhook.ErrBadSignature},
		"tampered event type": {func(h http.Header, b []byte) (http.Header, []byte) {
			h.Set(wire.HeaderEventType, "deleted")
			return h, b
		}, webhook.ErrBadSignature},
		"tampered sequence": {func(h http.Header, b []byte) (http.Header, []byte) {
			h.Set(wire.HeaderAggregateSequence, "2")
			return h, b
		}, webhook.ErrBadSignature},
		"Idempotency-Key not the event id": {func(h http.Header, b []byte) (http.Header, []byte) {
			h.Set(webhook.HeaderIdempotencyKey, "fresh-key")
			return h, b
		}, webhook.ErrBadSignature},
		"wrong secret": {func(h http.Header, b []byte) (http.Header, []byte) {
			h.Set(webhook.HeaderSignature, webhook.Sign(other, now, request(h, target), b))
			return h, b
		}, webhook.ErrBadSignature},
		"old timestamp": {func(h http.Header, b []byte) (http.Header, []byte) {
			h.Set(webhook.HeaderSignature, webhook.Sign(secret, now.Add(-6*time.Minute), request(h, target), b))
			return h, b
		}, webhook.ErrTooOld},
		"future timestamp": {func(h http.Header, b []byte) (http.Header, []byte) {
			h.Set(webhook.HeaderSignature, webhook.Sign(secret, now.Add(6*time.Minute), request(h, target), b))
			return h, b
		}, webhook.ErrTooNew},
		"within tolerance": {func(h http.Header, b []byte) (http.Header, []byte) {
			h.Set(webhook.HeaderSignature, webhook.Sign(secret, now.Add(-4*time.Minute), request(h, target), b))
			return h, b
		}, nil},
		"timestamp changed": {func(h http.Header, b []byte) (http.Header, []byte) {
			sig := h.Get(webhook.HeaderSignature)
			h.Set(webhook.HeaderSignature, "t=1748779201"+sig[strings.IndexByte(sig, ','):])
			return h, b
		}, webhook.ErrBadSignature},
		"missing header": {func(h http.Header, b []byte) (http.Header, []byte) {
			h.Del(webhook.HeaderSignature)
			return h, b
		}, webhook.ErrNoSignature},
		"two headers": {func(h http.Header, b []byte) (http.Header, []byte) {
			h.Add(webhook.HeaderSignature, h.Get(webhook.HeaderSignature))
			return h, b
		}, webhook.ErrAmbiguousRequest},
		"v1 alone (v2 stripped)": {func(h http.Header, b []byte) (http.Header, []byte) {
			sig := h.Get(webhook.HeaderSignature)
			h.Set(webhook.HeaderSignature, sig[:strings.Index(sig, ",v2=")])
			return h, b
		}, webhook.ErrMalformedSignature},
		"v2 of another request beside a valid v1": {func(h http.Header, b []byte) (http.Header, []byte) {
			sig := h.Get(webhook.HeaderSignature)
			h.Set(webhook.HeaderSignature, sig[:strings.Index(sig, ",v2=")]+",v2="+strings.Repeat("ab", 32))
			return h, b
		}, webhook.ErrBadSignature},
		"tampered content type": {func(h http.Header, b []byte) (http.Header, []byte) {
			h.Set("Content-Type", "application/x-www-form-urlencoded")
			return h, b
		}, webhook.ErrBadSignature},
		"content type removed": {func(h http.Header, b []byte) (http.Header, []byte) {
			h.Del("Content-Type")
			return h, b
		}, webhook.ErrBadSignature},
		"relabelled as a CloudEvent": {func(h http.Header, b []byte) (http.Header, []byte) {
			// The v1 attack: the same positions under Ce-* names, an unsigned source.
			for from, to := range map[string]string{
				wire.HeaderEventID: "Ce-Id", wire.HeaderEventType: "Ce-Type", wire.HeaderAggregateType: "Ce-Pgoutboxaggtype",
				wire.HeaderAggregateID: "Ce-Pgoutboxaggid", wire.HeaderAggregateSequence: "Ce-Pgoutboxseq",
				wire.HeaderSchemaVersion: "Ce-Pgoutboxschemaver", wire.HeaderOccurredAt: "Ce-Time",
			} {
				h.Set(to, h.Get(from))
				h.Del(from)
			}
			h.Set("Ce-Specversion", "1.0")
			h.Set("Ce-Source", "/forged")
			return h, b
		}, webhook.ErrBadSignature},
	} {
		h, body := signedRequest(secret, now)
		h, body = c.change(h, body)
		err := v.Verify(request(h, target), body)
		if c.want == nil && err != nil || c.want != nil && !errors.Is(err, c.want) {
			t.Errorf("%s: Verify = %v, want %v", name, err, c.want)
		}
	}

	// A second value of any signed header: a receiver may read either one.
	for _, name := range []string{
		wire.HeaderEventID, wire.HeaderEventType, wire.HeaderAggregateType, wire.HeaderAggregateID,
		wire.HeaderAggregateSequence, wire.HeaderSchemaVersion, wire.HeaderOccurredAt,
		"Content-Type", webhook.HeaderIdempotencyKey,
	} {
		for _, second := range []string{"forged", ""} {
			h, body := signedRequest(secret, now)
			h.Add(name, second)
			if err := v.Verify(request(h, target), body); !errors.Is(err, webhook.ErrAmbiguousRequest) {
				t.Errorf("a second %s %q: Verify = %v, want ErrAmbiguousRequest", name, second, err)
			}
			h, body = signedRequest(secret, now)
			h[name] = append([]string{second}, h[name]...) // the forged one first
			if err := v.Verify(request(h, target), body); !errors.Is(err, webhook.ErrAmbiguousRequest) {
				t.Errorf("%s %q before the signed one: Verify = %v, want ErrAmbiguousRequest", name, second, err)
			}
		}
	}
	// Another CloudEvents binding's attributes beside a signed default request: a
	// receiver decoding any binding (inbox.Decode) would take the event from them.
	for _, spec := range []string{"Ce_specversion", "Cloudevents_specversion", "ce_specversion"} {
		h, body := signedRequest(secret, now)
		h.Set(spec, "1.0")
		h.Set(strings.Replace(spec, "specversion", "id", 1), "01a241ce-0000-7000-8000-000000000000")
		if err := v.Verify(request(h, target), body); !errors.Is(err, webhook.ErrAmbiguousRequest) {
			t.Errorf("with %s: Verify = %v, want ErrAmbiguousRequest", spec, err)
		}
	}
	// Where it was sent is signed: another path, query or method.
	for _, change := range []func(*http.Request){
		func(r *http.Request) { r.URL.Path = "/hooks/other" },
		func(r *http.Request) { r.URL.RawQuery = "tenant=other" },
		func(r *http.Request) { r.URL.RawQuery = "" },
		func(r *http.Request) { r.Method = http.MethodPut },
	} {
		h, body := signedRequest(secret, now)
		r := request(h, target)
		change(r)
		if err := v.Verify(r, body); !errors.Is(err, webhook.ErrBadSignature) {
			t.Errorf("request %s %s: Verify = %v, want ErrBadSignature", r.Method, r.URL.RequestURI(), err)
		}
	}
}

// While a secret is rotated the receiver accepts both, and a sender may sign with
// both: one v1 per secret.
func TestVerifyRotatedSecrets(t *testing.T) {
	t.Parallel()
	old, next := []byte("the old secret, 32 bytes long..."), []byte("the new secret, 32 bytes long...")
	v := &webhook.Verifier{Secrets: [][]byte{next, old}}
	now := time.Now()
	for name, key := range map[string][]byte{"old": old, "new": next} {
		h, body := signedRequest(key, now)
		if err := v.Verify(request(h, target), body); err != nil {
			t.Errorf("signed with the %s secret: %v", name, err)
		}
	}
	h, body := signedRequest([]byte("an unrelated secret, 32 bytes..."), now)
	if err := v.Verify(request(h, target), body); !errors.Is(err, webhook.ErrBadSignature) {
		t.Errorf("signed with neither: %v, want ErrBadSignature", err)
	}
	// A sender signing with both, the first v1 not matching this receiver.
	h, body = signedRequest(next, now)
	unknown := webhook.Sign([]byte("an unrelated secret, 32 bytes..."), now, request(h, target), body)
	known := h.Get(webhook.HeaderSignature)
	h.Set(webhook.HeaderSignature, unknown+known[strings.IndexByte(known, ','):])
	if err := (&webhook.Verifier{Secrets: [][]byte{next}}).Verify(request(h, target), body); err != nil {
		t.Errorf("two v1 signatures, the second valid: %v", err)
	}
}

func TestVerifierConfig(t *testing.T) {
	t.Parallel()
	h, body := signedRequest(secret, time.Now())
	for name, v := range map[string]*webhook.Verifier{
		"Verifier.Secrets is empty": {},
		"Verifier.Secrets[1]":       {Secrets: [][]byte{secret, []byte("short")}},
		"Verifier.Tolerance":        {Secrets: [][]byte{secret}, Tolerance: -time.Second},
	} {
		if err := v.Verify(request(h, target), body); err == nil || !strings.Contains(err.Error(), name) {
			t.Errorf("%s: Verify = %v", name, err)
		}
	}
}

func TestVerifierHandler(t *testing.T) {
	t.Parallel()
	var got []byte
	v := &webhook.Verifier{Secrets: [][]byte{secret}, MaxBody: 64}
	h := v.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got = make([]byte, r.ContentLength)
		_, _ = r.Body.Read(got)
		w.WriteHeader(http.StatusAccepted)
	}))
	serveRequest := func(header http.Header, body []byte) *httptest.ResponseRecorder {
		r := httptest.NewRequest(http.MethodPost, target, strings.NewReader(string(body)))
		r.Header = header
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		return w
	}

	header, body := signedRequest(secret, time.Now())
	if w := serveRequest(header, body); w.Code != http.StatusAccepted || string(got) != string(body) {
		t.Errorf("authentic: %d, next handler read %q; want 202 and %q", w.Code, got, body)
	}
	header, _ = signedRequest(secret, time.Now())
	if w := serveRequest(header, []byte(`{"total":"0.01"}`)); w.Code != http.StatusUnauthorized ||
		!strings.Contains(w.Body.String(), "signature does not match") {
		t.Errorf("tampered: %d %q, want 401 with the reason", w.Code, w.Body)
	}
	long := []byte(`"` + strings.Repeat("x", 100) + `"`)
	header.Set(webhook.HeaderSignature, webhook.Sign(secret, time.Now(), request(header, target), long))
	if w := serveRequest(header, long); w.Code != http.StatusRequestEntityTooLarge {
		t.Errorf("body over MaxBody: %d, want 413", w.Code)
	}
	bad := (&webhook.Verifier{}).Handler(http.NotFoundHandler())
	w := httptest.NewRecorder()
	bad.ServeHTTP(w, httptest.NewRequest(http.MethodPost, "/", nil))
	if w.Code != http.StatusInternalServerError {
		t.Errorf("misconfigured verifier: %d, want 500", w.Code)
	}
}

// FuzzVerifyRequest: whatever header a forger adds (a second value of a signed
// one included) and whatever path and query it sends the request to, Verify
// accepts only a request whose signed headers, path and query are the ones
// signed, each header once, with no other CloudEvents binding's specversion.
func FuzzVerifyRequest(f *testing.F) {
	for _, c := range [][3]string{
		{"Tenant", "acme", target}, {wire.HeaderAggregateID, "43", target}, {"Content-Type", "text/plain", target},
		{webhook.HeaderIdempotencyKey, "k", target}, {"Ce-Specversion", "1.0", target}, {"Ce_specversion", "1.0", target},
		{"Ce-Source", "/forged", target}, {"Outbox-Signature", "t=1,v2=00", target}, {"X", "y", "/hooks/order"},
		{"X", "y", "/hooks/order?tenant=other"}, {"X", "y", "/hooks/order?tenant=acme&x=1"}, {"X", "y", "/hooks/%6Frder?tenant=acme"},
	} {
		f.Add(c[0], c[1], c[2])
	}
	now := time.Date(2025, 6, 1, 12, 0, 0, 0, time.UTC)
	v := &webhook.Verifier{Secrets: [][]byte{secret}, Now: func() time.Time { return now }}
	signed := []string{wire.HeaderEventID, wire.HeaderEventType, wire.HeaderAggregateType, wire.HeaderAggregateID,
		wire.HeaderAggregateSequence, wire.HeaderSchemaVersion, wire.HeaderOccurredAt, "Content-Type", webhook.HeaderIdempotencyKey}
	f.Fuzz(func(t *testing.T, name, value, uri string) {
		h, body := signedRequest(secret, now)
		orig := h.Clone()
		r, err := http.NewRequest(http.MethodPost, uri, nil)
		if err != nil || r.URL.Path == "" || r.URL.Host != "" || r.URL.Scheme != "" {
			return // not a request target a handler could see
		}
		r.Header = h
		if name != "" {
			h.Add(name, value)
		}
		if v.Verify(r, body) != nil {
			return
		}
		if got := r.URL.RequestURI(); got != target {
			t.Fatalf("accepted a request to %q, signed for %q", got, target)
		}
		for _, n := range signed {
			if got := h.Values(n); len(got) != 1 || got[0] != orig.Get(n) {
				t.Fatalf("accepted with %s = %q, signed %q", n, got, orig.Get(n))
			}
		}
		for k := range h {
			switch strings.ToLower(k) {
			case "ce-specversion", "ce_specversion", "cloudevents_specversion", "cloudevents:specversion":
				t.Fatalf("accepted with a %s header", k)
			}
		}
	})
}
