package main

import (
	"fmt"
	"strings"
	"time"

	"github.com/caddy-idempotency/caddy-idempotency/internal/caddyproc"
)

// variant is what a reload changes. A ttl changes the handlers only; a
// pool size changes the storage configuration, so that the instance
// swaps its store clients while requests run on the old ones (records
// stay in the server: no exception applies).
type variant struct {
	ttl      string
	poolSize int
}

func (v variant) String() string { return fmt.Sprintf("ttl %s, pool %d", v.ttl, v.poolSize) }

// variants are the configs reloads switch between; an instance starts on
// the first.
var variants = []variant{
	{"1h", 16},
	{"2h", 16},
	{"1h", 12},
}

// siteSettings are what every instance's config shares.
type siteSettings struct {
	lockTimeout  time.Duration
	storeTimeout time.Duration
	upstream     string // host:port
}

// siteConfig is the config of instance name on port, reaching Redis and
// PostgreSQL at its own proxies' addresses.
func siteConfig(s siteSettings, name string, port int, redisAddr, pgAddr string, v variant) caddyproc.Config {
	redis := fmt.Sprintf(`storage redis {
				url redis://%s/0
				key_prefix soak:
				pool_size %d
				timeout %s
			}`, redisAddr, v.poolSize, s.storeTimeout)
	pg := fmt.Sprintf(`storage postgres {
				dsn "postgres://postgres@%s/test?sslmode=disable"
				table soak_keys
				max_conns %d
				timeout %s
			}`, pgAddr, v.poolSize, s.storeTimeout)
	var b strings.Builder
	fmt.Fprintf(&b, "http://:%d {\n\tbind 127.0.0.1\n", port)
	for _, r := range routes {
		storage, onError := redis, "fail_closed"
		if r.store == "postgres" {
			storage = pg
		}
		if r.failOpen {
			onError = "fail_open"
		}
		fmt.Fprintf(&b, `	handle %s* {
		idempotency {
			%s
			lock_timeout %s
			ttl %s
			on_storage_error %s
		}
		reverse_proxy %s {
			header_up X-Soak-Instance %s
		}
	}
`, r.path, storage, s.lockTimeout, v.ttl, onError, s.upstream, name)
	}
	b.WriteString("}\n")
	return caddyproc.Config{Sites: b.String()}
}
