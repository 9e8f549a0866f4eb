//go:build unix

package redistest

import "syscall"

// Pause stops the server's process (SIGSTOP): it reads and answers
// nothing until Resume, as a replica behind a network blip.
func (s *Server) Pause() { s.signal(syscall.SIGSTOP) }

// Resume lets a paused server go on (SIGCONT).
func (s *Server) Resume() { s.signal(syscall.SIGCONT) }

func (s *Server) signal(sig syscall.Signal) {
	s.mu.Lock()
	cmd := s.cmd
	s.mu.Unlock()
	_ = cmd.Process.Signal(sig)
}
