package testutil

import (
	"context"
	"encoding/binary"
	"fmt"
	"net"
	"os"
	"slices"
	"sync"
	"testing"
	"time"

	"golang.org/x/net/dns/dnsmessage"
)

// A test suite sends nothing off the machine, not even a name lookup: on
// some machines the resolver is slow or absent, and a made-up name (a
// DSN's "db") can reach a real host. Main makes this process's resolver
// answer every DNS query itself, "no such host", and remember the names;
// names the hosts file knows (localhost) never reach it. Addresses are
// always fine.

var lookups = struct {
	sync.Mutex
	names []string
}{}

// Main runs a test package's tests with the resolver above and fails the
// package when any test or benchmark looked a name up. Every test package
// of the module calls it from its TestMain:
//
//	func TestMain(m *testing.M) { testutil.Main(m) }
func Main(m *testing.M) {
	os.Exit(RunWithoutLookups(m))
}

// RunWithoutLookups is Main for a TestMain that does more: it returns the
// exit status instead of exiting. The tests run in a home directory of
// their own (see isolateHome).
func RunWithoutLookups(m *testing.M) int {
	GuardLookups()
	cleanup, err := isolateHome()
	if err != nil {
		fmt.Fprintf(os.Stderr, "FAIL: a home of the tests' own: %v\n", err)
		return 1
	}
	defer cleanup()
	code := m.Run()
	if names := LookedUp(); len(names) > 0 {
		fmt.Fprintf(os.Stderr, "FAIL: the tests looked up names other than localhost (give tests loopback addresses, and stores that need not be reached no ping): %q\n", names)
		return 1
	}
	return code
}

// GuardLookups makes this process's resolver answer every query itself
// (see Main), for a program that checks LookedUp at its end (make bench).
func GuardLookups() {
	net.DefaultResolver = &net.Resolver{PreferGo: true, Dial: refuseLookup}
}

// LookedUp returns the names looked up so far, sorted, once each.
func LookedUp() []string {
	lookups.Lock()
	defer lookups.Unlock()
	names := slices.Clone(lookups.names)
	slices.Sort(names)
	return slices.Compact(names)
}

// refuseLookup is the resolver's connection to its "server": each query
// written to it is answered NXDOMAIN, its name remembered. A connection
// that is no net.PacketConn carries DNS as over TCP, whatever the network.
func refuseLookup(context.Context, string, string) (net.Conn, error) {
	client, server := net.Pipe()
	go answer(server)
	return client, nil
}

// answer reads queries from c and answers each with NXDOMAIN. Each
// message has a two-byte length first, as over TCP.
func answer(c net.Conn) {
	defer c.Close()
	buf := make([]byte, 64<<10)
	for {
		_ = c.SetDeadline(time.Now().Add(time.Minute))
		if _, err := readFull(c, buf[:2]); err != nil {
			return
		}
		n := int(binary.BigEndian.Uint16(buf[:2]))
		if _, err := readFull(c, buf[:n]); err != nil {
			return
		}
		msg := buf[:n]
		var p dnsmessage.Parser
		h, err := p.Start(msg)
		if err != nil {
			return
		}
		q, err := p.Question()
		if err != nil {
			return
		}
		lookups.Lock()
		lookups.names = append(lookups.names, q.Name.String())
		lookups.Unlock()
		reply, err := (&dnsmessage.Message{
			Header:    dnsmessage.Header{ID: h.ID, Response: true, RecursionAvailable: true, RCode: dnsmessage.RCodeNameError},
			Questions: []dnsmessage.Question{q},
		}).Pack()
		if err != nil {
			return
		}
		reply = append(binary.BigEndian.AppendUint16(nil, uint16(len(reply))), reply...)
		if _, err := c.Write(reply); err != nil {
			return
		}
	}
}

func readFull(c net.Conn, b []byte) (int, error) {
	n := 0
	for n < len(b) {
		k, err := c.Read(b[n:])
		n += k
		if err != nil {
			return n, err
		}
	}
	return n, nil
}
