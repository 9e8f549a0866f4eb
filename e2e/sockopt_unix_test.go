//go:build unix

package e2e

import (
	"syscall"
)

// shapeTCP sets, before a connection is made, its receive buffer and the
// largest segment it takes (see slowClientReceiveBuffer).
func shapeTCP(receiveBuffer, mss int) func(network, address string, c syscall.RawConn) error {
	return func(_, _ string, c syscall.RawConn) error {
		var err error
		if cerr := c.Control(func(fd uintptr) {
			err = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, receiveBuffer)
			if err == nil {
				err = syscall.SetsockoptInt(int(fd), syscall.IPPROTO_TCP, syscall.TCP_MAXSEG, mss)
			}
		}); cerr != nil {
			return cerr
		}
		return err
	}
}
