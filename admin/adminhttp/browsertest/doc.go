// Package browsertest holds the web console's browser tests: they drive
// Debian's chromium headless through the DevTools protocol (chromedp). It is
// a module of its own, github.com/pgoutbox/pgoutbox/admin/adminhttp/browsertest,
// so that the browser driver stays out of the library's go.mod; the console
// they start comes from admin/adminhttp/internal/consoletest, as in the
// console's own tests. It has no code besides the tests.
package browsertest
