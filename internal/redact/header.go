package redact

import (
	"regexp"
	"strings"
)

// Header returns how the value of a message header (an event's producer
// header, an HTTP header) may be shown, and whether anything was hidden: Mask
// when the header's name says it holds a secret (IsSecretName: authorization,
// *token*, *secret*, cookie, *session*, *key* of an API, …); a connection
// string's secrets hidden as URL does when the name says it holds one (*url,
// *uri, *dsn); otherwise the value with whatever in it looks like a credential
// hidden as Text does — a bearer or basic token, a URL's password,
// access_token=… — and a JSON Web Token.
func Header(name, value string) (string, bool) {
	n := strings.ReplaceAll(strings.ToLower(name), "-", "_")
	var shown string
	switch {
	case urlName(n):
		shown = URL(value)
	case isSecretName(n):
		shown = Mask
		if value == "" {
			shown = ""
		}
	default:
		shown = Text(value)
		if strings.Contains(shown, "eyJ") {
			shown = jwtRE.ReplaceAllString(shown, Mask)
		}
	}
	return shown, shown != value
}

// jwtRE matches a JSON Web Token: base64url JSON header ("eyJ" is `{"`), payload
// and signature.
var jwtRE = regexp.MustCompile(`\beyJ[A-Za-z0-9_\-]{4,}\.[A-Za-z0-9_\-]{4,}\.[A-Za-z0-9_\-]*`)
