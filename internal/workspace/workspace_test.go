package workspace_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"io/fs"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// root is the repository's root: the directory of go.work.
func root(t *testing.T) string {
	t.Helper()
	out, err := exec.Command("go", "env", "GOWORK").Output()
	if err != nil {
		t.Fatalf("go env GOWORK: %v", err)
	}
	work := strings.TrimSpace(string(out))
	if work == "" || work == "off" {
		t.Fatal("go env GOWORK is empty: run the tests from the repository, whose go.work joins its modules")
	}
	return filepath.Dir(work)
}

// modules returns the directories of go.work's modules other than the root's.
func modules(t *testing.T, dir string) []string {
	t.Helper()
	cmd := exec.Command("go", "list", "-m", "-json")
	cmd.Dir = dir
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list -m: %v", err)
	}
	var dirs []string
	dec := json.NewDecoder(bytes.NewReader(out))
	for {
		var m struct{ Dir string }
		if err := dec.Decode(&m); err != nil {
			if errors.Is(err, io.EOF) {
				break
			}
			t.Fatalf("go list -m: %v", err)
		}
		if m.Dir != dir {
			dirs = append(dirs, m.Dir)
		}
	}
	return dirs
}

// TestEveryGoModIsInTheWorkspace: a module left out of go.work would never be
// tested by the README's command.
func TestEveryGoModIsInTheWorkspace(t *testing.T) {
	dir := root(t)
	listed := modules(t, dir)
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && path != dir && (strings.HasPrefix(d.Name(), ".") || d.Name() == "testdata" || d.Name() == "node_modules") {
			return filepath.SkipDir
		}
		if d.Name() == "go.mod" && filepath.Dir(path) != dir && !slices.Contains(listed, filepath.Dir(path)) {
			rel, _ := filepath.Rel(dir, filepath.Dir(path))
			t.Errorf("%s has a go.mod that go.work does not use: add `./%s` to go.work's use list, or go test ./... never runs its tests", rel, rel)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// moduleRuns is how many modules' go test run at once, each one package at a
// time (-p=1). The root's own packages run beside them, go test's -p (the
// cores, 2 here) at a time, this one among them: at most moduleRuns+1 test
// binaries busy at once, which keeps the suite within the database's default
// 100 connections and the machine's cores (CONTRIBUTING.md, "Modules", has the
// figures).
const moduleRuns = 2

// TestEveryModule runs go test ./... in each module of go.work beside the
// library, moduleRuns modules at a time and one package at a time in each.
// Each module is a subtest of its own, with its own output: a failure shows
// that module's log alone. The race detector is on for them when it is on for
// this test.
func TestEveryModule(t *testing.T) {
	dir := root(t)
	slots := make(chan struct{}, moduleRuns)
	for _, m := range modules(t, dir) {
		rel, err := filepath.Rel(dir, m)
		if err != nil {
			t.Fatal(err)
		}
		t.Run(filepath.ToSlash(rel), func(t *testing.T) {
			t.Parallel()
			slots <- struct{}{}
			defer func() { <-slots }()
			args := append([]string{"test", "-count=1", "-p=1"}, raceFlag...)
			if deadline, ok := t.Deadline(); ok {
				// The modules' test binaries end before this one's deadline, so a
				// hung test there is reported with its goroutines, not cut off here.
				left := time.Until(deadline) - 30*time.Second
				if left < time.Minute {
					t.Fatalf("%v left before this test's deadline: run go test with a longer -timeout", time.Until(deadline))
				}
				args = append(args, "-timeout="+left.Round(time.Second).String())
			}
			args = append(args, "./...")
			cmd := exec.CommandContext(context.Background(), "go", args...)
			cmd.Dir = m
			var out bytes.Buffer
			cmd.Stdout, cmd.Stderr = &out, &out
			start := time.Now()
			err := cmd.Run()
			if err != nil {
				t.Fatalf("go %s in %s: %v after %v\n%s", strings.Join(args, " "), rel, err, time.Since(start).Round(time.Second), tail(out.Bytes(), 256<<10))
			}
			t.Logf("go %s in %s: ok in %v\n%s", strings.Join(args, " "), rel, time.Since(start).Round(time.Second), out.String())
		})
	}
}

// tail returns the last n bytes of b, from a line's start.
func tail(b []byte, n int) string {
	if len(b) <= n {
		return string(b)
	}
	b = b[len(b)-n:]
	if i := bytes.IndexByte(b, '\n'); i >= 0 {
		b = b[i+1:]
	}
	return "…\n" + string(b)
}
