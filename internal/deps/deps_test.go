package deps_test

import (
	"encoding/json"
	"errors"
	"go/parser"
	"go/token"
	"io"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

const root = "github.com/pgoutbox/pgoutbox"

// fixtures are the test fixture packages: test code only. pgoutboxtest is a
// public helper for users' tests; production code does not import it either.
var fixtures = []string{
	"internal/pgtest", "internal/natstest", "internal/rabbittest", "internal/logtest", "internal/inboxtest", "internal/cetest",
	"internal/faulttest", "internal/promtest", "internal/lifecycle/lifecycletest",
	"broker/brokertest", "inbox/inboxtest", "pgoutboxtest", "admin/adminhttp/internal/consoletest",
	"inbox/internal/exampletest", "internal/systool", "internal/wait", "internal/netns",
}

// moduleNames are the names a package's documentation gives the modules it
// pulls in, by module path prefix. A new dependency needs a line here.
var moduleNames = []struct{ prefix, name string }{
	{"github.com/jackc/pgx/", "pgx"},
	{"github.com/jackc/pglogrepl", "pglogrepl"},
	{"go.opentelemetry.io/otel", "OpenTelemetry"},
	{"github.com/twmb/franz-go", "franz-go"},
	{"github.com/nats-io/nats.go", "nats.go"},
	{"github.com/nats-io/nats-server/", "nats-server"},
	{"github.com/rabbitmq/amqp091-go", "amqp091-go"},
	{"github.com/redis/go-redis", "go-redis"},
	{"github.com/prometheus/", "Prometheus"},
	{"golang.org/x/crypto", "x/crypto"},
	{"golang.org/x/sync", "x/sync"},
	{"golang.org/x/sys", "x/sys"},
	{"github.com/eclipse/paho.mqtt.golang", "paho.mqtt.golang"},
	{"github.com/eclipse/paho.golang", "paho.golang"},
}

type pkg struct {
	ImportPath string
	Name       string
	Dir        string
	GoFiles    []string
	Imports    []string
	Deps       []string
	Standard   bool
	Module     *struct{ Path string }
}

// list is `go list -deps` of the library module: its packages and everything
// they import (not their tests'), by import path.
func list(t *testing.T) (lib []*pkg, all map[string]*pkg) {
	t.Helper()
	cmd := exec.Command("go", "list", "-deps", "-json=ImportPath,Name,Dir,GoFiles,Imports,Deps,Standard,Module", "./...")
	cmd.Dir = filepath.Join("..", "..")
	out, err := cmd.Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			t.Fatalf("go list: %v\n%s", err, ee.Stderr)
		}
		t.Fatalf("go list: %v", err)
	}
	all = map[string]*pkg{}
	dec := json.NewDecoder(strings.NewReader(string(out)))
	for {
		p := new(pkg)
		if err := dec.Decode(p); err == io.EOF {
			break
		} else if err != nil {
			t.Fatalf("go list output: %v", err)
		}
		all[p.ImportPath] = p
		if p.Module != nil && p.Module.Path == root {
			lib = append(lib, p)
		}
	}
	if len(lib) < 40 {
		t.Fatalf("go list found %d packages of the library, want them all", len(lib))
	}
	return lib, all
}

func rel(path string) string { return strings.TrimPrefix(strings.TrimPrefix(path, root), "/") }

// isFixture reports whether path is a fixture package or one below it (the
// fault suite's programs, for instance).
func isFixture(path string) bool {
	r := rel(path)
	return slices.ContainsFunc(fixtures, func(f string) bool { return r == f || strings.HasPrefix(r, f+"/") })
}

// TestNoProductionPackageImportsAFixture: a fixture in a production package's
// dependencies would ship test code (and its imports) to every user.
func TestNoProductionPackageImportsAFixture(t *testing.T) {
	lib, _ := list(t)
	for _, p := range lib {
		if isFixture(p.ImportPath) {
			continue
		}
		for _, d := range p.Deps {
			if isFixture(d) {
				t.Errorf("%s imports the test fixture %s (through its dependencies: go list -deps %s); keep fixtures in _test.go files",
					rel(p.ImportPath), rel(d), p.ImportPath)
			}
		}
	}
}

// pullsIn returns the names of the modules outside the standard library that
// p brings in itself or through other packages of the library (not what those
// modules import in turn), and the module paths that have no name.
func pullsIn(p *pkg, all map[string]*pkg) (names, unnamed []string) {
	seen := map[string]bool{}
	var walk func(*pkg)
	walk = func(p *pkg) {
		for _, imp := range p.Imports {
			d := all[imp]
			if d == nil || d.Standard || seen[imp] {
				continue
			}
			seen[imp] = true
			if d.Module != nil && d.Module.Path == root {
				walk(d)
				continue
			}
			mod := imp
			if d.Module != nil {
				mod = d.Module.Path
			}
			i := slices.IndexFunc(moduleNames, func(n struct{ prefix, name string }) bool { return strings.HasPrefix(mod, n.prefix) })
			if i < 0 {
				unnamed = append(unnamed, mod)
			} else {
				names = append(names, moduleNames[i].name)
			}
		}
	}
	walk(p)
	slices.Sort(names)
	slices.Sort(unnamed)
	return slices.Compact(names), slices.Compact(unnamed)
}

// pullsInParagraph returns the paragraph of p's package documentation that
// says what it pulls in, or "".
func pullsInParagraph(t *testing.T, p *pkg) string {
	t.Helper()
	fset := token.NewFileSet()
	for _, f := range p.GoFiles {
		file, err := parser.ParseFile(fset, filepath.Join(p.Dir, f), nil, parser.PackageClauseOnly|parser.ParseComments)
		if err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		if file.Doc == nil {
			continue
		}
		for para := range strings.SplitSeq(file.Doc.Text(), "\n\n") {
			if para = strings.Join(strings.Fields(para), " "); strings.Contains(para, "pulls in") {
				return para
			}
		}
	}
	return ""
}

// TestPublicPackagesSayWhatTheyPullIn: a user choosing a package reads in its
// documentation what it adds to their build, and the sentence stays true.
func TestPublicPackagesSayWhatTheyPullIn(t *testing.T) {
	lib, all := list(t)
	for _, p := range lib {
		r := rel(p.ImportPath)
		if p.Name == "main" || r == "internal" || strings.HasPrefix(r, "internal/") || strings.Contains(r, "/internal/") ||
			strings.HasPrefix(r, "examples/") {
			continue
		}
		names, unnamed := pullsIn(p, all)
		for _, m := range unnamed {
			t.Errorf("%s pulls in the module %s, which has no name in moduleNames: add one", p.ImportPath, m)
		}
		para := pullsInParagraph(t, p)
		if para == "" {
			t.Errorf("%s: its package documentation has no paragraph saying what it pulls in; it pulls in %v", p.ImportPath, names)
			continue
		}
		for _, n := range names {
			if !strings.Contains(para, n) {
				t.Errorf("%s pulls in %s, which its documentation does not name: %q", p.ImportPath, n, para)
			}
		}
		for _, n := range moduleNames {
			if strings.Contains(para, n.name) && !slices.Contains(names, n.name) {
				t.Errorf("%s: its documentation says it pulls in %s, which it does not: %q", p.ImportPath, n.name, para)
			}
		}
		if len(names) == 0 && !strings.Contains(para, "nothing outside the standard library") {
			t.Errorf("%s pulls in nothing outside the standard library, which its documentation does not say: %q", p.ImportPath, para)
		}
	}
}

// TestFixturesAreListed: a package whose non-test code imports "testing" is a
// fixture, whether or not it is named one, and must be in fixtures so the test
// above keeps production code away from it.
func TestFixturesAreListed(t *testing.T) {
	lib, _ := list(t)
	for _, p := range lib {
		if slices.Contains(p.Imports, "testing") && !isFixture(p.ImportPath) {
			t.Errorf("%s imports \"testing\" in its non-test files: it is a test fixture; add %q to fixtures in this file", rel(p.ImportPath), rel(p.ImportPath))
		}
	}
}
