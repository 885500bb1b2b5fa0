//go:build !unix

package pgtest

import "syscall"

// procAttr: outside Unix a cluster's binaries run as this process's user, with
// no parent-death signal.
func procAttr(*osUser, bool) *syscall.SysProcAttr { return nil }
