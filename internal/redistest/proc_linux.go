package redistest

import (
	"os/exec"
	"syscall"
)

// killWithParent makes the kernel kill the server when the test binary dies,
// even by a panic or a timeout that skips Run's and t.Cleanup's cleanup.
func killWithParent(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
