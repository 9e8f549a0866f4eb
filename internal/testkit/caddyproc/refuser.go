package caddyproc

import (
	"fmt"
	"syscall"
)

// Refuser is a loopback TCP address that refuses every connection (a
// connect gets ECONNREFUSED: nothing is ever sent there), for an upstream
// that is down: reverse_proxy's dial errors. A socket bound to its port
// that never listens holds the port, so that no other program takes it
// while a test dials it.
type Refuser struct {
	Addr string
	fd   int
}

// NewRefuser holds a free loopback port.
func NewRefuser() (*Refuser, error) {
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM, 0)
	if err != nil {
		return nil, err
	}
	if err := syscall.Bind(fd, &syscall.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		syscall.Close(fd)
		return nil, err
	}
	sa, err := syscall.Getsockname(fd)
	if err != nil {
		syscall.Close(fd)
		return nil, err
	}
	return &Refuser{Addr: fmt.Sprintf("127.0.0.1:%d", sa.(*syscall.SockaddrInet4).Port), fd: fd}, nil
}

// Close frees the port.
func (r *Refuser) Close() error { return syscall.Close(r.fd) }
