package e2e

import (
	"encoding/base64"
	"fmt"
	"regexp"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
)

// Credentials of two clients. The scan below looks for every one of these
// strings.
var (
	aliceToken = "alice-token-S3CR3T-7f3a9c"
	aliceAuth  = "Bearer " + aliceToken
	bobBasic   = base64.StdEncoding.EncodeToString([]byte("bob:hunter2-S3CR3T-b0b"))
	bobAuth    = "Basic " + bobBasic
	secrets    = []string{aliceAuth, aliceToken, bobAuth, bobBasic, "S3CR3T"}
)

// The same key from two clients (two Authorization values) or for two
// hosts runs twice and never replays one client's response to the other;
// a route whose scope evaluates to blank refuses keys instead of pooling
// every client in one namespace. Then the stores, the logs (debug level,
// access log on) and the metrics are scanned: no raw credential anywhere.
func TestScopesIsolateClientsAndNoCredentialIsStoredLoggedOrExported(t *testing.T) {
	redis := onRedis(t, sharedRedisAddr(t), "")
	pg := onPostgres(t)
	up := newUpstream(t)
	handle := func(path, options string) string {
		return fmt.Sprintf("\thandle %s {\n\t\tidempotency {\n%s\n\t\t}\n\t\treverse_proxy %s\n\t}\n", path, options, up.Addr)
	}
	inst := startCaddy(t, "caddy", site{
		globals: "debug",
		routes: "\tlog\n" +
			handle("/redis/*", redis.storage) +
			handle("/postgres/*", pg.storage) +
			handle("/client/*", redis.storage+"\nscope {http.request.header.X-Client-Id}"),
	})
	u := inst.URL()

	var keys []string
	for _, store := range []string{"redis", "postgres"} {
		path := "/" + store + "/orders"
		t.Run(store+"/two clients", func(t *testing.T) {
			key := "same-key-two-clients-" + store
			keys = append(keys, key)
			if r := post(u, path, key, `{"amount":1}`, "Authorization", aliceAuth); !r.isNew() || r.execution() != 1 {
				t.Fatalf("alice: %s", r)
			}
			if r := post(u, path, key, `{"amount":1}`, "Authorization", bobAuth); !r.isNew() || r.execution() != 2 {
				t.Fatalf("bob with alice's key: %s, want his own execution, never alice's response", r)
			}
			if r := post(u, path, key, `{"amount":1}`, "Authorization", aliceAuth); !r.isReplayOf(1) {
				t.Fatalf("alice again: %s, want her own response", r)
			}
			if r := post(u, path, key, `{"amount":1}`, "Authorization", bobAuth); !r.isReplayOf(2) {
				t.Fatalf("bob again: %s, want his own response", r)
			}
			// Another body under the same key is not a reuse for the other client.
			if r := post(u, path, key, `{"amount":999}`, "Authorization", aliceAuth); r.status != 422 {
				t.Fatalf("alice reusing her key for another body: %s, want 422", r)
			}
			assertExecutions(t, up, key, 2)
		})
		t.Run(store+"/two hosts", func(t *testing.T) {
			key := "same-key-two-hosts-" + store
			keys = append(keys, key)
			for i, host := range []string{"shop.example", "admin.example"} {
				if r := post(u, path, key, `{"amount":1}`, "Authorization", aliceAuth, "Host", host); !r.isNew() || r.execution() != i+1 {
					t.Fatalf("host %s: %s, want its own execution", host, r)
				}
			}
			for i, host := range []string{"shop.example", "admin.example"} {
				if r := post(u, path, key, `{"amount":1}`, "Authorization", aliceAuth, "Host", host); !r.isReplayOf(i + 1) {
					t.Fatalf("host %s again: %s, want its own response", host, r)
				}
			}
			assertExecutions(t, up, key, 2)
		})
	}

	t.Run("blank scope", func(t *testing.T) {
		const key = "same-key-client-scope"
		keys = append(keys, key)
		for _, header := range [][]string{nil, {"X-Client-Id", ""}, {"X-Client-Id", "   "}} {
			// The scope's own problem: the key is fine.
			if r := post(u, "/client/orders", key, `{"amount":1}`, header...); r.status != 400 || r.problem() != scopeEmpty {
				t.Fatalf("no client identity (%q): %s, want 400 %s", header, r, scopeEmpty)
			}
		}
		assertExecutions(t, up, key, 0)
		for i, client := range []string{"client-one", "client-two"} {
			if r := post(u, "/client/orders", key, `{"amount":1}`, "X-Client-Id", client); !r.isNew() || r.execution() != i+1 {
				t.Fatalf("%s: %s, want its own execution", client, r)
			}
		}
		if r := post(u, "/client/orders", key, `{"amount":1}`, "X-Client-Id", "client-one"); !r.isReplayOf(1) {
			t.Fatalf("client-one again: %s", r)
		}
		assertExecutions(t, up, key, 2)
	})
	if t.Failed() {
		return
	}

	// What the scan covers, each checked to be non-trivial so that a
	// scan of nothing cannot pass.
	status, metrics := adminGet(t, inst, "/metrics")
	if status != 200 || !strings.Contains(string(metrics), "caddy_http_idempotency_requests_total") {
		t.Fatalf("admin /metrics: %d, without the module's metrics", status)
	}
	log := inst.Log()
	for _, want := range []string{`"idempotency outcome"`, `"idempotency_outcome"`, `"Authorization":["REDACTED"]`} {
		if !strings.Contains(log, want) {
			t.Fatalf("the log lacks %s: debug or access logging is not on", want)
		}
	}
	redisDump, pgDump := redis.dump(t), pg.dump(t)
	if n := redis.records(t); n != 6 {
		t.Fatalf("redis holds %d records, want 6", n)
	}
	if n := pg.records(t); n != 4 {
		t.Fatalf("postgres holds %d records, want 4", n)
	}
	for name, text := range map[string]string{
		"redis keys and values": string(redisDump),
		"postgres rows":         string(pgDump),
		"caddy's log":           log,
		"metrics":               string(metrics),
	} {
		for _, s := range secrets {
			if strings.Contains(text, s) {
				t.Errorf("%s contain the credential %q", name, s)
			}
		}
	}

	// The module's own log lines and the metrics name neither keys nor
	// scopes (Caddy's access log does show request headers, Authorization
	// redacted).
	var own []string
	for _, line := range strings.Split(log, "\n") {
		if strings.Contains(line, `"logger":"http.handlers.idempotency"`) {
			own = append(own, line)
		}
	}
	if len(own) == 0 {
		t.Fatal("no log line of the module")
	}
	for _, s := range append(keys, "client-one", "client-two", "shop.example", "admin.example") {
		if strings.Contains(strings.Join(own, "\n"), s) {
			t.Errorf("the module's log lines contain %q", s)
		}
		if strings.Contains(string(metrics), s) {
			t.Errorf("the metrics contain %q", s)
		}
	}
	// Redis key names carry no client data; PostgreSQL scopes are hashes.
	for _, k := range keys {
		if strings.Contains(string(redisDump), k) {
			t.Errorf("redis holds the key %q in clear", k)
		}
	}
	hexScope := regexp.MustCompile(`^[0-9a-f]{64}$`)
	pgQuery(t, "SELECT scope FROM "+pgx.Identifier{pg.table}.Sanitize(), func(r pgx.Rows) error {
		var scope string
		if err := r.Scan(&scope); err != nil {
			return err
		}
		if !hexScope.MatchString(scope) {
			t.Errorf("postgres scope %q is not a SHA-256 hash", scope)
		}
		return nil
	})
}

// Not guaranteed: with the default scope, clients that send no
// credentials share one namespace per host, so two anonymous clients
// using the same key get one response. Keys must be unguessable, or the
// scope must name the client.
func TestAnonymousClientsShareTheDefaultScopeOfTheirHost(t *testing.T) {
	up := newUpstream(t)
	inst := startCaddy(t, "caddy", site{routes: route(up, "storage memory")})
	if r := post(inst.URL(), "/orders", "guessable-key", `{"amount":1}`); !r.isNew() {
		t.Fatal(r)
	}
	if r := post(inst.URL(), "/orders", "guessable-key", `{"amount":1}`); !r.isReplayOf(1) {
		t.Fatalf("second anonymous client: %s, want the first one's response", r)
	}
	assertExecutions(t, up, "guessable-key", 1)
}
