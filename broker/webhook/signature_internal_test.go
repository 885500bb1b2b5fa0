package webhook

import (
	"encoding/hex"
	"errors"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"
)

func TestParseSignature(t *testing.T) {
	t.Parallel()
	mac := strings.Repeat("0123456789abcdef", 4)
	for s, ok := range map[string]bool{
		"t=1700000000,v2=" + mac:                                     true,
		"v2=" + mac + ",t=1700000000":                                true,
		"t=0,v2=" + mac:                                              true,
		"t=1700000000,v1=" + mac + ",v2=" + mac:                      true, // as the publisher sends it
		"t=1700000000,v2=" + mac + ",v2=" + mac:                      true,
		"t=1700000000,v2=" + mac + ",v3=abc+/=":                      true,  // a later scheme, ignored
		"t=1700000000,v1=" + mac:                                     false, // v1 alone: no longer enough
		"t=1700000000,v1=" + mac + ",v1=" + mac:                      false,
		"":                                                           false,
		"t=1700000000":                                               false,
		"v2=" + mac:                                                  false,
		"t=1700000000,v2=" + mac[:62]:                                false,
		"t=1700000000,v2=" + strings.ToUpper(mac):                    false,
		"t=1700000000,v2=" + mac[:62] + "zz":                         false,
		"t=1700000000,v1=" + mac[:62] + ",v2=" + mac:                 false, // a malformed v1 is malformed still
		"t=01700000000,v2=" + mac:                                    false,
		"t=-1,v2=" + mac:                                             false,
		"t=+1,v2=" + mac:                                             false,
		"t=1e9,v2=" + mac:                                            false,
		"t=1700000000000,v2=" + mac:                                  false, // 13 digits
		"t=1,t=2,v2=" + mac:                                          false,
		"t=1700000000, v2=" + mac:                                    false,
		"t=1700000000,v2=" + mac + ",":                               false,
		"t=1700000000,,v2=" + mac:                                    false,
		"t=1700000000,v2=" + mac + ",x=":                             false,
		"t=1700000000,v2=" + mac + ",X=1":                            false,
		"t=1700000000,v2=" + mac + ",x=a b":                          false,
		"t=1700000000,v2=" + mac + ",x=\x00":                         false,
		"t=1700000000,v2=" + mac + strings.Repeat(",v2="+mac, 8):     false, // 9 signatures
		"t=1700000000,v2=" + mac + ",x=" + strings.Repeat("a", 1000): false,
	} {
		_, err := parseSignature(s)
		if (err == nil) != ok {
			t.Errorf("parseSignature(%.80q) = %v, want ok=%v", s, err, ok)
		}
		if err != nil && !errors.Is(err, ErrMalformedSignature) {
			t.Errorf("parseSignature(%.80q): %v does not wrap ErrMalformedSignature", s, err)
		}
	}
}

func TestRetryAfter(t *testing.T) {
	t.Parallel()
	now := time.Date(2025, 6, 1, 12, 0, 0, 0, time.UTC)
	for v, want := range map[string]time.Duration{
		"":                              0,
		"30":                            30 * time.Second,
		"0":                             0,
		"-5":                            0,
		"soon":                          0,
		"99999999999":                   24 * time.Hour,
		"Sun, 01 Jun 2025 12:01:30 GMT": 90 * time.Second,
		"Sun, 01 Jun 2025 11:00:00 GMT": 0,
	} {
		if got := retryAfter(v, now); got != want {
			t.Errorf("retryAfter(%q) = %s, want %s", v, got, want)
		}
	}
}

// FuzzParseSignature checks that the Outbox-Signature parser never panics and
// accepts only well-formed headers: bounded, no white space or control bytes, one
// timestamp that prints back the same, one to eight 32-byte signatures; and that
// Verify on any header and body never panics nor accepts a forgery.
func FuzzParseSignature(f *testing.F) {
	mac := strings.Repeat("0123456789abcdef", 4)
	for _, s := range []string{
		"t=1700000000,v1=" + mac, "v1=" + mac + ",t=0", "t=1,v1=" + mac + ",v1=" + mac, "t=1,v1=" + mac + ",v0=x",
		"t=1700000000,v2=" + mac, "t=1700000000,v1=" + mac + ",v2=" + mac, "t=1,v2=" + mac + ",v2=" + mac,
		"", ",", "=", "t=", "t=1,v1=", "t=1,v1=" + mac[:63] + "G", "t=00,v1=" + mac, "t=1;v1=" + mac, "t=1,v1=" + mac + ", ",
	} {
		f.Add(s, []byte(`{"a":1}`))
	}
	key := []byte("fuzz secret, at least 16 bytes")
	v := &Verifier{Secrets: [][]byte{key}, Now: func() time.Time { return time.Unix(1700000000, 0) }}
	f.Fuzz(func(t *testing.T, s string, body []byte) {
		p, err := parseSignature(s)
		if err == nil {
			if len(s) > maxSignatureLen || strings.ContainsFunc(s, func(r rune) bool { return r <= ' ' || r >= 0x7f }) {
				t.Fatalf("accepted %q: too long, or white space or a non-printable byte", s)
			}
			if p.t < 0 || !strings.Contains(","+s+",", ",t="+strconv.FormatInt(p.t, 10)+",") {
				t.Fatalf("accepted %q: timestamp %d does not print back", s, p.t)
			}
			if len(p.v2) < 1 || len(p.v2) > maxSignatures || len(p.v1) > maxSignatures {
				t.Fatalf("accepted %q with %d v2 and %d v1 signatures", s, len(p.v2), len(p.v1))
			}
			for _, m := range p.v2 {
				if len(m) != 32 || !strings.Contains(s, "v2="+hex.EncodeToString(m)) {
					t.Fatalf("accepted %q: signature %x is not in it", s, m)
				}
			}
		} else if !errors.Is(err, ErrMalformedSignature) {
			t.Fatalf("parseSignature(%q): %v does not wrap ErrMalformedSignature", s, err)
		}
		r := httptest.NewRequest(http.MethodPost, "/hooks", nil)
		r.Header = http.Header{HeaderSignature: {s}}
		if err := v.Verify(r, body); err == nil {
			// Only a signature made with the key verifies.
			want := Sign(key, time.Unix(p.t, 0), r, body)
			if !strings.Contains(s, want[strings.Index(want, ",v2="):]) {
				t.Fatalf("Verify accepted %q for body %q", s, body)
			}
		}
	})
}
