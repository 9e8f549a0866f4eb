package redistest

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/caddy-idempotency/caddy-idempotency/internal/testkit/testutil"
)

// Sentinel is a private Redis primary with one replica, watched by one
// Redis Sentinel, for tests of the Sentinel-managed setup and of failover.
type Sentinel struct {
	// Addr is the Sentinel's host:port.
	Addr string
	// MasterName is the name the Sentinel monitors the primary under.
	MasterName string
	// Password is the Sentinel's own requirepass ("" for none).
	Password string
	// Primary and Replica are the data nodes as started; after Failover
	// their roles are swapped.
	Primary, Replica *Server
}

// StartSentinel starts a primary, a replica of it and a Sentinel
// monitoring the primary with a quorum of one, requiring password from
// its clients when password is not empty (the data nodes require none).
// It returns once the replica is in sync and the Sentinel knows both.
// Like StartServer, it skips (fails with CI=true) without the
// redis-server binary.
func StartSentinel(t testing.TB, password string) *Sentinel {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		testutil.Unavailable(t, "redis-server binary: %v", err)
	}
	primary := StartServer(t)
	host, port, _ := net.SplitHostPort(primary.Addr)
	replica := start(t, "the replica", func() (*Server, error) {
		return startServer(t, bin, "", "--replicaof", host, port)
	})
	s := &Sentinel{MasterName: "idempotency-primary", Password: password, Primary: primary, Replica: replica}
	// The Sentinel rewrites its configuration file, so it gets one of its
	// own; the port and directory come from the command line.
	conf := t.TempDir() + "/sentinel.conf"
	lines := fmt.Sprintf("sentinel monitor %s %s %s 1\n"+
		"sentinel down-after-milliseconds %[1]s 5000\n"+
		"sentinel failover-timeout %[1]s 10000\n", s.MasterName, host, port)
	if password != "" {
		lines += "requirepass " + password + "\n"
	}
	if err := os.WriteFile(conf, []byte(lines), 0o600); err != nil {
		t.Fatal(err)
	}
	s.Addr = start(t, "redis-server --sentinel", func() (*Server, error) {
		return startServer(t, bin, conf, "--sentinel")
	}).Addr

	ctx := context.Background()
	sc := s.client()
	defer sc.Close()
	testutil.Eventually(t, 20*time.Second, "the replica in sync and known to the Sentinel", func() bool {
		replicas, err := sc.Replicas(ctx, s.MasterName).Result()
		if err != nil || len(replicas) != 1 {
			return false
		}
		return linkUp(ctx, replica.Addr)
	})
	return s
}

// client is a client of the Sentinel itself.
func (s *Sentinel) client() *goredis.SentinelClient {
	return goredis.NewSentinelClient(&goredis.Options{Addr: s.Addr, Password: s.Password})
}

// Failover makes the Sentinel promote the replica, as it would when the
// primary fails, and returns once the Sentinel names the replica as the
// primary, the replica accepts writes and the old primary has become a
// replica of the new one.
func (s *Sentinel) Failover(t testing.TB) {
	t.Helper()
	ctx := context.Background()
	sc := s.client()
	defer sc.Close()
	if err := sc.Failover(ctx, s.MasterName).Err(); err != nil {
		t.Fatalf("SENTINEL FAILOVER: %v", err)
	}
	testutil.Eventually(t, 20*time.Second, "the replica promoted", func() bool {
		addr, err := sc.GetMasterAddrByName(ctx, s.MasterName).Result()
		if err != nil || len(addr) != 2 || net.JoinHostPort(addr[0], addr[1]) != s.Replica.Addr {
			return false
		}
		c := goredis.NewClient(&goredis.Options{Addr: s.Replica.Addr})
		defer c.Close()
		info, err := c.Info(ctx, "replication").Result()
		return err == nil && strings.Contains(info, "role:master")
	})
	// Until the Sentinel has turned the old primary into a replica, it
	// still takes writes that the new primary never sees (Redis
	// replication is asynchronous): wait for the end of that window.
	testutil.Eventually(t, 20*time.Second, "the old primary demoted", func() bool {
		c := goredis.NewClient(&goredis.Options{Addr: s.Primary.Addr})
		defer c.Close()
		info, err := c.Info(ctx, "replication").Result()
		return err == nil && strings.Contains(info, "role:slave")
	})
	s.Primary, s.Replica = s.Replica, s.Primary
}

// WaitReplicated blocks until the replica has every write the primary
// has taken so far, so that a failover loses nothing.
func (s *Sentinel) WaitReplicated(t testing.TB) {
	t.Helper()
	c := goredis.NewClient(&goredis.Options{Addr: s.Primary.Addr})
	defer c.Close()
	n, err := c.Wait(context.Background(), 1, 5*time.Second).Result()
	if err != nil || n < 1 {
		t.Fatalf("WAIT for the replica: %d replicas, %v", n, err)
	}
}

// linkUp reports whether the replica at addr is connected to its primary
// and done with the initial sync.
func linkUp(ctx context.Context, addr string) bool {
	c := goredis.NewClient(&goredis.Options{Addr: addr})
	defer c.Close()
	info, err := c.Info(ctx, "replication").Result()
	return err == nil && strings.Contains(info, "master_link_status:up") &&
		strings.Contains(info, "master_sync_in_progress:0")
}

// StartReplica starts a private replica of primary and returns it once it
// is in sync. Like StartServer, it skips (fails with CI=true) without the
// redis-server binary.
func StartReplica(t testing.TB, primary *Server) *Server {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		testutil.Unavailable(t, "redis-server binary: %v", err)
	}
	host, port, _ := net.SplitHostPort(primary.Addr)
	replica := start(t, "a replica", func() (*Server, error) {
		return startServer(t, bin, "", "--replicaof", host, port)
	})
	testutil.Eventually(t, 20*time.Second, "the replica in sync", func() bool {
		return linkUp(context.Background(), replica.Addr)
	})
	return replica
}
