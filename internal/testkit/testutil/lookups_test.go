package testutil

import (
	"context"
	"net"
	"os"
	"slices"
	"testing"
)

// userHome is HOME as the tests found it.
var userHome = os.Getenv("HOME")

// TestMain guards lookups and isolates the home as RunWithoutLookups
// does, without failing the package for the names its tests look up on
// purpose.
func TestMain(m *testing.M) {
	GuardLookups()
	cleanup, err := isolateHome()
	if err != nil {
		panic(err)
	}
	code := m.Run()
	cleanup()
	os.Exit(code)
}

// The guard answers a made-up name itself, at once, and remembers it;
// localhost comes from the hosts file and never reaches it.
func TestNameLookupsAreAnsweredHereAndRemembered(t *testing.T) {
	if _, err := net.DefaultResolver.LookupHost(context.Background(), "localhost"); err != nil {
		t.Fatalf("localhost: %v", err)
	}
	if got := LookedUp(); len(got) != 0 {
		t.Fatalf("localhost reached the resolver: %q", got)
	}
	_, err := net.DefaultResolver.LookupHost(context.Background(), "db")
	var dnsErr *net.DNSError
	if err == nil || !errorsAs(err, &dnsErr) || !dnsErr.IsNotFound {
		t.Fatalf("db: %v, want no such host", err)
	}
	if got := LookedUp(); !slices.ContainsFunc(got, func(n string) bool { return n == "db." || len(n) > 3 && n[:3] == "db." }) {
		t.Fatalf("the lookup of db was not remembered: %q", got)
	}
	lookups.Lock()
	lookups.names = nil // the guard's own test leaves nothing to report
	lookups.Unlock()
}

func errorsAs(err error, target **net.DNSError) bool {
	d, ok := err.(*net.DNSError)
	if ok {
		*target = d
	}
	return ok
}
