//go:build linux

package servers

import "syscall"

// serverAttr runs a server as cred (nil: the current user) in a process
// group of its own, and has the kernel send it stopSig should this
// process die first (set after the change of user, which would clear it).
func serverAttr(cred *syscall.Credential, stopSig syscall.Signal) *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Credential: cred, Setpgid: true, Pdeathsig: stopSig}
}
