package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"syscall"
	"time"

	"github.com/caddy-idempotency/caddy-idempotency/internal/testkit/caddyproc"
	"github.com/caddy-idempotency/caddy-idempotency/internal/testkit/soak/history"
)

// Clients of every protocol Caddy serves that read as phones on a bad
// network do: slowly (1-3 KB/s, with small flow-control windows and TCP
// buffers, so that Caddy's writes wait for them), stopping for 12-25 s
// and then resuming, or hanging up half-way; and clients that read as
// the answer comes from an upstream that falls silent for 12-25 s once
// its headers or its first bytes are out (an SSE stream, an LLM). Each
// asks for a streamed answer several times what the connection buffers,
// and records what it received; the checker (history.checkBodies) judges
// it against what the upstream sent.

// reader is how one attempt's client speaks and reads.
type reader struct {
	proto caddyproc.Proto
	mode  string        // "", history.ReadSlow or history.ReadStall
	rate  int           // ReadSlow: bytes a second
	stall time.Duration // ReadStall: how long it stops reading
}

// stallFirst is what a stalling client reads before it stops.
const stallFirst = 8 << 10

// read reads body as r says (a nil reader reads at once), until ctx ends
// (a hang-up, the client's timeout).
func (r *reader) read(ctx context.Context, body io.Reader) ([]byte, error) {
	switch {
	case r == nil || r.mode == "":
		return io.ReadAll(body)
	case r.mode == history.ReadSlow:
		return caddyproc.ReadSlowly(body, r.rate)
	}
	first := make([]byte, stallFirst)
	n, err := io.ReadFull(body, first)
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		return first[:n], nil // the whole answer came before the stall
	}
	if err != nil {
		return first[:n], err
	}
	sleep(ctx, r.stall)
	rest, err := io.ReadAll(body)
	return append(first[:n], rest...), err
}

// transport is a client of its own for p with small windows: HTTP/2 and
// HTTP/3 trust the instances' certificate (caddyproc.Cert.Transport);
// HTTP/1.1 has a 4 KiB receive buffer and an Ethernet-sized MSS
// (slowSocket), so that the server's writes wait for it.
func (c *clients) transport(p caddyproc.Proto) http.RoundTripper {
	if p != caddyproc.H1 {
		return c.cert.Transport(p, true)
	}
	d := &net.Dialer{Timeout: 2 * time.Second, Control: func(_, _ string, rc syscall.RawConn) error {
		return rc.Control(slowSocket)
	}}
	t := &http.Transport{DisableCompression: true, Protocols: new(http.Protocols), DialContext: d.DialContext}
	t.Protocols.SetHTTP1(true)
	return t
}

// Ways a slow client reads, each over every protocol.
const (
	slowRead   = "slow"
	slowStall  = "stall"
	slowHangUp = "hang-up"
	slowSilent = "silent" // reads at once; the upstream falls silent
)

// slowCombos are the protocol and reading mode of each slow client in
// turn: a worker w takes combos w, w+W, w+2W, ..., so that a few workers
// cover them all within a few minutes.
var slowCombos = func() []struct {
	proto caddyproc.Proto
	mode  string
} {
	var out []struct {
		proto caddyproc.Proto
		mode  string
	}
	for _, m := range []string{slowRead, slowStall, slowHangUp, slowSilent} {
		for _, p := range []caddyproc.Proto{caddyproc.H2, caddyproc.H3, caddyproc.H1, caddyproc.H2C} {
			out = append(out, struct {
				proto caddyproc.Proto
				mode  string
			}{p, m})
		}
	}
	return out
}()

// slowIntent draws worker's n-th slow client: its intent (a new key, a
// streamed answer), the plan of its first attempt, and how long that
// attempt takes at most.
func slowIntent(seed int64, worker, workers, n int, L time.Duration) (intentSpec, sendPlan, time.Duration) {
	rng := rngFor(seed, 5, worker, n)
	combo := slowCombos[(worker+n*workers)%len(slowCombos)]
	in := intentSpec{Intent: history.Intent{Scope: fmt.Sprintf("Bearer soak-slow-%d", worker),
		Key: fmt.Sprintf("slow-%d-%d", worker, n), Senders: 1, Source: history.SourceSlow}}
	in.on(routeAt([]string{"/redis/", "/postgres/"}[n%2]))
	in.body = fmt.Appendf(nil, `{"download":"%d-%d","proto":%q,"mode":%q}`, worker, n, combo.proto, combo.mode)
	in.BodyDigest = digest(in.body)
	rd := &reader{proto: combo.proto}
	b := behaviour{delay: time.Duration(rng.Int64N(int64(L / 3)))}
	secs := func(lo, hi float64) time.Duration {
		return time.Duration((lo + rng.Float64()*(hi-lo)) * float64(time.Second))
	}
	var takes time.Duration
	switch combo.mode {
	case slowRead:
		// 40-60 s of reading at 1.5-3 KB/s: many times what the windows
		// and socket buffers hold, and a 32 KiB write takes longer than
		// the stall timeout.
		rd.mode, rd.rate = history.ReadSlow, 1500+rng.IntN(1501)
		in.size = max(96<<10, int(float64(rd.rate)*secs(40, 60).Seconds()))
		takes = time.Duration(in.size/rd.rate)*time.Second + 10*time.Second
	case slowStall:
		// Stops reading past the stall timeout, then resumes: it gets
		// the whole answer or an error, never a clean end after part.
		rd.mode, rd.stall = history.ReadStall, secs(12, 25)
		in.size = 600_000 + rng.IntN(400_001) // below max_response_size (1 MiB)
		takes = rd.stall + 20*time.Second
	case slowHangUp:
		// Reads slowly, then hangs up: the answer is still read to the
		// end and recorded whole, for the retry's replay.
		rd.mode, rd.rate = history.ReadSlow, 1000+rng.IntN(2001)
		in.size = 96<<10 + rng.IntN(96<<10)
		b.hangUp = b.delay + secs(2, 8)
		takes = b.hangUp
	case slowSilent:
		// The upstream sends nothing for longer than the stall timeout
		// once its headers (unsized) or its first 8 KiB are out; the
		// client reads all that comes, and must get all of it.
		in.size = 64<<10 + rng.IntN(64<<10)
		b.silence, b.silentAt = secs(12, 25), []int{0, 8 << 10}[rng.IntN(2)]
		in.silence, in.silentAt = b.silence, b.silentAt
		takes = b.delay + b.silence + 10*time.Second
	}
	b.timeout = takes + L
	return in, sendPlan{first: &b, reader: rd, budget: takes + senderBudget}, takes
}

// slowWork runs one slow client worker until issue ends: each intent's
// first attempt by a slow client, its retries by the steady one. It
// starts none that could not end by then.
func (c *clients) slowWork(issue, done context.Context, worker, workers int) {
	end, _ := issue.Deadline()
	for n := 0; issue.Err() == nil; n++ {
		in, sp, takes := slowIntent(c.seed, worker, workers, n, c.L)
		if !end.IsZero() && time.Until(end) < takes {
			return
		}
		c.register(&in)
		c.send(done, &in, 1, rngFor(c.seed, 6, worker, n), sp)
		sleep(issue, time.Duration(rngFor(c.seed, 7, worker, n).Int64N(int64(time.Second))))
	}
}
