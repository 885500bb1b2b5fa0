package kinesistest

import (
	"os/exec"
	"syscall"
)

// dieWithParent makes the emulator die with the test binary, even a killed one.
func dieWithParent(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
