package migrate_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// A schema selector is parsed once, where its text comes in: the CLI's
// parseSelector (its flags and its tenants file), programs' main packages, and
// test fixtures (packages named *test). No library package calls ParseSelector: they take a Selector. The test reads
// every Go file of the repository, all its modules, tests aside.
func TestParseSelectorOnlyAtTheEdge(t *testing.T) {
	t.Parallel()
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "go.work")); err != nil {
		t.Fatalf("repository root %s: %v", root, err)
	}
	edges := 0
	fset := token.NewFileSet()
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		name := d.Name()
		if d.IsDir() {
			if path != root && (strings.HasPrefix(name, ".") || name == "testdata" || name == "node_modules" || name == "vendor") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(name, ".go") || strings.HasSuffix(name, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		for _, decl := range f.Decls {
			fn, ok := decl.(*ast.FuncDecl)
			if !ok || fn.Body == nil {
				continue
			}
			ast.Inspect(fn.Body, func(n ast.Node) bool {
				call, ok := n.(*ast.CallExpr)
				if !ok || !callsParseSelector(call.Fun) {
					return true
				}
				switch {
				case filepath.ToSlash(rel) == "cmd/pgoutbox/cli/tenants.go" && fn.Name.Name == "parseSelector":
					edges++
				case f.Name.Name == "main", strings.HasSuffix(f.Name.Name, "test"): // a program; a test fixture
				default:
					t.Errorf("%s: %s calls ParseSelector: take a migrate.Selector parsed at the edge instead",
						fset.Position(call.Pos()), fn.Name.Name)
				}
				return true
			})
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if edges != 1 {
		t.Errorf("the CLI's parseSelector calls ParseSelector %d times, want once: is the test reading the tree?", edges)
	}
}

// callsParseSelector reports whether fun names ParseSelector, as
// migrate.ParseSelector or, inside package migrate, bare.
func callsParseSelector(fun ast.Expr) bool {
	switch f := fun.(type) {
	case *ast.Ident:
		return f.Name == "ParseSelector"
	case *ast.SelectorExpr:
		return f.Sel.Name == "ParseSelector"
	}
	return false
}
