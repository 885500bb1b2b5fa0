//go:build !linux

package cli

import (
	"os/exec"
	"syscall"
)

// setDemoProcAttr puts a demo worker in a process group of its own, so that a
// terminal's Ctrl-C reaches only the demo, which stops the workers in order. A
// worker also exits when its standard input (a pipe from the demo) closes.
func setDemoProcAttr(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
}
