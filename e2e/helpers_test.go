package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	goredis "github.com/redis/go-redis/v9"

	"github.com/caddy-idempotency/caddy-idempotency/internal/testkit/caddyproc"
	"github.com/caddy-idempotency/caddy-idempotency/internal/testkit/pgtest"
	"github.com/caddy-idempotency/caddy-idempotency/internal/testkit/redistest"
	"github.com/caddy-idempotency/caddy-idempotency/internal/testkit/testutil"
)

// site is what a test instance runs: global options and the routes of one
// site on the instance's port (bound to loopback, any Host).
type site struct {
	globals string
	routes  string
}

func (s site) config(port int) caddyproc.Config {
	return caddyproc.Config{
		Globals: s.globals,
		Sites:   fmt.Sprintf("http://:%d {\n\tbind 127.0.0.1\n%s\n}\n", port, s.routes),
	}
}

// startCaddy runs a Caddy instance with s on a free port until the test
// ends. Its log is printed if the test fails.
func startCaddy(t *testing.T, name string, s site) *caddyproc.Instance {
	t.Helper()
	port, err := caddyproc.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	return startCaddyOn(t, name, port, s)
}

// startCaddyOn is startCaddy on a given port (a restarted instance).
func startCaddyOn(t *testing.T, name string, port int, s site) *caddyproc.Instance {
	t.Helper()
	inst, err := caddyproc.Start(caddyBin, t.TempDir(), name, port, s.config(port))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		inst.Stop()
		// Whatever the test did, Caddy must never have panicked.
		log := inst.Log()
		for _, mark := range []string{"http: panic serving", "\npanic: "} {
			if i := strings.Index(log, mark); i >= 0 {
				t.Errorf("caddy %s panicked:\n%s", name, log[i:min(len(log), i+4000)])
			}
		}
		if t.Failed() {
			t.Logf("log of caddy %s (last 60 lines):\n%s", name, tail(inst.Log(), 60))
		}
	})
	return inst
}

// reload loads s into inst, failing the test if Caddy refuses it.
func reload(t *testing.T, inst *caddyproc.Instance, s site) {
	t.Helper()
	if err := inst.Reload(s.config(inst.Port)); err != nil {
		t.Fatal(err)
	}
}

func tail(s string, lines int) string {
	all := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(all) > lines {
		all = all[len(all)-lines:]
	}
	return strings.Join(all, "\n")
}

func newUpstream(t *testing.T) *caddyproc.Upstream {
	t.Helper()
	up, err := caddyproc.NewUpstream()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { up.Close() })
	return up
}

// route is an idempotency handler with options in front of up.
func route(up *caddyproc.Upstream, options string) string {
	return fmt.Sprintf("\tidempotency {\n%s\n\t}\n\treverse_proxy %s\n", options, up.Addr)
}

// backend is a store namespace of the test's own (a Redis key prefix, a
// PostgreSQL table) and how to look into it.
type backend struct {
	addr      string                    // the server's host:port
	storage   string                    // the Caddyfile storage block
	storageAt func(addr string) string  // the same, reaching the server at addr (a proxy)
	table     string                    // PostgreSQL: the table
	records   func(t *testing.T) int    // how many records it holds
	dump      func(t *testing.T) []byte // everything it holds, for scanning
}

// sharedBackends are the stores several instances can share.
var sharedBackends = []struct {
	name string
	open func(t *testing.T) backend
}{
	{"redis", func(t *testing.T) backend { return onRedis(t, sharedRedisAddr(t), "") }},
	{"postgres", onPostgres},
}

func sharedRedisAddr(t *testing.T) string {
	t.Helper()
	addr := redistest.Addr()
	redistest.Require(t, addr)
	return addr
}

// onRedis is a fresh key prefix on the Redis at addr; its keys are deleted
// when the test ends. extra adds options to the storage block.
func onRedis(t *testing.T, addr, extra string) backend {
	t.Helper()
	prefix := "idempotency-e2e:" + redistest.RandomHex(6) + ":"
	rdb := goredis.NewClient(&goredis.Options{Addr: addr, MaxRetries: -1})
	scan := func() ([]string, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		var keys []string
		iter := rdb.Scan(ctx, 0, prefix+"*", 100).Iterator()
		for iter.Next(ctx) {
			keys = append(keys, iter.Val())
		}
		return keys, iter.Err()
	}
	keys := func(t *testing.T) []string {
		t.Helper()
		keys, err := scan()
		if err != nil {
			t.Fatalf("scanning redis keys: %v", err)
		}
		return keys
	}
	t.Cleanup(func() {
		// A private server may be gone already; the shared one is cleaned.
		if keys, err := scan(); err == nil && len(keys) > 0 {
			rdb.Del(context.Background(), keys...)
		}
		rdb.Close()
	})
	storageAt := func(addr string) string {
		return fmt.Sprintf("storage redis {\n\turl redis://%s/0\n\tkey_prefix %s\n%s\n}", addr, prefix, extra)
	}
	return backend{
		addr:      addr,
		storage:   storageAt(addr),
		storageAt: storageAt,
		records:   func(t *testing.T) int { return len(keys(t)) },
		dump: func(t *testing.T) []byte {
			t.Helper()
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			var b bytes.Buffer
			for _, k := range keys(t) {
				fields, err := rdb.HGetAll(ctx, k).Result()
				if err != nil {
					t.Fatalf("HGETALL %s: %v", k, err)
				}
				b.WriteString(k + "\n")
				for f, v := range fields {
					b.WriteString(f + "=" + v + "\n")
				}
			}
			return b.Bytes()
		},
	}
}

// onPostgres is a fresh table on the test server, dropped when the test
// ends.
func onPostgres(t *testing.T) backend {
	t.Helper()
	return onPostgresWith(t, "")
}

// onPostgresWith is onPostgres with extra options in the storage block.
func onPostgresWith(t *testing.T, extra string) backend {
	t.Helper()
	dsn := pgtest.Require(t)
	table := pgtest.Table(t, dsn)
	u, err := url.Parse(dsn)
	if err != nil || u.Port() == "" {
		testutil.Unavailable(t, "these tests need %s as a URL with host and port", pgtest.EnvDSN)
	}
	storageAt := func(addr string) string {
		at := *u
		at.Host = addr
		return fmt.Sprintf("storage postgres {\n\tdsn %q\n\ttable %s\n%s\n}", at.String(), table, extra)
	}
	ident := pgx.Identifier{table}.Sanitize()
	return backend{
		addr:      u.Host,
		table:     table,
		storage:   storageAt(u.Host),
		storageAt: storageAt,
		records: func(t *testing.T) int {
			n := 0
			pgQuery(t, "SELECT count(*) FROM "+ident, func(r pgx.Rows) error { return r.Scan(&n) })
			return n
		},
		dump: func(t *testing.T) []byte {
			var b bytes.Buffer
			pgQuery(t, "SELECT scope, key, fingerprint, headers, body FROM "+ident, func(r pgx.Rows) error {
				var scope, key string
				var fp, headers, body []byte
				if err := r.Scan(&scope, &key, &fp, &headers, &body); err != nil {
					return err
				}
				fmt.Fprintf(&b, "%s\n%s\n%s\n%s\n%s\n", scope, key, fp, headers, body)
				return nil
			})
			return b.Bytes()
		},
	}
}

// pgQuery runs sql on the test server and calls scan for each row. A
// table that no request has created yet has no rows.
func pgQuery(t *testing.T, sql string, scan func(pgx.Rows) error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, pgtest.DSN())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	rows, err := conn.Query(ctx, sql)
	if err == nil {
		for rows.Next() {
			if err = scan(rows); err != nil {
				break
			}
		}
		rows.Close()
		if err == nil {
			err = rows.Err()
		}
	}
	if err != nil && !strings.Contains(err.Error(), "does not exist") {
		t.Fatalf("%s: %v", sql, err)
	}
}

// reply is what a client got.
type reply struct {
	status int
	header http.Header
	body   []byte
	err    error // the request failed without a response
}

func (r reply) String() string {
	if r.err != nil {
		return "error: " + r.err.Error()
	}
	return fmt.Sprintf("%d %s", r.status, bytes.TrimSpace(r.body))
}

// execution is the upstream's per-key execution number in the body, 0
// when the body is not the upstream's.
func (r reply) execution() int {
	var v struct {
		KeyExecution int `json:"key_execution"`
	}
	if json.Unmarshal(r.body, &v) != nil {
		return 0
	}
	return v.KeyExecution
}

func (r reply) replayed() bool { return r.header.Get("Idempotent-Replayed") == "true" }

// problem is the type of a problem response, "" for anything else.
func (r reply) problem() string {
	if r.header.Get("Content-Type") != "application/problem+json" {
		return ""
	}
	var p struct {
		Type string `json:"type"`
	}
	_ = json.Unmarshal(r.body, &p)
	return p.Type
}

// isNew: the upstream's own answer, not a replay.
func (r reply) isNew() bool {
	return r.err == nil && r.status == http.StatusCreated && !r.replayed() && r.execution() > 0
}

// isReplayOf: a replay of the upstream's execution n of the key.
func (r reply) isReplayOf(n int) bool {
	return r.err == nil && r.status == http.StatusCreated && r.replayed() && r.execution() == n
}

func (r reply) isConflict() bool {
	return r.status == http.StatusConflict && r.problem() == "urn:caddy-idempotency:request-outstanding"
}

var client = &http.Client{
	Timeout:   60 * time.Second,
	Transport: &http.Transport{MaxIdleConnsPerHost: 64, DisableCompression: true},
}

// post sends a POST with key (none when empty) and a JSON body to
// base+path. header holds name, value pairs; "Host" sets the Host header,
// and an explicit Content-Type replaces the JSON one.
func post(base, path, key, body string, header ...string) reply {
	return postReader(base, path, key, strings.NewReader(body), header...)
}

// postReader is post with the body read from body.
func postReader(base, path, key string, body io.Reader, header ...string) reply {
	req, err := http.NewRequest(http.MethodPost, base+path, body)
	if err != nil {
		return reply{err: err}
	}
	req.Header.Set("Content-Type", "application/json")
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	for i := 0; i+1 < len(header); i += 2 {
		if header[i] == "Host" {
			req.Host = header[i+1]
		} else {
			req.Header.Set(header[i], header[i+1])
		}
	}
	resp, err := client.Do(req)
	if err != nil {
		return reply{err: err}
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return reply{status: resp.StatusCode, header: resp.Header, body: b, err: err}
}

// delay is the header pair that makes the upstream work for d.
// running POSTs key to inst in the background, with an upstream that works
// for work, and returns once the upstream has started; the reply arrives on
// the channel when the request ends.
func running(t *testing.T, up *caddyproc.Upstream, inst *caddyproc.Instance, key, body string, work time.Duration) <-chan reply {
	t.Helper()
	done := make(chan reply, 1)
	go func() { done <- post(inst.URL(), "/orders", key, body, delay(work)...) }()
	testutil.Eventually(t, 10*time.Second, "the upstream to start running "+key, func() bool { return up.Executions(key) == 1 })
	return done
}

func delay(d time.Duration) []string {
	return []string{"X-Upstream-Delay", fmt.Sprint(d.Milliseconds())}
}

// raw writes request as is on a new connection to addr and reads the
// response: for requests that net/http would refuse to send.
func raw(t *testing.T, addr string, request []byte) reply {
	t.Helper()
	conn, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(30 * time.Second))
	if _, err := conn.Write(request); err != nil {
		return reply{err: err}
	}
	return readReply(conn)
}

func readReply(conn net.Conn) reply {
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		return reply{err: err}
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return reply{status: resp.StatusCode, header: resp.Header, body: b, err: err}
}

// adminGet GETs path on inst's admin endpoint.
func adminGet(t *testing.T, inst *caddyproc.Instance, path string) (int, []byte) {
	t.Helper()
	resp, err := client.Get("http://" + inst.AdminAddr + path)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, b
}

// adminRecord is a record as the admin API shows it.
type adminRecord struct {
	State     string    `json:"state"`
	CreatedAt time.Time `json:"created_at"`
	ExpiresAt time.Time `json:"expires_at"`
	Status    int       `json:"status"`
}

// storedRecord asks inst's admin API for the record of key in scope (the
// evaluated scope template); ok is false when there is none.
func storedRecord(t *testing.T, inst *caddyproc.Instance, key, scope string) (rec adminRecord, ok bool) {
	t.Helper()
	status, body := adminGet(t, inst, "/idempotency/keys?"+url.Values{"key": {key}, "scope": {scope}}.Encode())
	switch status {
	case http.StatusNotFound:
		return rec, false
	case http.StatusOK:
	default:
		t.Fatalf("admin API: %d %s", status, body)
	}
	var v struct {
		Records []adminRecord `json:"records"`
	}
	if err := json.Unmarshal(body, &v); err != nil || len(v.Records) != 1 {
		t.Fatalf("admin API: %s (%v)", body, err)
	}
	return v.Records[0], true
}

// assertExecutions fails unless the upstream ran key exactly want times.
func assertExecutions(t *testing.T, up *caddyproc.Upstream, key string, want int) {
	t.Helper()
	if got := up.Executions(key); got != want {
		t.Fatalf("upstream ran key %q %d times, want %d", key, got, want)
	}
}
