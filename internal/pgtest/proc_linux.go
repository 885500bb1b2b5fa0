package pgtest

import "syscall"

// procAttr runs a cluster's binary as u (nil: as this process's user); a guarded
// process (the postmaster) gets SIGQUIT, PostgreSQL's immediate shutdown, when
// the thread that started it ends: the test process dying, however it dies.
func procAttr(u *osUser, guarded bool) *syscall.SysProcAttr {
	a := &syscall.SysProcAttr{}
	if u != nil {
		a.Credential = &syscall.Credential{Uid: u.uid, Gid: u.gid}
	}
	if guarded {
		a.Pdeathsig = syscall.SIGQUIT
	}
	return a
}
