package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// failover is one forced failover, as the report names it.
type failover struct {
	N        int
	Kind     string // "kill -9" of a primary, or "CLUSTER FAILOVER"
	Node     string // the primary that failed or handed over
	At       time.Time
	Promoted time.Time // a replica took over
	Healed   time.Time // the old primary is a replica in sync again
}

func (f failover) String() string {
	return fmt.Sprintf("failover %d (%s of primary %s)", f.N, f.Kind, f.Node)
}

// topology is a replicated Redis that fails over on demand.
type topology interface {
	// storage is the Caddyfile storage block reaching it.
	storage(extra string) string
	// fail forces failover n, returns once a replica took over and the
	// old primary is back as a replica in sync.
	// With lag, the primary takes writes alone for that long before it
	// is killed (lagThenKill).
	fail(n int, r *rand.Rand, lag time.Duration) (failover, error)
	describe() string
	close()
}

// sentinel is a primary and a replica watched by three Sentinels.
type sentinel struct {
	data      []*server
	sentinels []*server
}

const masterName = "soak-primary"

func startSentinel(bin, root string) (*sentinel, error) {
	t := &sentinel{}
	for i := range 2 {
		s, err := startServer(bin, root, fmt.Sprintf("data%d", i+1))
		if err != nil {
			t.close()
			return nil, err
		}
		t.data = append(t.data, s)
	}
	host, port, _ := net.SplitHostPort(t.data[0].addr)
	c := t.data[1].client()
	err := c.ReplicaOf(context.Background(), host, port).Err()
	c.Close()
	if err == nil {
		err = waitFor(30*time.Second, "the replica in sync", t.data[1].inSyncReplica)
	}
	if err != nil {
		t.close()
		return nil, err
	}
	for i := range 3 {
		dir := filepath.Join(root, fmt.Sprintf("sentinel%d", i+1))
		if err := os.MkdirAll(dir, 0o700); err != nil {
			t.close()
			return nil, err
		}
		conf := filepath.Join(dir, "sentinel.conf")
		lines := fmt.Sprintf("sentinel monitor %s %s %s 2\nsentinel down-after-milliseconds %[1]s 1000\nsentinel failover-timeout %[1]s 5000\n",
			masterName, host, port)
		if err := os.WriteFile(conf, []byte(lines), 0o600); err != nil {
			t.close()
			return nil, err
		}
		s, err := startServer(bin, root, fmt.Sprintf("sentinel%d", i+1), conf, "--sentinel")
		if err != nil {
			t.close()
			return nil, err
		}
		t.sentinels = append(t.sentinels, s)
	}
	if err := waitFor(30*time.Second, "the Sentinels knowing the replica and each other", func() bool {
		for _, s := range t.sentinels {
			if s.info("sentinel", "master0") == "" || !strings.Contains(s.info("sentinel", "master0"), "slaves=1,sentinels=3") {
				return false
			}
		}
		return true
	}); err != nil {
		t.close()
		return nil, err
	}
	return t, nil
}

func (t *sentinel) storage(extra string) string {
	addrs := make([]string, len(t.sentinels))
	for i, s := range t.sentinels {
		addrs[i] = s.addr
	}
	return fmt.Sprintf("storage redis {\n\t\t\taddresses %s\n\t\t\tmaster_name %s\n\t\t\tkey_prefix soak:\n%s\n\t\t}", strings.Join(addrs, " "), masterName, extra)
}

func (t *sentinel) describe() string {
	return fmt.Sprintf("Sentinel: primary %s, replica %s, Sentinels %s %s %s (down-after 1s)",
		t.data[0].addr, t.data[1].addr, t.sentinels[0].addr, t.sentinels[1].addr, t.sentinels[2].addr)
}

// primary is the data node the Sentinels name.
func (t *sentinel) primary() (*server, error) {
	c := t.sentinels[0].client()
	defer c.Close()
	addr, err := c.Do(context.Background(), "SENTINEL", "get-master-addr-by-name", masterName).StringSlice()
	if err != nil || len(addr) != 2 {
		return nil, fmt.Errorf("SENTINEL get-master-addr-by-name: %v %v", addr, err)
	}
	for _, s := range t.data {
		if s.addr == net.JoinHostPort(addr[0], addr[1]) {
			return s, nil
		}
	}
	return nil, fmt.Errorf("the Sentinels name %v, no node of ours", addr)
}

func (t *sentinel) fail(n int, _ *rand.Rand, lag time.Duration) (failover, error) {
	old, err := t.primary()
	if err != nil {
		return failover{}, err
	}
	replica := t.data[0]
	if replica == old {
		replica = t.data[1]
	}
	f := failover{N: n, Kind: killKind(lag), Node: old.addr, At: time.Now()}
	lagThenKill(old, replica, lag)
	err = waitFor(60*time.Second, "a replica promoted", func() bool {
		p, err := t.primary()
		return err == nil && p != old && p.info("replication", "role") == "master"
	})
	if err != nil {
		return f, err
	}
	f.Promoted = time.Now()
	if err := old.restart(); err != nil {
		return f, err
	}
	// The Sentinels would turn the restarted node into a replica of the
	// new primary, some seconds later: do as they would, now, so that the
	// next failover comes sooner.
	p, err := t.primary()
	if err != nil {
		return f, err
	}
	host, port, _ := net.SplitHostPort(p.addr)
	replicaOf := func() error {
		c := old.client()
		defer c.Close()
		return c.ReplicaOf(context.Background(), host, port).Err()
	}
	if err := replicaOf(); err != nil {
		return f, fmt.Errorf("REPLICAOF: %v", err)
	}
	// A Sentinel still busy with the failover may turn it back into a
	// primary once (seen after a slow election): say it again.
	last := time.Now()
	if err := waitFor(60*time.Second, "the old primary back as a replica in sync", func() bool {
		if old.info("replication", "role") == "master" && time.Since(last) > 3*time.Second {
			replicaOf()
			last = time.Now()
		}
		return old.inSyncReplica()
	}); err != nil {
		return f, fmt.Errorf("%v: it says role %s, primary %s:%s, link %s; the Sentinels name %s", err, old.info("replication", "role"),
			old.info("replication", "master_host"), old.info("replication", "master_port"), old.info("replication", "master_link_status"), p.addr)
	}
	f.Healed = time.Now()
	return f, nil
}

func (t *sentinel) close() {
	for _, s := range append(t.sentinels, t.data...) {
		s.stop()
	}
}

// cluster is three primaries, each with a replica.
type cluster struct {
	nodes []*server
}

func startCluster(bin, root string) (*cluster, error) {
	t := &cluster{}
	for i := range 6 {
		s, err := startServer(bin, root, fmt.Sprintf("node%d", i+1), "--cluster-enabled", "yes",
			"--cluster-node-timeout", "1000", "--cluster-require-full-coverage", "no",
			"--cluster-config-file", "nodes.conf")
		if err != nil {
			t.close()
			return nil, err
		}
		t.nodes = append(t.nodes, s)
	}
	ctx := context.Background()
	host, port, _ := net.SplitHostPort(t.nodes[0].addr)
	for i, s := range t.nodes {
		c := s.client()
		if i < 3 {
			args := []any{"CLUSTER", "ADDSLOTSRANGE", i * 16384 / 3, (i+1)*16384/3 - 1}
			if err := c.Do(ctx, args...).Err(); err != nil {
				c.Close()
				t.close()
				return nil, fmt.Errorf("CLUSTER ADDSLOTSRANGE: %v", err)
			}
		}
		if i > 0 {
			p, _ := strconv.Atoi(port)
			if err := c.ClusterMeet(ctx, host, strconv.Itoa(p)).Err(); err != nil {
				c.Close()
				t.close()
				return nil, err
			}
		}
		c.Close()
	}
	if err := waitFor(30*time.Second, "every node known", func() bool {
		for _, s := range t.nodes {
			if s.info("cluster", "cluster_enabled") != "1" || t.clusterInfo(s, "cluster_known_nodes") != "6" {
				return false
			}
		}
		return true
	}); err != nil {
		t.close()
		return nil, err
	}
	for i := 3; i < 6; i++ {
		id := t.nodeID(t.nodes[i-3])
		c := t.nodes[i].client()
		err := c.ClusterReplicate(ctx, id).Err()
		c.Close()
		if err != nil {
			t.close()
			return nil, fmt.Errorf("CLUSTER REPLICATE: %v", err)
		}
	}
	if err := t.healthy(); err != nil {
		t.close()
		return nil, err
	}
	return t, nil
}

// clusterInfo returns field of CLUSTER INFO on s.
func (t *cluster) clusterInfo(s *server, field string) string {
	c := s.client()
	defer c.Close()
	v, err := c.ClusterInfo(context.Background()).Result()
	if err != nil {
		return ""
	}
	for line := range strings.Lines(v) {
		if val, ok := strings.CutPrefix(strings.TrimSpace(line), field+":"); ok {
			return val
		}
	}
	return ""
}

func (t *cluster) nodeID(s *server) string {
	c := s.client()
	defer c.Close()
	id, _ := c.Do(context.Background(), "CLUSTER", "MYID").Text()
	return id
}

// healthy waits until every slot is served, there are three primaries
// and every replica is in sync.
func (t *cluster) healthy() error {
	return waitFor(60*time.Second, "the cluster healthy, each primary with a replica in sync", func() bool {
		primaries := 0
		for _, s := range t.nodes {
			if t.clusterInfo(s, "cluster_state") != "ok" {
				return false
			}
			switch s.info("replication", "role") {
			case "master":
				primaries++
				if s.info("replication", "connected_slaves") != "1" {
					return false
				}
			case "slave":
				if !s.inSyncReplica() {
					return false
				}
			default:
				return false
			}
		}
		return primaries == 3
	})
}

func (t *cluster) storage(extra string) string {
	addrs := make([]string, len(t.nodes))
	for i, s := range t.nodes {
		addrs[i] = s.addr
	}
	return fmt.Sprintf("storage redis {\n\t\t\taddresses %s\n\t\t\tkey_prefix soak:\n%s\n\t\t}", strings.Join(addrs, " "), extra)
}

func (t *cluster) describe() string {
	addrs := make([]string, len(t.nodes))
	for i, s := range t.nodes {
		addrs[i] = s.addr
	}
	return "Cluster: three primaries, each with a replica (node timeout 1s): " + strings.Join(addrs, " ")
}

// fail alternates kill -9 of a primary (odd n) and CLUSTER FAILOVER on
// a replica (even n), on a node drawn from r.
func (t *cluster) fail(n int, r *rand.Rand, lag time.Duration) (failover, error) {
	var primaries, replicas []*server
	for _, s := range t.nodes {
		if s.info("replication", "role") == "master" {
			primaries = append(primaries, s)
		} else {
			replicas = append(replicas, s)
		}
	}
	if len(primaries) != 3 || len(replicas) != 3 {
		return failover{}, fmt.Errorf("%d primaries and %d replicas, want 3 and 3", len(primaries), len(replicas))
	}
	if n%2 == 0 {
		rep := replicas[r.IntN(len(replicas))]
		old := rep.info("replication", "master_port")
		f := failover{N: n, Kind: "CLUSTER FAILOVER", Node: "127.0.0.1:" + old, At: time.Now()}
		c := rep.client()
		err := c.ClusterFailover(context.Background()).Err()
		c.Close()
		if err != nil {
			return f, fmt.Errorf("CLUSTER FAILOVER: %v", err)
		}
		if err := waitFor(30*time.Second, "the replica promoted", func() bool { return rep.info("replication", "role") == "master" }); err != nil {
			return f, err
		}
		f.Promoted = time.Now()
		err = t.healthy()
		f.Healed = time.Now()
		return f, err
	}
	old := primaries[r.IntN(len(primaries))]
	f := failover{N: n, Kind: killKind(lag), Node: old.addr, At: time.Now()}
	var replica *server
	for _, s := range replicas {
		if s.info("replication", "master_port") == portOf(old.addr) {
			replica = s
		}
	}
	lagThenKill(old, replica, lag)
	if replica == nil {
		return f, fmt.Errorf("no replica of %s", old.addr)
	}
	if err := waitFor(60*time.Second, "its replica promoted", func() bool { return replica.info("replication", "role") == "master" }); err != nil {
		return f, err
	}
	f.Promoted = time.Now()
	// Restarted with its nodes.conf, it rejoins as a replica of the node
	// that took its slots.
	if err := old.restart(); err != nil {
		return f, err
	}
	err := t.healthy()
	f.Healed = time.Now()
	return f, err
}

// killKind names a kill -9 failover.
func killKind(lag time.Duration) string {
	if lag > 0 {
		return fmt.Sprintf("kill -9 %v after its replica's link was cut", lag)
	}
	return "kill -9"
}

func portOf(addr string) string {
	_, p, _ := net.SplitHostPort(addr)
	return p
}

func (t *cluster) close() {
	for _, s := range t.nodes {
		s.stop()
	}
}
