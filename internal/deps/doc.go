// Package deps has no code: its test checks what the library's packages
// import. No production package imports a test fixture (internal/pgtest,
// broker/brokertest, pgoutboxtest, ...), and the documentation of every public
// package names the modules outside the standard library it pulls in, in a
// paragraph saying "pulls in" (CONTRIBUTING.md "Modules"). It pulls in nothing
// outside the standard library.
package deps
