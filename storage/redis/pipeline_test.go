package redis

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/caddy-idempotency/caddy-idempotency/internal/testkit/caddyproc"
	"github.com/caddy-idempotency/caddy-idempotency/internal/testkit/redistest"
)

// echoScript answers its argument: what a batch sends does not matter
// here, only when each caller hears back.
var echoScript = goredis.NewScript(`return ARGV[1]`)

// stalledPipeliner returns a pipeliner on a private redis-server behind a
// proxy, with echoScript cached, and the proxy, so that the test can turn
// the server into a black hole and back.
func stalledPipeliner(t *testing.T) (*pipeliner, *caddyproc.Proxy) {
	t.Helper()
	srv := redistest.StartServer(t)
	proxy, err := caddyproc.NewProxy(srv.Addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(proxy.Close)
	client := goredis.NewClient(&goredis.Options{
		Addr:                  proxy.Addr,
		ContextTimeoutEnabled: true,
		ReadTimeout:           time.Minute,
		WriteTimeout:          time.Minute,
		MaxRetries:            -1,
	})
	t.Cleanup(func() { client.Close() })
	if err := echoScript.Load(t.Context(), client).Err(); err != nil {
		t.Fatal(err)
	}
	p := newPipeliner(client, Durability{})
	t.Cleanup(p.close)
	return p, proxy
}

func newCall(ctx context.Context, arg string) *call {
	return &call{ctx: ctx, script: echoScript, keys: []string{"k"}, args: []any{arg}, done: make(chan struct{})}
}

// TestBatchedCommandsKeepTheirOwnDeadlines sends a renewal's short
// deadline and a completion's long one in one pipeline to a server that
// answers only after the short deadline has passed. The completion must
// get its reply: a batch used to take its earliest deadline, so the
// renewal's timeout failed every command sent with it.
func TestBatchedCommandsKeepTheirOwnDeadlines(t *testing.T) {
	p, proxy := stalledPipeliner(t)
	shortCtx, cancelShort := context.WithTimeout(t.Context(), 200*time.Millisecond)
	defer cancelShort()
	longCtx, cancelLong := context.WithTimeout(t.Context(), time.Minute)
	defer cancelLong()
	short, long := newCall(shortCtx, "renew"), newCall(longCtx, "complete")

	proxy.Stall()
	flushed := make(chan struct{})
	go func() {
		defer close(flushed)
		p.flush([]*call{short, long})
	}()
	// The server answers only once the short deadline has passed: an
	// event, not a guess at how long anything takes.
	<-shortCtx.Done()
	proxy.Unstall()

	select {
	case <-long.done:
	case <-longCtx.Done():
		t.Fatal("the command with the long deadline got no reply within it")
	}
	if long.err != nil || long.val != "complete" {
		t.Fatalf("command with the long deadline: %v, %v; want its reply (the short deadline of another command failed it)", long.val, long.err)
	}
	<-flushed
}

// TestCallersReturnAtTheirOwnDeadline: over a black-holed server, a
// caller with a short deadline hears of it at that deadline, even when its
// command shares a pipeline with one that may wait much longer; and a
// command whose caller has given up before its batch goes out is not
// sent.
func TestCallersReturnAtTheirOwnDeadline(t *testing.T) {
	p, proxy := stalledPipeliner(t)
	proxy.Stall()
	defer proxy.Unstall()

	const long = time.Minute
	longCtx, cancelLong := context.WithTimeout(t.Context(), long)
	defer cancelLong()
	// Workers stuck on the black hole with long deadlines; the short
	// calls below go out with one of them, or queue up behind them.
	for range pipelineWorkers + 1 {
		go p.do(longCtx, echoScript, []string{"k"}, []any{"filler"}, false)
	}
	start := time.Now()
	errs := make(chan error, 3)
	for range 3 {
		go func() {
			ctx, cancel := context.WithTimeout(t.Context(), 100*time.Millisecond)
			defer cancel()
			_, _, err := p.do(ctx, echoScript, []string{"k"}, []any{"short"}, false)
			errs <- err
		}()
	}
	for range 3 {
		select {
		case err := <-errs:
			if !errors.Is(err, context.DeadlineExceeded) && !isTimeout(err) {
				t.Fatalf("short call over a black hole: %v, want a timeout", err)
			}
		case <-longCtx.Done():
			t.Fatal("a short call waited for the long deadline")
		}
	}
	if took := time.Since(start); took >= long {
		t.Fatalf("short calls returned after %v", took)
	}

	// A call given up before its batch went out is answered, not sent.
	gone, cancel := context.WithCancel(t.Context())
	cancel()
	c := newCall(gone, "gone")
	p.flush([]*call{c})
	if !errors.Is(c.err, context.Canceled) {
		t.Fatalf("flush of a cancelled call: %v, want context.Canceled", c.err)
	}
}

// roundTrips is a go-redis hook counting the commands and the pipelines
// of scripts a client sends: a round trip each. A new connection's
// handshake (HELLO, CLIENT SETINFO) is not counted.
type roundTrips struct{ n atomic.Int64 }

func isScript(cmd goredis.Cmder) bool {
	name := cmd.Name()
	return name == "evalsha" || name == "eval" || name == "script"
}

func (h *roundTrips) DialHook(next goredis.DialHook) goredis.DialHook { return next }
func (h *roundTrips) ProcessHook(next goredis.ProcessHook) goredis.ProcessHook {
	return func(ctx context.Context, cmd goredis.Cmder) error {
		if isScript(cmd) {
			h.n.Add(1)
		}
		return next(ctx, cmd)
	}
}
func (h *roundTrips) ProcessPipelineHook(next goredis.ProcessPipelineHook) goredis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []goredis.Cmder) error {
		if len(cmds) > 0 && isScript(cmds[0]) {
			h.n.Add(1)
		}
		return next(ctx, cmds)
	}
}

// TestABatchThatMetNoscriptIsSentAgainInOnePipeline: after the server
// forgot the script (SCRIPT FLUSH, a failover), the commands of a batch
// that met NOSCRIPT go again as EVAL in one more pipeline: two round
// trips for the batch, not one more (or two: EVALSHA, then EVAL) for
// each of its commands.
func TestABatchThatMetNoscriptIsSentAgainInOnePipeline(t *testing.T) {
	srv := redistest.StartServer(t)
	client := goredis.NewClient(&goredis.Options{Addr: srv.Addr})
	defer client.Close()
	trips := new(roundTrips)
	client.AddHook(trips)
	p := newPipeliner(client, Durability{})
	defer p.close()

	batch := make([]*call, 100)
	for i := range batch {
		batch[i] = newCall(t.Context(), fmt.Sprint(i))
	}
	p.flush(batch)
	for i, c := range batch {
		if c.err != nil || c.val != fmt.Sprint(i) {
			t.Fatalf("call %d: %v, %v", i, c.val, c.err)
		}
	}
	if n := trips.n.Load(); n != 2 {
		t.Fatalf("a batch of %d calls for a script the server did not know took %d round trips, want 2", len(batch), n)
	}
}
