package main

import (
	"fmt"
	"strings"
	"time"

	"github.com/caddy-idempotency/caddy-idempotency/internal/testkit/caddyproc"
	"github.com/caddy-idempotency/caddy-idempotency/internal/testkit/soak/history"
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

// responseHeaderTimeout is the response_header_timeout of the proxy that
// attempts asking X-Upstream-Fail timeout take; they make the upstream
// work timeoutWork, well past it.
const (
	responseHeaderTimeout = 500 * time.Millisecond
	timeoutWork           = 3 * responseHeaderTimeout
)

// siteSettings are what every instance's config shares.
type siteSettings struct {
	lockTimeout  time.Duration
	storeTimeout time.Duration
	upstream     string // host:port
	// refuse is an address that refuses connections: the upstream of the
	// proxy that attempts asking X-Upstream-Fail refused take.
	refuse string
	// memoryMaxKeys is the max_keys of the /memory/ route's store; 0: no
	// such route.
	memoryMaxKeys int
	cert          *caddyproc.Cert // of the TLS server
}

// endpoints are where an instance listens and reaches its stores.
type endpoints struct {
	name      string
	port      int // plain: HTTP/1.1 and h2c
	tlsPort   int // TLS: HTTP/1.1, HTTP/2 and HTTP/3 (UDP)
	redisAddr string
	pgAddr    string
}

// siteConfig is the config of an instance: a plain server (HTTP/1.1 and
// h2c) and a TLS one (HTTP/1.1, HTTP/2, HTTP/3) with the same routes,
// reaching Redis and PostgreSQL at the instance's own proxies.
func siteConfig(s siteSettings, e endpoints, v variant) caddyproc.Config {
	redis := fmt.Sprintf(`storage redis {
				url redis://%s/0
				key_prefix soak:
				pool_size %d
				timeout %s
			}`, e.redisAddr, v.poolSize, s.storeTimeout)
	pg := fmt.Sprintf(`storage postgres {
				dsn "postgres://postgres@%s/test?sslmode=disable"
				table soak_keys
				max_conns %d
				timeout %s
			}`, e.pgAddr, v.poolSize, s.storeTimeout)
	memory := fmt.Sprintf(`storage memory {
				max_keys %d
			}`, s.memoryMaxKeys)
	var handles strings.Builder
	for _, r := range routes {
		var storage string
		switch r.store {
		case history.Redis:
			storage = redis
		case history.Postgres:
			storage = pg
		case history.Memory:
			if s.memoryMaxKeys == 0 {
				continue
			}
			storage = memory
		}
		onError := "fail_closed"
		if r.failOpen {
			onError = "fail_open"
		}
		// Attempts that ask (X-Upstream-Fail) take a proxy whose
		// response_header_timeout is shorter than they make the upstream
		// work, or one that dials an address refusing connections.
		fmt.Fprintf(&handles, `	handle %s* {
		idempotency {
			%s
			lock_timeout %s
			ttl %s
			on_storage_error %s
		}
		reverse_proxy @timeout %s {
			header_up X-Soak-Instance %s
			transport http {
				response_header_timeout %s
			}
		}
		reverse_proxy @refused %s
		reverse_proxy %s {
			header_up X-Soak-Instance %s
		}
	}
`, r.path, storage, s.lockTimeout, v.ttl, onError, s.upstream, e.name, responseHeaderTimeout, s.refuse, s.upstream, e.name)
	}
	matchers := "\t@timeout header X-Upstream-Fail timeout\n\t@refused header X-Upstream-Fail refused\n"
	var b strings.Builder
	fmt.Fprintf(&b, "http://:%d {\n\tbind 127.0.0.1\n%s%s}\n\n", e.port, matchers, handles.String())
	fmt.Fprintf(&b, "https://:%d {\n\tbind 127.0.0.1\n\ttls %s %s\n%s%s}\n", e.tlsPort, s.cert.CertFile, s.cert.KeyFile, matchers, handles.String())
	globals := fmt.Sprintf(`	servers 127.0.0.1:%d {
		protocols h1 h2c
	}
	servers 127.0.0.1:%d {
		protocols h1 h2 h3
	}`, e.port, e.tlsPort)
	return caddyproc.Config{Globals: globals, Sites: b.String()}
}
