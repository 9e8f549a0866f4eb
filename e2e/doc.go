// Package e2e proves the module's promise, "the upstream runs once per
// intent", the way users will stress it: real `caddy run` processes built
// from this checkout, a counting upstream, and real Redis and PostgreSQL
// servers, under concurrency across instances, crashes, stalls, store
// outages, config reloads, long requests, hostile input and scope
// attacks.
//
// It holds tests only. TestMain builds Caddy once (internal/testkit/caddyproc);
// each test starts its own instances on loopback ports, with a key prefix
// or table of its own on the shared servers, and never stops or restarts
// a shared server: outages use a private redis-server (redistest) or a
// TCP proxy in front of the server (caddyproc.Proxy) that cuts or stalls
// its connections; a slow store is a table lock or DEBUG SLEEP. Redis and
// PostgreSQL tests skip when the servers are unreachable, and fail under
// CI=true, like the rest of the suite.
//
// docs/guarantees.md maps each guarantee (and each thing not guaranteed)
// to the test here that demonstrates it.
package e2e
