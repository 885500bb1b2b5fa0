//go:build unix && !linux

package pgtest

import "syscall"

// procAttr runs a cluster's binary as u (nil: as this process's user). Outside
// Linux there is no parent-death signal: a test process that is killed (rather
// than ending its TestMain) leaves its cluster running.
func procAttr(u *osUser, _ bool) *syscall.SysProcAttr {
	a := &syscall.SysProcAttr{}
	if u != nil {
		a.Credential = &syscall.Credential{Uid: u.uid, Gid: u.gid}
	}
	return a
}
