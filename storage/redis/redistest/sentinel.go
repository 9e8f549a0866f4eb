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
		unavailable(t, "redis-server binary: %v", err)
	}
	primary := StartServer(t)
	host, port, _ := net.SplitHostPort(primary.Addr)
	var replica *Server
	for attempt := 0; ; attempt++ {
		if replica, err = startServer(t, bin, "--replicaof", host, port); err == nil {
			break
		}
		if attempt == 2 {
			t.Fatalf("starting the replica: %v", err)
		}
	}
	s := &Sentinel{MasterName: "idempotency-primary", Password: password, Primary: primary, Replica: replica}
	for attempt := 0; ; attempt++ {
		if err = s.startSentinel(t, bin); err == nil {
			break
		}
		if attempt == 2 {
			t.Fatalf("starting redis-server --sentinel: %v", err)
		}
	}

	ctx := context.Background()
	sc := s.client()
	defer sc.Close()
	waitFor(t, 20*time.Second, "the replica in sync and known to the Sentinel", func() bool {
		replicas, err := sc.Replicas(ctx, s.MasterName).Result()
		if err != nil || len(replicas) != 1 {
			return false
		}
		return linkUp(ctx, replica.Addr)
	})
	return s
}

// startSentinel writes a Sentinel configuration (the Sentinel rewrites it,
// so it must be its own file) and starts the Sentinel on a free port.
func (s *Sentinel) startSentinel(t testing.TB, bin string) error {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	addr := l.Addr().String()
	l.Close()
	host, port, _ := net.SplitHostPort(s.Primary.Addr)
	_, own, _ := net.SplitHostPort(addr)
	dir := t.TempDir()
	conf := fmt.Sprintf("port %s\nbind 127.0.0.1\ndir %s\n"+
		"sentinel monitor %s %s %s 1\n"+
		"sentinel down-after-milliseconds %[3]s 5000\n"+
		"sentinel failover-timeout %[3]s 10000\n", own, dir, s.MasterName, host, port)
	if s.Password != "" {
		conf += "requirepass " + s.Password + "\n"
	}
	if err := os.WriteFile(dir+"/sentinel.conf", []byte(conf), 0o600); err != nil {
		return err
	}
	srv := &Server{Addr: addr, bin: bin, dir: dir, args: []string{"--sentinel"}, conf: dir + "/sentinel.conf"}
	if err := srv.launch(); err != nil {
		return err
	}
	t.Cleanup(srv.Kill)
	s.Addr = addr
	return nil
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
	waitFor(t, 20*time.Second, "the replica promoted", func() bool {
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
	waitFor(t, 20*time.Second, "the old primary demoted", func() bool {
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

func waitFor(t testing.TB, limit time.Duration, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(limit); !cond(); time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("waiting for %s: not within %v", what, limit)
		}
	}
}
