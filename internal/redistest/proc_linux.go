package redistest

import (
	"os/exec"
	"syscall"
)

// killWithParent makes the kernel kill the server when the test binary dies,
// even by a panic or a timeout that skips Run's and t.Cleanup's cleanup. The
// server leads a process group of its own, so that killGroup reaches the
// children it forks (an AOF rewrite, an RDB save for a replica's full sync).
func killWithParent(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true}
}

// killGroup kills the server and the children it forked with SIGKILL: a
// child killed with its parent alone went on writing its temporary file into
// the server's directory, and the test's TempDir clean-up then failed
// ("directory not empty").
func killGroup(cmd *exec.Cmd) {
	if err := syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL); err != nil {
		cmd.Process.Kill()
	}
}
