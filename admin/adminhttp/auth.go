package adminhttp

import (
	"bufio"
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"sync"
	"time"
	"unicode"

	"golang.org/x/crypto/bcrypt"
)

// Role is what a signed-in user may do.
type Role int

const (
	// RoleViewer sees every page and acts on nothing.
	RoleViewer Role = iota + 1
	// RoleOperator also retries and skips dead letters and runs replays.
	RoleOperator
)

func (r Role) String() string {
	switch r {
	case RoleViewer:
		return "viewer"
	case RoleOperator:
		return "operator"
	}
	return fmt.Sprintf("Role(%d)", int(r))
}

// ParseRole reads "viewer" or "operator".
func ParseRole(s string) (Role, error) {
	switch s {
	case "viewer":
		return RoleViewer, nil
	case "operator":
		return RoleOperator, nil
	}
	return 0, fmt.Errorf("role %q: want viewer or operator", s)
}

// User may sign in to the console.
type User struct {
	// Name is recorded in the audit as the actor ("console:<name>"): 1 to 64
	// letters, digits and ._@-.
	Name string
	Role Role
	// Secret is how the user proves who they are, in one of two forms:
	//
	//   - a slow salted hash of the user's password: bcrypt ("$2b$12$…", cost 10
	//     to 14) as pgoutbox console hash-password prints it, or argon2id as a
	//     PHC string ("$argon2id$v=19$m=19456,t=2,p=1$<salt>$<hash>", 19 to 128
	//     MiB, at least 2 passes under 38 MiB): the user signs in with HTTP
	//     basic auth, name and password;
	//   - a generated token of at least 32 characters (openssl rand -hex 16, or
	//     longer), no white space or control characters, at least 8 different
	//     characters: sent as a bearer token, or as the basic-auth password.
	//
	// Anything else is refused, in particular a "sha256:" hash: a fast hash
	// lets a short secret in, and a stolen file be guessed at billions a second.
	// Secrets must differ between users.
	Secret string
}

// Limits of the users' file and of its secrets.
const (
	// MinTokenBytes is the shortest token a user may have.
	MinTokenBytes = 32
	// MinPasswordBytes is the shortest password HashPassword hashes.
	MinPasswordBytes = 12
	// BcryptCost is the cost of HashPassword's hashes; secrets may have a cost in
	// minBcryptCost..maxBcryptCost.
	BcryptCost = 12

	minTokenRunes = 8 // different characters in a token
	maxUserName   = 64
	maxUsers      = 10000
	maxUsersFile  = 1 << 20
)

// ErrUsers is wrapped by the errors of ParseUsers and LoadUsers; they never hold
// a secret.
var ErrUsers = errors.New("adminhttp: bad users")

// ParseUsers reads users, one a line: "<name> <role> <secret>", separated by
// white space; blank lines and lines starting with # are ignored. Errors name
// the line, never the secret.
func ParseUsers(r io.Reader) ([]User, error) {
	data, err := io.ReadAll(io.LimitReader(r, maxUsersFile+1))
	if err != nil {
		return nil, fmt.Errorf("%w: read: %w", ErrUsers, err)
	}
	if len(data) > maxUsersFile {
		return nil, fmt.Errorf("%w: more than %d bytes", ErrUsers, maxUsersFile)
	}
	var users []User
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(make([]byte, 64*1024), maxUsersFile)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		f := strings.Fields(line)
		if len(f) != 3 {
			return nil, fmt.Errorf("%w: line %d: want \"<name> <role> <secret>\", got %d fields", ErrUsers, n, len(f))
		}
		role, err := ParseRole(f[1])
		if err != nil {
			// Not ParseRole's error: it quotes the field, which may be a secret
			// on a line whose fields are out of order.
			return nil, fmt.Errorf("%w: line %d: the second field must be viewer or operator (\"<name> <role> <secret>\")", ErrUsers, n)
		}
		users = append(users, User{Name: f[0], Role: role, Secret: f[2]})
		if err := checkUsers(users); err != nil {
			return nil, fmt.Errorf("line %d: %w", n, err)
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrUsers, err)
	}
	if len(users) == 0 {
		return nil, fmt.Errorf("%w: no users", ErrUsers)
	}
	return users, nil
}

// LoadUsers reads the users' file at path (see ParseUsers). A file that other
// users of the machine may read is refused: it holds secrets.
func LoadUsers(path string) ([]User, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrUsers, err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrUsers, err)
	}
	if fi.Mode().Perm()&0o007 != 0 {
		return nil, fmt.Errorf("%w: %s is readable or writable by every user of the machine (mode %s); chmod o-rwx it", ErrUsers, path, fi.Mode().Perm())
	}
	users, err := ParseUsers(f)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return users, nil
}

// HashPassword returns the bcrypt hash of password to put in a users' file
// (User.Secret): a password of at least MinPasswordBytes bytes, at most 72
// (bcrypt reads no further), without white space or control characters.
func HashPassword(password []byte) (string, error) {
	switch {
	case len(password) < MinPasswordBytes:
		return "", fmt.Errorf("%w: a password must be at least %d bytes", ErrUsers, MinPasswordBytes)
	case len(password) > 72:
		return "", fmt.Errorf("%w: a password must be at most 72 bytes (bcrypt reads no further)", ErrUsers)
	case bytes.ContainsFunc(password, unprintable):
		return "", fmt.Errorf("%w: a password must not hold white space or control characters", ErrUsers)
	}
	h, err := bcrypt.GenerateFromPassword(password, BcryptCost)
	if err != nil {
		return "", fmt.Errorf("%w: hash the password: %w", ErrUsers, err)
	}
	return string(h), nil
}

// checkUsers validates users; its errors never hold a secret, nor a name
// (on a line whose fields are out of order the name may be the secret): a user
// is named by its position.
func checkUsers(users []User) error {
	if len(users) > maxUsers {
		return fmt.Errorf("%w: more than %d users", ErrUsers, maxUsers)
	}
	names := map[string]bool{}
	secrets := map[[sha256.Size]byte]bool{}
	for i, u := range users {
		if !validName(u.Name) {
			return fmt.Errorf("%w: user %d: name must be 1 to %d letters, digits and ._@-", ErrUsers, i+1, maxUserName)
		}
		if names[u.Name] {
			return fmt.Errorf("%w: user %d has the name of an earlier user", ErrUsers, i+1)
		}
		names[u.Name] = true
		if u.Role != RoleViewer && u.Role != RoleOperator {
			return fmt.Errorf("%w: user %d: role must be viewer or operator", ErrUsers, i+1)
		}
		s, err := parseSecret(u.Secret)
		if err != nil {
			return fmt.Errorf("%w: user %d: %w", ErrUsers, i+1, err)
		}
		if secrets[s.id] {
			return fmt.Errorf("%w: user %d has the secret of an earlier user; each needs its own", ErrUsers, i+1)
		}
		secrets[s.id] = true
	}
	return nil
}

func validName(s string) bool {
	if s == "" || len(s) > maxUserName {
		return false
	}
	for _, r := range s {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("._@-", r)) {
			return false
		}
	}
	return true
}

// secret is a user's secret as the console checks it.
type secret struct {
	token [sha256.Size]byte // SHA-256 of a token; zero for a hash
	hash  passwordHash      // a password's hash; nil for a token
	// id stands for the secret in the anti-forgery token and in the check
	// that users have different secrets.
	id [sha256.Size]byte
}

// errFastHash refuses the "sha256:" form of old versions.
var errFastHash = errors.New("a sha256: secret is refused: a fast hash lets a short secret in and is guessed quickly " +
	"if the file leaks; give a bcrypt hash (pgoutbox console hash-password) or a generated token of at least 32 characters")

// parseSecret reads a User.Secret; its errors never hold the secret.
func parseSecret(s string) (secret, error) {
	var out secret
	var parse func(string) (passwordHash, error)
	switch {
	case strings.HasPrefix(strings.ToLower(s), "sha256:"):
		return out, errFastHash
	case strings.HasPrefix(s, "$2a$") || strings.HasPrefix(s, "$2b$") || strings.HasPrefix(s, "$2y$"):
		parse = parseBcrypt
	case strings.HasPrefix(s, "$argon2id$"):
		parse = parseArgon2id
	case strings.HasPrefix(s, "$"):
		return out, errors.New("a secret starting with $ must be a bcrypt ($2b$…) or argon2id ($argon2id$…) hash; other formats are not read")
	case len(s) < MinTokenBytes:
		return out, fmt.Errorf("a token must be at least %d characters (openssl rand -hex 16), or give a password hash (pgoutbox console hash-password)", MinTokenBytes)
	case strings.ContainsFunc(s, unprintable):
		return out, errors.New("a token must not hold white space or control characters")
	case distinct(s) < minTokenRunes:
		return out, fmt.Errorf("a token must hold at least %d different characters: generate it (openssl rand -hex 16)", minTokenRunes)
	default:
		out.token = sha256.Sum256([]byte(s))
		out.id = out.token
		return out, nil
	}
	h, err := parse(s)
	if err != nil {
		return out, err
	}
	out.hash, out.id = h, sha256.Sum256([]byte(s))
	return out, nil
}

func unprintable(r rune) bool {
	return r <= ' ' || r == 0x7f || unicode.IsSpace(r) || unicode.IsControl(r)
}

func distinct(s string) int {
	seen := map[rune]bool{}
	for _, r := range s {
		seen[r] = true
	}
	return len(seen)
}

// principal is who a request comes from.
type principal struct {
	name  string
	role  Role
	actor string // as recorded in the audit
	csrf  string // the anti-forgery token of this user's forms
}

type account struct {
	name   string
	role   Role
	secret secret
}

// Bounds of the authenticator's work and memory.
const (
	// maxAuthHeader bounds the Authorization header read.
	maxAuthHeader = 4096
	// maxHashChecks bounds the password-hash checks running at once (each
	// takes a CPU for tens of milliseconds, an argon2id one up to 128 MiB); the
	// others wait their turn.
	maxHashChecks = 2
	// maxKnown caps the credentials remembered as checked.
	maxKnown = 1024
)

// authenticator checks credentials: tokens in constant time over every
// account, password hashes at most maxHashChecks at once; the credentials of a
// request it has accepted are remembered (as a keyed MAC) so that a browser's
// next requests do not each cost a hash check. Failures go through the limiter.
type authenticator struct {
	noAuth   *principal
	accounts []account
	csrfKey  []byte
	limits   *limiter
	hashing  chan struct{} // a slot per hash check running
	dummy    passwordHash  // checked for unknown names, so they cost the same

	mu       sync.Mutex
	known    map[[sha256.Size]byte]int // MAC of a credential → account index
	knownAge [][sha256.Size]byte       // the keys of known, oldest first
}

func newAuthenticator(c *Config, key []byte, now func() time.Time) *authenticator {
	a := &authenticator{csrfKey: key, limits: newLimiter(c.Logger, now), hashing: make(chan struct{}, maxHashChecks),
		known: map[[sha256.Size]byte]int{}}
	if c.NoAuth {
		a.noAuth = &principal{name: "(no auth)", role: RoleOperator, actor: c.NoAuthActor, csrf: a.token("noauth", [sha256.Size]byte{})}
		return a
	}
	for _, u := range c.Users {
		s, _ := parseSecret(u.Secret) // checked by Validate
		a.accounts = append(a.accounts, account{name: u.Name, role: u.Role, secret: s})
		if s.hash != nil && a.dummy == nil {
			a.dummy = s.hash
		}
	}
	return a
}

// token is the CSRF token of one user's forms: a MAC of the user and the id of
// their secret, so it changes with the secret and cannot be made without the key.
func (a *authenticator) token(name string, id [sha256.Size]byte) string {
	m := hmac.New(sha256.New, a.csrfKey)
	m.Write([]byte("pgoutbox-console-csrf\x00" + name + "\x00"))
	m.Write(id[:])
	return base64.RawURLEncoding.EncodeToString(m.Sum(nil))
}

// authResult is the outcome of authenticate.
type authResult int

const (
	authNone    authResult = iota // no credentials: ask for them
	authOK                        // signed in
	authFailed                    // wrong credentials
	authLimited                   // too many failures: retry after the duration returned
)

// authenticate returns who r comes from. A request whose client, named user or
// console has failed too often is refused without its credentials being
// checked (authLimited, with how long to wait).
func (a *authenticator) authenticate(r *http.Request) (*principal, authResult, time.Duration) {
	if a.noAuth != nil {
		return a.noAuth, authOK, 0
	}
	h := r.Header.Get("Authorization")
	if h == "" {
		return nil, authNone, 0
	}
	var name, secret string
	if len(h) <= maxAuthHeader {
		if tok, ok := cutPrefixFold(h, "Bearer "); ok {
			secret = strings.TrimSpace(tok)
		} else if user, pass, ok := r.BasicAuth(); ok {
			name, secret = user, pass
		}
	}
	mac := a.mac(name, secret)
	if i, ok := a.remembered(mac); ok {
		return a.principal(i), authOK, 0
	}
	user := ""
	if i := a.byName(name); i >= 0 {
		user = a.accounts[i].name
	}
	at, wait := a.limits.begin(clientKey(r.RemoteAddr), user)
	if at == nil {
		return nil, authLimited, wait
	}
	i := a.check(r.Context(), name, secret)
	if i < 0 {
		at.failed()
		return nil, authFailed, 0
	}
	at.succeeded()
	a.remember(mac, i)
	return a.principal(i), authOK, 0
}

func (a *authenticator) principal(i int) *principal {
	acc := &a.accounts[i]
	return &principal{name: acc.name, role: acc.role, actor: "console:" + acc.name, csrf: a.token(acc.name, acc.secret.id)}
}

// byName returns the index of the account named name, or -1; the comparison
// takes the same time whichever account matches.
func (a *authenticator) byName(name string) int {
	found := -1
	if name == "" {
		return found
	}
	for i := range a.accounts {
		if subtle.ConstantTimeCompare([]byte(name), []byte(a.accounts[i].name)) == 1 {
			found = i
		}
	}
	return found
}

// check returns the index of the account that name (or, for a bearer token,
// "") and secret sign in as, or -1.
func (a *authenticator) check(ctx context.Context, name, secret string) int {
	if secret == "" {
		return -1
	}
	got := sha256.Sum256([]byte(secret))
	if name == "" { // a bearer token: any token account
		found := -1
		for i := range a.accounts {
			if s := &a.accounts[i].secret; s.hash == nil && subtle.ConstantTimeCompare(got[:], s.token[:]) == 1 {
				found = i
			}
		}
		return found
	}
	i := a.byName(name)
	if i >= 0 && a.accounts[i].secret.hash == nil {
		if subtle.ConstantTimeCompare(got[:], a.accounts[i].secret.token[:]) == 1 {
			return i
		}
		return -1
	}
	hash := a.dummy // an unknown name costs a hash check too
	if i >= 0 {
		hash = a.accounts[i].secret.hash
	}
	if hash == nil {
		return -1
	}
	select {
	case a.hashing <- struct{}{}:
	case <-ctx.Done():
		return -1
	}
	ok := hash.matches([]byte(secret))
	<-a.hashing
	if !ok || i < 0 {
		return -1
	}
	return i
}

// mac is the key credentials are remembered by: a MAC under the process's
// key, so the table holds nothing a guess could be checked against.
func (a *authenticator) mac(name, secret string) [sha256.Size]byte {
	m := hmac.New(sha256.New, a.csrfKey)
	m.Write([]byte("pgoutbox-console-known\x00" + name + "\x00" + secret))
	var out [sha256.Size]byte
	copy(out[:], m.Sum(nil))
	return out
}

func (a *authenticator) remembered(mac [sha256.Size]byte) (int, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	i, ok := a.known[mac]
	return i, ok
}

func (a *authenticator) remember(mac [sha256.Size]byte, i int) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if _, ok := a.known[mac]; ok {
		return
	}
	a.knownAge = evictOldest(a.known, a.knownAge, maxKnown)
	a.known[mac] = i
	a.knownAge = append(a.knownAge, mac)
}

func cutPrefixFold(s, prefix string) (string, bool) {
	if len(s) >= len(prefix) && strings.EqualFold(s[:len(prefix)], prefix) {
		return s[len(prefix):], true
	}
	return "", false
}

// tokenEqual compares anti-forgery tokens in constant time.
func tokenEqual(got, want string) bool {
	return got != "" && subtle.ConstantTimeCompare([]byte(got), []byte(want)) == 1
}
