package testsync

import "syscall"

// sysProcAttr makes the kernel kill the server if the test binary dies
// without running its cleanups (a panic or a -timeout), so no server is
// left listening. Go never retires an unlocked OS thread, so the death
// signal fires only when the test process itself exits.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
