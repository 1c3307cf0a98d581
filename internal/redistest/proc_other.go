//go:build !linux

package redistest

import "os/exec"

// killWithParent does nothing here: only Linux can kill a child with its
// parent, so a crashed test binary may leave servers behind.
func killWithParent(*exec.Cmd) {}

// killGroup kills the server; here the children it forked are left to end by
// themselves.
func killGroup(cmd *exec.Cmd) { cmd.Process.Kill() }
