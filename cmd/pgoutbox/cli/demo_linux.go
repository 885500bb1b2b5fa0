package cli

import (
	"os/exec"
	"syscall"
)

// setDemoProcAttr puts a demo worker in a process group of its own, so that a
// terminal's Ctrl-C reaches only the demo (which stops the workers in order), and
// has the kernel kill it if the demo dies without stopping it.
func setDemoProcAttr(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}
