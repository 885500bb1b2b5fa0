//go:build !linux

package kinesistest

import "os/exec"

// dieWithParent does nothing here: the test's cleanup stops the emulator.
func dieWithParent(*exec.Cmd) {}
