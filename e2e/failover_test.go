//go:build unix

package e2e

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/caddy-idempotency/caddy-idempotency/internal/testkit/caddyproc"
	"github.com/caddy-idempotency/caddy-idempotency/internal/testkit/pgtest"
	"github.com/caddy-idempotency/caddy-idempotency/internal/testkit/testutil"
)

// A PostgreSQL promotion through a real Caddy process, on a private
// primary and streaming standby (pgtest.Replicated) whose commits wait for
// the standby: the site's DSN lists the standby first and the primary
// second with target_session_attrs=read-write, so that it writes to the
// primary, and after the primary is killed and the standby promoted, to
// the new primary, which has every record; a route whose DSN names the
// standby alone answers by on_storage_error (fail_open: passed on), with
// a log line that says why; the admin API shows each store's facts.
func TestPostgresPromotionIsFollowedThroughAMultiHostDSN(t *testing.T) {
	_, primary, standby := pgtest.Replicated(t)
	if err := primary.AlterSystem("synchronous_standby_names", "*"); err != nil {
		t.Fatal(err)
	}
	if err := primary.WaitStreaming(1, time.Minute); err != nil {
		t.Fatal(err)
	}
	table := pgtest.Name("idem_e2e_failover_")
	storage := func(dsn string) string {
		return fmt.Sprintf("\t\tstorage postgres {\n\t\t\tdsn %q\n\t\t\ttable %s\n\t\t\ttimeout 2s\n\t\t}\n", dsn, table)
	}
	both := fmt.Sprintf("postgres://postgres@%s,%s/test?sslmode=disable&target_session_attrs=read-write", standby.Addr, primary.Addr)
	alone := fmt.Sprintf("postgres://postgres@%s/test?sslmode=disable", standby.Addr)
	up := newUpstream(t)
	inst := startCaddy(t, "failover", site{routes: "\thandle /standby/* {\n" + route(up, storage(alone)+"\t\ton_storage_error fail_open") + "\t}\n" +
		"\thandle {\n" + route(up, storage(both)) + "\t}\n"})

	if r := post(inst.URL(), "/orders", "before", `{"amount":10}`); !r.isNew() {
		t.Fatalf("before the promotion: %s, want the upstream's answer", r)
	}
	if r := post(inst.URL(), "/standby/orders", "on-standby", `{"amount":10}`); !r.isNew() {
		t.Errorf("on the standby with fail_open: %s, want the request passed on", r)
	}
	assertExecutions(t, up, "on-standby", 1)
	testutil.Eventually(t, time.Minute, "the fail_open line of the standby's store, saying why", func() bool {
		for _, line := range strings.Split(inst.Log(), "\n") {
			if strings.Contains(line, "(fail_open)") && strings.Contains(line, "connected to a read-only server: the records cannot be written there; a standby (in recovery") {
				return true
			}
		}
		return false
	})
	if code, body := adminGet(t, inst, "/idempotency/stores"); code != 200 ||
		!strings.Contains(string(body), `"in_recovery":true`) || !strings.Contains(string(body), `"synchronous":true`) ||
		!strings.Contains(string(body), "target_session_attrs=read-write") {
		t.Errorf("GET /idempotency/stores: %d %s; want the standby's store in recovery, the primary's synchronous", code, body)
	}

	primary.Kill()
	if err := standby.Promote(); err != nil {
		t.Fatal(err)
	}
	var r reply
	testutil.Eventually(t, time.Minute, "a new key on the new primary", func() bool {
		r = post(inst.URL(), "/orders", "after", `{"amount":10}`)
		return r.status != 503
	})
	if !r.isNew() {
		t.Errorf("after the promotion: %s, want the upstream's answer", r)
	}
	if r := post(inst.URL(), "/orders", "before", `{"amount":10}`); !r.isReplayOf(1) {
		t.Errorf("the key of before the promotion: %s, want a replay", r)
	}
	assertExecutions(t, up, "before", 1)
}

// A synchronous standby cut off, then the primary lost, through a real
// Caddy process (issue 38's finding): the standby streams through a link
// the test cuts while a request runs. Its completion's wait for the
// standby is cancelled at the storage's timeout (PostgreSQL commits it on
// the primary alone and answers success with a warning): the completion
// is sent again in the background, its lease renewed. A new key meanwhile
// gets 503 (its reservation is not replicated) and never runs. Then the
// primary is killed and the standby promoted: it holds the first request's
// reservation in flight, and the completion sent again lands there, so
// that the retry is a replay, never a second run; the new key's retry runs
// once. Before the fix, the new key ran on a reservation the standby never
// got, and the first request's retry ran again once its lease lapsed.
func TestACutOffSynchronousStandbyLetsNoRetryRunAgain(t *testing.T) {
	var link *caddyproc.Proxy
	_, primary, standby := pgtest.ReplicatedVia(t, func(addr string) string {
		var err error
		if link, err = caddyproc.NewProxy(addr); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(link.Close)
		return link.Addr
	})
	if err := primary.AlterSystem("synchronous_standby_names", "*"); err != nil {
		t.Fatal(err)
	}
	if err := primary.WaitStreaming(1, time.Minute); err != nil {
		t.Fatal(err)
	}
	table := pgtest.Name("idem_e2e_cut_")
	dsn := fmt.Sprintf("postgres://postgres@%s,%s/test?sslmode=disable&target_session_attrs=read-write", standby.Addr, primary.Addr)
	up := newUpstream(t)
	inst := startCaddy(t, "cut", site{routes: route(up, fmt.Sprintf("\t\tstorage postgres {\n\t\t\tdsn %q\n\t\t\ttable %s\n\t\t\ttimeout 1s\n\t\t}\n", dsn, table))})
	// The table is made, and on the standby, before the link is cut.
	if r := post(inst.URL(), "/orders", "warm", `{"amount":1}`); !r.isNew() {
		t.Fatalf("with the standby in sync: %s, want the upstream's answer", r)
	}

	first := running(t, up, inst, "first", `{"amount":10}`, 2*time.Second)
	link.Cut()
	if r := <-first; !r.isNew() {
		t.Fatalf("the request that ran while the standby was cut off: %s, want the upstream's answer", r)
	}
	if r := post(inst.URL(), "/orders", "cut", `{"amount":20}`); r.status != 503 || r.problem() != "urn:caddy-idempotency:store-unavailable" {
		t.Fatalf("a new key with the standby cut off: %s, want 503 store-unavailable (not replicated)", r)
	}
	assertExecutions(t, up, "cut", 0)
	testutil.Eventually(t, 30*time.Second, "the line of the cancelled waits", func() bool {
		return strings.Contains(inst.Log(), "PostgreSQL cancelled idempotency commits' waits for a synchronous standby")
	})

	primary.Kill()
	if err := standby.Promote(); err != nil {
		t.Fatal(err)
	}
	var r reply
	testutil.Eventually(t, time.Minute, "the first request's retry answered on the promoted standby", func() bool {
		r = post(inst.URL(), "/orders", "first", `{"amount":10}`)
		return r.status != 503 && !r.isConflict()
	})
	if !r.isReplayOf(1) {
		t.Fatalf("the first request's retry after the promotion: %s, want its replay", r)
	}
	assertExecutions(t, up, "first", 1)
	if r := post(inst.URL(), "/orders", "cut", `{"amount":20}`); !r.isNew() {
		t.Fatalf("the new key's retry after the promotion: %s, want it run, once", r)
	}
	assertExecutions(t, up, "cut", 1)
}
