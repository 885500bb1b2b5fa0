package webhook

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// Names of the Standard Webhooks headers (https://www.standardwebhooks.com),
// sent when Config.StandardSecret is set. The specification spells them in lower
// case; HTTP header names are case-insensitive.
const (
	// HeaderWebhookID carries the event id, the same on every attempt.
	HeaderWebhookID = "Webhook-Id"
	// HeaderWebhookTimestamp carries the time of signing, in Unix seconds.
	HeaderWebhookTimestamp = "Webhook-Timestamp"
	// HeaderWebhookSignature carries "v1,<base64 HMAC-SHA256>"; see [SignStandard].
	HeaderWebhookSignature = "Webhook-Signature"
)

const (
	// StandardSecretPrefix opens a Standard Webhooks secret in its text form:
	// "whsec_" followed by the standard base64 of the key bytes.
	StandardSecretPrefix = "whsec_"
	// MinStandardSecretLen and MaxStandardSecretLen bound the decoded key, as
	// the Standard Webhooks specification does (24 to 64 bytes).
	MinStandardSecretLen = 24
	MaxStandardSecretLen = 64

	maxWebhookIDLen = 256
)

// Errors of the Standard Webhooks verification, beside ErrBadSignature, ErrTooOld,
// ErrTooNew and ErrAmbiguousRequest, which [StandardVerifier.Verify] returns too.
var (
	// ErrNoStandardSignature: a webhook-id, webhook-timestamp or
	// webhook-signature header is missing or empty.
	ErrNoStandardSignature = errors.New("webhook: no webhook-id, webhook-timestamp or webhook-signature header")
	// ErrMalformedStandardSignature: webhook-signature is not a space-separated
	// list of "<version>,<base64>" holding a v1 of 32 bytes, webhook-timestamp
	// is not Unix seconds, or webhook-id is too long or not printable ASCII.
	ErrMalformedStandardSignature = errors.New("webhook: malformed Standard Webhooks headers")
)

// ParseStandardSecret decodes a Standard Webhooks secret, "whsec_" followed by
// the standard base64 (with padding) of 24 to 64 key bytes, and returns the key
// bytes, what Config.StandardSecret and StandardVerifier.Secrets hold. Errors say
// what is wrong and never quote s.
func ParseStandardSecret(s string) ([]byte, error) {
	rest, ok := strings.CutPrefix(s, StandardSecretPrefix)
	if !ok {
		return nil, fmt.Errorf("webhook: a Standard Webhooks secret starts with %q", StandardSecretPrefix)
	}
	if len(rest) > base64.StdEncoding.EncodedLen(MaxStandardSecretLen) {
		return nil, fmt.Errorf("webhook: the Standard Webhooks secret is longer than %d bytes", MaxStandardSecretLen)
	}
	key, err := base64.StdEncoding.Strict().DecodeString(rest)
	if err != nil || strings.ContainsAny(rest, "\r\n") { // the decoder skips line breaks
		// err quotes the offending byte's position only, but say it in our words.
		return nil, errors.New("webhook: the Standard Webhooks secret is not " + StandardSecretPrefix + " followed by standard base64")
	}
	if err := checkStandardKey(key); err != nil {
		return nil, fmt.Errorf("webhook: the Standard Webhooks secret %w", err)
	}
	return key, nil
}

// FormatStandardSecret returns key in the text form ParseStandardSecret reads
// and the Standard Webhooks libraries take: "whsec_" + base64(key).
func FormatStandardSecret(key []byte) string {
	return StandardSecretPrefix + base64.StdEncoding.EncodeToString(key)
}

func checkStandardKey(key []byte) error {
	if len(key) < MinStandardSecretLen || len(key) > MaxStandardSecretLen {
		return fmt.Errorf("is %d bytes, want %d to %d", len(key), MinStandardSecretLen, MaxStandardSecretLen)
	}
	return nil
}

// SignStandard returns the value of the webhook-signature header of a request
// with the given webhook-id, webhook-timestamp (t) and body, signed with key (the
// decoded secret):
//
//	v1,<base64(HMAC-SHA256(key, id + "." + <t as Unix seconds> + "." + body))>
//
// as the Standard Webhooks specification defines it. The publisher calls it for
// every attempt, over the exact bytes it sends; it is exported for tests of
// receivers.
func SignStandard(key []byte, id string, t time.Time, body []byte) string {
	return "v1," + base64.StdEncoding.EncodeToString(standardMAC(key, id, t.Unix(), body))
}

func standardMAC(key []byte, id string, ts int64, body []byte) []byte {
	mac := hmac.New(sha256.New, key)
	var buf [20]byte
	mac.Write([]byte(id))
	mac.Write([]byte{'.'})
	mac.Write(strconv.AppendInt(buf[:0], ts, 10))
	mac.Write([]byte{'.'})
	mac.Write(body)
	return mac.Sum(nil)
}

// setStandardHeaders signs a request with key as Standard Webhooks does.
func setStandardHeaders(h http.Header, key []byte, id string, t time.Time, body []byte) {
	h.Set(HeaderWebhookID, id)
	h.Set(HeaderWebhookTimestamp, strconv.FormatInt(t.Unix(), 10))
	h.Set(HeaderWebhookSignature, SignStandard(key, id, t, body))
}

// StandardVerifier checks Standard Webhooks signatures (webhook-id,
// webhook-timestamp, webhook-signature) on the receiving side; receivers in
// other languages use the standardwebhooks libraries instead. Such a signature
// covers the id, the timestamp and the body only, not the Outbox-* headers or the
// path: act on what the body says, or use [Verifier] and Outbox-Signature, which
// cover them. Its fields must not change once it is in use; it is then safe for
// concurrent use.
type StandardVerifier struct {
	// Secrets are the keys (decoded, see ParseStandardSecret) a signature may be
	// made with; a request is accepted if one of its signatures was made with any
	// of them. Each must be 24 to 64 bytes. Required.
	Secrets [][]byte

	// Tolerance is how far webhook-timestamp may be from the receiver's clock,
	// either way. Zero means DefaultTolerance (5 minutes), the libraries' own.
	Tolerance time.Duration

	// MaxBody bounds the body Handler reads. Zero means DefaultMaxBody (1 MiB).
	MaxBody int64

	// Now returns the current time. Nil means time.Now.
	Now func() time.Time
}

// Validate reports why v cannot verify requests, naming the field.
func (v *StandardVerifier) Validate() error {
	if v == nil {
		return errors.New("webhook: StandardVerifier is required: StandardVerifier.Secrets has no default")
	}
	_, err := v.check()
	return err
}

func (v *StandardVerifier) check() (time.Duration, error) {
	return checkVerifier("StandardVerifier", v.Secrets, v.Tolerance, checkStandardKey)
}

// checkVerifier validates the fields of the verifier type who, checking each
// secret with checkKey, and returns the tolerance to apply.
func checkVerifier(who string, secrets [][]byte, tol time.Duration, checkKey func([]byte) error) (time.Duration, error) {
	if len(secrets) == 0 {
		return 0, fmt.Errorf("webhook: %s.Secrets is empty", who)
	}
	for i, s := range secrets {
		if err := checkKey(s); err != nil {
			return 0, fmt.Errorf("webhook: %s.Secrets[%d] %w", who, i, err)
		}
	}
	switch {
	case tol < 0:
		return 0, fmt.Errorf("webhook: %s.Tolerance %s: must not be negative", who, tol)
	case tol == 0:
		return DefaultTolerance, nil
	}
	return tol, nil
}

// Verify checks the Standard Webhooks headers of the request r with body (r's own
// body is not read): a v1 signature made with one of the secrets over
// webhook-id, webhook-timestamp and body, with a timestamp within the tolerance.
// Stricter than the specification's libraries, it refuses a request in which
// webhook-id, webhook-timestamp, webhook-signature or Idempotency-Key appears
// more than once ([ErrAmbiguousRequest]: a receiver could read the unsigned
// one), and one whose Idempotency-Key differs from its webhook-id, since either
// may be what a receiver deduplicates on. Signatures are compared in constant
// time; errors never quote the headers.
//
// It returns nil for an authentic request, or an error wrapping one of
// ErrNoStandardSignature, ErrMalformedStandardSignature, ErrAmbiguousRequest,
// ErrBadSignature, ErrTooOld or ErrTooNew; or a configuration error.
func (v *StandardVerifier) Verify(r *http.Request, body []byte) error {
	tol, err := v.check()
	if err != nil {
		return err
	}
	h := r.Header
	for _, name := range []string{HeaderWebhookID, HeaderWebhookTimestamp, HeaderWebhookSignature, HeaderIdempotencyKey} {
		if n := len(h.Values(name)); n > 1 {
			return fmt.Errorf("%w: %d %s headers", ErrAmbiguousRequest, n, name)
		}
	}
	id, ts, sig := h.Get(HeaderWebhookID), h.Get(HeaderWebhookTimestamp), h.Get(HeaderWebhookSignature)
	if id == "" || ts == "" || sig == "" {
		return ErrNoStandardSignature
	}
	if len(id) > maxWebhookIDLen || !isPrintableASCII(id) {
		return fmt.Errorf("%w: webhook-id is over %d bytes or not printable ASCII", ErrMalformedStandardSignature, maxWebhookIDLen)
	}
	if len(ts) > maxTimestampLen || !isDecimal(ts) || (len(ts) > 1 && ts[0] == '0') {
		return fmt.Errorf("%w: webhook-timestamp is not Unix seconds", ErrMalformedStandardSignature)
	}
	t, _ := strconv.ParseInt(ts, 10, 64) // cannot fail: at most 12 digits
	macs, err := parseStandardSignature(sig)
	if err != nil {
		return err
	}
	if key := h.Get(HeaderIdempotencyKey); key != "" && key != id {
		return fmt.Errorf("%w: %s differs from %s", ErrBadSignature, HeaderIdempotencyKey, HeaderWebhookID)
	}
	matched := false
	for _, secret := range v.Secrets {
		want := standardMAC(secret, id, t, body)
		for _, got := range macs {
			matched = hmac.Equal(want, got) || matched
		}
	}
	if !matched {
		return ErrBadSignature
	}
	return checkAge(v.Now, t, tol)
}

// checkAge returns ErrTooOld or ErrTooNew when the timestamp ts is further
// than tol from now (time.Now when now is nil).
func checkAge(now func() time.Time, ts int64, tol time.Duration) error {
	if now == nil {
		now = time.Now
	}
	switch age := now().Sub(time.Unix(ts, 0)); {
	case age > tol:
		return fmt.Errorf("%w: signed %s ago, tolerance %s", ErrTooOld, age.Truncate(time.Second), tol)
	case age < -tol:
		return fmt.Errorf("%w: signed %s ahead, tolerance %s", ErrTooNew, (-age).Truncate(time.Second), tol)
	}
	return nil
}

// parseStandardSignature parses a webhook-signature header: one to eight
// space-separated "<version>,<base64>" entries (several while a sender signs
// with an old and a new key), at least one of them v1 with a 32-byte MAC;
// entries of other versions (lowercase letters and digits) are ignored. Errors
// wrap ErrMalformedStandardSignature and never quote the header.
func parseStandardSignature(s string) ([][]byte, error) {
	malformed := func(format string, args ...any) ([][]byte, error) {
		return nil, fmt.Errorf("%w: webhook-signature "+format, append([]any{ErrMalformedStandardSignature}, args...)...)
	}
	if len(s) > maxSignatureLen {
		return malformed("is longer than %d bytes", maxSignatureLen)
	}
	var macs [][]byte
	n := 0
	for entry := range strings.SplitSeq(s, " ") {
		n++
		if n > maxSignatures {
			return malformed("has more than %d entries", maxSignatures)
		}
		version, value, ok := strings.Cut(entry, ",")
		if !ok || !isSignatureKey(version) || value == "" || !isPrintableASCII(value) {
			return malformed("entry %d is not <version>,<signature>", n)
		}
		if version != "v1" {
			continue
		}
		mac, err := base64.StdEncoding.Strict().DecodeString(value)
		if err != nil || len(mac) != sha256.Size {
			return malformed("entry %d is not v1,<base64 of %d bytes>", n, sha256.Size)
		}
		macs = append(macs, mac)
	}
	if len(macs) == 0 {
		return malformed("has no v1 entry")
	}
	return macs, nil
}

// isPrintableASCII reports whether s is made of printable ASCII bytes, no spaces.
func isPrintableASCII(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] <= ' ' || s[i] >= 0x7f {
			return false
		}
	}
	return true
}

// Handler returns middleware that reads the request body (up to MaxBody), checks
// its Standard Webhooks signature with Verify and passes the request on to next
// with the body restored; it answers as [Verifier.Handler] does.
func (v *StandardVerifier) Handler(next http.Handler) http.Handler {
	return verifyingHandler(func() error { _, err := v.check(); return err }, v.MaxBody, v.Verify, next)
}
