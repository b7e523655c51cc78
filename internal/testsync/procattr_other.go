//go:build !linux

package testsync

import "syscall"

// sysProcAttr returns nil: outside Linux there is no parent-death signal,
// and the test's cleanup alone stops the server.
func sysProcAttr() *syscall.SysProcAttr { return nil }
