package webhook

import (
	"bytes"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/pgoutbox/pgoutbox/wire"
)

// Names of the headers the publisher sets beside the wire headers
// (docs/design.md, "Wire headers").
const (
	// HeaderSignature carries the request's HMAC signature; see [Sign] for its
	// format. Producer headers cannot spoof it: [broker.Message.WireHeaders] drops
	// their Outbox-* names.
	HeaderSignature = "Outbox-Signature"

	// HeaderIdempotencyKey carries the event id, the same on every attempt, so a
	// receiver can tell a re-delivery from a new event.
	HeaderIdempotencyKey = "Idempotency-Key"
)

// signedHeaders are the wire headers the signature covers, in signing order:
// everything a receiver needs to act on an event besides the body.
var signedHeaders = [...]string{
	wire.HeaderEventID,
	wire.HeaderEventType,
	wire.HeaderAggregateType,
	wire.HeaderAggregateID,
	wire.HeaderAggregateSequence,
	wire.HeaderSchemaVersion,
	wire.HeaderOccurredAt,
}

// signedCloudEventsHeaders stand for signedHeaders, position by position, in a
// request of the CloudEvents format (one with a Ce-Specversion header).
var signedCloudEventsHeaders = [...]string{
	wire.CloudEventsHTTP.Prefix + wire.CEAttrID,
	wire.CloudEventsHTTP.Prefix + wire.CEAttrType,
	wire.CloudEventsHTTP.Prefix + wire.CEExtAggregateType,
	wire.CloudEventsHTTP.Prefix + wire.CEExtAggregateID,
	wire.CloudEventsHTTP.Prefix + wire.CEExtSequence,
	wire.CloudEventsHTTP.Prefix + wire.CEExtSchemaVersion,
	wire.CloudEventsHTTP.Prefix + wire.CEAttrTime,
}

// signedV2Headers are the headers a v2 signature covers in a request of the
// default format, in signing order: v1's, then the body's content type and the
// key a receiver deduplicates on.
var signedV2Headers = append(signedHeaders[:len(signedHeaders):len(signedHeaders)],
	"Content-Type", HeaderIdempotencyKey)

// signedV2CloudEventsHeaders are the headers a v2 signature covers in a request
// of the CloudEvents format: v1's, then the attributes v1 left out (specversion,
// source, subject: every attribute the publisher sends is signed), the content
// type and the key.
var signedV2CloudEventsHeaders = append(signedCloudEventsHeaders[:len(signedCloudEventsHeaders):len(signedCloudEventsHeaders)],
	wire.CloudEventsHTTP.Prefix+wire.CEAttrSpecVersion,
	wire.CloudEventsHTTP.Prefix+wire.CEAttrSource,
	wire.CloudEventsHTTP.Prefix+wire.CEAttrSubject,
	"Content-Type", HeaderIdempotencyKey)

// v2Tag opens the text a v2 signature covers, so that it can never be taken for
// a v1 text (or a later version's).
const v2Tag = "pgoutbox-webhook-v2"

const (
	// MinSecretLen is the shortest secret the publisher and the verifier accept: a
	// shorter one could be guessed offline from a single signed request.
	MinSecretLen = 16

	// DefaultTolerance is the clock difference a signature may show when
	// Verifier.Tolerance is zero.
	DefaultTolerance = 5 * time.Minute
	// DefaultMaxBody bounds the body Verifier.Handler reads when
	// Verifier.MaxBody is zero.
	DefaultMaxBody = 1 << 20

	// Bounds on what the verifier parses and hashes for one request.
	maxSignatureLen = 1024
	maxSignatures   = 8
	maxTimestampLen = 12 // decimal digits: far beyond any real clock
)

// Verification errors, for errors.Is. Verify wraps them with details.
var (
	// ErrNoSignature: the request has no Outbox-Signature header.
	ErrNoSignature = errors.New("webhook: no " + HeaderSignature + " header")
	// ErrMalformedSignature: the Outbox-Signature header is not of the form
	// t=<unix seconds>,v1=<64 hex digits>[,v1=…].
	ErrMalformedSignature = errors.New("webhook: malformed " + HeaderSignature + " header")
	// ErrBadSignature: no signature matches any of the secrets; the body or a
	// signed header was changed, or the sender uses another secret.
	ErrBadSignature = errors.New("webhook: signature does not match")
	// ErrTooOld: the signature is valid but older than the tolerance: a replay,
	// or a sender whose clock is behind.
	ErrTooOld = errors.New("webhook: signature is too old")
	// ErrTooNew: the signature is valid but dated further in the future than the
	// tolerance: a sender whose clock is ahead.
	ErrTooNew = errors.New("webhook: signature is dated in the future")
	// ErrAmbiguousRequest: a header the signature covers (or Outbox-Signature)
	// appears more than once, or the request carries a CloudEvents specversion
	// header of another binding (Ce_specversion, Cloudevents_specversion) that
	// a receiver could read in place of the signed ones.
	ErrAmbiguousRequest = errors.New("webhook: ambiguous request")
)

var newline = []byte{'\n'}

// Sign returns the value of the Outbox-Signature header for the request r (its
// method, its URL's path and query, its headers) with body, signed with secret
// at time t:
//
//	t=<t as Unix seconds>,v1=<hex(HMAC-SHA256(secret, v1 text))>,v2=<hex(HMAC-SHA256(secret, v2 text))>
//
// The v2 text, the one [Verifier] checks, is these lines joined by newlines
// ("\n"), the body last:
//
//	pgoutbox-webhook-v2
//	<t>
//	<method> <path and query, as r.URL.RequestURI gives them>
//	<lower-case name>:<value>     one line per signed header, in this order:
//	<body>
//
// with, in the default format, Outbox-Event-Id, Outbox-Event-Type,
// Outbox-Aggregate-Type, Outbox-Aggregate-Id, Outbox-Aggregate-Sequence,
// Outbox-Schema-Version, Outbox-Occurred-At, Content-Type and Idempotency-Key;
// in a request of the CloudEvents format (--format cloudevents: it has a
// Ce-Specversion header) Ce-Id, Ce-Type, Ce-Pgoutboxaggtype, Ce-Pgoutboxaggid,
// Ce-Pgoutboxseq, Ce-Pgoutboxschemaver, Ce-Time, Ce-Specversion, Ce-Source,
// Ce-Subject, Content-Type and Idempotency-Key. So everything a
// receiver acts on is signed: which event, where it comes from, how to read the
// body, where it was sent (a receiver routing by path or tenant), and the
// header names bind the format, so a default-format request cannot be
// relabelled as a CloudEvent. A missing header counts as empty. Header values
// cannot hold a newline, so the text is unambiguous. Producer headers such as
// traceparent are not signed. The secret's bytes are used as they are (a hex
// string is not decoded).
//
// v1 is the previous scheme, sent so that receivers of an earlier release keep
// accepting events until they are upgraded; it covers the timestamp, seven
// headers (the Outbox-* ones, or in the CloudEvents format Ce-Id, Ce-Type,
// Ce-Pgoutboxaggtype, Ce-Pgoutboxaggid, Ce-Pgoutboxseq, Ce-Pgoutboxschemaver,
// Ce-Time) and the body, not the source, subject, content type or path. This
// release's Verifier ignores v1 and requires v2.
//
// The timestamp lets a receiver refuse replays ([ErrTooOld]). The publisher
// calls Sign for every attempt; it is exported for other senders and for tests
// of receivers.
func Sign(secret []byte, t time.Time, r *http.Request, body []byte) string {
	ts := t.Unix()
	v1 := signatureV1(hmac.New(sha256.New, secret), ts, r.Header, body)
	v2 := signatureV2(hmac.New(sha256.New, secret), ts, r, body)
	return "t=" + strconv.FormatInt(ts, 10) + ",v1=" + hex.EncodeToString(v1) + ",v2=" + hex.EncodeToString(v2)
}

// isCloudEvents reports whether a request with header h is of the CloudEvents
// format, as the publisher sends it: it has a Ce-Specversion header.
func isCloudEvents(h http.Header) bool {
	return len(h.Values(wire.CloudEventsHTTP.Prefix+wire.CEAttrSpecVersion)) > 0
}

// signatureV1 is the v1 scheme, sent for receivers of earlier releases.
func signatureV1(mac hash.Hash, ts int64, h http.Header, body []byte) []byte {
	names := &signedHeaders
	if isCloudEvents(h) {
		names = &signedCloudEventsHeaders
	}
	var buf [20]byte
	mac.Write(strconv.AppendInt(buf[:0], ts, 10))
	for _, name := range names {
		mac.Write(newline)
		_, _ = io.WriteString(mac, h.Get(name))
	}
	mac.Write(newline)
	mac.Write(body)
	return mac.Sum(nil)
}

// signedV2Names returns the headers a v2 signature of a request with header h
// covers.
func signedV2Names(h http.Header) []string {
	if isCloudEvents(h) {
		return signedV2CloudEventsHeaders
	}
	return signedV2Headers
}

// signatureV2 is the v2 scheme (see [Sign]).
func signatureV2(mac hash.Hash, ts int64, r *http.Request, body []byte) []byte {
	var buf [20]byte
	_, _ = io.WriteString(mac, v2Tag)
	mac.Write(newline)
	mac.Write(strconv.AppendInt(buf[:0], ts, 10))
	mac.Write(newline)
	_, _ = io.WriteString(mac, r.Method+" "+r.URL.RequestURI())
	for _, name := range signedV2Names(r.Header) {
		mac.Write(newline)
		_, _ = io.WriteString(mac, strings.ToLower(name)+":"+r.Header.Get(name))
	}
	mac.Write(newline)
	mac.Write(body)
	return mac.Sum(nil)
}

// checkUnambiguous returns an error wrapping ErrAmbiguousRequest when a header of
// a request with header h that the signature covers, or Outbox-Signature,
// appears more than once (a receiver could read the unsigned one), or when h has
// a CloudEvents specversion header of a binding other than HTTP's Ce- (a
// receiver decoding any binding, as inbox.Decode does, could take the event
// from unsigned headers). Errors name the header, never its values.
func checkUnambiguous(h http.Header) error {
	for _, name := range append([]string{HeaderSignature}, signedV2Names(h)...) {
		if n := len(h.Values(name)); n > 1 {
			return fmt.Errorf("%w: %d %s headers", ErrAmbiguousRequest, n, name)
		}
	}
	// A specversion header under another prefix marks a CloudEvent to whoever
	// looks for it there: refuse it, whether or not Ce-Specversion is present.
	ceSpec := http.CanonicalHeaderKey(wire.CloudEventsHTTP.Prefix + wire.CEAttrSpecVersion)
	var other string
	wire.CloudEventsPrefix(func(name string) string {
		if key := http.CanonicalHeaderKey(name); key != ceSpec && other == "" && len(h.Values(key)) > 0 {
			other = key
		}
		return ""
	})
	if other != "" {
		return fmt.Errorf("%w: a %s header (another CloudEvents binding's)", ErrAmbiguousRequest, other)
	}
	return nil
}

// parsedSignature is an Outbox-Signature header.
type parsedSignature struct {
	t  int64
	v1 [][]byte
	v2 [][]byte
}

// parseSignature parses an Outbox-Signature header: comma-separated key=value
// fields without spaces, exactly one t (Unix seconds, decimal, no sign or leading
// zero) and one to eight v2 (64 lowercase hex digits: several while a sender
// signs with an old and a new secret), and as many v1 of the same form. Other
// keys (lowercase letters and digits) with printable values are ignored, for
// later signature schemes. Errors wrap ErrMalformedSignature and never quote the
// header.
func parseSignature(s string) (parsedSignature, error) {
	var p parsedSignature
	malformed := func(format string, args ...any) (parsedSignature, error) {
		return parsedSignature{}, fmt.Errorf("%w: "+format, append([]any{ErrMalformedSignature}, args...)...)
	}
	if len(s) > maxSignatureLen {
		return malformed("longer than %d bytes", maxSignatureLen)
	}
	haveT := false
	n := 0
	for field := range strings.SplitSeq(s, ",") {
		n++
		key, value, ok := strings.Cut(field, "=")
		if !ok || !isSignatureKey(key) || value == "" {
			return malformed("field %d is not key=value", n)
		}
		switch key {
		case "t":
			if haveT {
				return malformed("more than one timestamp")
			}
			if len(value) > maxTimestampLen || !isDecimal(value) || (len(value) > 1 && value[0] == '0') {
				return malformed("timestamp is not Unix seconds")
			}
			p.t, _ = strconv.ParseInt(value, 10, 64) // cannot fail: at most 12 digits
			haveT = true
		case "v1", "v2":
			list := &p.v1
			if key == "v2" {
				list = &p.v2
			}
			if len(*list) == maxSignatures {
				return malformed("more than %d %s signatures", maxSignatures, key)
			}
			if len(value) != 2*sha256.Size || !isLowerHex(value) {
				return malformed("%s is not %d lowercase hex digits", key, 2*sha256.Size)
			}
			mac, _ := hex.DecodeString(value) // cannot fail: checked above
			*list = append(*list, mac)
		default:
			if !isPrintableASCII(value) {
				return malformed("field %d has a space or a non-printable byte", n)
			}
		}
	}
	switch {
	case !haveT:
		return malformed("no timestamp (t=)")
	case len(p.v2) == 0:
		// A v1 alone is an earlier release's sender (or a v2 stripped off): v1
		// does not cover what a receiver acts on, so it is not enough.
		return malformed("no v2 signature")
	}
	return p, nil
}

func isSignatureKey(s string) bool {
	if s == "" || len(s) > 16 {
		return false
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; !('a' <= c && c <= 'z' || '0' <= c && c <= '9') {
			return false
		}
	}
	return true
}

func isDecimal(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return s != ""
}

func isLowerHex(s string) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i]; !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
			return false
		}
	}
	return true
}

// Verifier checks the signature of webhook requests on the receiving side. Its
// fields must not change once it is in use; it is then safe for concurrent use.
type Verifier struct {
	// Secrets are the keys a signature may be made with; a request is accepted
	// if it was signed with any of them. To rotate a secret without refusing
	// events: add the new secret here, switch the sender to it, then remove the
	// old one. Each must be at least MinSecretLen bytes. Required.
	Secrets [][]byte

	// Tolerance is how far the signature's timestamp may be from the receiver's
	// clock, either way. Together with deduplication by Idempotency-Key over
	// that window, it makes a captured request useless for replays. Zero means
	// DefaultTolerance (5 minutes).
	Tolerance time.Duration

	// MaxBody bounds the body Handler reads; a larger request is answered 413,
	// which the publisher takes as a permanent refusal. Zero means
	// DefaultMaxBody (1 MiB).
	MaxBody int64

	// Now returns the current time. Nil means time.Now.
	Now func() time.Time
}

// Validate reports why v cannot verify requests (no secrets, a short one, a
// negative Tolerance), naming the field; Verify and Handler report the same.
func (v *Verifier) Validate() error {
	if v == nil {
		return errors.New("webhook: Verifier is required: Verifier.Secrets has no default")
	}
	_, err := v.check()
	return err
}

// check validates the configuration and returns the tolerance to apply.
func (v *Verifier) check() (time.Duration, error) {
	return checkVerifier("Verifier", v.Secrets, v.Tolerance, func(s []byte) error {
		if len(s) < MinSecretLen {
			return fmt.Errorf("is %d bytes, want at least %d", len(s), MinSecretLen)
		}
		return nil
	})
}

// Verify checks the Outbox-Signature header of the request r with body (r's
// own body is not read): a v2 signature made with one of the secrets over the
// body, the method, the path and query, and the signed headers (see [Sign]),
// with a timestamp within the tolerance. A request in which a signed header
// appears twice, or that carries another CloudEvents binding's specversion
// header, is refused ([ErrAmbiguousRequest]), and so is one whose
// Idempotency-Key differs from its (signed) event id, since the key is what a
// receiver deduplicates on. A v1 signature alone is refused: it does not cover
// the CloudEvents source, subject, content type or path. Signatures are
// compared in constant time.
//
// It returns nil for an authentic request, or an error wrapping one of
// ErrNoSignature, ErrMalformedSignature, ErrAmbiguousRequest, ErrBadSignature,
// ErrTooOld or ErrTooNew; or a configuration error (no secrets, a short one).
func (v *Verifier) Verify(r *http.Request, body []byte) error {
	tol, err := v.check()
	if err != nil {
		return err
	}
	h := r.Header
	values := h.Values(HeaderSignature)
	if len(values) == 0 || len(values) == 1 && values[0] == "" {
		return ErrNoSignature
	}
	if err := checkUnambiguous(h); err != nil {
		return err
	}
	sig, err := parseSignature(values[0])
	if err != nil {
		return err
	}
	idHeader := wire.HeaderEventID
	if isCloudEvents(h) {
		idHeader = wire.CloudEventsHTTP.Prefix + wire.CEAttrID
	}
	if key := h.Get(HeaderIdempotencyKey); key != "" && key != h.Get(idHeader) {
		return fmt.Errorf("%w: %s differs from %s", ErrBadSignature, HeaderIdempotencyKey, idHeader)
	}
	// The signature first: a timestamp error then says that the request is
	// authentic, only stale.
	matched := false
	for _, secret := range v.Secrets {
		want := signatureV2(hmac.New(sha256.New, secret), sig.t, r, body)
		for _, got := range sig.v2 {
			matched = hmac.Equal(want, got) || matched
		}
	}
	if !matched {
		return ErrBadSignature
	}
	return checkAge(v.Now, sig.t, tol)
}

// Handler returns middleware that reads the request body (up to MaxBody), checks
// its signature with Verify and passes the request on to next with the body
// restored. It answers itself when the check fails: 401 Unauthorized for a
// missing, malformed, wrong or stale signature (which the publisher takes as a
// permanent refusal, so the event is quarantined, not retried forever), 413 for a
// body over MaxBody, 500 when the Verifier is misconfigured (retried).
func (v *Verifier) Handler(next http.Handler) http.Handler {
	return verifyingHandler(func() error { _, err := v.check(); return err }, v.MaxBody, v.Verify, next)
}

// verifyingHandler is the middleware of both verifiers: check validates the
// verifier's configuration, verify checks a request with its body.
func verifyingHandler(check func() error, maxBody int64, verify func(*http.Request, []byte) error, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if err := check(); err != nil {
			http.Error(w, "webhook signature verifier is misconfigured", http.StatusInternalServerError)
			return
		}
		limit := maxBody
		if limit <= 0 {
			limit = DefaultMaxBody
		}
		body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, limit))
		if err != nil {
			var tooLarge *http.MaxBytesError
			if errors.As(err, &tooLarge) {
				http.Error(w, fmt.Sprintf("request body over %d bytes", limit), http.StatusRequestEntityTooLarge)
				return
			}
			http.Error(w, "cannot read the request body", http.StatusBadRequest)
			return
		}
		if err := verify(r, body); err != nil {
			http.Error(w, err.Error(), http.StatusUnauthorized)
			return
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		next.ServeHTTP(w, r)
	})
}
