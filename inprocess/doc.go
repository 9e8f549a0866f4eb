// Package inprocess holds the tests that run a real Caddy in the test
// process: configurations adapted from Caddyfiles (the adapt fixtures in
// testdata/adapt beside them) and from JSON, loaded with caddy.Load in
// front of counting upstreams, Redis and PostgreSQL. They see the module
// only as Caddy does, through its directive, JSON and admin API; the
// white-box tests of the handler are in the root package, and the tests
// that run `caddy run` processes are in e2e/.
//
// It holds tests only.
package inprocess
