package redis

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/caddy-idempotency/caddy-idempotency/internal/testkit/caddyproc"
	"github.com/caddy-idempotency/caddy-idempotency/internal/testkit/redistest"
	"github.com/caddy-idempotency/caddy-idempotency/internal/testkit/testutil"
	"github.com/caddy-idempotency/caddy-idempotency/storage"
)

// Renewals in batches (renew.go): one round trip per node whatever the
// number of leases, on connections of their own, which a late reply
// within the caller's deadline never costs.

// renewStore returns a store built as the Caddy module builds it (NewClient,
// NewRenewClient), the renewal client with hook added before the store
// takes it; closed when the test ends.
func renewStore(t testing.TB, o ClientOptions, hook goredis.Hook) *Store {
	t.Helper()
	return renewStoreVia(t, o, o, hook)
}

// renewStoreVia is renewStore with the renewal client built from ro:
// the same server, reached another way (a proxy of its own).
func renewStoreVia(t testing.TB, o, ro ClientOptions, hook goredis.Hook) *Store {
	t.Helper()
	client, err := NewClient(o)
	if err != nil {
		t.Fatal(err)
	}
	renew, err := NewRenewClient(ro)
	if err != nil {
		t.Fatal(err)
	}
	if hook != nil {
		renew.AddHook(hook)
	}
	s := New(client, Options{KeyPrefix: testPrefix(), Timeout: orDefault(o.Timeout, DefaultTimeout), RenewClient: renew})
	t.Cleanup(func() { s.Close() })
	return s
}

// acquireMany reserves n new keys with lease, concurrently (so that the
// pipeliner batches them), and returns them as renewals of renewTo.
func acquireMany(t *testing.T, s *Store, n int, lease, renewTo time.Duration) []storage.Renewal {
	t.Helper()
	batch := make([]storage.Renewal, n)
	scope := "renew-" + redistest.RandomHex(4)
	const workers = 50
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for i := w; i < n; i += workers {
				key := storage.Key{Scope: scope, ID: strconv.Itoa(i)}
				res, err := s.Reserve(context.Background(), key, fp, lease)
				if err != nil || res.Outcome != storage.Acquired {
					t.Errorf("Reserve of lease %d: %v %v", i, res.Outcome, err)
					return
				}
				batch[i] = storage.Renewal{Key: key, Token: res.Token, Lease: renewTo}
			}
		})
	}
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	return batch
}

// renewAll renews batch with a deadline of within and fails the test
// unless every lease was renewed.
func renewAll(t *testing.T, s *Store, batch []storage.Renewal, within time.Duration) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), within)
	defer cancel()
	err := s.RenewBatch(ctx, batch)
	failed := 0
	var first error
	for _, r := range batch {
		if r.Err != nil {
			if failed == 0 {
				first = r.Err
			}
			failed++
		}
	}
	if err != nil || failed > 0 {
		t.Fatalf("RenewBatch of %d leases: %v; %d failed, the first with %v", len(batch), err, failed, first)
	}
}

// info returns the integer field of an INFO section.
func info(t testing.TB, c *goredis.Client, section, field string) int64 {
	t.Helper()
	s, err := c.Info(context.Background(), section).Result()
	if err != nil {
		t.Fatalf("INFO %s: %v", section, err)
	}
	for line := range strings.SplitSeq(s, "\r\n") {
		if v, ok := strings.CutPrefix(line, field+":"); ok {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				t.Fatalf("INFO %s: %s", section, line)
			}
			return n
		}
	}
	t.Fatalf("INFO %s has no %s", section, field)
	return 0
}

// evalshaCalls returns how many EVALSHA commands the server at c ran.
func evalshaCalls(t testing.TB, c *goredis.Client) int64 {
	t.Helper()
	s, err := c.Info(context.Background(), "commandstats").Result()
	if err != nil {
		t.Fatalf("INFO commandstats: %v", err)
	}
	for line := range strings.SplitSeq(s, "\r\n") {
		if rest, ok := strings.CutPrefix(line, "cmdstat_evalsha:calls="); ok {
			calls, _, _ := strings.Cut(rest, ",")
			n, _ := strconv.ParseInt(calls, 10, 64)
			return n
		}
	}
	return 0
}

// clientsNamed returns how many connections CLIENT LIST shows under name.
func clientsNamed(t testing.TB, c *goredis.Client, name string) int {
	t.Helper()
	list, err := c.ClientList(context.Background()).Result()
	if err != nil {
		t.Fatalf("CLIENT LIST: %v", err)
	}
	n := 0
	for line := range strings.SplitSeq(list, "\n") {
		if strings.Contains(" "+line+" ", " name="+name+" ") {
			n++
		}
	}
	return n
}

// dialCounter is a go-redis hook counting the connections a client opens.
type dialCounter struct{ n atomic.Int64 }

func (d *dialCounter) DialHook(next goredis.DialHook) goredis.DialHook {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		d.n.Add(1)
		return next(ctx, network, addr)
	}
}
func (d *dialCounter) ProcessHook(next goredis.ProcessHook) goredis.ProcessHook { return next }
func (d *dialCounter) ProcessPipelineHook(next goredis.ProcessPipelineHook) goredis.ProcessPipelineHook {
	return next
}

// TestRenewBatchOfTenThousandLeasesIsOneRoundTrip: 10,000 leases are
// renewed by one pipeline on one connection of the renewal client: one
// round trip by the store's count, 10,000 EVALSHA by the server's, one
// connection of the renewal client in CLIENT LIST, and none opened.
func TestRenewBatchOfTenThousandLeasesIsOneRoundTrip(t *testing.T) {
	srv := redistest.StartServer(t) // alone: commandstats and connections are counted
	const name = "renewals"
	s := renewStoreVia(t, ClientOptions{URL: srv.Addr}, ClientOptions{URL: "redis://" + srv.Addr + "/0?client_name=" + name}, nil)
	admin := adminClient(t, srv.Addr)
	const n = 10_000
	batch := acquireMany(t, s, n, time.Minute, 10*time.Minute)
	// Warm up: the renewal client's connection, and the script, which a
	// fresh server answers with NOSCRIPT (then EVAL, one more round trip).
	renewAll(t, s, batch[:1], time.Minute)
	if got := s.RenewalRoundTrips(); got != 2 {
		t.Errorf("the first batch took %d round trips, want 2 (EVALSHA, NOSCRIPT, then EVAL)", got)
	}

	trips, evalsha := s.RenewalRoundTrips(), evalshaCalls(t, admin)
	conns := info(t, admin, "stats", "total_connections_received")
	start := time.Now()
	renewAll(t, s, batch, time.Minute)
	took := time.Since(start)
	if d := s.RenewalRoundTrips() - trips; d != 1 {
		t.Errorf("%d leases renewed in %d round trips, want 1", n, d)
	}
	if d := evalshaCalls(t, admin) - evalsha; d != n {
		t.Errorf("the server ran %d EVALSHA for %d leases", d, n)
	}
	if d := info(t, admin, "stats", "total_connections_received") - conns; d != 0 {
		t.Errorf("%d connections opened during the batch, want none", d)
	}
	if got := clientsNamed(t, admin, name); got != 1 {
		t.Errorf("%d connections of the renewal client, want 1", got)
	}
	t.Logf("%d leases renewed in one round trip, %v", n, took)
	for _, i := range []int{0, n / 2, n - 1} {
		rec, err := s.Get(t.Context(), batch[i].Key, false)
		if err != nil {
			t.Fatal(err)
		}
		if left := time.Until(rec.ExpiresAt); left < 5*time.Minute {
			t.Errorf("lease %d lapses in %v: not renewed for 10 minutes", i, left)
		}
	}
}

// TestRenewBatchAnswersAfterAScriptFlush: a node that forgot the script
// gets it again by EVAL, in one more pipeline, not one command per lease.
func TestRenewBatchAnswersAfterAScriptFlush(t *testing.T) {
	srv := redistest.StartServer(t) // SCRIPT FLUSH on the shared one would disturb other tests
	s := renewStore(t, ClientOptions{URL: srv.Addr}, nil)
	admin := adminClient(t, srv.Addr)
	batch := acquireMany(t, s, 100, time.Minute, time.Minute)
	renewAll(t, s, batch, time.Minute)
	if err := admin.ScriptFlush(t.Context()).Err(); err != nil {
		t.Fatal(err)
	}
	trips := s.RenewalRoundTrips()
	renewAll(t, s, batch, time.Minute)
	if d := s.RenewalRoundTrips() - trips; d != 2 {
		t.Errorf("after SCRIPT FLUSH, %d round trips, want 2 (NOSCRIPT, then EVAL)", d)
	}
	trips = s.RenewalRoundTrips()
	renewAll(t, s, batch, time.Minute)
	if d := s.RenewalRoundTrips() - trips; d != 1 {
		t.Errorf("once EVAL cached the script again, %d round trips, want 1", d)
	}
}

// TestRenewalsGoOnWhileThePipelinerIsStalled: reservations and
// completions are stuck on a connection that carries nothing (their
// proxy is a black hole) and more queue up behind them; renewals, on
// connections of their own (a proxy of their own to the same server),
// are answered all the same.
func TestRenewalsGoOnWhileThePipelinerIsStalled(t *testing.T) {
	srv := redistest.StartServer(t)
	main, renewals := newProxy(t, srv.Addr), newProxy(t, srv.Addr)
	s := renewStoreVia(t, ClientOptions{URL: main.Addr}, ClientOptions{URL: renewals.Addr}, nil)
	batch := acquireMany(t, s, 500, time.Minute, time.Minute)

	main.Stall()
	var wg sync.WaitGroup
	defer wg.Wait()
	defer main.Unstall()
	// More reservations than the pipeliner's workers take in their
	// batches: the rest queue up behind them.
	for i := range pipelineWorkers*maxBatch + 100 {
		wg.Go(func() {
			key := storage.Key{Scope: "stalled", ID: strconv.Itoa(i)}
			s.Reserve(context.Background(), key, fp, time.Minute)
		})
	}
	testutil.Eventually(t, time.Minute, "reservations queued behind the stalled pipeliner", func() bool {
		return len(s.pipe.queue) > 0
	})
	renewAll(t, s, batch, time.Minute)
	if len(s.pipe.queue) == 0 {
		t.Fatal("the pipeliner drained its queue while stalled: the test proved nothing")
	}
}

// newProxy returns a proxy to addr, closed when the test ends.
func newProxy(t testing.TB, addr string) *caddyproc.Proxy {
	t.Helper()
	p, err := caddyproc.NewProxy(addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return p
}

// TestRenewalsThirtyMillisecondsAway is the outside review's setting: a
// Redis 30 ms away each way (with jitter), lock_timeout 2s (a renewal
// every 200 ms, given half a lease), requests reserving and completing
// keys all the while through the pipeliner on the same link. 500 leases
// are renewed every tick for several seconds: no renewal fails, and the
// renewal client never opens a second connection (a renewal that missed
// a deadline would have cost its connection).
func TestRenewalsThirtyMillisecondsAway(t *testing.T) {
	if testing.Short() {
		t.Skip("renews for several seconds")
	}
	srv := redistest.StartServer(t)
	proxy := newProxy(t, srv.Addr)
	proxy.SetLatency(30*time.Millisecond, 5*time.Millisecond)
	const (
		lockTimeout = 2 * time.Second
		every       = lockTimeout / 10
		leases      = 500
		ticks       = 15
	)
	dials := new(dialCounter)
	s := renewStore(t, ClientOptions{URL: proxy.Addr}, dials)
	batch := acquireMany(t, s, leases, time.Minute, lockTimeout)
	// The renewal client's connection, and the script (NOSCRIPT, then
	// EVAL, on a fresh server).
	renewAll(t, s, batch[:1], time.Minute)

	// Fifty requests at a time reserve and complete keys of their own.
	stop := make(chan struct{})
	var load sync.WaitGroup
	var served atomic.Int64
	for w := range 50 {
		load.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				key := storage.Key{Scope: "load", ID: fmt.Sprint(w, "-", i)}
				ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
				if res, err := s.Reserve(ctx, key, fp, lockTimeout); err == nil && res.Outcome == storage.Acquired {
					if s.Complete(ctx, key, res.Token, textResponse("done"), time.Minute) == nil {
						served.Add(1)
					}
				}
				cancel()
			}
		})
	}
	defer load.Wait()
	defer close(stop)

	trips := s.RenewalRoundTrips()
	tick := time.NewTicker(every)
	defer tick.Stop()
	var slowest time.Duration
	for range ticks {
		<-tick.C
		start := time.Now()
		renewAll(t, s, batch, lockTimeout/2)
		slowest = max(slowest, time.Since(start))
	}
	if d := s.RenewalRoundTrips() - trips; d != ticks {
		t.Errorf("%d batches took %d round trips, want one each", ticks, d)
	}
	if n := dials.n.Load(); n != 1 {
		t.Errorf("the renewal client opened %d connections, want 1: a connection was lost", n)
	}
	t.Logf("%d batches of %d leases, the slowest in %v; %d requests served meanwhile", ticks, leases, slowest, served.Load())
}

// TestASlowReplyWithinTheDeadlineKeepsTheConnection: a batch whose reply
// comes long after the store's timeout, but within the caller's
// deadline, succeeds on the connection it was sent on. A client whose
// socket timeout is the store's timeout gives the batch up and closes
// the connection, and the next batch pays for a new one.
func TestASlowReplyWithinTheDeadlineKeepsTheConnection(t *testing.T) {
	srv := redistest.StartServer(t)
	proxy := newProxy(t, srv.Addr)
	const timeout = 50 * time.Millisecond
	dials := new(dialCounter)
	s := renewStore(t, ClientOptions{URL: proxy.Addr, Timeout: timeout}, dials)
	batch := acquireMany(t, s, 10, time.Minute, time.Minute)
	renewAll(t, s, batch, time.Minute)

	proxy.Stall()
	done := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		done <- s.RenewBatch(ctx, batch)
	}()
	select {
	case err := <-done:
		proxy.Unstall()
		t.Fatalf("RenewBatch returned while Redis did not answer, within its deadline of a minute: %v", err)
	case <-time.After(10 * timeout):
	}
	proxy.Unstall()
	if err := <-done; err != nil {
		t.Fatalf("RenewBatch: %v", err)
	}
	for i, r := range batch {
		if r.Err != nil {
			t.Fatalf("lease %d: %v", i, r.Err)
		}
	}
	renewAll(t, s, batch, time.Minute)
	if n := dials.n.Load(); n != 1 {
		t.Errorf("the renewal client opened %d connections, want 1: the slow reply cost one", n)
	}
}

// TestRenewClientBoundsCommandsWithoutADeadline: the renewal client has
// no socket timeout of its own; a command sent without a deadline (as
// go-redis sends its own) gets the client's timeout instead of hanging
// on a server that does not answer.
func TestRenewClientBoundsCommandsWithoutADeadline(t *testing.T) {
	srv := redistest.StartServer(t)
	proxy := newProxy(t, srv.Addr)
	c, err := NewRenewClient(ClientOptions{URL: proxy.Addr, Timeout: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := c.Ping(context.Background()).Err(); err != nil {
		t.Fatal(err)
	}
	proxy.Stall()
	defer proxy.Unstall()
	done := make(chan error, 1)
	go func() { done <- c.Ping(context.Background()).Err() }()
	select {
	case err := <-done:
		if !unreachable(err) {
			t.Fatalf("PING over a black hole: %v, want a timeout", err)
		}
	case <-time.After(time.Minute):
		t.Fatal("PING without a deadline over a black hole still waits after a minute")
	}
}

// TestRenewBatchWhenRedisIsDown: no command got an answer, so the batch
// fails as a whole, with an error wrapping storage.ErrUnavailable, and
// every lease carries it.
func TestRenewBatchWhenRedisIsDown(t *testing.T) {
	s := renewStore(t, ClientOptions{URL: "127.0.0.1:1", Timeout: time.Second}, nil)
	batch := []storage.Renewal{
		{Key: storage.Key{Scope: "s", ID: "a"}, Token: 1, Lease: time.Minute},
		{Key: storage.Key{Scope: "s", ID: "b"}, Token: 2, Lease: time.Minute},
	}
	err := s.RenewBatch(t.Context(), batch)
	if !errors.Is(err, storage.ErrUnavailable) {
		t.Fatalf("RenewBatch on a closed port: %v, want an error wrapping storage.ErrUnavailable", err)
	}
	for i, r := range batch {
		if r.Err != err {
			t.Errorf("lease %d: %v, want the batch's error", i, r.Err)
		}
	}
}

// TestRenewBatchChecksItsLeases: a lease that is not positive is refused
// and a zero token is lost, without asking Redis; the others are renewed.
func TestRenewBatchChecksItsLeases(t *testing.T) {
	s := newTestStore(t, redistest.Addr(), Options{})
	key := storage.Key{Scope: "scope", ID: "checked"}
	tok := acquire(t, s, key, time.Minute)
	batch := []storage.Renewal{
		{Key: key, Token: tok, Lease: 0},
		{Key: key, Token: 0, Lease: time.Minute},
		{Key: key, Token: tok, Lease: time.Minute},
	}
	if err := s.RenewBatch(t.Context(), batch); err != nil {
		t.Fatal(err)
	}
	if !errors.Is(batch[0].Err, storage.ErrInvalid) || batch[1].Err != storage.ErrLeaseLost || batch[2].Err != nil {
		t.Fatalf("answers %v, %v, %v; want invalid, lost, renewed", batch[0].Err, batch[1].Err, batch[2].Err)
	}
}

// TestRenewBatchWithoutARenewClient: a store built without
// Options.RenewClient renews on its own client, one pipeline a batch
// still.
func TestRenewBatchWithoutARenewClient(t *testing.T) {
	redistest.Require(t, redistest.Addr())
	s := New(goredis.NewClient(&goredis.Options{Addr: redistest.Addr()}), Options{KeyPrefix: testPrefix()})
	defer s.Close()
	batch := acquireMany(t, s, 300, time.Minute, 10*time.Minute)
	lost := storage.Renewal{Key: batch[0].Key, Token: batch[0].Token + 1, Lease: time.Minute}
	batch = append(batch, lost)
	if err := s.RenewBatch(t.Context(), batch); err != nil {
		t.Fatal(err)
	}
	for i, r := range batch[:len(batch)-1] {
		if r.Err != nil {
			t.Fatalf("lease %d: %v", i, r.Err)
		}
	}
	if err := batch[len(batch)-1].Err; err != storage.ErrLeaseLost {
		t.Fatalf("a token that is not the lease's: %v, want storage.ErrLeaseLost", err)
	}
	// Only the renewals count, not the pipeliner's pipelines on the
	// same client; the shared server may ask for the script once more.
	if n := s.RenewalRoundTrips(); n < 1 || n > 2 {
		t.Errorf("%d round trips for one batch", n)
	}
}
