package layout

import (
	"bufio"
	"bytes"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"maps"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
)

// The one package map, and the documents that link to it instead of copying it.
const (
	mapFile     = "CONTRIBUTING.md"
	mapSection  = "Layout"
	readmeFile  = "README.md"
	fileMapFile = "docs/design.md"
	fileMapName = "File map"
)

// lifecycletestPath is the import path of the lifecycle test table, relative
// to the library module.
const lifecycletestPath = "internal/lifecycle/lifecycletest"

// knownLifecycleGaps are services (directory.Type, relative to the repository
// root) known not to run the lifecycle table yet, each with why. Empty is the
// goal: a service listed here that runs the table, or is no longer a service,
// fails the test so that its entry is removed.
var knownLifecycleGaps = map[string]string{
	// The relay group is being put through lifecycletest.Run by a change of its
	// own; when it lands, this entry goes.
	"relay.Group": "the lifecycle table for relay.Group is being added by another change",
}

// pkg is one Go package of the repository, in any of its modules.
type pkg struct {
	ImportPath string
	Dir        string // absolute
	Name       string
	ModuleDir  string // absolute directory of the module holding it
	Rel        string // slash-separated directory relative to the repository root; "." for the root
}

// repoRoot is the repository's root directory: two levels above this package.
func repoRoot(t *testing.T) string {
	t.Helper()
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatalf("repository root: %v", err)
	}
	if _, err := os.Stat(filepath.Join(root, "go.mod")); err != nil {
		t.Fatalf("repository root %s has no go.mod: %v", root, err)
	}
	return root
}

var packagesOnce struct {
	sync.Once
	pkgs []pkg
	err  error
}

// packages lists every Go package of every module of the repository: the
// modules of go.work (or the one go.mod) at the root and any other go.mod
// below it, each listed with go list in its own directory.
func packages(t *testing.T) []pkg {
	t.Helper()
	root := repoRoot(t)
	packagesOnce.Do(func() { packagesOnce.pkgs, packagesOnce.err = listPackages(root) })
	if packagesOnce.err != nil {
		t.Fatal(packagesOnce.err)
	}
	return packagesOnce.pkgs
}

func listPackages(root string) ([]pkg, error) {
	// The modules the go command sees from the root (all of go.work's, if any).
	out, err := goCmd(root, nil, "list", "-m", "-f", "{{.Dir}}")
	if err != nil {
		return nil, err
	}
	workspace := map[string]bool{}
	for _, d := range strings.Fields(string(out)) {
		workspace[filepath.Clean(d)] = true
	}
	// And every go.mod below the root, in the workspace or not.
	modules := map[string]bool{}
	for d := range workspace {
		modules[d] = true
	}
	err = filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && p != root && skipDir(d.Name()) {
			return filepath.SkipDir
		}
		if !d.IsDir() && d.Name() == "go.mod" {
			modules[filepath.Dir(p)] = true
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("looking for go.mod files: %w", err)
	}
	_, statErr := os.Stat(filepath.Join(root, "go.work"))
	hasWork := statErr == nil

	seen := map[string]bool{}
	var pkgs []pkg
	for _, m := range slices.Sorted(maps.Keys(modules)) {
		var env []string
		if hasWork && !workspace[m] {
			env = []string{"GOWORK=off"} // a module outside go.work is listed on its own
		}
		out, err := goCmd(m, env, "list", "-e", "-find", "-f",
			"{{.ImportPath}}\t{{.Dir}}\t{{.Name}}\t{{with .Module}}{{.Dir}}{{end}}", "./...")
		if err != nil {
			return nil, err
		}
		for l := range strings.Lines(string(out)) {
			f := strings.Split(strings.TrimRight(l, "\n"), "\t")
			if len(f) != 4 || f[1] == "" || seen[f[1]] {
				continue
			}
			seen[f[1]] = true
			rel, err := filepath.Rel(root, f[1])
			if err != nil {
				return nil, fmt.Errorf("package %s: %w", f[0], err)
			}
			moduleDir := f[3]
			if moduleDir == "" {
				moduleDir = m
			}
			pkgs = append(pkgs, pkg{ImportPath: f[0], Dir: f[1], Name: f[2], ModuleDir: filepath.Clean(moduleDir), Rel: filepath.ToSlash(rel)})
		}
	}
	if len(pkgs) == 0 {
		return nil, fmt.Errorf("go list found no packages under %s", root)
	}
	sort.Slice(pkgs, func(i, j int) bool { return pkgs[i].Rel < pkgs[j].Rel })
	return pkgs, nil
}

// skipDir reports whether the go command ignores a directory of this name.
func skipDir(name string) bool {
	return name == "testdata" || name == "vendor" || strings.HasPrefix(name, ".") || strings.HasPrefix(name, "_")
}

func goCmd(dir string, env []string, args ...string) ([]byte, error) {
	cmd := exec.Command("go", args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), env...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("go %s in %s: %w\n%s", strings.Join(args, " "), dir, err, stderr.String())
	}
	return out, nil
}

// mdLine is a line of a Markdown section.
type mdLine struct {
	n    int // 1-based line number in the file
	text string
	code bool // inside a fenced code block
}

var headingRE = regexp.MustCompile(`^(#{1,6})\s+(.*?)\s*#*\s*$`)

// section returns the lines under the heading titled title in file (relative
// to root), up to the next heading of the same or a higher level; it fails the
// test if there is no such heading.
func section(t *testing.T, root, file, title string) []mdLine {
	t.Helper()
	lines, ok, err := readSection(filepath.Join(root, file), title)
	if err != nil {
		t.Fatal(err)
	}
	if !ok {
		t.Fatalf("%s has no section %q (a heading line \"## %s\"); the tests of internal/layout read it", file, title, title)
	}
	return lines
}

func readSection(file, title string) (lines []mdLine, found bool, err error) {
	data, err := os.ReadFile(file)
	if err != nil {
		return nil, false, err
	}
	level := 0
	fence := ""
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(make([]byte, 0, 64*1024), 1<<20)
	for n := 1; sc.Scan(); n++ {
		text := sc.Text()
		trimmed := strings.TrimSpace(text)
		if fence != "" {
			if strings.HasPrefix(trimmed, fence) {
				fence = ""
			}
			if level > 0 {
				lines = append(lines, mdLine{n, text, true})
			}
			continue
		}
		if strings.HasPrefix(trimmed, "```") || strings.HasPrefix(trimmed, "~~~") {
			fence = trimmed[:3]
			if level > 0 {
				lines = append(lines, mdLine{n, text, true})
			}
			continue
		}
		if m := headingRE.FindStringSubmatch(text); m != nil {
			if level > 0 && len(m[1]) <= level {
				return lines, true, nil
			}
			if level == 0 && m[2] == title {
				level = len(m[1])
				found = true
				continue
			}
		}
		if level > 0 {
			lines = append(lines, mdLine{n, text, false})
		}
	}
	return lines, found, sc.Err()
}

// tableRow is a body row of a Markdown table.
type tableRow struct {
	n     int
	cells []string
}

var separatorRE = regexp.MustCompile(`^\|?\s*:?-+:?\s*(\|\s*:?-+:?\s*)*\|?$`)

// tableRows returns the body rows of the tables in lines (header and
// separator rows left out).
func tableRows(lines []mdLine) []tableRow {
	var rows []tableRow
	for i, l := range lines {
		s := strings.TrimSpace(l.text)
		if l.code || !strings.HasPrefix(s, "|") || separatorRE.MatchString(s) {
			continue
		}
		if i+1 < len(lines) && separatorRE.MatchString(strings.TrimSpace(lines[i+1].text)) {
			continue // a header row
		}
		rows = append(rows, tableRow{l.n, splitCells(s)})
	}
	return rows
}

// splitCells splits a table row on the pipes that are not escaped or inside
// backticks.
func splitCells(s string) []string {
	s = strings.TrimPrefix(strings.TrimSuffix(s, "|"), "|")
	var cells []string
	var cur strings.Builder
	inCode := false
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c == '\\' && i+1 < len(s) && s[i+1] == '|':
			cur.WriteByte('|')
			i++
		case c == '`':
			inCode = !inCode
			cur.WriteByte(c)
		case c == '|' && !inCode:
			cells = append(cells, strings.TrimSpace(cur.String()))
			cur.Reset()
		default:
			cur.WriteByte(c)
		}
	}
	return append(cells, strings.TrimSpace(cur.String()))
}

var codeSpanRE = regexp.MustCompile("`([^`]+)`")

// codeSpans returns the texts in backticks in s.
func codeSpans(s string) []string {
	var spans []string
	for _, m := range codeSpanRE.FindAllStringSubmatch(s, -1) {
		spans = append(spans, m[1])
	}
	return spans
}

// expand expands the brace lists of a path: a/{b,c}/d is a/b/d and a/c/d.
func expand(p string) []string {
	open := strings.IndexByte(p, '{')
	if open < 0 {
		return []string{p}
	}
	end := strings.IndexByte(p[open:], '}')
	if end < 0 {
		return []string{p}
	}
	end += open
	var out []string
	for alt := range strings.SplitSeq(p[open+1:end], ",") {
		out = append(out, expand(p[:open]+strings.TrimSpace(alt)+p[end+1:])...)
	}
	return out
}

// mapPaths returns the package directories a first cell of the package map
// names: its code spans, brace lists expanded, without a trailing slash; a
// cell saying "(root)" names the root package.
func mapPaths(cell string) []string {
	if strings.Contains(cell, "(root)") {
		return []string{"."}
	}
	var paths []string
	for _, s := range codeSpans(cell) {
		for _, p := range expand(s) {
			paths = append(paths, strings.TrimSuffix(p, "/"))
		}
	}
	return paths
}

// table returns the repository root, its packages and the body rows of the
// table in the section title of file; it fails the test, saying what the table
// should hold, if there is none.
func table(t *testing.T, file, title, holds string) (root string, pkgs []pkg, rows []tableRow) {
	t.Helper()
	root = repoRoot(t)
	pkgs = packages(t)
	rows = tableRows(section(t, root, file, title))
	if len(rows) == 0 {
		t.Fatalf("%s's %q section has no table: %s", file, title, holds)
	}
	return root, pkgs, rows
}

// Every package of every module has exactly one row in the package map, and
// every row names a package that exists.
func TestPackageMap(t *testing.T) {
	_, pkgs, rows := table(t, mapFile, mapSection, "it is the package map, one row \"| `dir/of/package` | what it is |\" per package")
	isPkg := map[string]bool{}
	for _, p := range pkgs {
		isPkg[p.Rel] = true
	}
	mapped := map[string]int{}
	for _, r := range rows {
		paths := mapPaths(r.cells[0])
		if len(paths) == 0 {
			t.Errorf("%s:%d: the row names no package in backticks in its first cell", mapFile, r.n)
		}
		if len(r.cells) < 2 || r.cells[1] == "" {
			t.Errorf("%s:%d: the row does not say what the package is (second cell empty)", mapFile, r.n)
		}
		for _, p := range paths {
			if prev, ok := mapped[p]; ok {
				t.Errorf("%s:%d: `%s` already has a row (line %d): one row per package", mapFile, r.n, p, prev)
			}
			mapped[p] = r.n
			if !isPkg[p] {
				t.Errorf("%s:%d: `%s` is not a Go package of the repository (go list): correct the row or remove it", mapFile, r.n, p)
			}
		}
	}
	var missing []string
	for _, p := range pkgs {
		if _, ok := mapped[p.Rel]; !ok {
			missing = append(missing, fmt.Sprintf("| `%s` | … |   (package %s)", p.Rel, p.ImportPath))
		}
	}
	if len(missing) > 0 {
		t.Errorf("%d package(s) have no row in the package map, the table of %s's %q section; add, in its order:\n\t%s",
			len(missing), mapFile, mapSection, strings.Join(missing, "\n\t"))
	}
}

// README.md's Layout section links to the package map and copies none of it.
func TestReadmeLinksToThePackageMap(t *testing.T) {
	root := repoRoot(t)
	pkgs := packages(t)
	lines := section(t, root, readmeFile, mapSection)
	link := mapFile + "#" + strings.ToLower(mapSection)
	linked := false
	isPkg := map[string]bool{}
	for _, p := range pkgs {
		if p.Rel != "." {
			isPkg[p.Rel] = true
		}
	}
	for _, l := range lines {
		if strings.Contains(l.text, "("+link+")") {
			linked = true
		}
		candidates := codeSpans(l.text)
		if l.code {
			candidates = strings.Fields(l.text)
		} else if s := strings.TrimSpace(l.text); strings.HasPrefix(s, "|") {
			candidates = append(candidates, splitCells(s)[0])
		}
		for _, c := range candidates {
			for _, p := range expand(c) {
				if p = strings.TrimSuffix(p, "/"); isPkg[p] {
					t.Errorf("%s:%d: lists package %s; the one package map is %s's %q section: link to it ([…](%s)) instead of listing packages here",
						readmeFile, l.n, p, mapFile, mapSection, link)
				}
			}
		}
	}
	if !linked {
		t.Errorf("%s's %q section does not link to the package map: add a link to (%s)", readmeFile, mapSection, link)
	}
}

// fileMapRow is a row of docs/design.md's file map, resolved.
type fileMapRow struct {
	n       int
	baseDir string   // the folder of the row's first name, relative to root
	files   []string // the Go files whose declarations the row's symbols may name (absolute)
}

var (
	symbolRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)?$`)
	goFileRE = regexp.MustCompile(`^[A-Za-z0-9_./-]+\.go$`)
)

// Every file docs/design.md's file map names exists, and every Go symbol in
// backticks is declared in the files (or the folders' packages) of its row.
//
// In a row's first cell, the first name is relative to the repository root
// and the others to the first one's folder, or else to the root; `a/{b,c}/`
// is a/b/ and a/c/. In the second cell, a name ending in .go is a file of the
// row's folder (or else of the root); every other name in backticks shaped
// like a Go identifier, Name or X.Name, is a symbol: a declaration or method
// of the row's files, a method or field of a type declared there, or Name of
// the package X.
func TestFileMap(t *testing.T) {
	root, pkgs, rows := table(t, fileMapFile, fileMapName, "one row per file or group of files")
	exists := func(rel string) (fs.FileInfo, bool) {
		fi, err := os.Stat(filepath.Join(root, filepath.FromSlash(rel)))
		return fi, err == nil
	}
	decls := newDeclIndex()
	for _, r := range rows {
		row := fileMapRow{n: r.n}
		var names []string
		for _, s := range codeSpans(r.cells[0]) {
			names = append(names, expand(s)...)
		}
		if len(names) == 0 {
			t.Errorf("%s:%d (%s): the row names no file in backticks in its first cell", fileMapFile, r.n, fileMapName)
			continue
		}
		var found []string
		for i, name := range names {
			rel := path.Clean(name)
			if i > 0 {
				if _, ok := exists(path.Join(row.baseDir, name)); ok {
					rel = path.Join(row.baseDir, name)
				}
			}
			fi, ok := exists(rel)
			if !ok {
				where := "the repository root"
				if i > 0 {
					where = fmt.Sprintf("%s/ or the repository root", row.baseDir)
				}
				t.Errorf("%s:%d (%s): `%s` does not exist (looked in %s): correct the name or remove it", fileMapFile, r.n, fileMapName, name, where)
				if i == 0 {
					row.baseDir = path.Dir(rel)
				}
				continue
			}
			if i == 0 {
				row.baseDir = rel
				if !fi.IsDir() {
					row.baseDir = path.Dir(rel)
				}
			}
			found = append(found, rel)
		}
		if len(r.cells) < 2 {
			continue
		}
		var symbols []string
		for _, s := range codeSpans(r.cells[1]) {
			switch {
			case goFileRE.MatchString(s):
				rel := path.Join(row.baseDir, s)
				if _, ok := exists(rel); !ok {
					rel = path.Clean(s)
				}
				if _, ok := exists(rel); !ok {
					t.Errorf("%s:%d (%s): `%s` does not exist (looked in %s/ and the repository root): correct the name or remove it", fileMapFile, r.n, fileMapName, s, row.baseDir)
					continue
				}
				found = append(found, rel)
			case symbolRE.MatchString(s):
				symbols = append(symbols, s)
			}
		}
		for _, rel := range found {
			abs := filepath.Join(root, filepath.FromSlash(rel))
			if strings.HasSuffix(rel, ".go") {
				row.files = append(row.files, abs)
			} else {
				row.files = append(row.files, goFiles(abs, false)...)
			}
		}
		for _, sym := range symbols {
			if !decls.declares(t, row.files, sym, pkgs) {
				var where []string
				for _, f := range row.files {
					r, _ := filepath.Rel(root, f)
					where = append(where, filepath.ToSlash(r))
				}
				if len(where) == 0 {
					where = []string{"(no Go file in the row)"}
				}
				t.Errorf("%s:%d (%s): `%s` is not declared in %s: correct the name, list the file that declares it, or drop the backticks if it is not a Go symbol",
					fileMapFile, r.n, fileMapName, sym, strings.Join(where, ", "))
			}
		}
	}
}

// goFiles returns the .go files of dir (not recursive); with tests, only the
// _test.go ones, else only the others.
func goFiles(dir string, tests bool) []string {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil
	}
	var files []string
	for _, e := range entries {
		n := e.Name()
		if e.IsDir() || !strings.HasSuffix(n, ".go") || strings.HasSuffix(n, "_test.go") != tests {
			continue
		}
		files = append(files, filepath.Join(dir, n))
	}
	return files
}

// fileDecls is what a Go file declares at the top level.
type fileDecls struct {
	names   map[string]bool            // funcs, types, vars, consts
	methods map[string]map[string]bool // receiver type → method names
	fields  map[string]map[string]bool // struct type → field names
	file    *ast.File
}

// declIndex parses files once.
type declIndex struct {
	fset  *token.FileSet
	files map[string]*fileDecls
}

func newDeclIndex() *declIndex {
	return &declIndex{fset: token.NewFileSet(), files: map[string]*fileDecls{}}
}

func (x *declIndex) parse(t *testing.T, file string) *fileDecls {
	t.Helper()
	if d, ok := x.files[file]; ok {
		return d
	}
	f, err := parser.ParseFile(x.fset, file, nil, parser.SkipObjectResolution)
	if err != nil {
		t.Fatalf("parse %s: %v", file, err)
	}
	d := &fileDecls{names: map[string]bool{}, methods: map[string]map[string]bool{}, fields: map[string]map[string]bool{}, file: f}
	for _, decl := range f.Decls {
		switch decl := decl.(type) {
		case *ast.FuncDecl:
			if decl.Recv == nil {
				d.names[decl.Name.Name] = true
				continue
			}
			recv := receiverType(decl)
			if d.methods[recv] == nil {
				d.methods[recv] = map[string]bool{}
			}
			d.methods[recv][decl.Name.Name] = true
		case *ast.GenDecl:
			for _, spec := range decl.Specs {
				switch spec := spec.(type) {
				case *ast.TypeSpec:
					d.names[spec.Name.Name] = true
					if st, ok := spec.Type.(*ast.StructType); ok {
						fields := map[string]bool{}
						for _, fl := range st.Fields.List {
							for _, n := range fl.Names {
								fields[n.Name] = true
							}
							if len(fl.Names) == 0 { // embedded: its type's name
								if n := typeName(fl.Type); n != "" {
									fields[n] = true
								}
							}
						}
						d.fields[spec.Name.Name] = fields
					}
				case *ast.ValueSpec:
					for _, n := range spec.Names {
						d.names[n.Name] = true
					}
				}
			}
		}
	}
	x.files[file] = d
	return d
}

// declares reports whether sym (Name or X.Name) is declared in files, or
// X.Name in a package of the repository named X.
func (x *declIndex) declares(t *testing.T, files []string, sym string, pkgs []pkg) bool {
	t.Helper()
	first, second, dotted := strings.Cut(sym, ".")
	for _, f := range files {
		d := x.parse(t, f)
		if !dotted {
			if d.names[first] {
				return true
			}
			for _, ms := range d.methods {
				if ms[first] {
					return true
				}
			}
			continue
		}
		// Type.Method or Type.Field: the method may be in another file of the
		// type's package.
		if d.names[first] {
			for _, g := range goFiles(filepath.Dir(f), false) {
				gd := x.parse(t, g)
				if gd.methods[first][second] || gd.fields[first][second] {
					return true
				}
			}
		}
	}
	if dotted {
		for _, p := range pkgs {
			if p.Name != first {
				continue
			}
			for _, g := range goFiles(p.Dir, false) {
				if x.parse(t, g).names[second] {
					return true
				}
			}
		}
	}
	return false
}

// receiverType is the name of a method's receiver type, without pointer or
// type parameters.
func receiverType(fn *ast.FuncDecl) string {
	if fn.Recv == nil || len(fn.Recv.List) == 0 {
		return ""
	}
	return typeName(fn.Recv.List[0].Type)
}

func typeName(e ast.Expr) string {
	switch e := e.(type) {
	case *ast.StarExpr:
		return typeName(e.X)
	case *ast.IndexExpr:
		return typeName(e.X)
	case *ast.IndexListExpr:
		return typeName(e.X)
	case *ast.Ident:
		return e.Name
	case *ast.SelectorExpr:
		return e.Sel.Name
	}
	return ""
}

// isContextParam reports whether a field list is exactly one context.Context.
func isContextParam(fl *ast.FieldList) bool {
	if fl == nil || len(fl.List) != 1 || len(fl.List[0].Names) > 1 {
		return false
	}
	sel, ok := fl.List[0].Type.(*ast.SelectorExpr)
	if !ok {
		return false
	}
	x, ok := sel.X.(*ast.Ident)
	return ok && x.Name == "context" && sel.Sel.Name == "Context"
}

// isErrorResult reports whether a result list is exactly one error.
func isErrorResult(fl *ast.FieldList) bool {
	if fl == nil || len(fl.List) != 1 || len(fl.List[0].Names) > 1 {
		return false
	}
	id, ok := fl.List[0].Type.(*ast.Ident)
	return ok && id.Name == "error"
}

// imports maps a file's import names to import paths.
func imports(f *ast.File, names map[string]string) map[string]string {
	m := map[string]string{}
	for _, im := range f.Imports {
		p, err := strconv.Unquote(im.Path.Value)
		if err != nil {
			continue
		}
		name := path.Base(p)
		if n, ok := names[p]; ok {
			name = n
		}
		if im.Name != nil {
			name = im.Name.Name
		}
		m[name] = p
	}
	return m
}

// funcKey names a function of a package.
type funcKey struct{ importPath, name string }

// Every service of the library (an exported type with Start(context.Context)
// error and Stop(context.Context) error) is run through the lifecycle test
// table by a test in its own package: a test function that calls
// lifecycletest.Run, or a function of the repository that does (such as
// inbox/inboxtest.Run), and that builds the service (names its type or a
// function of its package returning it, directly or through the test files'
// own functions and types).
func TestServicesRunTheLifecycleTable(t *testing.T) {
	pkgs := packages(t)
	decls := newDeclIndex()

	var library *pkg
	for i, p := range pkgs {
		if p.Rel == "." {
			library = &pkgs[i]
		}
	}
	if library == nil {
		t.Fatal("go list found no package at the repository root")
	}
	tablePath := library.ImportPath + "/" + lifecycletestPath
	pkgNames := map[string]string{}
	for _, p := range pkgs {
		pkgNames[p.ImportPath] = p.Name
	}

	// The runners: lifecycletest.Run and every function of the repository
	// (outside tests) that calls a runner.
	runners := map[funcKey]bool{{tablePath, "Run"}: true}
	type fn struct {
		key  funcKey
		decl *ast.FuncDecl
		imp  map[string]string
	}
	var fns []fn
	for _, p := range pkgs {
		for _, f := range goFiles(p.Dir, false) {
			d := decls.parse(t, f)
			imp := imports(d.file, pkgNames)
			for _, decl := range d.file.Decls {
				if fd, ok := decl.(*ast.FuncDecl); ok && fd.Recv == nil && fd.Body != nil {
					fns = append(fns, fn{funcKey{p.ImportPath, fd.Name.Name}, fd, imp})
				}
			}
		}
	}
	for changed := true; changed; {
		changed = false
		for _, f := range fns {
			if !runners[f.key] && callsRunner(f.decl, f.key.importPath, f.imp, runners) {
				runners[f.key] = true
				changed = true
			}
		}
	}

	var problems []string
	gapsSeen := map[string]bool{}
	for _, p := range pkgs {
		if p.ModuleDir != library.ModuleDir || p.Name == "main" || strings.HasPrefix(p.Rel, "cmd/") || strings.HasPrefix(p.Rel, "examples/") {
			continue
		}
		services, constructors := findServices(t, decls, p)
		if len(services) == 0 {
			continue
		}
		covered := coveredServices(t, decls, p, pkgNames, runners, services, constructors)
		for _, s := range services {
			id := p.Rel + "." + s
			if _, gap := knownLifecycleGaps[id]; gap {
				gapsSeen[id] = true
				if covered[s] {
					problems = append(problems, fmt.Sprintf("%s runs the lifecycle table now: remove its entry from knownLifecycleGaps in internal/layout/layout_test.go", id))
				}
				continue
			}
			if !covered[s] {
				problems = append(problems, fmt.Sprintf("%s (%s) has Start(context.Context) error and Stop(context.Context) error, but no test in %s/ runs it through lifecycletest.Run: "+
					"add a test there that calls lifecycletest.Run(t, lifecycletest.Harness{New: …}) with a New that builds a %s (as relay/lifecycle_test.go does for relay.Relay)",
					id, p.ImportPath, p.Rel, s))
			}
		}
	}
	for id := range knownLifecycleGaps {
		if !gapsSeen[id] {
			problems = append(problems, fmt.Sprintf("knownLifecycleGaps lists %s, which is not a service of the library: remove the entry from internal/layout/layout_test.go", id))
		}
	}
	sort.Strings(problems)
	for _, pr := range problems {
		t.Error(pr)
	}
}

// callsRunner reports whether fd calls a runner, by a selector on an import
// or by a bare name of its own package.
func callsRunner(fd *ast.FuncDecl, importPath string, imp map[string]string, runners map[funcKey]bool) bool {
	found := false
	ast.Inspect(fd, func(n ast.Node) bool {
		call, ok := n.(*ast.CallExpr)
		if !ok || found {
			return !found
		}
		switch f := call.Fun.(type) {
		case *ast.SelectorExpr:
			if x, ok := f.X.(*ast.Ident); ok {
				if p, ok := imp[x.Name]; ok && runners[funcKey{p, f.Sel.Name}] {
					found = true
				}
			}
		case *ast.Ident:
			if runners[funcKey{importPath, f.Name}] {
				found = true
			}
		}
		return !found
	})
	return found
}

// findServices returns the services of p (its exported types with Start and
// Stop taking a context.Context and returning an error) and, for each, the
// functions of p returning it.
func findServices(t *testing.T, decls *declIndex, p pkg) (services []string, constructors map[string][]string) {
	t.Helper()
	start, stop := map[string]bool{}, map[string]bool{}
	var funcs []*ast.FuncDecl
	for _, f := range goFiles(p.Dir, false) {
		for _, decl := range decls.parse(t, f).file.Decls {
			fd, ok := decl.(*ast.FuncDecl)
			if !ok {
				continue
			}
			if fd.Recv == nil {
				funcs = append(funcs, fd)
				continue
			}
			if !isContextParam(fd.Type.Params) || !isErrorResult(fd.Type.Results) {
				continue
			}
			switch fd.Name.Name {
			case "Start":
				start[receiverType(fd)] = true
			case "Stop":
				stop[receiverType(fd)] = true
			}
		}
	}
	constructors = map[string][]string{}
	for typ := range start {
		if !stop[typ] || !ast.IsExported(typ) {
			continue
		}
		services = append(services, typ)
		for _, fd := range funcs {
			if fd.Type.Results == nil {
				continue
			}
			for _, r := range fd.Type.Results.List {
				if e, ok := r.Type.(*ast.StarExpr); ok {
					r = &ast.Field{Type: e.X}
				}
				if id, ok := r.Type.(*ast.Ident); ok && id.Name == typ {
					constructors[typ] = append(constructors[typ], fd.Name.Name)
				}
			}
		}
	}
	sort.Strings(services)
	return services, constructors
}

// coveredServices returns which of p's services a test of p runs through a
// runner: the test function calling a runner, with the functions, types and
// methods of p's test files it reaches, names the service's type or one of its
// constructors.
func coveredServices(t *testing.T, decls *declIndex, p pkg, pkgNames map[string]string, runners map[funcKey]bool, services []string, constructors map[string][]string) map[string]bool {
	t.Helper()
	type node struct {
		n   ast.Node
		imp map[string]string
		own bool // an in-package test file: bare names are p's
	}
	index := map[string][]node{} // name → the test files' declarations of it (a type also indexes its methods)
	var roots []node
	for _, f := range goFiles(p.Dir, true) {
		d := decls.parse(t, f)
		imp := imports(d.file, pkgNames)
		own := d.file.Name.Name == p.Name
		for _, decl := range d.file.Decls {
			switch decl := decl.(type) {
			case *ast.FuncDecl:
				nd := node{decl, imp, own}
				if decl.Recv != nil {
					index[receiverType(decl)] = append(index[receiverType(decl)], nd)
				} else {
					index[decl.Name.Name] = append(index[decl.Name.Name], nd)
				}
				if decl.Body != nil && callsRunner(decl, "", imp, runners) {
					roots = append(roots, nd)
				}
			case *ast.GenDecl:
				for _, spec := range decl.Specs {
					switch spec := spec.(type) {
					case *ast.TypeSpec:
						index[spec.Name.Name] = append(index[spec.Name.Name], node{spec, imp, own})
					case *ast.ValueSpec:
						for _, n := range spec.Names {
							index[n.Name] = append(index[n.Name], node{spec, imp, own})
						}
					}
				}
			}
		}
	}
	covered := map[string]bool{}
	for _, r := range roots {
		mentioned := map[string]bool{}
		visited := map[ast.Node]bool{r.n: true}
		queue := []node{r}
		for len(queue) > 0 {
			cur := queue[0]
			queue = queue[1:]
			ast.Inspect(cur.n, func(n ast.Node) bool {
				switch n := n.(type) {
				case *ast.SelectorExpr:
					if x, ok := n.X.(*ast.Ident); ok && cur.imp[x.Name] == p.ImportPath {
						mentioned[n.Sel.Name] = true
					}
				case *ast.Ident:
					if cur.own {
						mentioned[n.Name] = true
					}
					for _, nd := range index[n.Name] {
						if !visited[nd.n] {
							visited[nd.n] = true
							queue = append(queue, nd)
						}
					}
				}
				return true
			})
		}
		for _, s := range services {
			if mentioned[s] {
				covered[s] = true
			}
			for _, c := range constructors[s] {
				if mentioned[c] {
					covered[s] = true
				}
			}
		}
	}
	return covered
}

// The Markdown helpers read what the maps are written with: brace lists, pipes
// escaped or in code spans, and headings that are not headings inside code.
func TestMarkdownHelpers(t *testing.T) {
	if got, want := expand("a/{b,c}/{d,e}"), []string{"a/b/d", "a/b/e", "a/c/d", "a/c/e"}; !slices.Equal(got, want) {
		t.Errorf("expand: got %q, want %q", got, want)
	}
	if got, want := splitCells("| `a|b` | c \\| d | e |"), []string{"`a|b`", "c | d", "e"}; !slices.Equal(got, want) {
		t.Errorf("splitCells: got %q, want %q", got, want)
	}
	if got, want := mapPaths("`pgoutbox` (root)"), []string{"."}; !slices.Equal(got, want) {
		t.Errorf("mapPaths: got %q, want %q", got, want)
	}
	doc := filepath.Join(t.TempDir(), "doc.md")
	text := "# Doc\n## Layout\n| a | b |\n|---|---|\n| `x/` | y |\n```sh\n# not a heading\n```\n### Sub\ntext\n## Next\n| `z` | w |\n"
	if err := os.WriteFile(doc, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	lines, found, err := readSection(doc, "Layout")
	if err != nil || !found {
		t.Fatalf("readSection: found %v, err %v", found, err)
	}
	if n := len(lines); n != 8 {
		t.Errorf("readSection: %d lines, want 8 (up to the next level-2 heading)", n)
	}
	rows := tableRows(lines)
	if len(rows) != 1 || rows[0].n != 5 || rows[0].cells[0] != "`x/`" {
		t.Errorf("tableRows: got %+v, want the one body row at line 5", rows)
	}
	if _, found, _ := readSection(doc, "not a heading"); found {
		t.Error("readSection found a heading inside a code block")
	}
}
