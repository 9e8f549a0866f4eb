//go:build unix && !linux

package servers

import "syscall"

// serverAttr runs a server as cred (nil: the current user) in a process
// group of its own. Only Linux can have a server stopped when this
// process dies.
func serverAttr(cred *syscall.Credential, _ syscall.Signal) *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Credential: cred, Setpgid: true}
}
