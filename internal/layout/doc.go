// Package layout holds no code: its tests keep the repository's maps true.
//
// They fail when a Go package of any module of the repository has no row in
// the package map (CONTRIBUTING.md, section "Layout") or a row names a package
// that is gone; when README.md's "Layout" section lists packages instead of
// linking to that map; when docs/design.md's "File map" names a file, or a Go
// symbol in backticks, that does not exist where the row says; and when a
// service of the library (an exported type with Start(context.Context) error
// and Stop(context.Context) error) is not run through the lifecycle test table
// (internal/lifecycle/lifecycletest.Run) by a test in its own package.
//
// They use only the standard library and the go command (go list).
package layout
