// Package redact removes credentials from what pgoutbox shows: connection
// strings in every form (URLs of any scheme, lists of them, PostgreSQL key=value
// DSNs), secret flags and environment variables, and free text such as an error
// message or a receiver's answer that may echo them.
//
// It is the one place that knows what a secret looks like; everything that prints,
// logs, reports or stores a URL or a foreign error goes through it. It errs towards
// hiding too much: a display that hides a host is a nuisance, one that shows a
// password is a leak.
package redact

import (
	"encoding/base64"
	"net/url"
	"regexp"
	"slices"
	"strings"
)

// Mask replaces every secret; it is what net/url's Redacted writes too.
const Mask = "xxxxx"

// minSecretLen is the shortest known secret Text replaces wherever it occurs:
// shorter strings would mangle ordinary words (the forms Text recognises still
// hide them where they stand as credentials).
const minSecretLen = 3

// URL returns s, one connection string, without its secrets: the password (or a
// bare token) of a URL's user info, sensitive query and fragment parameters
// (password, sslpassword, token, access_token, sig, secret, api_key, …), every
// URL of a comma-separated list, and the password-like values of a key=value DSN
// ("host=db password=s3cret"). The scheme, host, port, path and other parameters
// stay. A postgres:// user name stays; a user name without a password in other
// schemes (nats://token@host) is a token and is masked.
func URL(s string) string {
	if !strings.Contains(s, "://") {
		s = keyValues(s)
	}
	return Text(s)
}

// Text returns s, free text, with every URL in it redacted as URL does,
// password-like key=value pairs ("password=…", "token: …", JSON
// "password":"…"), Authorization-style credentials ("Basic …", "Bearer …") and
// each of the known secrets — in its raw, URL-escaped and base64 forms — replaced
// by Mask. Secrets shorter than 3 bytes are not searched for on their own.
func Text(s string, secrets ...string) string {
	s = replaceKnown(s, secrets)
	// Each expression runs only where a cheap look for its literal parts finds
	// them: most texts hold none, and the case-insensitive expressions cost about
	// a millisecond per 4 KiB each.
	lower := strings.ToLower(s)
	has := func(words ...string) bool {
		for _, w := range words {
			if strings.Contains(lower, w) {
				return true
			}
		}
		return false
	}
	if strings.Contains(s, "://") {
		s = urlRE.ReplaceAllStringFunc(s, urlList)
	}
	if strings.ContainsAny(s, "=:") && has(kvWords...) {
		if strings.Contains(s, `"`) {
			s = jsonRE.ReplaceAllString(s, `$1:"`+Mask+`"`)
		}
		s = kvRE.ReplaceAllString(s, "${1}${2}"+Mask)
	} else if strings.Contains(s, `"`) && has("authorization", "cookie") {
		s = jsonRE.ReplaceAllString(s, `$1:"`+Mask+`"`)
	}
	if has("basic", "bearer", "digest", "negotiate") {
		s = authRE.ReplaceAllString(s, "${1} "+Mask)
	}
	if strings.Contains(s, ":") && has("authorization", "cookie", "api-key", "outbox-signature") {
		s = headerRE.ReplaceAllString(s, "${1}: "+Mask)
	}
	return s
}

// kvWords are the literal parts of kvRE's and jsonRE's secret names.
var kvWords = []string{"password", "passwd", "pwd", "secret", "token", "signature", "api_key", "api-key", "apikey",
	"access_key", "access-key", "accesskey", "private_key", "private-key", "privatekey", "credential"}

// Args returns a copy of a command line with the values of secret flags hidden:
// URL-valued flags (--database-url, --broker, --url, …) go through URL, other
// secret flags (--password, --webhook-secret, --token, …) become Mask; every
// other argument goes through Text.
func Args(args []string) []string {
	out := make([]string, len(args))
	hideNext := ""
	for i, a := range args {
		if hideNext != "" {
			out[i] = hideValue(hideNext, a)
			hideNext = ""
			continue
		}
		name, value, hasValue := strings.Cut(strings.TrimLeft(a, "-"), "=")
		switch {
		case !strings.HasPrefix(a, "-") || !isSecretName(name):
			out[i] = Text(a)
		case hasValue:
			out[i] = a[:len(a)-len(value)] + hideValue(name, value)
		default:
			out[i] = a
			hideNext = name
		}
	}
	return out
}

// Env returns an environment entry NAME=value with the value hidden when NAME is
// a secret (DATABASE_URL, PGOUTBOX_BROKER, PGPASSWORD, *_SECRET, *_TOKEN, …).
func Env(entry string) string {
	name, value, ok := strings.Cut(entry, "=")
	if !ok {
		return Text(entry)
	}
	if isSecretName(name) {
		return name + "=" + hideValue(name, value)
	}
	return name + "=" + Text(value)
}

// IsSecretName reports whether a flag or environment variable of this name holds a
// secret or a connection string that may hold one.
func IsSecretName(name string) bool { return isSecretName(name) }

func isSecretName(name string) bool {
	n := strings.ToLower(strings.TrimLeft(name, "-"))
	n = strings.ReplaceAll(n, "-", "_")
	if urlName(n) {
		return true
	}
	for _, w := range secretWords {
		if strings.Contains(n, w) {
			return true
		}
	}
	return false
}

// secretWords mark a parameter, flag or variable name as secret when it contains
// one of them.
var secretWords = []string{"password", "passwd", "pwd", "secret", "token", "sig", "apikey", "api_key",
	"access_key", "accesskey", "private_key", "credential", "auth", "cookie", "session", "jwt", "bearer"}

// urlName reports names whose value is a connection string: redacted as one, so
// the host stays visible.
func urlName(n string) bool {
	return strings.HasSuffix(n, "url") || strings.HasSuffix(n, "dsn") || strings.HasSuffix(n, "uri") ||
		n == "broker" || strings.HasSuffix(n, "_broker") || n == "servers" || n == "brokers"
}

func hideValue(name, value string) string {
	n := strings.ReplaceAll(strings.ToLower(strings.TrimLeft(name, "-")), "-", "_")
	if urlName(n) {
		return URL(value)
	}
	if value == "" {
		return ""
	}
	return Mask
}

// sensitiveParam reports whether a URL query parameter or DSN key holds a secret.
func sensitiveParam(key string) bool {
	k := strings.ToLower(key)
	if k == "key" || k == "code" || k == "pass" || k == "pw" {
		return true
	}
	for _, w := range secretWords {
		if strings.Contains(k, w) {
			return true
		}
	}
	return false
}

var (
	// A URL of any scheme, up to white space, a quote or an angle bracket.
	urlRE = regexp.MustCompile(`(?i)\b[a-z][a-z0-9+.\-]*://[^\s"'<>\x60]*`)
	// The start of the next URL of a comma-separated list.
	listRE = regexp.MustCompile(`(?i),\s*[a-z][a-z0-9+.\-]*://`)
	// key=value or key: value where the key names a secret; the value is quoted or
	// runs to white space or a separator.
	kvRE = regexp.MustCompile(`(?i)\b([a-z0-9_.\-]*(?:password|passwd|pwd|secret|token|signature|api[_-]?key|access[_-]?key|private[_-]?key|credential|sslpassword)[a-z0-9_.\-]*)(\s*[=:]\s*)('(?:[^'\\]|\\.)*'|"(?:[^"\\]|\\.)*"|[^\s&;,'"#]+)`)
	// JSON "name": "value" (or "name": ["value", …]) where the name is secret.
	jsonRE = regexp.MustCompile(`(?i)("[a-z0-9_.\-]*(?:password|passwd|secret|token|signature|authorization|cookie|api[_-]?key|credential)[a-z0-9_.\-]*")\s*:\s*(?:"(?:[^"\\]|\\.)*"|\[\s*(?:"(?:[^"\\]|\\.)*"\s*,?\s*)*\])`)
	// Credentials of an HTTP authentication scheme.
	authRE = regexp.MustCompile(`(?i)\b(basic|bearer|digest|negotiate)\s+[A-Za-z0-9._~+/=\-]{6,}`)
	// Header lines whose whole value is a credential.
	headerRE = regexp.MustCompile(`(?im)\b(authorization|proxy-authorization|cookie|set-cookie|x-api-key|api-key|outbox-signature)\s*:\s*[^\r\n"]*`)
)

// urlList redacts one URL, or a comma-separated list of them.
func urlList(s string) string {
	idx := listRE.FindAllStringIndex(s, -1)
	if len(idx) == 0 {
		return oneURL(s)
	}
	var b strings.Builder
	start := 0
	for _, m := range idx {
		b.WriteString(oneURL(s[start:m[0]]))
		// Keep the comma and spaces; the scheme starts the next piece.
		sep := s[m[0]:m[1]]
		cut := strings.LastIndexAny(sep, ", \t") + 1
		b.WriteString(sep[:cut])
		start = m[0] + cut
	}
	b.WriteString(oneURL(s[start:]))
	return b.String()
}

// oneURL redacts the user info and secret parameters of one URL.
func oneURL(s string) string {
	scheme, rest, ok := strings.Cut(s, "://")
	if !ok {
		return s
	}
	var b strings.Builder
	b.WriteString(scheme + "://")
	if at := strings.LastIndexByte(rest, '@'); at >= 0 {
		info := rest[:at]
		switch {
		case strings.ContainsAny(info, "/?#"):
			// An '@' after the host: either a password holding /, ? or # (which no
			// parser reads as such) or an '@' in the path or query. Hide it all.
			b.WriteString(Mask)
		default:
			user, _, hasPass := strings.Cut(info, ":")
			switch {
			case hasPass:
				b.WriteString(user + ":" + Mask)
			case keepsUser(scheme):
				b.WriteString(user)
			default:
				b.WriteString(Mask) // a bare token: nats://token@host
			}
		}
		b.WriteByte('@')
		rest = rest[at+1:]
	}
	// Parameters in the query and the fragment (#access_token=… of OAuth).
	cut := strings.IndexAny(rest, "?#")
	if cut < 0 {
		b.WriteString(rest)
		return b.String()
	}
	b.WriteString(rest[:cut])
	rest = rest[cut:]
	for rest != "" {
		b.WriteByte(rest[0]) // '?' or '#'
		rest = rest[1:]
		part := rest
		if i := strings.IndexByte(rest, '#'); i >= 0 {
			part = rest[:i]
		}
		rest = rest[len(part):]
		b.WriteString(params(part))
	}
	return b.String()
}

// keepsUser reports schemes whose user name without a password is a name, not a
// token.
func keepsUser(scheme string) bool {
	switch strings.ToLower(scheme) {
	case "postgres", "postgresql", "amqp", "amqps":
		return true
	}
	return false
}

// params redacts the secret values of a&b=c;d=e.
func params(q string) string {
	pairs := strings.FieldsFunc(q, func(r rune) bool { return r == '&' || r == ';' })
	seps := make([]byte, 0, len(pairs))
	for i := 0; i < len(q); i++ {
		if q[i] == '&' || q[i] == ';' {
			seps = append(seps, q[i])
		}
	}
	var b strings.Builder
	si := 0
	lead := 0
	for lead < len(q) && (q[lead] == '&' || q[lead] == ';') {
		b.WriteByte(q[lead])
		lead++
		si++
	}
	for i, p := range pairs {
		if i > 0 && si < len(seps) {
			b.WriteByte(seps[si])
			si++
		}
		k, _, hasValue := strings.Cut(p, "=")
		if uk, err := url.QueryUnescape(k); err == nil {
			k = uk
		}
		if hasValue && sensitiveParam(k) {
			b.WriteString(p[:strings.IndexByte(p, '=')+1] + Mask)
			continue
		}
		b.WriteString(p)
	}
	for ; si < len(seps); si++ {
		b.WriteByte(seps[si])
	}
	return b.String()
}

// keyValues redacts a key=value DSN: password='a b' sslpassword=x → masked.
func keyValues(s string) string {
	return dsnRE.ReplaceAllStringFunc(s, func(m string) string {
		sub := dsnRE.FindStringSubmatch(m)
		if !sensitiveParam(sub[1]) {
			return m
		}
		return sub[1] + sub[2] + Mask
	})
}

var dsnRE = regexp.MustCompile(`([A-Za-z_][A-Za-z0-9_]*)(\s*=\s*)('(?:[^'\\]|\\.)*'|[^\s']*)`)

// replaceKnown replaces each secret, and the forms it travels in, by Mask.
func replaceKnown(s string, secrets []string) string {
	var forms []string
	for _, sec := range secrets {
		if len(sec) < minSecretLen {
			continue
		}
		forms = append(forms, sec, url.QueryEscape(sec), url.PathEscape(sec),
			base64.StdEncoding.EncodeToString([]byte(sec)), base64.RawURLEncoding.EncodeToString([]byte(sec)))
	}
	// Longest first, so a secret's escaped form is not half-replaced by a shorter one.
	slices.SortFunc(forms, func(a, b string) int { return len(b) - len(a) })
	for _, f := range slices.Compact(forms) {
		if len(f) >= minSecretLen {
			s = strings.ReplaceAll(s, f, Mask)
		}
	}
	return s
}

// Secrets returns the secret values held in connection strings (URLs of any
// scheme, comma-separated lists, key=value DSNs): user-info passwords, bare
// tokens, and sensitive parameters, decoded. Text(s, Secrets(urls...)...) then
// hides them wherever an error message repeats them out of their URL.
func Secrets(connStrings ...string) []string {
	var out []string
	add := func(v string) {
		if v != "" && v != Mask {
			out = append(out, v)
			if dec, err := url.QueryUnescape(v); err == nil && dec != v {
				out = append(out, dec)
			}
		}
	}
	for _, s := range connStrings {
		for _, m := range kvRE.FindAllStringSubmatch(s, -1) {
			add(strings.Trim(m[3], `'"`))
		}
		if !strings.Contains(s, "://") {
			for _, m := range dsnRE.FindAllStringSubmatch(s, -1) {
				if sensitiveParam(m[1]) {
					add(strings.Trim(m[3], "'"))
				}
			}
			continue
		}
		for _, u := range splitList(s) {
			scheme, rest, _ := strings.Cut(u, "://")
			if at := strings.LastIndexByte(rest, '@'); at >= 0 {
				info := rest[:at]
				rest = rest[at+1:]
				user, pass, hasPass := strings.Cut(info, ":")
				switch {
				case hasPass:
					add(pass)
				case !keepsUser(scheme):
					add(user)
				}
			}
			if i := strings.IndexAny(rest, "?#"); i >= 0 {
				for _, p := range strings.FieldsFunc(rest[i+1:], func(r rune) bool { return r == '&' || r == ';' || r == '#' }) {
					k, v, ok := strings.Cut(p, "=")
					if uk, err := url.QueryUnescape(k); err == nil {
						k = uk
					}
					if ok && sensitiveParam(k) {
						add(v)
					}
				}
			}
		}
	}
	return out
}

// splitList splits a comma-separated list of URLs.
func splitList(s string) []string {
	var out []string
	start := 0
	for _, m := range listRE.FindAllStringIndex(s, -1) {
		out = append(out, s[start:m[0]])
		sep := s[m[0]:m[1]]
		start = m[0] + strings.LastIndexAny(sep, ", \t") + 1
	}
	return append(out, s[start:])
}

// Endpoint returns s, a connection string or a comma-separated list of them,
// in its strictest display, for lines that only need to say where something
// goes: everything before the last '@' (user names, passwords and tokens of every
// server in the list, whatever characters they hold) becomes Mask, and the query
// and fragment become "?…" unless keepQuery (a scheme whose query holds no
// secrets). It returns "" when s has no scheme, so that a caller shows a
// placeholder rather than a string it cannot tell apart from a secret.
func Endpoint(s string, keepQuery bool) string {
	scheme, rest, ok := strings.Cut(strings.TrimSpace(s), "://")
	if !ok || scheme == "" {
		return ""
	}
	creds := ""
	if i := strings.LastIndexByte(rest, '@'); i >= 0 {
		rest, creds = rest[i+1:], Mask+"@"
	}
	if q := strings.IndexAny(rest, "?#"); q >= 0 && !keepQuery {
		rest = rest[:q] + "?…"
	}
	return scheme + "://" + creds + rest
}
