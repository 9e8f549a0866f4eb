package testutil

import (
	"context"
	"net"
	"os"
	"slices"
	"testing"
)

func TestMain(m *testing.M) {
	GuardLookups()
	os.Exit(m.Run())
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
