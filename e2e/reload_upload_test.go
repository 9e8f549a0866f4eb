package e2e

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"
)

// A reload that changes the storage configuration drops the old store
// (its pool key changes). A request the old configuration accepted and
// whose body is still being uploaded has not reserved its key yet; it
// must still be able to use the store it was accepted with, not find it
// closed (a 503, or a "client is closed" error) when its body is in.
func TestReloadThatChangesTheStoreWhileABodyUploadsLetsTheRequestFinish(t *testing.T) {
	for _, tc := range []struct {
		name          string
		open          func(t *testing.T) backend
		before, after string // the option the reload changes
	}{
		{"redis", func(t *testing.T) backend { return onRedis(t, sharedRedisAddr(t), "pool_size 5") }, "pool_size 5", "pool_size 6"},
		{"postgres", func(t *testing.T) backend { return onPostgresWith(t, "max_conns 4") }, "max_conns 4", "max_conns 5"},
		// The control: a reload that keeps the store.
		{"redis, store kept", func(t *testing.T) backend { return onRedis(t, sharedRedisAddr(t), "pool_size 5") }, "ttl 1h", "ttl 2h"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			store := tc.open(t)
			up := newUpstream(t)
			options := store.storage + "\nttl 1h"
			inst := startCaddy(t, "caddy", site{routes: route(up, options)})
			if r := post(inst.URL(), "/orders", "warm", `{"amount":10}`); !r.isNew() {
				t.Fatalf("before the reload: %s", describe(r))
			}

			const key, body = "uploading-across-reload", `{"amount":10,"note":"sent across a reload"}`
			conn, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", inst.Port), 5*time.Second)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			conn.SetDeadline(time.Now().Add(30 * time.Second))
			br := bufio.NewReader(conn)
			// Expect: 100-continue makes Caddy say when the handler starts
			// reading the body: from then on the request is the old
			// configuration's, whatever the reload does.
			head := fmt.Sprintf("POST /orders HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"+
				"Idempotency-Key: %s\r\nContent-Length: %d\r\nExpect: 100-continue\r\nConnection: close\r\n\r\n", key, len(body))
			if _, err := conn.Write([]byte(head)); err != nil {
				t.Fatal(err)
			}
			if resp, err := http.ReadResponse(br, nil); err != nil || resp.StatusCode != http.StatusContinue {
				t.Fatalf("waiting for 100 Continue: %v, %v", resp, err)
			}
			if _, err := conn.Write([]byte(body[:5])); err != nil {
				t.Fatal(err)
			}

			// Caddy has cleaned the old configuration up when the reload
			// returns.
			reload(t, inst, site{routes: route(up, strings.Replace(options, tc.before, tc.after, 1))})

			if _, err := conn.Write([]byte(body[5:])); err != nil {
				t.Fatal(err)
			}
			var r reply
			if resp, err := http.ReadResponse(br, nil); err != nil {
				r.err = err
			} else {
				r.status, r.header = resp.StatusCode, resp.Header
				r.body, r.err = io.ReadAll(resp.Body)
				resp.Body.Close()
			}
			if !r.isNew() || r.execution() != 1 {
				t.Fatalf("request uploading across the reload: %s, want the upstream's 201 (execution 1)", describe(r))
			}
			if !strings.Contains(string(r.body), fmt.Sprintf(`"request_bytes":%d`, len(body))) {
				t.Fatalf("the upstream got %s, want the whole %d-byte body", r.body, len(body))
			}
			for _, closed := range []string{"store is closed", "client is closed", "closed pool"} {
				if strings.Contains(inst.Log(), closed) {
					t.Fatalf("the request used a closed store:\n%s", tail(inst.Log(), 20))
				}
			}
			// It was recorded: the new configuration reaches the same
			// records (same key prefix or table) and replays it.
			if r := post(inst.URL(), "/orders", key, body); !r.isReplayOf(1) {
				t.Fatalf("retry after the reload: %s, want a replay of execution 1", describe(r))
			}
			assertExecutions(t, up, key, 1)
		})
	}
}
