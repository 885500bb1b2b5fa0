package adminhttp_test

import (
	"bufio"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/crypto/argon2"
	"golang.org/x/crypto/bcrypt"

	"github.com/pgoutbox/pgoutbox/admin/adminhttp"
	"github.com/pgoutbox/pgoutbox/internal/logtest"
)

// carolPassword signs in as carol, whose users' line holds carolHash, its
// argon2id hash at the least cost the console accepts; argon2idPHC writes one.
var (
	carolPassword = "carol-" + secret()
	carolHash     = argon2idPHC(carolPassword, 19*1024, 2, 1)
)

func argon2idPHC(password string, memory, time uint32, lanes uint8) string {
	salt := []byte(secret())[:16]
	key := argon2.IDKey([]byte(password), salt, time, memory, lanes, 32)
	return fmt.Sprintf("$argon2id$v=19$m=%d,t=%d,p=%d$%s$%s", memory, time, lanes,
		base64.RawStdEncoding.EncodeToString(salt), base64.RawStdEncoding.EncodeToString(key))
}

// bobPassword signs in as bob, whose users' line holds bobHash, its bcrypt
// hash at the least cost the console accepts; cheapHash has a cost it refuses.
var (
	bobPassword        = "bob-" + secret()
	bobHash, cheapHash = func() (string, string) {
		h, err := bcrypt.GenerateFromPassword([]byte(bobPassword), 10)
		c, err2 := bcrypt.GenerateFromPassword([]byte(bobPassword), bcrypt.MinCost)
		if err != nil || err2 != nil {
			panic("bcrypt")
		}
		return string(h), string(c)
	}()
)

// signIn sends GET / from the client at remote with the Authorization header
// auth ("" for none), straight to the handler.
func (e *env) signIn(remote, auth string) *httptest.ResponseRecorder {
	e.t.Helper()
	req := httptest.NewRequest("GET", "/?schema="+e.schema, nil)
	req.RemoteAddr = remote
	if auth != "" {
		req.Header.Set("Authorization", auth)
	}
	rec := httptest.NewRecorder()
	e.h.ServeHTTP(rec, req)
	return rec
}

func (e *env) wantStatus(what string, rec *httptest.ResponseRecorder, want int) {
	e.t.Helper()
	if rec.Code != want {
		e.t.Fatalf("%s: %d, want %d: %s", what, rec.Code, want, rec.Body.String())
	}
	if want == http.StatusTooManyRequests {
		n, err := strconv.Atoi(rec.Header().Get("Retry-After"))
		if err != nil || n < 1 || n > 60 {
			e.t.Fatalf("%s: Retry-After %q, want 1..60 seconds", what, rec.Header().Get("Retry-After"))
		}
	}
}

// Failures of one client: ten of any kind, then 429 without the credentials
// being checked, even right ones, until the bucket refills; other clients and
// credentials already accepted are not held up.
func TestSignInLimitPerClient(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	const me = "192.0.2.1:40000"
	e.wantStatus("victor before", e.signIn("192.0.2.1:1", basic("victor", e.victorKey)), http.StatusOK)
	wrong := []string{basic("alice", e.aliceKey+"x"), "Bearer " + secret(), basic("mallory", e.aliceKey), "Basic !!!",
		"Bearer " + strings.Repeat("a", 5000), "Token " + e.aliceKey, basic("alice", ""), "Bearer ", basic("victor", e.aliceKey),
		basic("alice", strings.Repeat("p", 100))}
	for i, auth := range wrong {
		e.wantStatus("failure "+strconv.Itoa(i), e.signIn(me, auth), http.StatusUnauthorized)
	}
	e.wantStatus("alice's right password past the limit", e.signIn(me, basic("alice", e.aliceKey)), http.StatusTooManyRequests)
	e.wantStatus("alice's right token past the limit", e.signIn("192.0.2.1:40001", "Bearer "+e.aliceKey), http.StatusTooManyRequests)
	e.wantStatus("a wrong password past the limit", e.signIn(me, basic("alice", "x")), http.StatusTooManyRequests)
	e.wantStatus("another client", e.signIn("192.0.2.2:40000", basic("alice", e.aliceKey)), http.StatusOK)
	e.wantStatus("victor, signed in before, from the limited client", e.signIn(me, basic("victor", e.victorKey)), http.StatusOK)
	e.clock.Add(5 * time.Second)
	e.wantStatus("5s later", e.signIn(me, "Bearer "+e.aliceKey), http.StatusTooManyRequests)
	e.clock.Add(time.Second)
	e.wantStatus("6s later, a guess", e.signIn(me, "Bearer "+secret()), http.StatusUnauthorized)
	e.wantStatus("and the next", e.signIn(me, "Bearer "+secret()), http.StatusTooManyRequests)
	e.clock.Add(6 * time.Second)
	e.wantStatus("6s later, alice", e.signIn(me, "Bearer "+e.aliceKey), http.StatusOK)
	e.wantStatus("a success gives its token back", e.signIn(me, "Bearer "+secret()), http.StatusUnauthorized)
	e.clock.Add(time.Hour)
	for i := range 10 {
		e.wantStatus("an hour later, failure "+strconv.Itoa(i), e.signIn(me, "Bearer "+secret()), http.StatusUnauthorized)
	}
	// Without credentials the browser is asked for them: not a failure.
	e.clock.Add(time.Hour)
	for range 30 {
		e.wantStatus("no credentials", e.signIn(me, ""), http.StatusUnauthorized)
	}
	e.wantStatus("after asking 30 times", e.signIn(me, basic("alice", e.aliceKey)), http.StatusOK)
}

// Failures against one user from many clients: twenty, then that user's
// sign-ins wait, unless their credentials were accepted before; other users
// are not held up.
func TestSignInLimitPerUser(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	e.wantStatus("victor before", e.signIn("198.51.100.1:1", basic("victor", e.victorKey)), http.StatusOK)
	for i := range 20 {
		e.wantStatus("guess "+strconv.Itoa(i), e.signIn("203.0.113."+strconv.Itoa(i+1)+":1", basic("alice", "guess-"+strconv.Itoa(i))), http.StatusUnauthorized)
	}
	e.wantStatus("alice's right password from a new client", e.signIn("198.51.100.2:1", basic("alice", e.aliceKey)), http.StatusTooManyRequests)
	e.wantStatus("a guess for alice from a new client", e.signIn("198.51.100.3:1", basic("alice", "guess")), http.StatusTooManyRequests)
	e.wantStatus("alice's token from a new client", e.signIn("198.51.100.4:1", "Bearer "+e.aliceKey), http.StatusOK)
	e.wantStatus("victor from a new client", e.signIn("198.51.100.5:1", basic("victor", e.victorKey)), http.StatusOK)
	e.clock.Add(6 * time.Second)
	e.wantStatus("alice 6s later", e.signIn("198.51.100.2:1", basic("alice", e.aliceKey)), http.StatusOK)
	// Accepted once, alice's credentials are not held up by guesses against her.
	for i := range 25 {
		e.signIn("203.0.113."+strconv.Itoa(100+i)+":1", basic("alice", "guess-"+strconv.Itoa(i)))
	}
	e.wantStatus("alice signed in before", e.signIn("198.51.100.9:1", basic("alice", e.aliceKey)), http.StatusOK)
	e.wantStatus("a guess for alice", e.signIn("198.51.100.10:1", basic("alice", "x")), http.StatusTooManyRequests)
}

// Guesses from many clients, none past its own limit: the console's limit
// holds them all to one a second once a hundred failed.
func TestSignInLimitOverAllClients(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	for i := range 100 {
		e.wantStatus("client "+strconv.Itoa(i), e.signIn("10.0."+strconv.Itoa(i/250)+"."+strconv.Itoa(i%250+1)+":1", "Bearer "+secret()),
			http.StatusUnauthorized)
	}
	e.wantStatus("client 101", e.signIn("10.1.0.1:1", "Bearer "+secret()), http.StatusTooManyRequests)
	e.clock.Add(time.Second)
	e.wantStatus("a second later", e.signIn("10.1.0.2:1", "Bearer "+secret()), http.StatusUnauthorized)
	e.wantStatus("and the next", e.signIn("10.1.0.3:1", "Bearer "+secret()), http.StatusTooManyRequests)
}

// An IPv6 client is its /64, and an IPv4-mapped address its IPv4 address:
// changing the address within them does not reset the limit.
func TestSignInLimitClientAddresses(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	for i := range 10 {
		e.wantStatus("v6 guess", e.signIn("[2001:db8::"+strconv.FormatInt(int64(i+1), 16)+"]:1", "Bearer "+secret()), http.StatusUnauthorized)
	}
	e.wantStatus("same /64", e.signIn("[2001:db8::ffff:1234]:9", "Bearer "+e.aliceKey), http.StatusTooManyRequests)
	e.wantStatus("another /64", e.signIn("[2001:db8:0:1::1]:9", "Bearer "+e.aliceKey), http.StatusOK)
	for i := range 10 {
		e.wantStatus("v4 guess", e.signIn("192.0.2.77:"+strconv.Itoa(1000+i), "Bearer "+secret()), http.StatusUnauthorized)
	}
	e.wantStatus("v4-mapped", e.signIn("[::ffff:192.0.2.77]:1", "Bearer "+e.victorKey), http.StatusTooManyRequests)
	for i := range 10 {
		e.wantStatus("zoned guess", e.signIn("[fe80::"+strconv.Itoa(i+1)+"%eth"+strconv.Itoa(i)+"]:1", "Bearer "+secret()), http.StatusUnauthorized)
	}
	e.wantStatus("same /64, another zone", e.signIn("[fe80::99%lo]:1", "Bearer "+e.victorKey), http.StatusTooManyRequests)
	for i := range 10 {
		e.wantStatus("unparsable address", e.signIn("somewhere:"+strconv.Itoa(i), "Bearer "+secret()), http.StatusUnauthorized)
	}
	e.wantStatus("another unparsable address", e.signIn("elsewhere", "Bearer "+e.victorKey), http.StatusTooManyRequests)
}

// A password hash (bcrypt or argon2id) signs in with its user's name and
// password only.
func TestSignInWithPasswordHash(t *testing.T) {
	t.Parallel()
	e := newEnv(t, func(c *adminhttp.Config) {
		c.Users = append(c.Users, adminhttp.User{Name: "bob", Role: adminhttp.RoleViewer, Secret: bobHash},
			adminhttp.User{Name: "carol", Role: adminhttp.RoleOperator, Secret: carolHash})
	})
	for name, auth := range map[string]string{
		"the password as a bearer token": "Bearer " + bobPassword,
		"the hash as a bearer token":     "Bearer " + bobHash,
		"the hash as the password":       basic("bob", bobHash),
		"a wrong password":               basic("bob", bobPassword+"x"),
		"bob's password for alice":       basic("alice", bobPassword),
		"bob's password for an unknown":  basic("dave", bobPassword),
		"the password over 72 bytes":     basic("bob", bobPassword+strings.Repeat("x", 72)),
		"the password in another scheme": "Digest " + bobPassword,
		"bob with an empty password":     basic("bob", ""),
		"carol's password for bob":       basic("bob", carolPassword),
		"bob's password for carol":       basic("carol", bobPassword),
		"carol's password cut":           basic("carol", carolPassword[:len(carolPassword)-1]),
		"carol's as a bearer token":      "Bearer " + carolPassword,
	} {
		e.clock.Add(time.Hour)
		if r := e.signIn("192.0.2.1:1", auth); r.Code != http.StatusUnauthorized {
			t.Errorf("%s: %d, want 401", name, r.Code)
		}
	}
	e.wantStatus("bob", e.signIn("192.0.2.1:1", basic("bob", bobPassword)), http.StatusOK)
	e.wantStatus("bob again (remembered)", e.signIn("192.0.2.2:1", basic("bob", bobPassword)), http.StatusOK)
	e.wantStatus("carol", e.signIn("192.0.2.1:1", basic("carol", carolPassword)), http.StatusOK)
}

// argon2id hashes outside the bounds, or not in PHC form, are refused.
func TestArgon2idSecretsBounded(t *testing.T) {
	t.Parallel()
	good := strings.Split(carolHash, "$")
	with := func(i int, v string) string {
		p := append([]string(nil), good...)
		p[i] = v
		return strings.Join(p, "$")
	}
	for name, s := range map[string]string{
		"4 MiB":            with(3, "m=4096,t=3,p=1"),
		"1 pass at 19 MiB": with(3, "m=19456,t=1,p=1"),
		"1 GiB":            with(3, "m=1048576,t=2,p=1"),
		"100 passes":       with(3, "m=19456,t=100,p=1"),
		"no lanes":         with(3, "m=19456,t=2,p=0"),
		"256 lanes":        with(3, "m=19456,t=2,p=256"),
		"extra parameter":  with(3, "m=19456,t=2,p=1,x=1"),
		"leading zero":     with(3, "m=019456,t=2,p=1"),
		"order":            with(3, "t=2,m=19456,p=1"),
		"version 16":       with(2, "v=16"),
		"padded salt":      with(4, good[4]+"=="),
		"short salt":       with(4, "c2FsdA"),
		"bad base64":       with(5, "!!!!"+good[5][4:]),
		"short hash":       with(5, "aGFzaA"),
		"argon2i":          with(1, "argon2i"),
		"one part more":    carolHash + "$x",
		"one part less":    strings.Join(good[:5], "$"),
		"argon2d":          with(1, "argon2d"),
	} {
		_, err := adminhttp.ParseUsers(strings.NewReader("carol viewer " + s))
		if err == nil {
			t.Errorf("%s: accepted", name)
		} else if strings.Contains(err.Error(), good[5]) || strings.Contains(err.Error(), good[4]) {
			t.Errorf("%s: the error quotes the hash: %v", name, err)
		}
	}
	if _, err := adminhttp.ParseUsers(strings.NewReader("carol viewer " + with(3, "m=47104,t=1,p=1"))); err != nil {
		t.Errorf("46 MiB and 1 pass (OWASP's other setting): %v", err)
	}
}

// syncBuf is a log buffer the handler writes while the test reads.
type syncBuf struct{ logtest.Buffer }

// lines returns the JSON log lines whose msg is msg.
func (s *syncBuf) lines(t *testing.T, msg string) []map[string]any {
	t.Helper()
	var out []map[string]any
	sc := bufio.NewScanner(strings.NewReader(s.String()))
	for sc.Scan() {
		var m map[string]any
		if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
			t.Fatalf("log line %q: %v", sc.Text(), err)
		}
		if m["msg"] == msg {
			out = append(out, m)
		}
	}
	return out
}

func count(lines []map[string]any) int {
	n := 0
	for _, l := range lines {
		for _, k := range []string{"failures", "refused_429", "other_failures", "other_refused_429"} {
			if v, ok := l[k].(float64); ok {
				n += int(v)
			}
		}
	}
	return n
}

// Failed sign-ins are logged per client at most once a minute with their
// count, at most 20 lines a minute in all, each failure counted on a line, no
// guess in the log.
func TestSignInFailuresLoggedBounded(t *testing.T) {
	t.Parallel()
	logs := &syncBuf{}
	e := newEnv(t, func(c *adminhttp.Config) { c.Logger = slog.New(slog.NewJSONHandler(logs, nil)) })
	const msg = "console: sign-in refused"
	guesses := map[string]bool{}
	guess := func() string { g := "guess-" + secret(); guesses[g] = true; return g }
	// One client, 1000 guesses a second apart: 10 failures, then one in six.
	for range 1000 {
		e.signIn("192.0.2.1:1", basic("alice", guess()))
		e.clock.Add(time.Second)
	}
	lines := logs.lines(t, msg)
	if len(lines) < 16 || len(lines) > 17 {
		t.Errorf("1000 guesses over 1000 s: %d lines, want one a minute", len(lines))
	}
	if n := count(lines); n < 1000-60 || n > 1000 {
		t.Errorf("the lines count %d attempts of 1000 (all but the last minute's)", n)
	}
	if lines[0]["client"] != "192.0.2.1" || lines[0]["user"] != "alice" || lines[0]["failures"] != 1.0 {
		t.Errorf("first line: %v", lines[0])
	}
	// 500 clients in one minute: 20 lines; the rest counted on the next one.
	e.clock.Add(time.Hour)
	before := len(lines)
	for i := range 500 {
		e.signIn("10.9."+strconv.Itoa(i/200)+"."+strconv.Itoa(i%200+1)+":1", basic("mallory-"+strconv.Itoa(i), guess()))
	}
	lines = logs.lines(t, msg)
	if n := len(lines) - before; n != 20 {
		t.Errorf("500 clients in a minute: %d lines, want 20", n)
	}
	e.clock.Add(61 * time.Second)
	e.signIn("10.10.0.1:1", "Bearer "+guess())
	lines = logs.lines(t, msg)
	if n := count(lines[before:]); n != 501 {
		t.Errorf("the lines after count %d attempts, want 501: %v", n, lines[len(lines)-1])
	}
	for _, l := range lines[before:] {
		if u, ok := l["user"]; ok {
			t.Errorf("an unknown user's name is logged: %v", u)
		}
	}
	all := logs.String()
	for g := range guesses {
		if strings.Contains(all, g) {
			t.Fatalf("a guess is in the log")
		}
	}
	t.Logf("1,501 failed or refused sign-ins: %d log lines, %d bytes", len(lines), len(all))
}

// The examples of the documentation do not sign in: their secrets are
// placeholders that ParseUsers refuses.
func TestDocsExampleSecretsRefused(t *testing.T) {
	t.Parallel()
	doc, err := os.ReadFile("../../docs/console.md")
	if err != nil {
		t.Fatal(err)
	}
	_, block, ok := strings.Cut(string(doc), "<<'USERS'\n")
	block, _, ok2 := strings.Cut(block, "\nUSERS\n")
	if !ok || !ok2 {
		t.Fatal("docs/console.md has no users' example")
	}
	n := 0
	for line := range strings.SplitSeq(block, "\n") {
		if strings.HasPrefix(strings.TrimSpace(line), "#") || strings.TrimSpace(line) == "" {
			continue
		}
		n++
		if _, err := adminhttp.ParseUsers(strings.NewReader(line)); err == nil {
			t.Errorf("the example line %q signs in", line)
		}
	}
	if n == 0 {
		t.Fatal("no example line")
	}
}

// HashPassword's hashes sign in; short and odd passwords are refused.
func TestHashPassword(t *testing.T) {
	t.Parallel()
	for _, p := range []string{"", "short", "eleven-char", "has a space in it", "tab\there-and-long", strings.Repeat("x", 73)} {
		if _, err := adminhttp.HashPassword([]byte(p)); err == nil {
			t.Errorf("%q hashed", p)
		} else if p != "" && strings.Contains(err.Error(), p) {
			t.Errorf("the error holds the password: %v", err)
		}
	}
	h, err := adminhttp.HashPassword([]byte("twelve-chars"))
	if err != nil {
		t.Fatal(err)
	}
	users, err := adminhttp.ParseUsers(strings.NewReader("carol viewer " + h))
	if err != nil || len(users) != 1 {
		t.Fatalf("the hash is refused: %v", err)
	}
	// (TestSignInWithBcryptHash signs in through such a hash; checking this
	// one would cost seconds under the race detector.)
	if cost, err := bcrypt.Cost([]byte(h)); err != nil || cost != adminhttp.BcryptCost {
		t.Fatalf("cost %d %v", cost, err)
	}
}

// ParseUsers never quotes a secret in its errors, whatever the file.
func FuzzParseUsers(f *testing.F) {
	for _, s := range []string{"alice operator 0123456789abcdef0123456789abcdef", "a viewer sha256:" + strings.Repeat("ab", 32),
		"a viewer " + bobHash, "a viewer " + cheapHash, "a viewer " + carolHash, "a viewer $2b$99$" + strings.Repeat("x", 53), "a viewer $argon2id$v=19$x",
		"a b c\nd e f", "# c\n\na operator " + strings.Repeat("z", 31), "a operator aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
		"alice 0123456789abcdef0123456789abcdef operator", "0123456789abcdef0123456789abcdef operator alice",
		"x aaaaaaaaaaaaaaaa aaaaaaaaaaaaaaaa"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, text string) {
		users, err := adminhttp.ParseUsers(strings.NewReader(text))
		if err == nil {
			if len(users) == 0 {
				t.Fatal("no users and no error")
			}
			return
		}
		// No field is quoted: on a line out of order any may be the secret.
		// Fields of 16 bytes or more: shorter runs without spaces occur in
		// the messages themselves ("sha256:", "hash-password").
		for line := range strings.SplitSeq(text, "\n") {
			for _, f := range strings.Fields(line) {
				if len(f) >= 16 && strings.Contains(err.Error(), f) {
					t.Fatalf("the error quotes the field %q: %v", f, err)
				}
			}
		}
	})
}

// How many sign-ins a client gets checked per second once it is past the
// limit, over real HTTP and the real clock: a one-off measurement for
// docs/console.md, PGOUTBOX_CONSOLE_MEASURE=1 go test -run
// TestSignInRateFigure -v ./admin/adminhttp.
func TestSignInRateFigure(t *testing.T) {
	if os.Getenv("PGOUTBOX_CONSOLE_MEASURE") != "1" {
		t.Skip("a measurement: PGOUTBOX_CONSOLE_MEASURE=1")
	}
	logs := &syncBuf{}
	e := newEnv(t, func(c *adminhttp.Config) { c.Logger = slog.New(slog.NewJSONHandler(logs, nil)) })
	adminhttp.SetClock(e.h, time.Now)
	c := &http.Client{}
	status := map[int]int{}
	const d = 10 * time.Second
	start := time.Now()
	for time.Since(start) < d {
		req, _ := http.NewRequest("GET", e.srv.URL+"/", nil)
		req.SetBasicAuth("alice", "guess-"+secret())
		res, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, res.Body)
		res.Body.Close()
		status[res.StatusCode]++
	}
	el := time.Since(start).Seconds()
	n := len(logs.String())
	t.Logf("%.1f s: %d attempts (%.0f/s); checked and refused (401): %d (%.2f/s, %d of them the first burst); "+
		"refused unchecked (429): %d; log: %d lines, %d bytes",
		el, status[401]+status[429], float64(status[401]+status[429])/el, status[401], float64(status[401]-10)/el, 10,
		status[429], len(logs.lines(t, "console: sign-in refused")), n)
}
