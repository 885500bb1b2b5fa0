package adminhttp

import (
	"crypto/subtle"
	"encoding/base64"
	"errors"
	"fmt"
	"strings"

	"golang.org/x/crypto/argon2"
	"golang.org/x/crypto/bcrypt"
)

// passwordHash is a slow, salted hash of a user's password from a users' file.
type passwordHash interface {
	// matches reports whether password is the one hashed; it takes tens of
	// milliseconds of a CPU (and, for argon2id, its memory).
	matches(password []byte) bool
}

// Bounds of the hashes a users' file may hold: slow enough to resist guessing
// a stolen file, cheap enough that the console's two concurrent checks
// (maxHashChecks) stay within a CPU second and 256 MiB.
const (
	minBcryptCost = 10
	maxBcryptCost = 14

	// argon2id: at least OWASP's 19 MiB and 2 passes, at most 128 MiB, 10
	// passes and 16 lanes.
	minArgonMemory = 19 * 1024 // KiB
	maxArgonMemory = 128 * 1024
	minArgonWork   = 2 * minArgonMemory // memory × passes
	maxArgonTime   = 10
	maxArgonLanes  = 16
)

type bcryptHash []byte

func (h bcryptHash) matches(password []byte) bool {
	return len(password) <= 72 && bcrypt.CompareHashAndPassword(h, password) == nil
}

func parseBcrypt(s string) (passwordHash, error) {
	cost, err := bcrypt.Cost([]byte(s))
	if err != nil || len(s) != 60 {
		return nil, errors.New("a bcrypt secret must be a whole hash as pgoutbox console hash-password prints it (60 characters)")
	}
	if cost < minBcryptCost || cost > maxBcryptCost {
		return nil, fmt.Errorf("a bcrypt secret must have a cost in %d..%d, this one has %d", minBcryptCost, maxBcryptCost, cost)
	}
	return bcryptHash(s), nil
}

type argon2idHash struct {
	memory, time uint32
	lanes        uint8
	salt, key    []byte
}

func (h *argon2idHash) matches(password []byte) bool {
	got := argon2.IDKey(password, h.salt, h.time, h.memory, h.lanes, uint32(len(h.key)))
	return subtle.ConstantTimeCompare(got, h.key) == 1
}

var errArgon2 = errors.New(`an argon2id secret must be a PHC string "$argon2id$v=19$m=<KiB>,t=<passes>,p=<lanes>$<salt>$<hash>" ` +
	"(base64 without padding, salt and hash 16 to 64 bytes)")

// parseArgon2id reads the PHC string of an argon2id hash, as the argon2 CLI,
// libsodium and most libraries write it.
func parseArgon2id(s string) (passwordHash, error) {
	parts := strings.Split(s, "$")
	if len(parts) != 6 || parts[0] != "" || parts[1] != "argon2id" || parts[2] != "v=19" {
		return nil, errArgon2
	}
	var h argon2idHash
	var lanes uint32
	if n, err := fmt.Sscanf(parts[3], "m=%d,t=%d,p=%d", &h.memory, &h.time, &lanes); err != nil || n != 3 ||
		fmt.Sprintf("m=%d,t=%d,p=%d", h.memory, h.time, lanes) != parts[3] {
		return nil, errArgon2
	}
	var err error
	if h.salt, err = base64.RawStdEncoding.Strict().DecodeString(parts[4]); err != nil || len(h.salt) < 16 || len(h.salt) > 64 {
		return nil, errArgon2
	}
	if h.key, err = base64.RawStdEncoding.Strict().DecodeString(parts[5]); err != nil || len(h.key) < 16 || len(h.key) > 64 {
		return nil, errArgon2
	}
	switch {
	case h.memory < minArgonMemory || h.memory > maxArgonMemory:
		return nil, fmt.Errorf("an argon2id secret must use %d to %d KiB of memory (m=), this one %d", minArgonMemory, maxArgonMemory, h.memory)
	case h.time < 1 || h.time > maxArgonTime || uint64(h.memory)*uint64(h.time) < minArgonWork:
		return nil, fmt.Errorf("an argon2id secret must make 1 to %d passes (t=), and at least 2 at under 38 MiB; this one makes %d", maxArgonTime, h.time)
	case lanes < 1 || lanes > maxArgonLanes:
		return nil, fmt.Errorf("an argon2id secret must use 1 to %d lanes (p=), this one %d", maxArgonLanes, lanes)
	}
	h.lanes = uint8(lanes)
	return &h, nil
}
