package inprocess_test

import (
	"bytes"
	"compress/gzip"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	_ "github.com/caddyserver/caddy/v2/modules/standard"
	goredis "github.com/redis/go-redis/v9"

	_ "github.com/caddy-idempotency/caddy-idempotency" // the idempotency module and directive
	"github.com/caddy-idempotency/caddy-idempotency/internal/testkit/pgtest"
	"github.com/caddy-idempotency/caddy-idempotency/internal/testkit/redistest"
	"github.com/caddy-idempotency/caddy-idempotency/internal/testkit/testutil"
)

// These tests run a real Caddy in this process, configured from a
// Caddyfile, in front of a counting upstream. Caddy holds one config per
// process, so they do not run in parallel.

// countingUpstream is an HTTP server that counts requests and answers
// with a JSON body, gzip-encoded when the request accepts it (so tests
// see what an encoding upstream would make Caddy store).
type countingUpstream struct {
	*httptest.Server
	calls atomic.Int64
	delay time.Duration
	body  string
}

func newCountingUpstream(t *testing.T) *countingUpstream {
	u := &countingUpstream{body: `{"id":"ord_1","items":[` + strings.Repeat(`{"sku":"abc","qty":1},`, 60) + `{"sku":"end","qty":0}]}`}
	u.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		u.calls.Add(1)
		_, _ = io.Copy(io.Discard, r.Body)
		time.Sleep(u.delay)
		w.Header().Set("Content-Type", "application/json")
		if strings.Contains(r.Header.Get("Accept-Encoding"), "gzip") {
			w.Header().Set("Content-Encoding", "gzip")
			w.WriteHeader(http.StatusCreated)
			zw := gzip.NewWriter(w)
			_, _ = zw.Write([]byte(u.body))
			_ = zw.Close()
			return
		}
		w.WriteHeader(http.StatusCreated)
		_, _ = io.WriteString(w, u.body)
	}))
	t.Cleanup(u.Close)
	return u
}

func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// loadCaddyfile adapts and runs a Caddyfile site body on a fresh port and
// returns the site's base URL. The config stays loaded until the test ends.
func loadCaddyfile(t *testing.T, port int, site string) string {
	return loadCaddyfileGlobals(t, port, "admin off", site)
}

// loadCaddyfileGlobals is loadCaddyfile with more global options (which
// must set the admin endpoint, "admin off" or an address).
func loadCaddyfileGlobals(t *testing.T, port int, globals, site string) string {
	t.Helper()
	cfg := fmt.Sprintf(`{
	%s
	auto_https off
	persist_config off
	http_port %d
	log {
		level ERROR
	}
}

http://127.0.0.1:%d {
%s
}
`, globals, port, port, site)
	adapter := caddyconfig.GetAdapter("caddyfile")
	js, warnings, err := adapter.Adapt(caddyfile.Format([]byte(cfg)), map[string]any{"filename": "Caddyfile"})
	if err != nil {
		t.Fatalf("adapt: %v\n%s", err, cfg)
	}
	if len(warnings) > 0 {
		t.Fatalf("adapt warnings: %v", warnings)
	}
	if err := caddy.Load(js, true); err != nil {
		t.Fatalf("load: %v", err)
	}
	t.Cleanup(func() { _ = caddy.Stop() })
	ports := []int{port}
	if m := adminPort.FindStringSubmatch(globals); m != nil {
		p, _ := strconv.Atoi(m[1])
		ports = append(ports, p)
	}
	oneListener(t, ports...)
	return fmt.Sprintf("http://127.0.0.1:%d", port)
}

var adminPort = regexp.MustCompile(`admin 127\.0\.0\.1:(\d+)`)

// oneListener waits until only one socket listens on each port. Caddy
// listens with SO_REUSEPORT, so a reload binds a socket of its own beside
// the old config's, and the kernel spreads new connections over both
// until the old one closes (once Load has returned, as the old servers
// shut down): a connection still queued on it then is reset, an EOF
// after the request was sent. A test's request after a reload waits for
// that, rather than meet it by chance.
func oneListener(t *testing.T, ports ...int) {
	t.Helper()
	for _, port := range ports {
		testutil.Eventually(t, 10*time.Second, fmt.Sprintf("one socket listening on port %d", port), func() bool {
			n, ok := listeners(port)
			return !ok || n == 1
		})
	}
}

// listeners counts the sockets listening on port, from /proc/net/tcp and
// tcp6; ok is false where there is no /proc.
func listeners(port int) (n int, ok bool) {
	for _, f := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		data, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		ok = true
		for _, line := range strings.Split(string(data), "\n")[1:] {
			fields := strings.Fields(line)
			// local_address is hex address:port, st 0A is LISTEN
			if len(fields) > 3 && fields[3] == "0A" && strings.HasSuffix(fields[1], fmt.Sprintf(":%04X", port)) {
				n++
			}
		}
	}
	return n, ok
}

// client does not ask for compression unless told and never decodes.
var client = &http.Client{Transport: &http.Transport{DisableCompression: true, MaxIdleConnsPerHost: 200}, Timeout: 30 * time.Second}

func post(t *testing.T, url, key, body string, header ...string) (*http.Response, []byte) {
	t.Helper()
	resp, b, err := tryPost(url, key, body, header...)
	if err != nil {
		t.Fatal(err)
	}
	return resp, b
}

// postAcrossReload is post for the first request after a reload. Caddy
// shuts the old servers down in the background after Load returns, so a
// connection the old server held or still accepted may be closed under
// the request (EOF): a real client retries, which the key makes safe.
func postAcrossReload(t *testing.T, url, key, body string) (*http.Response, []byte) {
	t.Helper()
	for attempt := 1; ; attempt++ {
		resp, b, err := tryPost(url, key, body)
		if err == nil {
			return resp, b
		}
		if attempt == 5 {
			t.Fatal(err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func tryPost(url, key, body string, header ...string) (*http.Response, []byte, error) {
	req, _ := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := client.Do(req)
	if err != nil {
		return nil, nil, fmt.Errorf("POST %s: %w", url, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, nil, fmt.Errorf("reading response: %w", err)
	}
	return resp, b, nil
}

// storages runs test once per store, as subtests named memory, redis and
// postgres, each with the Caddyfile storage block of a namespace of its
// own: the Caddyfile side of the backend matrix in matrix_test.go. A
// subtest whose server does not answer is skipped, or failed under
// CI=true.
// memoryStorage is a memory storage block of its own (a store is shared
// by the configs that describe it alike: see uniqueMaxKeys).
func memoryStorage() string {
	return fmt.Sprintf("storage memory {\n\tmax_keys %d\n}", uniqueMaxKeys())
}

func storages(t *testing.T, test func(t *testing.T, storage string)) {
	t.Helper()
	for _, s := range []struct {
		name  string
		block func(t *testing.T) string
	}{
		{"memory", func(*testing.T) string { return memoryStorage() }},
		{"redis", func(t *testing.T) string {
			addr := redistest.Addr()
			redistest.Require(t, addr)
			prefix := "idempotency-test:" + redistest.RandomHex(6) + ":"
			t.Cleanup(func() { deleteRedisKeys(t, addr, prefix) })
			return fmt.Sprintf("storage redis redis://%s/0 {\n\tkey_prefix %s\n\ttimeout 2s\n}", addr, prefix)
		}},
		{"postgres", func(t *testing.T) string {
			dsn := pgtest.Require(t)
			t.Setenv("IDEM_TEST_PG_DSN", dsn) // the DSN as a placeholder, as a secret would be
			return "storage postgres {\n\tdsn {env.IDEM_TEST_PG_DSN}\n\ttable " + pgtest.Table(t, dsn) +
				"\n\tcleanup_interval 1m\n\tmax_conns 4\n}"
		}},
	} {
		t.Run(s.name, func(t *testing.T) { test(t, s.block(t)) })
	}
}

// uniqueMaxKeys returns a max_keys no other memory store in this process
// uses: handlers share a memory store per max_keys. (The package's
// internal tests count from 900000000.)
func uniqueMaxKeys() int64 { return 800_000_000 + nextMaxKeys.Add(1) }

var nextMaxKeys atomic.Int64

// redisKeys lists the keys under prefix on the Redis at addr.
func redisKeys(t *testing.T, addr, prefix string) []string {
	t.Helper()
	c := goredis.NewClient(&goredis.Options{Addr: addr})
	defer c.Close()
	keys, err := c.Keys(context.Background(), prefix+"*").Result()
	if err != nil {
		t.Fatal(err)
	}
	return keys
}

// deleteRedisKeys deletes every key under prefix on the Redis at addr.
func deleteRedisKeys(t *testing.T, addr, prefix string) {
	t.Helper()
	keys := redisKeys(t, addr, prefix)
	if len(keys) == 0 {
		return
	}
	c := goredis.NewClient(&goredis.Options{Addr: addr})
	defer c.Close()
	if err := c.Del(context.Background(), keys...).Err(); err != nil {
		t.Fatal(err)
	}
}

// TestCaddyfileConcurrentSameKeyRunsOnce runs a real Caddy from a
// Caddyfile with a storage block in front of a reverse-proxied upstream:
// of 100 concurrent requests with one key, the upstream runs once; one
// client gets its response, every other one a 409 or the same response
// replayed, and a later retry gets the replay.
func TestCaddyfileConcurrentSameKeyRunsOnce(t *testing.T) {
	storages(t, func(t *testing.T, storage string) {
		up := newCountingUpstream(t)
		up.delay = 100 * time.Millisecond
		base := loadCaddyfile(t, freePort(t), `
	idempotency {
		`+storage+`
	}
	reverse_proxy `+up.Listener.Addr().String())

		var wg sync.WaitGroup
		var created, replayed, conflict atomic.Int64
		start := make(chan struct{})
		for range 100 {
			wg.Go(func() {
				<-start
				resp, body := post(t, base+"/orders", "order-1", `{"amount":10}`)
				switch {
				case resp.StatusCode == http.StatusConflict:
					conflict.Add(1)
				case resp.StatusCode == http.StatusCreated && resp.Header.Get("Idempotent-Replayed") == "true":
					replayed.Add(1)
					if string(body) != up.body {
						t.Errorf("replay body differs")
					}
				case resp.StatusCode == http.StatusCreated:
					created.Add(1)
				default:
					t.Errorf("unexpected %d %s", resp.StatusCode, body)
				}
			})
		}
		close(start)
		wg.Wait()
		if n := up.calls.Load(); n != 1 {
			t.Fatalf("upstream ran %d times, want 1", n)
		}
		if created.Load() != 1 || conflict.Load()+replayed.Load() != 99 {
			t.Fatalf("created %d conflict %d replayed %d", created.Load(), conflict.Load(), replayed.Load())
		}
		resp, body := post(t, base+"/orders", "order-1", `{"amount":10}`)
		if resp.StatusCode != http.StatusCreated || resp.Header.Get("Idempotent-Replayed") != "true" || string(body) != up.body {
			t.Fatalf("retry: %d replayed=%q, want the replay", resp.StatusCode, resp.Header.Get("Idempotent-Replayed"))
		}
		if n := up.calls.Load(); n != 1 {
			t.Fatalf("upstream ran %d times, want 1", n)
		}
	})
}

func TestEncodeNeverReplaysCompressedBytesToPlainClients(t *testing.T) {
	up := newCountingUpstream(t)
	base := loadCaddyfile(t, freePort(t), `
	encode gzip
	idempotency
	reverse_proxy `+up.Listener.Addr().String())

	// The first client asks for gzip and gets it (from encode).
	resp, body := post(t, base+"/orders", "k", "{}", "Accept-Encoding", "gzip")
	if resp.Header.Get("Content-Encoding") != "gzip" || string(gunzip(t, body)) != up.body {
		t.Fatalf("first: Content-Encoding %q", resp.Header.Get("Content-Encoding"))
	}
	// A retry from a client that did not ask for gzip gets plain bytes.
	resp, body = post(t, base+"/orders", "k", "{}")
	if resp.Header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("retry not replayed: %d", resp.StatusCode)
	}
	if resp.Header.Get("Content-Encoding") != "" || string(body) != up.body {
		t.Fatalf("plain client got Content-Encoding %q and %d bytes", resp.Header.Get("Content-Encoding"), len(body))
	}
	// And one that asks for gzip gets the replay compressed.
	resp, body = post(t, base+"/orders", "k", "{}", "Accept-Encoding", "gzip")
	if resp.Header.Get("Content-Encoding") != "gzip" || string(gunzip(t, body)) != up.body {
		t.Fatalf("gzip client replay: Content-Encoding %q", resp.Header.Get("Content-Encoding"))
	}
	if up.calls.Load() != 1 {
		t.Fatalf("upstream ran %d times, want 1", up.calls.Load())
	}
}

func gunzip(t *testing.T, b []byte) []byte {
	t.Helper()
	zr, err := gzip.NewReader(bytes.NewReader(b))
	if err != nil {
		t.Fatalf("not gzip: %v", err)
	}
	out, err := io.ReadAll(zr)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func TestReloadKeepsMemoryState(t *testing.T) {
	up := newCountingUpstream(t)
	port := freePort(t)
	base := loadCaddyfile(t, port, `
	idempotency {
		ttl 1h
	}
	reverse_proxy `+up.Listener.Addr().String())
	post(t, base+"/orders", "k", "{}")

	// A reload with another TTL provisions a new handler; the memory store
	// (same max_keys) is the same one.
	loadCaddyfile(t, port, `
	idempotency {
		ttl 2h
	}
	reverse_proxy `+up.Listener.Addr().String())
	resp, _ := postAcrossReload(t, base+"/orders", "k", "{}")
	if resp.Header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("after reload: %d, not replayed", resp.StatusCode)
	}
	if up.calls.Load() != 1 {
		t.Fatalf("upstream ran %d times across the reload, want 1", up.calls.Load())
	}
}

func TestPerRouteTTLs(t *testing.T) {
	up := newCountingUpstream(t)
	base := loadCaddyfile(t, freePort(t), `
	@payments path /payments/*
	idempotency @payments {
		ttl 48h
		required
	}
	idempotency {
		ttl 1s
	}
	reverse_proxy `+up.Listener.Addr().String())

	if resp, _ := post(t, base+"/payments/1", "", "{}"); resp.StatusCode != http.StatusBadRequest {
		t.Fatalf("payments without a key: %d, want 400", resp.StatusCode)
	}
	post(t, base+"/payments/1", "p", "{}")
	post(t, base+"/orders", "o", "{}")
	time.Sleep(1300 * time.Millisecond)
	if resp, _ := post(t, base+"/payments/1", "p", "{}"); resp.Header.Get("Idempotent-Replayed") != "true" {
		t.Fatal("payments record expired early")
	}
	if resp, _ := post(t, base+"/orders", "o", "{}"); resp.Header.Get("Idempotent-Replayed") != "" {
		t.Fatal("orders record outlived its 1s TTL")
	}
	if up.calls.Load() != 3 {
		t.Fatalf("upstream ran %d times, want 3", up.calls.Load())
	}
}
