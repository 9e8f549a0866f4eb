//go:build !unix

package e2e

import "syscall"

// shapeTCP leaves the connection as it is where the socket options are
// not available: the slow-client tests then prove less over HTTP/1.1.
func shapeTCP(receiveBuffer, mss int) func(network, address string, c syscall.RawConn) error {
	return nil
}
