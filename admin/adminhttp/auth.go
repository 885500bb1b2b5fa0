package adminhttp

import (
	"bufio"
	"bytes"
	"crypto/hmac"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
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
	// Secret is the user's token (bearer) and basic-auth password: at least 16
	// bytes, no white space, or "sha256:" and the hex SHA-256 of it so the file
	// need not hold the secret itself. Secrets must differ between users.
	Secret string
}

// Limits of the users' file.
const (
	minSecretBytes = 16
	maxUserName    = 64
	maxUsers       = 10000
	maxUsersFile   = 1 << 20
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
			return nil, fmt.Errorf("%w: line %d: %w", ErrUsers, n, err)
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

// checkUsers validates users; its errors never hold a secret.
func checkUsers(users []User) error {
	if len(users) > maxUsers {
		return fmt.Errorf("%w: more than %d users", ErrUsers, maxUsers)
	}
	names := map[string]bool{}
	hashes := map[[sha256.Size]byte]bool{}
	for i, u := range users {
		if !validName(u.Name) {
			return fmt.Errorf("%w: user %d: name must be 1 to %d letters, digits and ._@-", ErrUsers, i+1, maxUserName)
		}
		if names[u.Name] {
			return fmt.Errorf("%w: user %q appears twice", ErrUsers, u.Name)
		}
		names[u.Name] = true
		if u.Role != RoleViewer && u.Role != RoleOperator {
			return fmt.Errorf("%w: user %q: role must be viewer or operator", ErrUsers, u.Name)
		}
		h, err := secretHash(u.Secret)
		if err != nil {
			return fmt.Errorf("%w: user %q: %w", ErrUsers, u.Name, err)
		}
		if hashes[h] {
			return fmt.Errorf("%w: user %q has the secret of another user; each needs its own", ErrUsers, u.Name)
		}
		hashes[h] = true
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

// secretHash returns the SHA-256 a secret is compared through.
func secretHash(s string) ([sha256.Size]byte, error) {
	var h [sha256.Size]byte
	if hexed, ok := strings.CutPrefix(s, "sha256:"); ok {
		b, err := hex.DecodeString(hexed)
		if err != nil || len(b) != sha256.Size {
			return h, errors.New("a sha256: secret must be 64 hex digits")
		}
		copy(h[:], b)
		return h, nil
	}
	if len(s) < minSecretBytes {
		return h, fmt.Errorf("secret must be at least %d bytes", minSecretBytes)
	}
	if strings.ContainsFunc(s, func(r rune) bool { return r <= ' ' || r == 0x7f }) {
		return h, errors.New("secret must not hold white space or control characters")
	}
	return sha256.Sum256([]byte(s)), nil
}

// principal is who a request comes from.
type principal struct {
	name  string
	role  Role
	actor string // as recorded in the audit
	csrf  string // the anti-forgery token of this user's forms
}

type account struct {
	name string
	role Role
	hash [sha256.Size]byte
}

// authenticator checks credentials in constant time: every account's hash is
// compared, whatever matches first.
type authenticator struct {
	noAuth   *principal
	accounts []account
	csrfKey  []byte
}

func newAuthenticator(c *Config, key []byte) *authenticator {
	a := &authenticator{csrfKey: key}
	if c.NoAuth {
		a.noAuth = &principal{name: "(no auth)", role: RoleOperator, actor: c.NoAuthActor, csrf: a.token("noauth", [sha256.Size]byte{})}
		return a
	}
	for _, u := range c.Users {
		h, _ := secretHash(u.Secret) // checked by Validate
		a.accounts = append(a.accounts, account{name: u.Name, role: u.Role, hash: h})
	}
	return a
}

// token is the CSRF token of one user's forms: a MAC of the user and the hash of
// their secret, so it changes with the secret and cannot be made without the key.
func (a *authenticator) token(name string, hash [sha256.Size]byte) string {
	m := hmac.New(sha256.New, a.csrfKey)
	m.Write([]byte("pgoutbox-console-csrf\x00" + name + "\x00"))
	m.Write(hash[:])
	return base64.RawURLEncoding.EncodeToString(m.Sum(nil))
}

// maxAuthHeader bounds the Authorization header read.
const maxAuthHeader = 4096

// authenticate returns who r comes from, or nil.
func (a *authenticator) authenticate(r *http.Request) *principal {
	if a.noAuth != nil {
		return a.noAuth
	}
	h := r.Header.Get("Authorization")
	if h == "" || len(h) > maxAuthHeader {
		return nil
	}
	var name, secret string
	if tok, ok := cutPrefixFold(h, "Bearer "); ok {
		secret = strings.TrimSpace(tok)
	} else if user, pass, ok := r.BasicAuth(); ok {
		name, secret = user, pass
	} else {
		return nil
	}
	got := sha256.Sum256([]byte(secret))
	var found *account
	for i := range a.accounts {
		acc := &a.accounts[i]
		hashOK := subtle.ConstantTimeCompare(got[:], acc.hash[:]) == 1
		nameOK := name == "" || subtle.ConstantTimeCompare([]byte(name), []byte(acc.name)) == 1
		if hashOK && nameOK {
			found = acc
		}
	}
	if found == nil {
		return nil
	}
	return &principal{name: found.name, role: found.role, actor: "console:" + found.name, csrf: a.token(found.name, found.hash)}
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
