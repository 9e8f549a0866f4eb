package main

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/caddy-idempotency/caddy-idempotency/internal/testkit/caddyproc"
	"github.com/caddy-idempotency/caddy-idempotency/internal/testkit/servers"
	"github.com/caddy-idempotency/caddy-idempotency/internal/testkit/soak/history"
)

// instanceHeader tells the upstream which instance passed a request on.
const instanceHeader = "X-Soak-Instance"

// cluster is everything a run starts: a private Redis (persistent) and
// PostgreSQL, the upstream, and the Caddy instances, each reaching each
// store through a proxy of its own, so that link faults are per instance.
type cluster struct {
	set   *servers.Set
	redis *servers.Redis
	pg    *servers.Postgres
	up    *caddyproc.Upstream
	// refuse refuses connections: the upstream of the proxy that
	// attempts asking X-Upstream-Fail refused take.
	refuse *caddyproc.Refuser
	cert   *caddyproc.Cert // the TLS servers'; their clients trust it
	nodes  []*node
	// latency and jitter are every link's one-way latency when no
	// latency fault is on it (-store-latency, -store-jitter).
	latency, jitter time.Duration
}

// node is one Caddy instance across its restarts.
type node struct {
	name    string
	port    int // plain: HTTP/1.1, h2c
	tlsPort int // TLS: HTTP/1.1, HTTP/2, HTTP/3
	bin     string
	dir     string
	site    siteSettings
	links   map[string]*caddyproc.Proxy // by store

	mu      sync.Mutex
	inst    *caddyproc.Instance   // the running process
	past    []*caddyproc.Instance // earlier processes, for their logs
	variant variant
	down    bool // killed on purpose, not restarted yet
}

// startCluster starts the stores, the upstream and n instances of bin,
// with files in a temporary directory that close removes.
func startCluster(bin string, n int, site siteSettings, latency, jitter time.Duration, rec *recorder, logf func(string, ...any)) (c *cluster, err error) {
	c = &cluster{latency: latency, jitter: jitter}
	defer func() {
		if err != nil {
			c.close()
		}
	}()
	bins, err := servers.Find(true, true, logf)
	if err != nil {
		return c, err
	}
	as, err := servers.ServerAccount()
	if err != nil {
		return c, err
	}
	if c.set, err = servers.NewSet("idempotency-soak-", logf); err != nil {
		return c, err
	}
	if c.redis, err = c.set.StartRedis(bins.Redis, servers.RedisOptions{Persistent: true}); err != nil {
		return c, err
	}
	if c.pg, err = c.set.StartPostgres(bins, as); err != nil {
		return c, err
	}
	logf("redis-server %s on %s (appendonly, appendfsync always); PostgreSQL %s on %s; files in %s",
		servers.RedisVersion(bins.Redis), c.redis.Addr, c.pg.Version, c.pg.Addr, c.set.Dir)
	c.up, err = caddyproc.NewUpstreamWith(caddyproc.UpstreamOptions{
		Echo:        []string{"Authorization"},
		OnExecution: rec.execution,
	})
	if err != nil {
		return c, err
	}
	site.upstream = c.up.Addr
	if c.refuse, err = caddyproc.NewRefuser(); err != nil {
		return c, err
	}
	site.refuse = c.refuse.Addr
	if c.cert, err = caddyproc.NewCert(c.set.Dir); err != nil {
		return c, err
	}
	site.cert = c.cert
	for i := range n {
		nd := &node{name: string(rune('a' + i)), bin: bin, dir: filepath.Join(c.set.Dir, "caddy"), site: site,
			links: map[string]*caddyproc.Proxy{}, variant: variants[0]}
		c.nodes = append(c.nodes, nd)
		if nd.port, err = caddyproc.FreePort(); err != nil {
			return c, err
		}
		if nd.tlsPort, err = caddyproc.FreePort(); err != nil {
			return c, err
		}
		for store, addr := range map[string]string{history.Redis: c.redis.Addr, history.Postgres: c.pg.Addr} {
			p, err := caddyproc.NewProxy(addr)
			if err != nil {
				return c, err
			}
			p.SetLatency(latency, jitter)
			nd.links[store] = p
		}
		if err := nd.start(); err != nil {
			return c, err
		}
	}
	return c, nil
}

func (n *node) config() caddyproc.Config {
	return siteConfig(n.site, endpoints{name: n.name, port: n.port, tlsPort: n.tlsPort,
		redisAddr: n.links[history.Redis].Addr, pgAddr: n.links[history.Postgres].Addr}, n.variant)
}

// url is the instance's plain site, the same across restarts.
func (n *node) url() string { return fmt.Sprintf("http://127.0.0.1:%d", n.port) }

// tlsURL is the instance's TLS site (HTTP/1.1, HTTP/2, HTTP/3).
func (n *node) tlsURL() string { return fmt.Sprintf("https://127.0.0.1:%d", n.tlsPort) }

// pgDSN is the DSN of the soak's PostgreSQL, reached directly (no proxy).
func (c *cluster) pgDSN() string { return c.pg.DSN }

// start runs a new process with the current config; the caller holds no
// lock.
func (n *node) start() error {
	n.mu.Lock()
	cfg := n.config()
	n.mu.Unlock()
	inst, err := caddyproc.Start(n.bin, n.dir, n.name, n.port, cfg)
	if err != nil {
		return err
	}
	n.mu.Lock()
	if n.inst != nil {
		n.past = append(n.past, n.inst)
	}
	n.inst, n.down = inst, false
	n.mu.Unlock()
	return nil
}

func (n *node) current() *caddyproc.Instance {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.inst
}

// kill ends the process with SIGKILL.
func (n *node) kill() {
	n.mu.Lock()
	n.down = true
	inst := n.inst
	n.mu.Unlock()
	inst.Kill()
}

// restart starts the instance again on its port, trying a few times (the
// port may linger for a moment).
func (n *node) restart() error {
	var err error
	for range 5 {
		if err = n.start(); err == nil {
			return nil
		}
		time.Sleep(500 * time.Millisecond)
	}
	return err
}

// reload loads v through the admin API.
func (n *node) reload(v variant) error {
	n.mu.Lock()
	n.variant = v
	cfg, inst := n.config(), n.inst
	n.mu.Unlock()
	return inst.Reload(cfg)
}

// exitedOnItsOwn reports whether the process ended without being killed.
func (n *node) exitedOnItsOwn() bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.inst != nil && !n.down && !n.inst.Running()
}

// logs are the logs of every process of the instance, oldest first.
func (n *node) logs() []string {
	n.mu.Lock()
	defer n.mu.Unlock()
	var out []string
	for _, i := range append(append([]*caddyproc.Instance(nil), n.past...), n.inst) {
		if i != nil {
			out = append(out, i.Log())
		}
	}
	return out
}

// panicMarks are what a panic leaves in Caddy's log.
var panicMarks = []string{"http: panic serving", "\npanic: "}

// panics returns an excerpt of each panic in the instance's logs.
func (n *node) panics() []string {
	var found []string
	for _, log := range n.logs() {
		for _, mark := range panicMarks {
			if i := strings.Index(log, mark); i >= 0 {
				found = append(found, log[i:min(len(log), i+2000)])
			}
		}
	}
	return found
}

// saveLogs writes every process's log into dir.
func (c *cluster) saveLogs(dir string) error {
	var errs []error
	for _, n := range c.nodes {
		for i, log := range n.logs() {
			errs = append(errs, os.WriteFile(filepath.Join(dir, fmt.Sprintf("caddy-%s-%d.log", n.name, i+1)), []byte(log), 0o644))
		}
	}
	return errors.Join(errs...)
}

// close stops everything and removes every file; safe on a cluster only
// partly started.
func (c *cluster) close() error {
	var wg sync.WaitGroup
	for _, n := range c.nodes {
		if inst := n.current(); inst != nil {
			wg.Add(1)
			go func() { defer wg.Done(); inst.Stop() }()
		}
	}
	wg.Wait()
	for _, n := range c.nodes {
		for _, p := range n.links {
			p.Close()
		}
	}
	if c.up != nil {
		c.up.Close()
	}
	if c.refuse != nil {
		c.refuse.Close()
	}
	if c.set != nil {
		return c.set.Close()
	}
	return nil
}
