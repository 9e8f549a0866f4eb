package inprocess_test

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"
)

// withReplayCache adds a replay cache to a Redis or PostgreSQL storage
// block; a memory block is returned as it is.
func withReplayCache(storage string) string {
	if strings.HasPrefix(storage, "storage memory") {
		return storage
	}
	return strings.TrimSuffix(strings.TrimSpace(storage), "}") + "\treplay_cache 100 1m\n}"
}

// TestReplaysAreTheRecordedResponseWhateverOuterHandlersDo: a replay
// carries the headers the handlers inside idempotency set (the upstream's
// Server, not Caddy's), lacks those they deleted, and is rewritten by
// outer handlers afresh each time: an outer `header` replace never
// reaches the record, even when a replay cache hands the same record to
// concurrent replays (run with -race).
func TestReplaysAreTheRecordedResponseWhateverOuterHandlersDo(t *testing.T) {
	storages(t, func(t *testing.T, storage string) {
		for _, deleteServer := range []bool{false, true} {
			t.Run(fmt.Sprintf("delete Server %v", deleteServer), func(t *testing.T) {
				up := modelUpstream(t)
				inner := ""
				if deleteServer {
					inner = "header {\n\t\t\t-Server\n\t\t\tdefer\n\t\t}"
				}
				base := loadCaddyfile(t, freePort(t), `
	header >Location ^/ /app/
	route {
		idempotency {
			`+withReplayCache(storage)+`
		}
		`+inner+`
		reverse_proxy `+up.Addr+`
	}`)
				a := attempt{key: fmt.Sprintf("fidelity-%v", deleteServer), body: `{}`, ctype: "application/json", do: "s=201;n=30;loc=1"}
				first, _, errText := a.send(t, base)
				if first == nil {
					t.Fatal(errText)
				}
				wantServer := "model-upstream"
				if deleteServer {
					wantServer = ""
				}
				if first.Header.Get("Location") != "/app/orders/1" || first.Header.Get("Server") != wantServer {
					t.Fatalf("first answer: Location %q Server %q", first.Header.Get("Location"), first.Header.Get("Server"))
				}
				var wg sync.WaitGroup
				for range 3 { // sequential rounds of concurrent replays
					for range 10 {
						wg.Go(func() {
							r, _, errText := a.send(t, base)
							switch {
							case r == nil:
								t.Error(errText)
							case r.Header.Get("Idempotent-Replayed") != "true":
								t.Errorf("not a replay: %v", r.Header)
							case r.Header.Get("Location") != "/app/orders/1":
								t.Errorf("replay Location %q, want /app/orders/1 as the first answer had", r.Header.Get("Location"))
							case r.Header.Values("Server") == nil && wantServer != "" || r.Header.Get("Server") != wantServer:
								t.Errorf("replay Server %q, want %q as the first answer had", r.Header.Values("Server"), wantServer)
							}
						})
					}
					wg.Wait()
				}
				if n := len(up.Executions()); n != 1 {
					t.Fatalf("the upstream ran %d times, want once", n)
				}
			})
		}
	})
}

// TestTrailersAreRecordedAndReplayed: an answer with trailers is replayed
// with them.
func TestTrailersAreRecordedAndReplayed(t *testing.T) {
	storages(t, func(t *testing.T, storage string) {
		up := modelUpstream(t)
		base := loadCaddyfile(t, freePort(t), `
	idempotency {
		`+storage+`
	}
	reverse_proxy `+up.Addr)
		a := attempt{key: "trailers", body: `{}`, ctype: "application/json", do: "s=200;n=40;tr=1"}
		for i := range 2 {
			resp, _, errText := a.send(t, base)
			if resp == nil {
				t.Fatal(errText)
			}
			if resp.Trailer.Get("Grpc-Status") != "0" || resp.Trailer.Get("X-Model-Trailer") != "t1" {
				t.Fatalf("answer %d (replayed %q): trailers %v, want Grpc-Status 0 and X-Model-Trailer t1", i+1, resp.Header.Get("Idempotent-Replayed"), resp.Trailer)
			}
		}
		if n := len(up.Executions()); n != 1 {
			t.Fatalf("the upstream ran %d times, want once", n)
		}
	})
}

// TestAGRPCUnaryCallIsReplayedWithItsStatus: a gRPC unary call over
// HTTP/2 (cleartext, h2c) behind reverse_proxy replays with its message
// and its grpc-status trailer.
func TestAGRPCUnaryCallIsReplayedWithItsStatus(t *testing.T) {
	var runs int
	var mu sync.Mutex
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Protocols: new(http.Protocols), Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		runs++
		mu.Unlock()
		in, _ := io.ReadAll(r.Body)
		if r.ProtoMajor != 2 || r.Header.Get("Content-Type") != "application/grpc" || len(in) < 5 {
			http.Error(w, "not a gRPC call", http.StatusBadRequest)
			return
		}
		w.Header().Set("Content-Type", "application/grpc")
		w.Header().Set("Trailer", "Grpc-Status, Grpc-Message")
		w.WriteHeader(http.StatusOK)
		_, _ = w.Write(grpcFrame([]byte("reply to " + string(in[5:]))))
		w.Header().Set("Grpc-Status", "0")
		w.Header().Set("Grpc-Message", "ok")
	})}
	srv.Protocols.SetUnencryptedHTTP2(true)
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { srv.Close() })

	base := loadCaddyfileGlobals(t, freePort(t), "admin off\n\tservers {\n\t\tprotocols h1 h2c\n\t}", `
	idempotency {
		`+memoryStorage()+`
	}
	reverse_proxy h2c://`+ln.Addr().String())

	h2c := &http.Client{Transport: &http.Transport{Protocols: new(http.Protocols)}}
	h2c.Transport.(*http.Transport).Protocols.SetUnencryptedHTTP2(true)
	for i := range 2 {
		req, _ := http.NewRequest(http.MethodPost, base+"/orders.Orders/Create", bytes.NewReader(grpcFrame([]byte("order 7"))))
		req.Header.Set("Content-Type", "application/grpc")
		req.Header.Set("Te", "trailers")
		req.Header.Set("Idempotency-Key", "grpc-7")
		resp, err := h2c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.ProtoMajor != 2 || !bytes.Equal(body, grpcFrame([]byte("reply to order 7"))) {
			t.Fatalf("call %d: HTTP/%d body %q", i+1, resp.ProtoMajor, body)
		}
		if resp.Trailer.Get("Grpc-Status") != "0" || resp.Trailer.Get("Grpc-Message") != "ok" {
			t.Fatalf("call %d (replayed %q): trailers %v, want grpc-status 0", i+1, resp.Header.Get("Idempotent-Replayed"), resp.Trailer)
		}
	}
	if runs != 1 {
		t.Fatalf("the gRPC server ran %d times, want once", runs)
	}
}

// grpcFrame frames msg as a gRPC length-prefixed message.
func grpcFrame(msg []byte) []byte {
	out := make([]byte, 5+len(msg))
	binary.BigEndian.PutUint32(out[1:5], uint32(len(msg)))
	copy(out[5:], msg)
	return out
}

// TestAGzipBodyFromAnUpstreamThatIgnoredIdentityIsRecordedDecoded: the
// handler asks for identity; an upstream that gzips anyway has its answer
// passed on as it is, and recorded decoded, so that replays go to clients
// that never asked for gzip in a form they can read.
func TestAGzipBodyFromAnUpstreamThatIgnoredIdentityIsRecordedDecoded(t *testing.T) {
	storages(t, func(t *testing.T, storage string) {
		up := modelUpstream(t)
		base := loadCaddyfile(t, freePort(t), `
	idempotency {
		`+storage+`
	}
	reverse_proxy `+up.Addr)
		a := attempt{key: "gzip", body: `{}`, ctype: "application/json", do: "s=201;n=60;gz=1"}
		first, id, errText := a.send(t, base)
		if first == nil || first.Header.Get("Content-Encoding") != "gzip" {
			t.Fatalf("first answer %v (%s): want the upstream's gzip", first, errText)
		}
		replay, _, body := a.send(t, base)
		want := string(up.Settled(id, time.Minute).Sent.Body)
		if replay == nil || replay.Header.Get("Content-Encoding") != "" || body != want || replay.Header.Get("Idempotent-Replayed") != "true" {
			t.Fatalf("replay to a client that accepts no gzip: %v body %q, want identity %q", replay, body, want)
		}
	})
}
