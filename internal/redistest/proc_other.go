//go:build !linux

package redistest

import "os/exec"

// killWithParent does nothing here: only Linux can kill a child with its
// parent, so a crashed test binary may leave servers behind.
func killWithParent(*exec.Cmd) {}
