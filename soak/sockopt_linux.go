package main

import "syscall"

// slowSocket sets, before a slow HTTP/1.1 client's connection is made, a
// 4 KiB receive buffer and an Ethernet-sized MSS (1460 bytes): on
// loopback (MSS 64 KiB) the server's send buffer would grow to megabytes
// and its writes would never wait for the client, as they do over a real
// network.
func slowSocket(fd uintptr) {
	_ = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 4<<10)
	_ = syscall.SetsockoptInt(int(fd), syscall.IPPROTO_TCP, syscall.TCP_MAXSEG, 1460)
}
