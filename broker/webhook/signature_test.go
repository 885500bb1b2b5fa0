package webhook_test

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/pgoutbox/pgoutbox/broker"
	"github.com/pgoutbox/pgoutbox/broker/webhook"
)

// signedRequest returns the headers and body of a request as the publisher signs
// it, at time at with key.
func signedRequest(key []byte, at time.Time) (http.Header, []byte) {
	m := message("order", "42", 1)
	h := http.Header{}
	for name, v := range m.WireHeaders() {
		h.Set(name, v)
	}
	h.Set(webhook.HeaderIdempotencyKey, m.EventID.String())
	h.Set(webhook.HeaderSignature, webhook.Sign(key, at, h, m.Payload))
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
			h.Set(broker.HeaderEventType, "deleted")
			return h, b
		}, webhook.ErrBadSignature},
		"tampered sequence": {func(h http.Header, b []byte) (http.Header, []byte) {
			h.Set(broker.HeaderAggregateSequence, "2")
			return h, b
		}, webhook.ErrBadSignature},
		"Idempotency-Key not the event id": {func(h http.Header, b []byte) (http.Header, []byte) {
			h.Set(webhook.HeaderIdempotencyKey, "fresh-key")
			return h, b
		}, webhook.ErrBadSignature},
		"wrong secret": {func(h http.Header, b []byte) (http.Header, []byte) {
			h.Set(webhook.HeaderSignature, webhook.Sign(other, now, h, b))
			return h, b
		}, webhook.ErrBadSignature},
		"old timestamp": {func(h http.Header, b []byte) (http.Header, []byte) {
			h.Set(webhook.HeaderSignature, webhook.Sign(secret, now.Add(-6*time.Minute), h, b))
			return h, b
		}, webhook.ErrTooOld},
		"future timestamp": {func(h http.Header, b []byte) (http.Header, []byte) {
			h.Set(webhook.HeaderSignature, webhook.Sign(secret, now.Add(6*time.Minute), h, b))
			return h, b
		}, webhook.ErrTooNew},
		"within tolerance": {func(h http.Header, b []byte) (http.Header, []byte) {
			h.Set(webhook.HeaderSignature, webhook.Sign(secret, now.Add(-4*time.Minute), h, b))
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
		}, webhook.ErrMalformedSignature},
		"malformed header": {func(h http.Header, b []byte) (http.Header, []byte) {
			h.Set(webhook.HeaderSignature, "sha256="+strings.Repeat("ab", 32))
			return h, b
		}, webhook.ErrMalformedSignature},
	} {
		h, body := signedRequest(secret, now)
		h, body = c.change(h, body)
		err := v.Verify(h, body)
		if c.want == nil && err != nil || c.want != nil && !errors.Is(err, c.want) {
			t.Errorf("%s: Verify = %v, want %v", name, err, c.want)
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
		if err := v.Verify(h, body); err != nil {
			t.Errorf("signed with the %s secret: %v", name, err)
		}
	}
	h, body := signedRequest([]byte("an unrelated secret, 32 bytes..."), now)
	if err := v.Verify(h, body); !errors.Is(err, webhook.ErrBadSignature) {
		t.Errorf("signed with neither: %v, want ErrBadSignature", err)
	}
	// A sender signing with both, the first v1 not matching this receiver.
	h, body = signedRequest(next, now)
	unknown := webhook.Sign([]byte("an unrelated secret, 32 bytes..."), now, h, body)
	known := h.Get(webhook.HeaderSignature)
	h.Set(webhook.HeaderSignature, unknown+known[strings.IndexByte(known, ','):])
	if err := (&webhook.Verifier{Secrets: [][]byte{next}}).Verify(h, body); err != nil {
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
		if err := v.Verify(h, body); err == nil || !strings.Contains(err.Error(), name) {
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
		r := httptest.NewRequest(http.MethodPost, "/hooks", strings.NewReader(string(body)))
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
	header.Set(webhook.HeaderSignature, webhook.Sign(secret, time.Now(), header, long))
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
