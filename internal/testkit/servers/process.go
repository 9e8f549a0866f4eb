//go:build unix

package servers

import (
	"fmt"
	"os/exec"
	"syscall"
	"time"
)

// process is one running server process.
type process struct {
	name    string
	cmd     *exec.Cmd
	done    chan struct{}  // closed when the process has exited
	stopSig syscall.Signal // asks it to shut down cleanly
}

// launch starts a server process as cred (nil: the current user) in a
// process group of its own, so that a ^C on the terminal reaches the
// command that uses the servers but not the servers: they are stopped
// after it. Should this process die without stopping them, the kernel
// sends them stopSig (Linux).
func launch(name string, cmd *exec.Cmd, cred *syscall.Credential, stopSig syscall.Signal) (*process, error) {
	cmd.SysProcAttr = serverAttr(cred, stopSig)
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting %s: %w", name, err)
	}
	p := &process{name: name, cmd: cmd, done: make(chan struct{}), stopSig: stopSig}
	go func() { _ = cmd.Wait(); close(p.done) }()
	return p, nil
}

// exited reports whether the process has ended.
func (p *process) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// stopTimeout is how long a server gets to shut down cleanly.
const stopTimeout = 30 * time.Second

// stop asks the server to shut down and waits; it kills a server that
// takes longer than stopTimeout.
func (p *process) stop() error {
	if p.exited() {
		return nil
	}
	_ = p.cmd.Process.Signal(p.stopSig)
	select {
	case <-p.done:
		return nil
	case <-time.After(stopTimeout):
	}
	p.kill()
	return fmt.Errorf("%s (pid %d) did not stop within %v; killed it", p.name, p.cmd.Process.Pid, stopTimeout)
}

// kill ends the server and every process it started (PostgreSQL's
// backends) at once with SIGKILL, as a crash of its machine would, and
// waits for it. The group is the one launch made, named by the server's
// own pid.
func (p *process) kill() {
	if !p.exited() {
		_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
		_ = p.cmd.Process.Kill()
	}
	<-p.done
	// Children in the group may outlive the leader by a moment.
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if syscall.Kill(-p.cmd.Process.Pid, 0) == syscall.ESRCH {
			return
		}
	}
}
