// Package workspace holds one test: the README's test command, go test ./... at the
// repository root, reaches only the library module's packages (a pattern stops at a
// nested module's boundary, even in workspace mode), so this package's test runs
// go test in every other module of go.work — the CLI and the test-only modules
// (CONTRIBUTING.md "Modules") — and fails when one of them fails, or when a go.mod
// in the tree is missing from go.work.
//
// It has no code of its own and pulls in nothing.
package workspace
