package e2e

import (
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/caddy-idempotency/caddy-idempotency/internal/testkit/testutil"
	"github.com/caddy-idempotency/caddy-idempotency/storage/postgres"
)

// deadPort is a loopback address where nothing listens.
func deadPort(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	return addr
}

// Start-up says which store each configuration uses, and names a store it
// cannot reach at once, without failing or waiting.
func TestStartUpNamesTheStoresAndWarnsOfAnUnreachableOne(t *testing.T) {
	for _, tc := range []struct{ name, storage, address string }{
		{"redis", "storage redis {\n\turl redis://user:hunter2@%s/0\n}", "redis://%s/0 key_prefix idempotency:"},
		{"postgres", "storage postgres {\n\tdsn \"postgres://postgres:hunter2@%s/test?sslmode=disable\"\n}", "postgres://postgres@%s/test"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			addr := deadPort(t)
			up := newUpstream(t)
			began := time.Now()
			inst := startCaddy(t, "caddy", site{routes: route(up, strings.ReplaceAll(tc.storage, "%s", addr))})
			if took := time.Since(began); took > 10*time.Second {
				t.Errorf("start-up took %s with the store down", took)
			}
			wantAddress := strings.ReplaceAll(tc.address, "%s", addr)
			testutil.Eventually(t, 10*time.Second, "the unreachable store to be named in a warning", func() bool {
				log := inst.Log()
				return strings.Contains(log, `"msg":"idempotency store unreachable`) && strings.Contains(log, wantAddress)
			})
			log := inst.Log()
			if !strings.Contains(log, `"msg":"idempotency store opened"`) || !strings.Contains(log, `"backend":"`+tc.name+`"`) {
				t.Errorf("no info line announcing the %s store", tc.name)
			}
			if pool := fmt.Sprintf("(max_conns %d)", postgres.DefaultMaxConns()); tc.name == "postgres" && !strings.Contains(log, pool) {
				t.Errorf("the postgres store's announcement lacks its default pool size %s", pool)
			}
			if strings.Contains(log, "hunter2") {
				t.Error("the log holds the store's password")
			}
		})
	}
}

// A route whose idempotency handler has nothing after it answers empty
// 200s: the first one is named in a warning.
func TestAHandlerWithNothingAfterItWarns(t *testing.T) {
	inst := startCaddy(t, "caddy", site{routes: "\troute {\n\t\tidempotency\n\t}\n"})
	if r := post(inst.URL(), "/orders", "nothing-after", `{}`); r.status != 200 || len(r.body) != 0 {
		t.Fatalf("a route with idempotency alone: %s", describe(r))
	}
	testutil.Eventually(t, 5*time.Second, "the warning about the empty route", func() bool {
		return strings.Contains(inst.Log(), "no handler after idempotency in its route wrote a response")
	})
}
