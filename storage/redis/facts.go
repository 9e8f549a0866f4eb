package redis

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"

	goredis "github.com/redis/go-redis/v9"

	"github.com/caddy-idempotency/caddy-idempotency/storage"
)

var _ storage.DurabilityReporter = (*Store)(nil)

// unknown is a fact the server would not tell (managed Redis often
// refuses CONFIG GET, and may refuse INFO sections).
const unknown = "unknown"

// NodeFacts is what one primary says of what protects its records.
type NodeFacts struct {
	Addr               string `json:"addr"`
	Role               string `json:"role"`               // master, slave; unknown
	ConnectedReplicas  string `json:"connected_replicas"` // a number; unknown
	AppendOnly         string `json:"appendonly"`         // yes, no; unknown
	AppendFsync        string `json:"appendfsync"`        // always, everysec, no; unknown
	MinReplicasToWrite string `json:"min_replicas_to_write"`
	Save               string `json:"save"`             // RDB snapshots ("" for none); unknown
	MaxmemoryPolicy    string `json:"maxmemory_policy"` // noeviction, allkeys-lru, ...; unknown
	Maxmemory          string `json:"maxmemory"`        // bytes, 0 for no limit; unknown
	Version            string `json:"redis_version"`
	Error              string `json:"error,omitempty"` // why the node could not be asked at all
}

// DurabilityFacts is the answer of Store.Durability.
type DurabilityFacts struct {
	// Option is the Durability in force: replicas (0: no WAIT), timeout,
	// on_timeout (fail or proceed) and the command (WAIT).
	Option map[string]any `json:"option"`
	// Nodes are the primaries (one, or a Cluster's).
	Nodes []NodeFacts `json:"nodes"`
}

// Durability implements storage.DurabilityReporter: the option in force,
// and each primary's role, replicas and persistence, from INFO and
// CONFIG GET; what a server refuses to say is "unknown".
func (s *Store) Durability(ctx context.Context) (any, error) {
	opt := map[string]any{"replicas": s.durability.Replicas}
	if s.durability.Replicas > 0 {
		opt["timeout"] = s.durability.timeout().String()
		opt["on_timeout"] = "fail"
		if s.durability.Proceed {
			opt["on_timeout"] = "proceed"
		}
		// WAITAOF (Redis 7.2) is not used: see durability.go.
		opt["command"] = "WAIT"
	}
	out := DurabilityFacts{Option: opt, Nodes: []NodeFacts{}}
	if s.invalid != nil {
		return out, nil
	}
	cc, ok := s.client.(*goredis.ClusterClient)
	if !ok {
		out.Nodes = append(out.Nodes, s.nodeFacts(ctx, s.client))
		return out, errors.Join(s.shortOfReplicas(out.Nodes), risks(out.Nodes))
	}
	var mu sync.Mutex
	err := cc.ForEachMaster(ctx, func(ctx context.Context, c *goredis.Client) error {
		f := s.nodeFacts(ctx, c)
		mu.Lock()
		out.Nodes = append(out.Nodes, f)
		mu.Unlock()
		return nil
	})
	if err != nil && len(out.Nodes) == 0 {
		out.Nodes = append(out.Nodes, NodeFacts{Addr: unknown, Role: unknown, ConnectedReplicas: unknown, AppendOnly: unknown,
			AppendFsync: unknown, MinReplicasToWrite: unknown, Save: unknown, MaxmemoryPolicy: unknown, Maxmemory: unknown, Version: unknown, Error: s.classify(err).Error()})
	}
	slices.SortFunc(out.Nodes, func(a, b NodeFacts) int { return strings.Compare(a.Addr, b.Addr) })
	return out, errors.Join(s.shortOfReplicas(out.Nodes), risks(out.Nodes))
}

// risks says what each primary may lose of the records without a fault
// of the store's: keys it evicts to make room (any maxmemory-policy but
// noeviction: records all have a TTL, so the volatile policies take them
// too), and, with neither persistence nor a replica, every record on a
// restart. nil when there is nothing to say (or a node would not tell).
// The start-up line warns with it.
func risks(nodes []NodeFacts) error {
	var out []string
	for _, n := range nodes {
		if n.MaxmemoryPolicy != unknown && n.MaxmemoryPolicy != "" && n.MaxmemoryPolicy != "noeviction" {
			out = append(out, fmt.Sprintf("%s evicts keys when it is full (maxmemory-policy %s, maxmemory %s): it may drop live records, in flight or completed, and a retry then runs again; set maxmemory-policy noeviction (a full Redis then refuses new keys, 503)",
				n.Addr, n.MaxmemoryPolicy, n.Maxmemory))
		}
		if n.Role == "master" && n.AppendOnly == "no" && n.Save == "" && n.ConnectedReplicas == "0" {
			out = append(out, fmt.Sprintf("%s keeps nothing on disk (appendonly no, no save) and has no replica: a restart loses every record, and the retries of the requests they answered run again; turn appendonly on (appendfsync everysec or always), or add a replica",
				n.Addr))
		}
	}
	if len(out) == 0 {
		return nil
	}
	return fmt.Errorf("redis durability: %s", strings.Join(out, "; "))
}

// shortOfReplicas says which primaries have fewer replicas connected than
// the durability option waits for (nil when none, or when a node would
// not tell): their reservations all wait out the timeout, then fail as
// store errors (wrapping storage.ErrUnavailable, as Reserve's do) or,
// with Proceed, run unreplicated. The start-up line warns with it.
func (s *Store) shortOfReplicas(nodes []NodeFacts) error {
	if s.durability.Replicas <= 0 {
		return nil
	}
	var short []string
	for _, n := range nodes {
		if c, err := strconv.Atoi(n.ConnectedReplicas); err == nil && c < s.durability.Replicas {
			short = append(short, fmt.Sprintf("%s has %d connected replicas", n.Addr, c))
		}
	}
	if len(short) == 0 {
		return nil
	}
	what := fmt.Sprintf("%s, fewer than durability replicas %d: each reservation waits %v for them", strings.Join(short, ", "),
		s.durability.Replicas, s.durability.timeout())
	if s.durability.Proceed {
		return fmt.Errorf("redis durability: %s, then runs unreplicated (on_timeout proceed)", what)
	}
	return fmt.Errorf("redis durability: %w: %w: %s, then fails as a store error (on_timeout fail)", storage.ErrUnavailable, ErrNotReplicated, what)
}

// nodeFacts asks one node.
func (s *Store) nodeFacts(ctx context.Context, c goredis.UniversalClient) NodeFacts {
	f := NodeFacts{Addr: unknown, Role: unknown, ConnectedReplicas: unknown, AppendOnly: unknown,
		AppendFsync: unknown, MinReplicasToWrite: unknown, Save: unknown, MaxmemoryPolicy: unknown, Maxmemory: unknown, Version: unknown}
	if n, ok := c.(*goredis.Client); ok {
		f.Addr = n.Options().Addr
	}
	if _, _, err := net.SplitHostPort(f.Addr); err != nil && !strings.HasPrefix(f.Addr, "/") {
		// Not an address: a Sentinel client's Options say
		// "FailoverClient", and the primary it follows changes. The
		// server says which address the connection reached.
		f.Addr = unknown
		if ci, err := c.ClientInfo(ctx).Result(); err == nil && ci.LAddr != "" {
			f.Addr = ci.LAddr
		}
	}
	if info, err := c.Info(ctx, "replication").Result(); err == nil {
		f.Role = cmpUnknown(infoField(info, "role"))
		f.ConnectedReplicas = cmpUnknown(infoField(info, "connected_slaves"))
	} else {
		f.Error = s.classify(err).Error()
	}
	if info, err := c.Info(ctx, "server").Result(); err == nil {
		f.Version = cmpUnknown(infoField(info, "redis_version"))
	}
	for _, p := range []struct {
		name string
		to   *string
	}{{"appendonly", &f.AppendOnly}, {"appendfsync", &f.AppendFsync}, {"min-replicas-to-write", &f.MinReplicasToWrite},
		{"maxmemory-policy", &f.MaxmemoryPolicy}, {"maxmemory", &f.Maxmemory}} {
		if m, err := c.ConfigGet(ctx, p.name).Result(); err == nil {
			*p.to = cmpUnknown(m[p.name])
		}
	}
	// save is "" when snapshots are off: that is a value, not unknown.
	if m, err := c.ConfigGet(ctx, "save").Result(); err == nil {
		if v, ok := m["save"]; ok {
			f.Save = v
		}
	}
	return f
}

// infoField returns the value of name in an INFO reply, "" when absent.
func infoField(info, name string) string {
	for line := range strings.Lines(info) {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), name+":"); ok {
			return v
		}
	}
	return ""
}

func cmpUnknown(s string) string {
	if s == "" {
		return unknown
	}
	return s
}
