//go:build linux

package caddyproc

import "syscall"

// procAttr has the kernel kill a Caddy process should the process that
// started it die first (a test binary or a soak killed with SIGKILL), so
// that nothing is left running.
func procAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
